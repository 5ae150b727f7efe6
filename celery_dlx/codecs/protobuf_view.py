"""Protobuf bodies: the best-fitting registered type, else a schema-less wire dump."""

from __future__ import annotations

from celery_dlx.codecs.context import Context
from celery_dlx.codecs.fit import MIN_MATCH, Fit, rank
from celery_dlx.codecs.limits import PRESELECTED
from celery_dlx.codecs.messages import message_data
from celery_dlx.codecs.registry import (
    INSTALL_HINT,
    MODULES_SETTING,
    SETS_SETTING,
    protobuf_available,
)
from celery_dlx.codecs.result import KIND_PROTOBUF, KIND_PROTOBUF_WIRE, Decoded, RunnerUp
from celery_dlx.codecs.wire import Scan, dump, scan


def typed(data: bytes, ctx: Context, scanned: Scan | None = None) -> Decoded | None:
    """``data`` decoded with the registered type that fits it best, or None (with a note why)."""
    if not ctx.registry:
        return None
    if ctx.truncated:
        ctx.notes.append("typed protobuf decoding skipped: the body is cut at the decode limit")
        return None
    scanned = scanned or scan(data)
    if scanned.error is not None:
        return None
    hint = ctx.type_hint
    if hint and hint not in ctx.registry:
        ctx.notes.append(f"the content type names protobuf type {hint}, which is not registered")
    fits, cut_short = rank(ctx.registry, scanned, data, hint)
    if cut_short:
        ctx.notes.append(
            f"many registered types fit the top-level fields; only the best {PRESELECTED} by "
            "those were measured in depth"
        )
    if not fits:
        ctx.notes.append("no registered protobuf type parses the body")
        return None
    best = fits[0]
    chosen_by_hint = best.type_name == hint
    if not chosen_by_hint and best.match < MIN_MATCH:
        ctx.notes.append(
            f"no registered protobuf type fits: the best, {best.type_name}, explains "
            f"{best.match:.0%} of the fields (score {best.score})"
        )
        return None
    return _reading(best, fits[1] if len(fits) > 1 else None, ctx, chosen_by_hint)


def _reading(best: Fit, second: Fit | None, ctx: Context, chosen_by_hint: bool) -> Decoded:
    data = message_data(best.message)
    if best.strays:
        numbers = ", ".join(str(n) for n in sorted({f.number for f in best.strays}))
        ctx.notes.append(
            f"fields {numbers} are not in {best.type_name} or have another wire type: "
            "shown under _unknown_fields"
        )
        data["_unknown_fields"] = dump(list(best.strays))[0]
    if best.missing_required:
        ctx.notes.append(f"required fields missing: {', '.join(best.missing_required)}")
    if chosen_by_hint:
        ctx.notes.append(f"type {best.type_name} named by the content type")
    elif second is not None and second.score == best.score:
        ctx.notes.append(
            f"ambiguous: {best.type_name} and {second.type_name} fit equally well "
            f"(score {best.score}); a top-level type, else the first by name, is shown"
        )
    runner_up = RunnerUp(second.type_name, second.score) if second is not None else None
    return Decoded(
        KIND_PROTOBUF, data, type_name=best.type_name, score=best.score, runner_up=runner_up
    )


def wire(
    data: bytes, ctx: Context, *, declared: bool, scanned: Scan | None = None
) -> Decoded | None:
    """A schema-less dump of ``data``, or None when it is not protobuf wire format (a body cut at
    the limit, or declared protobuf but corrupt, is dumped up to the damage, with a note)."""
    scanned = scanned or scan(data)
    if not scanned.fields:
        if declared:
            ctx.notes.append(f"not valid protobuf: {scanned.error}")
        return None
    if scanned.error is not None:
        # A body cut at the limit breaks its last field; a break the full body explains is fine.
        cut_here = scanned.needs is not None and scanned.needs <= ctx.full_size
        if not (declared or (ctx.truncated and cut_here)):
            return None
        what = "the body is cut at the decode limit" if ctx.truncated else "not valid protobuf"
        ctx.notes.append(
            f"{what}: {scanned.error}; showing the {len(scanned.fields)} fields before it"
        )
    fields, cut = dump(scanned.fields)
    if cut or scanned.capped:
        ctx.notes.append("wire dump cut: too many fields or nested too deeply")
        ctx.truncated = True
    if not ctx.registry and not protobuf_available():
        ctx.notes.append(f"schema-less wire dump: {INSTALL_HINT} to decode with types")
    elif not ctx.registry:
        ctx.notes.append(
            f"schema-less wire dump: no protobuf type registered (settings {SETS_SETTING}, "
            f"{MODULES_SETTING})"
        )
    return Decoded(KIND_PROTOBUF_WIRE, fields)
