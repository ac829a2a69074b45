"""A refund or a settlement credits only the state that still holds the charge: the window
the units were charged in (nothing once it has ended), the charge's own sliding-log entries,
and for the token bucket and GCRA only what has not refilled since. So a refund, a
reservation and its settlement never admit past a limit. On memory:// and a real Redis
server, both driven by a ManualClock that crosses window boundaries."""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator

import pytest
import redcount
import redcount.aio as aio
from redcount.tools.servers import RedisServer
from redcount.limiter import Strategy

RATE: list[Strategy] = ["fixed-window", "sliding-window", "sliding-window-approx", "token-bucket", "gcra"]
# The strategies whose refunds credited the current window (the approximate sliding window
# gave back to its newest sub-buckets, which were the charge's own).
CREDITED_NOW: list[Strategy] = ["fixed-window", "sliding-window", "token-bucket", "gcra"]


def next_hour() -> float:
    """The start of an hour ahead of the real clock: Redis expires keys by its own clock, so
    a ManualClock for a Redis store runs ahead of it, never behind."""
    return math.ceil(time.time() / 3600) * 3600 + 3600.0


@pytest.fixture(params=["memory", "redis"])
def moving(request: pytest.FixtureRequest) -> Iterator[tuple[redcount.Store, redcount.ManualClock]]:
    """A store on each backend whose limiters read a ManualClock (client time), which the
    test moves across windows; it starts a quarter second into an hour."""
    clock = redcount.ManualClock(next_hour() + 0.25)
    if request.param == "memory":
        s = redcount.connect(clock=clock)
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        s = redcount.connect(f"redis://127.0.0.1:{server.port}/0", clock=clock)
        s.execute("FLUSHALL")
    try:
        yield s, clock
    finally:
        s.close()


def admitted(lim: redcount.Limiter, limit: str, key: str, n: int) -> int:
    return sum(bool(lim.hit(limit, key)) for _ in range(n))


@pytest.mark.parametrize("strategy", RATE)
def test_a_settle_in_the_next_window_admits_nothing_past_the_limit(
    moving: tuple[redcount.Store, redcount.ManualClock], strategy: Strategy
) -> None:
    """With "5/minute": reserve(cost=5, deadline=600); in the next minute 5 hits are
    admitted; settle(actual=0) must not give the 5 to that minute (it gave them back, and 5
    more were admitted: 10 in one minute)."""
    store, clock = moving
    lim = redcount.Limiter(store, strategy)
    r = lim.reserve("5/minute", "k", 5, deadline=600)
    assert r
    clock.advance(60)
    first = admitted(lim, "5/minute", "k", 5)
    s = r.settle(0)
    assert s.applied and s.estimate == 5
    second = admitted(lim, "5/minute", "k", 5)
    assert first + second <= 5, f"{first} + {second} admitted within one minute under 5/minute"
    if strategy in CREDITED_NOW:
        assert first == 5 and s.units == 0  # nothing of the reservation was left to credit


@pytest.mark.parametrize("strategy", RATE)
def test_a_settle_in_the_same_window_gives_back(
    moving: tuple[redcount.Store, redcount.ManualClock], strategy: Strategy
) -> None:
    store, clock = moving
    lim = redcount.Limiter(store, strategy)
    r = lim.reserve("5/minute", "k", 5, deadline=600)
    assert r
    s = r.settle(2)  # at once: nothing has refilled, the window is the same
    assert s.applied and s.units == 3
    assert admitted(lim, "5/minute", "k", 4) == 3


def test_a_reservation_straddling_an_hour_keeps_its_estimate_in_its_hour(
    moving: tuple[redcount.Store, redcount.ManualClock],
) -> None:
    """A token reservation made two minutes before the hour with a 300 s deadline and
    settled after it: its unused estimate stays in the hour it was charged in."""
    store, clock = moving
    clock.set(next_hour() - 120)
    lim = redcount.Limiter(store, "fixed-window")
    r = lim.reserve("1000/hour", "tokens:acme", 800, deadline=300)
    assert r
    clock.advance(180)  # one minute into the next hour
    assert lim.hit("1000/hour", "tokens:acme", 1000)
    s = r.settle(100)
    assert s.applied and s.units == 0
    assert not lim.test("1000/hour", "tokens:acme")
    assert lim.stats("1000/hour", "tokens:acme")[0].count == 1000


@pytest.mark.parametrize("strategy", CREDITED_NOW)
def test_a_refund_of_an_earlier_windows_hits_admits_nothing_past_the_limit(
    moving: tuple[redcount.Store, redcount.ManualClock], strategy: Strategy
) -> None:
    """refund(request_id=..., decision=) of the hits of a minute that has passed gives
    nothing to the current one."""
    store, clock = moving
    lim = redcount.Limiter(store, strategy)
    old = [lim.hit("5/minute", "k") for _ in range(5)]
    assert all(old) and all(d.charged_at is not None for d in old)
    clock.advance(60)
    assert admitted(lim, "5/minute", "k", 5) == 5
    for i, d in enumerate(old):
        r = lim.refund("5/minute", "k", 1, request_id=f"req-{i}", decision=d)
        assert r.applied and r.units == 0
    assert admitted(lim, "5/minute", "k", 5) == 0
    # Each request id's marker records where its refund's units were charged (script unit:
    # µs for GCRA, else ms).
    at = round((old[0].charged_at or 0) * 1000) * (1000 if strategy == "gcra" else 1)
    keys = store.execute("KEYS", "redcount:lim:*")
    assert isinstance(keys, list)
    markers = [k for k in keys if isinstance(k, bytes) and b":refund:" in k]
    assert len(markers) == 5
    assert {store.execute("GET", k) for k in markers} == {str(at).encode()}


