"""Calendar periods in a time zone for the fixed-window limiter, FixedWindowCounter and Quota.

The C++ core computes every period (day, ISO week, month anchored on a day, year) from a
table of the zone's UTC-offset changes. The table is read here, once per zone and process,
from the IANA time-zone database through `zoneinfo` (the system's database, or the
``tzdata`` package where the system has none): it covers 1970 to 2100, and after 2100 the
last offset holds. The core keeps the table immutable and shared, so deciding a window is
a binary search with no Python, no lock and no GIL.
"""

from __future__ import annotations

import functools
from datetime import datetime, timezone
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from . import _core
from .errors import InvalidInputError

__all__ = ["CALENDAR_UNITS", "calendar_arg", "calendar_unit", "make_calendar"]

CALENDAR_UNITS: dict[str, float] = {
    "day": 86400.0,
    "week": 7 * 86400.0,
    "month": 30 * 86400.0,
    "year": 365 * 86400.0,
}
"""The units a calendar window may have, with the nominal length (seconds) the
counter's ``window`` property reports for them."""

_TABLE_END = int(datetime(2100, 1, 1, tzinfo=timezone.utc).timestamp())
_DAY = 86400


def _offset(tz: ZoneInfo, t: int) -> int:
    off = datetime.fromtimestamp(t, tz).utcoffset()
    assert off is not None
    return int(off.total_seconds() * 1000)


@functools.lru_cache(maxsize=64)
def _table(zone: str) -> tuple[list[int], list[int]]:
    """(instants in ms at which the offset changes, offsets in ms: one more than instants)."""
    try:
        tz = ZoneInfo(zone)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise InvalidInputError(
            f"unknown time zone {zone!r} (use an IANA name such as 'Europe/Berlin'; where the "
            "system has no time-zone database, pip install tzdata)"
        ) from e
    # A probe a day apart finds each change (zones change their offset at most a few times
    # a year); bisection then finds its second.
    at: list[int] = []
    offsets = [_offset(tz, 0)]
    t = 0
    while t < _TABLE_END:
        nxt = t + _DAY
        if _offset(tz, nxt) != offsets[-1]:
            lo, hi = t, nxt
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if _offset(tz, mid) == offsets[-1]:
                    lo = mid
                else:
                    hi = mid
            at.append(hi * 1000)
            offsets.append(_offset(tz, hi))
            nxt = hi
        t = nxt
    return at, offsets


def make_calendar(zone: object, anchor_day: object = 1) -> _core.Calendar:
    """The core's calendar of ``zone`` with months starting on ``anchor_day`` (1..31)."""
    if not isinstance(zone, str) or not zone:
        raise InvalidInputError(
            f"calendar must be an IANA time-zone name such as 'Europe/Berlin', got {zone!r}"
        )
    if isinstance(anchor_day, bool) or not isinstance(anchor_day, int) or not 1 <= anchor_day <= 31:
        raise InvalidInputError(f"anchor_day must be a day of the month between 1 and 31, got {anchor_day!r}")
    at, offsets = _table(zone)
    return _core.Calendar(zone, at, offsets, anchor_day)


def calendar_unit(window: object, what: str = "window") -> str:
    """The calendar unit named by ``window``: ``"day"``, ``"week"``, ``"month"`` or ``"year"``."""
    if isinstance(window, str) and window.strip().lower() in CALENDAR_UNITS:
        return window.strip().lower()
    hint = " (drop calendar= for clock-aligned windows of a number of seconds)" if what == "window" else ""
    raise InvalidInputError(
        f"with a calendar, {what} must be 'day', 'week', 'month' or 'year', got {window!r}{hint}"
    )


def calendar_arg(calendar: object, anchor_day: object) -> _core.Calendar | None:
    """The core's calendar for a ``calendar=``/``anchor_day=`` pair of options (None: none)."""
    if calendar is None:
        if anchor_day != 1:
            raise InvalidInputError(f"anchor_day={anchor_day!r} needs calendar= (a time zone such as 'UTC')")
        return None
    return make_calendar(calendar, anchor_day)
