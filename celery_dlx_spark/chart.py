"""The PNG chart: failures per hour by top cause, for people who would rather look than read."""

from __future__ import annotations

import io
from datetime import datetime, timezone
from typing import Any

from celery_dlx_spark.records import FAILURE_FATES

HOUR_MS = 3600 * 1000
#: Causes drawn as their own line; the rest are summed as "other causes".
TOP_CAUSES = 6
#: Key of the summed remaining causes (not a possible cause fingerprint).
OTHER = "\x00other"


def hourly_failures(
    events: Any, days: float, top: int = TOP_CAUSES, bounds: tuple[Any, Any] | None = None
) -> dict[str, Any]:
    """Failures per hour and cause over the last ``days`` days before the last failure (or since
    the first failure, when the history is shorter).

    Args:
        events: the events output (its ``day`` partitions outside the window are not read).
        days: days of history drawn.
        top: causes drawn as their own line.
        bounds: the first and last failure's ``at_ms`` when already known (``None, None``: no
            failure); read from ``events`` when not given.

    Returns:
        ``{"hours": [epoch hour, ...], "series": {label: [count per hour]}}`` with every hour of
        the window (zero-filled) and at most ``top`` causes plus "other causes"; empty lists
        when there is no failure.
    """
    from pyspark.sql import functions as F

    failures = events.filter(F.col("fate").isin(*FAILURE_FATES))
    if bounds is None:
        bounds = tuple(failures.agg(F.min("at_ms"), F.max("at_ms")).first() or (None, None))
    if bounds[1] is None:
        return {"hours": [], "series": {}}
    last_hour = int(bounds[1]) // HOUR_MS
    first_hour = max(int(bounds[0]) // HOUR_MS, last_hour - max(1, int(days * 24)) + 1)
    # the day partitions before the window's first day are not read at all
    first_day = datetime.fromtimestamp(first_hour * 3600, tz=timezone.utc).date().isoformat()
    window = failures.filter(
        (F.col("day") >= F.lit(first_day)) & (F.col("at_ms") >= first_hour * HOUR_MS)
    )
    counts = (
        window.groupBy(F.floor(F.col("at_ms") / HOUR_MS).alias("hour"), "cause")
        .agg(F.count("*").alias("n"), F.max("exc_type").alias("exc_type"))
        .collect()
    )
    totals: dict[str, int] = {}
    exc_types: dict[str, str | None] = {}
    for row in counts:
        totals[row["cause"]] = totals.get(row["cause"], 0) + row["n"]
        exc_types[row["cause"]] = row["exc_type"]
    ranked = sorted(totals, key=lambda cause: (-totals[cause], cause))
    shown = ranked[:top]
    hours = list(range(first_hour, last_hour + 1))
    by_cause = {cause: [0] * len(hours) for cause in [*shown, OTHER]}
    for row in counts:
        cause = row["cause"] if row["cause"] in by_cause else OTHER
        by_cause[cause][int(row["hour"]) - first_hour] += row["n"]
    series = {_label(cause, exc_types[cause]): by_cause[cause] for cause in shown}
    if len(series) < len(shown):  # shortened labels collided: show the causes whole
        series = {cause or "(unknown cause)": by_cause[cause] for cause in shown}
    if len(ranked) > top:
        series["other causes"] = by_cause[OTHER]
    return {"hours": hours, "series": series}


def _label(cause: str, exc_type: str | None) -> str:
    name = (exc_type or "").rsplit(".", 1)[-1]
    text = cause or "(unknown cause)"
    return f"{text[:16]} {name}".strip() if name else text[:16]


def title(data: dict[str, Any]) -> str:
    """The chart's title, naming the hours it covers."""
    if not data["hours"]:
        return "Failures per hour by top cause"
    first, last = (
        datetime.fromtimestamp(h * 3600, tz=timezone.utc)
        for h in (data["hours"][0], data["hours"][-1])
    )
    return f"Failures per hour by top cause, {first:%Y-%m-%d %H:00} to {last:%Y-%m-%d %H:00} UTC"


def render_png(data: dict[str, Any], title: str) -> bytes:
    """Draw ``hourly_failures`` data as a PNG (matplotlib, Agg backend: no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import dates as mdates
    from matplotlib import pyplot as plt

    hours = [datetime.fromtimestamp(h * 3600, tz=timezone.utc) for h in data["hours"]]
    times = mdates.date2num(hours)  # type: ignore[no-untyped-call]
    figure, axes = plt.subplots(figsize=(11, 5), dpi=100)
    try:
        if not len(times):
            axes.text(0.5, 0.5, "no failures", ha="center", va="center", fontsize=14)
        for label, values in data["series"].items():
            axes.plot(times, values, label=label, linewidth=1.6, drawstyle="steps-mid")
        axes.set_title(title)
        axes.set_ylabel("failures per hour")
        axes.set_xlabel("hour (UTC)")
        axes.grid(True, alpha=0.3)
        if len(times):
            locator = mdates.AutoDateLocator()  # type: ignore[no-untyped-call]
            axes.xaxis.set_major_locator(locator)
            formatter = mdates.ConciseDateFormatter(locator)  # type: ignore[no-untyped-call]
            axes.xaxis.set_major_formatter(formatter)
            axes.legend(loc="best", fontsize=8, title="cause")
        axes.set_ylim(bottom=0)
        figure.tight_layout()
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png")
        return buffer.getvalue()
    finally:
        plt.close(figure)
