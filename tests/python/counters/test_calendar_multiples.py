"""Calendar periods of several units ("10/2 days", "100/2 weeks", "1000/3 months"): counted
from a fixed epoch in the zone (days from 1970-01-01, weeks from Monday 1969-12-29, months
from January 1970 starting on the anchor day, years from 1970), so every process cuts time
the same way; checked against zoneinfo through 2026 and 2027 (DST changes included) and on
both stores with a travelling clock."""

from __future__ import annotations

import asyncio
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
import redcount
import redcount.aio
from redcount._calendar import make_calendar
from test_calendar import DAY, H, TimeTravel, local, travel  # noqa: F401  (travel: a fixture)

EPOCH = date(1970, 1, 1)
EPOCH_MONDAY = date(1969, 12, 29)


def oracle(zone: str, unit: str, n: int, anchor: int, t: float) -> tuple[float, float]:
    """The period of n units holding `t`, from zoneinfo and the stated epochs."""
    tz = ZoneInfo(zone)
    d = datetime.fromtimestamp(t, tz).date()

    def clamp(months: int) -> date:  # months since January 1970 -> the anchored start
        y, m = 1970 + months // 12, months % 12 + 1
        last = (date(y + m // 12, m % 12 + 1, 1) - timedelta(days=1)).day
        return date(y, m, min(anchor, last))

    if unit == "day":
        k = (d - EPOCH).days // n * n
        first, nxt = EPOCH + timedelta(days=k), EPOCH + timedelta(days=k + n)
    elif unit == "week":
        w = (d - EPOCH_MONDAY).days // 7 // n * n
        first, nxt = EPOCH_MONDAY + timedelta(weeks=w), EPOCH_MONDAY + timedelta(weeks=w + n)
    elif unit == "month":
        months = (d.year - 1970) * 12 + d.month - 1
        if d < clamp(months):
            months -= 1
        k = months // n * n
        first, nxt = clamp(k), clamp(k + n)
    else:
        k = 1970 + (d.year - 1970) // n * n
        first, nxt = date(k, 1, 1), date(k + n, 1, 1)

    def midnight(x: date) -> float:
        return datetime(x.year, x.month, x.day, tzinfo=tz).timestamp()

    return midnight(first), midnight(nxt)


CASES = [("day", 2), ("day", 3), ("day", 7), ("week", 2), ("week", 4), ("month", 2), ("month", 3), ("month", 5),
         ("month", 12), ("year", 2), ("year", 3)]


@pytest.mark.parametrize("zone", ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Havana"])
@pytest.mark.parametrize("anchor", [1, 15, 31])
def test_multiples_agree_with_zoneinfo_through_2026_and_2027(zone: str, anchor: int) -> None:
    cal = make_calendar(zone, anchor)
    t = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp() - 5 * DAY
    end = datetime(2028, 1, 10, tzinfo=timezone.utc).timestamp()
    while t < end:
        for unit, n in CASES:
            if unit != "month" and anchor != 1:
                continue
            start, stop = cal.period(unit, int(t * 1000), n)
            assert (start / 1000, stop / 1000) == oracle(zone, unit, n, anchor, t), (zone, unit, n, anchor, t)
            assert start <= t * 1000 < stop
        t += 11 * H + 23 * 60  # steps that drift across every hour of the day


def test_one_unit_is_the_plain_period() -> None:
    cal = make_calendar("Europe/Berlin", 15)
    t = int(local("Europe/Berlin", 2026, 10, 25, 12) * 1000)
    for unit in ("day", "week", "month", "year"):
        assert cal.period(unit, t, 1) == cal.period(unit, t)


def test_two_days_across_the_spring_change(travel: TimeTravel) -> None:
    """A two-day period holding the 23-hour day is 47 hours long; both days share the count,
    and the next period starts from zero at local midnight."""
    zone = "Europe/Berlin"
    lim = redcount.Limiter(travel.store, calendar=zone)
    y, m, d = travel.dst("eu_spring")
    start, stop = oracle(zone, "day", 2, 1, local(zone, y, m, d, 12))
    assert stop - start == 47 * H
    travel.clock.set(start + 60)
    for _ in range(3):
        assert lim.hit("3/2 days", "u")
    travel.clock.set(stop - 60)
    refused = lim.hit("3/2 days", "u")
    assert not refused and refused.retry_after == 60.0
    assert lim.stats("3/2 days", "u")[0].count == 3
    travel.clock.set(stop)  # local midnight: a new period
    d2 = lim.hit("3/2 days", "u")
    assert d2 and d2.remaining == 2
    nxt = oracle(zone, "day", 2, 1, stop)
    assert nxt[0] == stop and d2.reset_after == nxt[1] - stop


def test_two_weeks_across_the_autumn_change(travel: TimeTravel) -> None:
    """"100/2 weeks" holding the 25-hour day: 14 days and an hour, Monday to Monday."""
    zone = "America/New_York"
    lim = redcount.Limiter(travel.store, calendar=zone)
    y, m, d = travel.dst("us_autumn")
    start, stop = oracle(zone, "week", 2, 1, local(zone, y, m, d, 12))
    assert stop - start == 14 * DAY + H
    assert datetime.fromtimestamp(start, ZoneInfo(zone)).weekday() == 0
    travel.clock.set(start)
    assert lim.hit("100/2 weeks", "u", 60)
    travel.clock.set(stop - 1)
    assert lim.hit("100/2 weeks", "u", 40).remaining == 0
    assert not lim.hit("100/2 weeks", "u")
    travel.clock.set(stop)
    assert lim.hit("100/2 weeks", "u").remaining == 99


def test_quarters_anchored_on_the_15th(travel: TimeTravel) -> None:
    """"1000/3 months" with anchor_day=15: quarters from the 15th of January, April, July and
    October, Berlin time (one of them holds the spring change, one the autumn change)."""
    zone = "Europe/Berlin"
    lim = redcount.Limiter(travel.store, calendar=zone, anchor_day=15)
    y = travel.year
    travel.at(zone, y, 4, 14, 23, 59)  # still the quarter from 15 January
    assert lim.hit("1000/3 months", "t", 999).remaining == 1
    assert lim.stats("1000/3 months", "t")[0].reset_after == 60.0
    travel.at(zone, y, 4, 15, 0, 0)
    d = lim.hit("1000/3 months", "t", 1000)
    assert d and d.remaining == 0
    assert d.reset_after == local(zone, y, 7, 15) - local(zone, y, 4, 15)
    travel.at(zone, y, 10, 15, 0, 0)
    assert lim.hit_all([("1000/3 months", "t"), ("10/2 days", "t")]).per_key == [(1000, 999), (10, 9)]


def test_async_and_several_periods_in_one_call(travel: TimeTravel) -> None:
    zone = "UTC"

    async def main() -> None:
        lim = redcount.aio.Limiter(travel.store, calendar=zone)
        travel.at(zone, travel.year, 6, 1, 12, 0)
        d = await lim.hit("5/2 days;20/2 weeks;100/3 months;1000/2 years", "k", 5)
        assert d and d.remaining == 0
        stats = await lim.stats("5/2 days;20/2 weeks;100/3 months;1000/2 years", "k")
        assert [s.count for s in stats] == [5, 5, 5, 5]

    asyncio.run(main())


@pytest.mark.parametrize(
    ("limit", "message"),
    [
        ("1/101 years", "1 to 100 years"),
        ("1/1201 months", "1 to 1200 months"),
        ("1/5201 weeks", "1 to 5200 weeks"),
        ("1/36501 days", "1 to 36500 days"),
        ("1/2 hours", "got 'hour'"),
    ],
)
def test_multiples_beyond_a_century_are_refused(memory_store: redcount.Store, limit: str, message: str) -> None:
    lim = redcount.Limiter(memory_store, calendar="UTC")
    with pytest.raises(ValueError, match=message):
        lim.hit(limit, "k")
    assert memory_store.execute("KEYS", "*") == []
