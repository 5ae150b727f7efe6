"""Which deploy broke it: cause groups against the code versions they were seen with (pure).

Code versions (``dlx_code_version``, ``$DLX_CODE_VERSION`` or ``$GIT_COMMIT``) are opaque strings
such as git SHAs, so they are never compared as strings: they are ordered by the time each was
first seen in the graveyard (a burial under it), ties by name. ``""`` stands for obituaries buried
without a code version; it is never "the newest version".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from celery_dlx.errors import DLXError
from celery_dlx.message.graveyard import Group


class UnknownVersion(DLXError, LookupError):
    """``--new-since`` named a code version no burial of this graveyard was seen with."""


def version_order(first_seen: Mapping[str, int]) -> list[str]:
    """The known code versions (``""`` included), oldest first by first-seen time, ties by name."""
    return sorted(first_seen, key=lambda v: (first_seen[v], v))


def newest_version(first_seen: Mapping[str, int]) -> str | None:
    """The code version first seen last (``""`` never counts); None if none is known."""
    known = [v for v in version_order(first_seen) if v]
    return known[-1] if known else None


def new_since(groups: Sequence[Group], first_seen: Mapping[str, int], version: str) -> list[Group]:
    """The groups whose first-seen version is ``version``, or that were first seen at or after
    the first time ``version`` was seen anywhere in the graveyard; in the order given.

    Raises:
        UnknownVersion: no burial was ever seen with ``version`` (the message lists the known
            ones, oldest first).
    """
    if version not in first_seen:
        known = ", ".join(repr(v) for v in version_order(first_seen) if v) or "none"
        raise UnknownVersion(
            f"code version {version!r} was never seen in this graveyard (known, oldest first: "
            f"{known}); pass one of them to --new-since"
        )
    since = first_seen[version]
    return [
        g
        for g in groups
        if g.first_version == version or (g.first_seen_ms is not None and g.first_seen_ms >= since)
    ]


def new_in(group: Group, newest: str | None) -> str | None:
    """``newest`` when ``group`` was first seen with it (the console's "new in VERSION")."""
    return newest if newest and group.first_version == newest else None
