"""Calendar windows: days, ISO weeks, months (anchored on a day) and years in a time zone,
for the fixed-window limiter, FixedWindowCounter and Quota, on both stores, sync and async.

Time travels with a ManualClock. On memory:// the store's TTLs follow that clock, so the
tests there run across 2026's DST changes. A real redis-server keeps its own clock for
TTLs, and the real date is past 2026's changes, so on Redis the same tests run across
2027's (a key whose deadline the server sees as past would vanish at once).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
import redcount
import redcount.aio
from helpers import all_keys
from redcount._calendar import make_calendar
from redcount.tools.servers import RedisServer

H = 3600.0
DAY = 24 * H

# The DST changes (local dates) of the years the store tests run in.
DST = {
    2026: {"eu_spring": (3, 29), "eu_autumn": (10, 25), "us_spring": (3, 8), "us_autumn": (11, 1)},
    2027: {"eu_spring": (3, 28), "eu_autumn": (10, 31), "us_spring": (3, 14), "us_autumn": (11, 7)},
}


def local(zone: str, *args: int) -> float:
    """Seconds since the epoch of a wall-clock time (the first one, in a fold)."""
    return datetime(*args, tzinfo=ZoneInfo(zone)).timestamp()  # type: ignore[arg-type,misc]


def next_day(y: int, m: int, d: int) -> tuple[int, int, int]:
    n = date(y, m, d) + timedelta(days=1)
    return n.year, n.month, n.day


# ---- periods against zoneinfo ---------------------------------------------------------


def oracle(zone: str, unit: str, anchor: int, t: float) -> tuple[float, float]:
    """The period of `unit` holding `t`, from zoneinfo: local midnights of its first and
    next day (the first such instant in a fold; the instant after a gap at midnight)."""
    tz = ZoneInfo(zone)
    d = datetime.fromtimestamp(t, tz).date()

    def clamp(y: int, m: int) -> date:
        last = (date(y + m // 12, m % 12 + 1, 1) - timedelta(days=1)).day
        return date(y, m, min(anchor, last))

    if unit == "day":
        first, nxt = d, d + timedelta(days=1)
    elif unit == "week":
        first = d - timedelta(days=d.weekday())
        nxt = first + timedelta(days=7)
    elif unit == "month":
        y, m = d.year, d.month
        if d < clamp(y, m):
            y, m = (y, m - 1) if m > 1 else (y - 1, 12)
        first = clamp(y, m)
        nxt = clamp(y, m + 1) if m < 12 else clamp(y + 1, 1)
    else:
        first, nxt = date(d.year, 1, 1), date(d.year + 1, 1, 1)

    def midnight(x: date) -> float:
        return datetime(x.year, x.month, x.day, tzinfo=tz).timestamp()

    return midnight(first), midnight(nxt)


ZONES = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Havana", "Asia/Kolkata", "UTC"]


@pytest.mark.parametrize("zone", ZONES)
@pytest.mark.parametrize("anchor", [1, 15, 29, 30, 31])
def test_periods_agree_with_zoneinfo_through_2026(zone: str, anchor: int) -> None:
    cal = make_calendar(zone, anchor)
    t = datetime(2026, 1, 1, tzinfo=timezone.utc).timestamp() - 5 * DAY
    end = datetime(2027, 1, 10, tzinfo=timezone.utc).timestamp()
    while t < end:
        for unit in ("day", "week", "month", "year"):
            if unit != "month" and anchor != 1:
                continue
            start, stop = cal.period(unit, int(t * 1000))
            assert (start / 1000, stop / 1000) == oracle(zone, unit, anchor, t), (zone, unit, anchor, t)
            assert start <= t * 1000 < stop
        t += 5 * H + 17 * 60  # steps that drift across every hour of the day


@pytest.mark.parametrize(
    ("zone", "day", "hours"),
    [
        ("Europe/Berlin", (2026, 3, 29), 23),
        ("Europe/Berlin", (2026, 10, 25), 25),
        ("America/New_York", (2026, 3, 8), 23),
        ("America/New_York", (2026, 11, 1), 25),
        ("Australia/Lord_Howe", (2026, 4, 5), 24.5),  # a half-hour change
        ("America/Havana", (2026, 3, 8), 23),  # midnight itself is skipped
    ],
)
def test_dst_days_last_23_or_25_hours(zone: str, day: tuple[int, int, int], hours: float) -> None:
    cal = make_calendar(zone)
    start, stop = cal.period("day", int((local(zone, *day, 12)) * 1000))
    assert (stop - start) / 3_600_000 == hours
    assert start / 1000 == local(zone, *day)


def test_dst_ending_at_midnight() -> None:
    # Chile leaves DST at midnight of 5 Apr 2026: after 23:59:59 the clock shows 23:00 of the
    # 4th again, so the 4th lasts 25 hours (the repeated hour is its own) and the 5th 24.
    cal = make_calendar("America/Santiago")
    midnight = local("America/Santiago", 2026, 4, 5)
    fourth = cal.period("day", int(midnight * 1000) - 1)
    assert fourth == (int(local("America/Santiago", 2026, 4, 4) * 1000), int(midnight * 1000))
    assert (fourth[1] - fourth[0]) / 3_600_000 == 25
    fifth = cal.period("day", int(midnight * 1000))
    assert (fifth[1] - fifth[0]) / 3_600_000 == 24


# ---- stores ---------------------------------------------------------------------------


@dataclass
class TimeTravel:
    store: redcount.Store
    clock: redcount.ManualClock
    year: int

    def at(self, zone: str, *args: int) -> float:
        t = local(zone, *args)
        self.clock.set(t)
        return t

    def dst(self, name: str) -> tuple[int, int, int]:
        return (self.year, *DST[self.year][name])


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis_only)])
def travel(request: pytest.FixtureRequest) -> Iterator[TimeTravel]:
    clock = redcount.ManualClock(0.0)
    if request.param == "memory":
        s = redcount.connect(clock=clock)
        year = 2026
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        s = redcount.connect(f"redis://127.0.0.1:{server.port}/0", clock=clock)
        s.execute("FLUSHALL")
        year = 2027
    try:
        yield TimeTravel(s, clock, year)
    finally:
        s.close()


def test_daily_limit_resets_at_local_midnight_on_dst_days(travel: TimeTravel) -> None:
    zone = "Europe/Berlin"
    lim = redcount.Limiter(travel.store, calendar=zone)
    y, m, d = travel.dst("eu_spring")
    travel.at(zone, y, m, d - 1, 23, 59)
    assert lim.hit("2/day", "u").allowed
    assert lim.hit("2/day", "u").allowed
    refused = lim.hit("2/day", "u")
    assert not refused.allowed and refused.retry_after == 60.0
    travel.at(zone, y, m, d, 0, 0)  # midnight of the 23-hour day
    first = lim.hit("2/day", "u")
    assert first.allowed and first.remaining == 1 and first.reset_after == 23 * H
    # One key per period, named after the period's length and start (ms).
    period_key = f"{{u}}:{23 * 3_600_000}:{int(local(zone, y, m, d) * 1000)}"
    assert any(k.decode().endswith(period_key) for k in all_keys(travel.store))
    travel.at(zone, y, m, d, 23, 59)
    assert lim.hit("2/day", "u").allowed
    assert not lim.hit("2/day", "u").allowed
    y, m, d = travel.dst("eu_autumn")
    travel.at(zone, y, m, d, 0, 0)
    assert lim.hit("2/day", "u").reset_after == 25 * H
    period_key = f"{{u}}:{25 * 3_600_000}:{int(local(zone, y, m, d) * 1000)}"
    assert any(k.decode().endswith(period_key) for k in all_keys(travel.store))


def test_us_zone_weeks_and_months(travel: TimeTravel) -> None:
    zone = "America/New_York"
    lim = redcount.Limiter(travel.store, calendar=zone)
    y, m, d = travel.dst("us_spring")  # a Sunday: the week began on Monday, 6 days before
    travel.at(zone, y, m, d, 12)
    week = lim.hit("5/week", "u")
    monday = local(zone, y, m, d - 6)
    assert week.reset_after == pytest.approx(local(zone, y, m, d + 1) - travel.clock.now())
    assert local(zone, y, m, d + 1) - monday == 7 * DAY - H
    for _ in range(4):
        assert lim.hit("5/week", "u").allowed
    assert not lim.hit("5/week", "u").allowed
    travel.at(zone, y, m, d + 1)  # Monday 00:00
    assert lim.hit("5/week", "u").remaining == 4
    # "/month": the calendar month, not 30 days.
    travel.at(zone, y, 1, 31, 23, 59)
    assert lim.hit("1/month", "m").allowed
    assert not lim.hit("1/month", "m").allowed
    travel.at(zone, y, 2, 1)
    feb = lim.hit("1/month", "m")
    assert feb.allowed and feb.reset_after == 28 * DAY


@pytest.mark.parametrize("anchor", [29, 30, 31])
def test_billing_periods_with_anchor_days_past_february(travel: TimeTravel, anchor: int) -> None:
    zone = "Europe/Berlin"
    lim = redcount.Limiter(travel.store, calendar=zone, anchor_day=anchor)
    y = travel.year  # 2026 and 2027: February has 28 days
    travel.at(zone, y, 2, 27, 23, 59)
    assert lim.hit("1/month", "k").allowed  # the period that began on Jan 29/30/31
    assert not lim.hit("1/month", "k").allowed
    travel.at(zone, y, 2, 28)  # the anchor clamped to February's last day
    d = lim.hit("1/month", "k")
    assert d.allowed
    assert d.reset_after == local(zone, y, 3, anchor) - local(zone, y, 2, 28)
    travel.at(zone, y, 3, anchor)
    assert lim.hit("1/month", "k").allowed


def test_anchor_day_15_billing_period(travel: TimeTravel) -> None:
    zone = "Europe/Berlin"
    lim = redcount.Limiter(travel.store, calendar=zone, anchor_day=15)
    y = travel.year
    travel.at(zone, y, 4, 14, 23)
    s = lim.stats("10000/month", "acct")[0]
    assert s.reset_after == H
    lim.hit("10000/month", "acct", 9_999)
    assert lim.test("10000/month", "acct").remaining == 1
    travel.at(zone, y, 4, 15)
    assert lim.test("10000/month", "acct").remaining == 10_000
    lim.reset("10000/month", "acct")


def test_counter_in_calendar_months(travel: TimeTravel) -> None:
    zone = "America/New_York"
    c = redcount.FixedWindowCounter(travel.store, "calls", "month", calendar=zone, anchor_day=31)
    y = travel.year
    travel.at(zone, y, 4, 29, 12)  # April's period began on Mar 31
    assert c.incr("k", 3) == 3
    assert c.current_window("k") == (local(zone, y, 3, 31), local(zone, y, 4, 30))
    key = c.storage_key("k")
    travel.at(zone, y, 4, 30)  # the anchor clamped to April's last day
    assert c.get("k") == 0
    assert c.incr("k") == 1
    assert c.storage_key("k") != key
    assert c.get_many(["k", "other"]) == {"k": 1, "other": 0}
    assert c.incr_many({"k": 2, "other": 5}) == {"k": 3, "other": 5}
    assert c.calendar == zone and c.anchor_day == 31


def test_ttl_is_the_period_end_plus_grace() -> None:
    zone = "Europe/Berlin"
    clock = redcount.ManualClock(local(zone, 2026, 10, 25, 0, 30))
    with redcount.connect(clock=clock) as store:
        c = redcount.FixedWindowCounter(store, "ttl", "day", calendar=zone, grace=5)
        c.incr("k")
        assert c.ttl("k") == pytest.approx(local(zone, 2026, 10, 26) - clock.now() + 5)
        assert c.ttl("k") == pytest.approx(24.5 * H + 5)  # the 25-hour day
        lim = redcount.Limiter(store, calendar=zone)
        lim.hit("1/week", "k")
        (key,) = [k for k in all_keys(store) if b":fw:" in k]
        ttl_ms = store.execute("PTTL", key.decode())
        assert ttl_ms == int((local(zone, 2026, 10, 26) - clock.now()) * 1000) + 1000  # the limiter's grace


def test_quota_resets_each_billing_period(travel: TimeTravel) -> None:
    zone = "Europe/Berlin"
    y = travel.year
    q = redcount.Quota(travel.store, "credits", reset="month", reset_to=100, calendar=zone, anchor_day=15)
    travel.at(zone, y, 3, 20)
    assert q.value() == 100
    assert q.take(30, request_id="r1").value == 70
    assert q.take(30, request_id="r1").duplicate
    assert not q.take(80).applied
    assert q.current_period() == (local(zone, y, 3, 15), local(zone, y, 4, 15))
    travel.at(zone, y, 4, 15)  # the scheduled reset
    assert q.value() == 100
    assert q.take(100).value == 0
    assert q.set(40).value == 40 and q.value() == 40
    assert q.give(10).value == 50
    travel.at(zone, y, 3, 20)  # the earlier period's key is still there (until its TTL)
    assert q.value() == 70
    assert q.reset_to == 100


def test_quota_daily_reset_in_utc_by_default() -> None:
    clock = redcount.ManualClock(datetime(2026, 2, 28, 23, 0, tzinfo=timezone.utc).timestamp())
    with redcount.connect(clock=clock) as store:
        q = redcount.Quota(store, "daily", reset="day", reset_to=3)
        assert q.take(3).applied
        assert not q.take().applied
        assert store.execute("PTTL", q.storage_key()) == 3_600_000 + 1000
        clock.advance(H)
        assert q.value() == 3


def test_without_calendar_nothing_changes(memory_store: redcount.Store) -> None:
    lim = redcount.Limiter(memory_store)
    assert lim.hit("1/month", "k").reset_after <= 30 * DAY
    assert redcount.LimitSet("2/week").limits[0].window == 7 * DAY
    q = redcount.Quota(memory_store, "plain")
    assert q.storage_key() == "redcount:quota:{plain}" and q.current_period() is None
    c = redcount.FixedWindowCounter(memory_store, "plain", 3600)
    assert c.calendar is None


BAD = [
    (lambda s: redcount.Limiter(s, calendar="Mars/Olympus_Mons"), "unknown time zone"),
    (lambda s: redcount.Limiter(s, calendar=""), "IANA"),
    (lambda s: redcount.Limiter(s, calendar="UTC", anchor_day=0), "anchor_day"),
    (lambda s: redcount.Limiter(s, calendar="UTC", anchor_day=32), "anchor_day"),
    (lambda s: redcount.Limiter(s, calendar="UTC", anchor_day=True), "anchor_day"),
    (lambda s: redcount.Limiter(s, anchor_day=15), "needs calendar"),
    (lambda s: redcount.Limiter(s, "sliding-window", calendar="UTC"), "fixed-window"),
    (lambda s: redcount.Limiter(s, calendar="UTC").hit("10/second", "k"), "days, weeks, months or years"),
    (lambda s: redcount.Limiter(s, calendar="UTC").hit("1/day;10/hour", "k"), "got 'hour'"),
    (lambda s: redcount.Limiter(s, calendar="UTC").hit("10/101 years", "k"), "1 to 100 years"),
    (lambda s: redcount.Limiter(s, calendar="UTC").test("10/minute", "k"), "minute"),
    (lambda s: redcount.Limiter(s, calendar="UTC").stats("10/minute", "k"), "minute"),
    (lambda s: redcount.FixedWindowCounter(s, "c", 3600, calendar="UTC"), "window must be"),
    (lambda s: redcount.FixedWindowCounter(s, "c", "hour", calendar="UTC"), "window must be"),
    (lambda s: redcount.FixedWindowCounter(s, "c", "day", calendar="UTC", stagger=True), "stagger"),
    (lambda s: redcount.Quota(s, "q", calendar="UTC"), "need reset="),
    (lambda s: redcount.Quota(s, "q", reset="hour"), "reset must be"),  # type: ignore[arg-type]
    (lambda s: redcount.Quota(s, "q", reset="day", reset_to=-1), "reset_to"),
]


def test_hit_all_uses_the_same_periods_as_hit(travel: TimeTravel) -> None:
    """A calendar limiter's hit_all charges the very keys its hit does (one period each)."""
    zone = "Europe/Berlin"
    lim = redcount.Limiter(travel.store, calendar=zone)
    y, m, d = travel.dst("eu_spring")
    travel.at(zone, y, m, d, 12, 0)  # inside the 23-hour day
    both = lim.hit_all([("3/day", "u"), ("5/month", "org")])
    assert both.allowed
    assert lim.hit("3/day", "u").remaining == 1 and lim.hit("5/month", "org").remaining == 3
    day_key = f"{{u}}:{23 * 3_600_000}:{int(local(zone, y, m, d) * 1000)}"
    assert sum(k.decode().endswith(day_key) for k in all_keys(travel.store)) == 1
    assert lim.hit("3/day", "u").remaining == 0
    refused = lim.hit_all([("3/day", "u"), ("5/month", "org")])  # the day is used up
    assert not refused.allowed and refused.refused_by is not None and refused.refused_by[1] == "u"
    assert refused.retry_after == pytest.approx(12 * H)  # to local midnight (DST began at 02:00)
    assert lim.test("5/month", "org").remaining == 3  # all or nothing: the month was not charged
    with pytest.raises(redcount.InvalidInputError, match="minute"):
        lim.hit_all([("3/day", "u"), ("10/minute", "u")])