@pytest.mark.parametrize("strategy", RATE)
def test_a_refund_given_the_decision_gives_back_in_its_window(
    moving: tuple[redcount.Store, redcount.ManualClock], strategy: Strategy
) -> None:
    store, clock = moving
    lim = redcount.Limiter(store, strategy)
    d = lim.hit("5/minute", "k", 3)
    assert d and d.charged_at == pytest.approx(clock.now(), abs=0.001)
    clock.advance(1)
    r = lim.refund("5/minute", "k", 3, decision=d)
    # The buckets refilled 1/12 of a token in that second: the 3 tokens are still owed
    # (a token partly refilled counts as given).
    assert r.applied and r.units == 3 and r.decision.remaining == 5


@pytest.mark.parametrize("strategy", ["token-bucket", "gcra"])
def test_the_buckets_give_back_only_what_has_not_refilled(
    moving: tuple[redcount.Store, redcount.ManualClock], strategy: Strategy
) -> None:
    store, clock = moving
    lim = redcount.Limiter(store, strategy)
    d = lim.hit("5/minute", "k", 5)
    assert d
    clock.advance(24)  # two tokens refilled since the hit (one every 12 s)
    r = lim.refund("5/minute", "k", 5, decision=d)
    assert r.units == 3 and r.decision.remaining == 5
    assert admitted(lim, "5/minute", "k", 6) == 5
    clock.advance(60)
    late = lim.hit("5/minute", "k", 5)
    clock.advance(60)  # all of it refilled: nothing is owed
    assert lim.refund("5/minute", "k", 5, decision=late).units == 0


def test_the_sliding_log_removes_the_charges_own_entries(
    moving: tuple[redcount.Store, redcount.ManualClock],
) -> None:
    store, clock = moving
    lim = redcount.Limiter(store, "sliding-window")
    first = lim.hit("3/minute", "u")
    clock.advance(30)
    assert lim.hit("3/minute", "u", 2)
    assert lim.refund("3/minute", "u", 1, decision=first).units == 1
    # The hit at t=0 is gone, the two at t=30 stay: they free up at t=90.
    clock.advance(29)
    assert lim.hit("3/minute", "u")
    d = lim.hit("3/minute", "u")
    assert not d and d.retry_after == pytest.approx(31.0, abs=0.01)


def test_a_refund_without_a_decision_still_credits_the_current_window(
    moving: tuple[redcount.Store, redcount.ManualClock],
) -> None:
    """The old call form keeps its documented meaning: the current window."""
    store, clock = moving
    lim = redcount.Limiter(store, "fixed-window")
    assert lim.hit("5/minute", "k")
    clock.advance(60)
    assert lim.hit("5/minute", "k")
    r = lim.refund("5/minute", "k", 1, request_id="r")
    assert r.units == 1 and r.decision.remaining == 5


def test_a_decision_that_charged_nothing_is_refused(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, "sliding-window")
    assert lim.test("1/minute", "k").charged_at is None
    assert lim.hit("1/minute", "k").charged_at is not None
    refused = lim.hit("1/minute", "k")
    assert not refused and refused.charged_at is None
    for d in (refused, lim.test("1/minute", "k"), lim.hit_all([("1/minute", "j")])):
        with pytest.raises(redcount.InvalidInputError, match="charged nothing"):
            lim.refund("1/minute", "k", decision=d)
    with pytest.raises(redcount.InvalidInputError, match="decision must be the Decision"):
        lim.refund("1/minute", "k", decision="yesterday")  # type: ignore[arg-type]
    assert not lim.test("1/minute", "k")  # nothing was given back


def test_async_refund_and_settle_keep_to_where_they_charged(
    moving: tuple[redcount.Store, redcount.ManualClock],
) -> None:
    store, clock = moving

    async def main() -> None:
        lim = aio.Limiter(store, "fixed-window")
        d = await lim.hit("5/minute", "k", 2)
        r = await lim.reserve("5/minute", "k", 3)
        assert d and r
        clock.advance(60)
        assert await lim.hit("5/minute", "k", 5)
        assert (await lim.refund("5/minute", "k", 2, decision=d)).units == 0
        assert (await r.settle(0)).units == 0
        assert not await lim.hit("5/minute", "k")

    asyncio.run(main())


@pytest.mark.parametrize("strategy", RATE)
@pytest.mark.usefixtures("away_from_hour_boundary")
def test_with_the_servers_clock_a_refund_finds_its_charge(
    redis_store: redcount.Store, strategy: Strategy
) -> None:
    """clock="server": the scripts decide at Redis's TIME; the charge time is that time,
    and the refund's script, reading TIME too, finds the charge by it."""
    lim = redcount.Limiter(redis_store, strategy, clock="server")
    d = lim.hit("5/hour", "k", 2)
    assert d and d.charged_at == pytest.approx(time.time(), abs=60)
    r = lim.refund("5/hour", "k", 2, decision=d)
    assert r.applied and r.units == 2 and r.decision.remaining == 5