@pytest.mark.parametrize(("make", "message"), BAD)
def test_bad_input_is_refused_and_stores_nothing(store: redcount.Store, make: object, message: str) -> None:
    with pytest.raises(redcount.InvalidInputError, match=message) as e:
        make(store)  # type: ignore[operator]
    assert isinstance(e.value, ValueError)
    assert all_keys(store) == []


def test_async_twins(travel: TimeTravel) -> None:
    zone = "Europe/Berlin"
    y, m, d = travel.dst("eu_autumn")

    async def main() -> None:
        lim = redcount.aio.Limiter(travel.store, calendar=zone, anchor_day=25)
        c = redcount.aio.FixedWindowCounter(travel.store, "a", "day", calendar=zone)
        q = redcount.aio.Quota(travel.store, "aq", reset="week", reset_to=2, calendar=zone)
        travel.at(zone, y, m, d, 1, 30)
        hit = await lim.hit("1/month;5/day", "u")
        # The binding limit is the one with the least left: the month, from the 25th.
        assert hit.allowed and hit.limit == 1 and hit.remaining == 0
        assert hit.reset_after == local(zone, y, 11, 25) - travel.clock.now()
        stats = await lim.stats("1/month;5/day", "u")
        assert stats[1].reset_after == local(zone, *next_day(y, m, d)) - travel.clock.now()
        assert not (await lim.hit("1/month", "u")).allowed
        assert await c.incr("k") == 1
        assert (await q.take(2)).value == 0
        assert not (await q.take()).applied
        travel.at(zone, *next_day(y, m, d))  # Monday: a new day and week; the month (from the 25th) goes on
        assert not (await lim.hit("1/month", "u")).allowed
        assert await c.get("k") == 0
        assert await q.value() == 2
        start, end = q.current_period() or (0.0, 0.0)
        assert start == local(zone, *next_day(y, m, d)) and end - start == 7 * DAY

    asyncio.run(main())


def test_web_layer_takes_a_calendar_limiter() -> None:
    flask = pytest.importorskip("flask")
    import redcount.flask

    zone = "America/New_York"
    clock = redcount.ManualClock(local(zone, 2026, 11, 1, 0, 30))  # the 25-hour day
    with redcount.connect(clock=clock) as store:
        app = flask.Flask(__name__)
        rl = redcount.flask.RateLimiter(app, limiter=redcount.Limiter(store, calendar=zone, prefix="redcount:web"))

        @app.get("/export")
        @rl.limit("1/day")
        def export() -> str:
            return "ok"

        client = app.test_client()
        assert client.get("/export").status_code == 200
        refused = client.get("/export")
        assert refused.status_code == 429
        assert int(refused.headers["Retry-After"]) == int(local(zone, 2026, 11, 2) - clock.now())  # 24.5 h
        clock.set(local(zone, 2026, 11, 2))
        assert client.get("/export").status_code == 200
