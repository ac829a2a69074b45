"""Refunds (Limiter.refund, idempotent by request id) and reservations (reserve, settle,
deadlines), sync and async, on every rate strategy, on memory:// and a real Redis server."""

from __future__ import annotations

import asyncio

import pytest
import redcount
import redcount.aio as aio
from helpers import all_keys
from redcount.limiter import Strategy

RATE: list[Strategy] = ["fixed-window", "sliding-window", "sliding-window-approx", "token-bucket", "gcra"]


def left(lim: redcount.Limiter, limit: str, key: str) -> int:
    return lim.test(limit, key).remaining


@pytest.mark.parametrize("strategy", RATE)
@pytest.mark.usefixtures("away_from_hour_boundary")
def test_a_refund_gives_back_what_was_charged(store: redcount.Store, strategy: Strategy) -> None:
    lim = redcount.Limiter(store, strategy)
    for _ in range(3):
        assert lim.hit("3/hour", "u")
    assert not lim.hit("3/hour", "u")
    r = lim.refund("3/hour", "u", 2)
    assert r and r.status == "applied" and r.applied and not r.duplicate
    assert r.units == 2
    assert r.decision.allowed and r.decision.remaining == 2
    assert lim.hit("3/hour", "u") and lim.hit("3/hour", "u")
    assert not lim.hit("3/hour", "u")


@pytest.mark.parametrize("strategy", RATE)
@pytest.mark.usefixtures("away_from_hour_boundary")
def test_a_refund_never_gives_back_more_than_was_charged(store: redcount.Store, strategy: Strategy) -> None:
    lim = redcount.Limiter(store, strategy)
    assert lim.hit("5/hour", "u", 2)
    r = lim.refund("5/hour", "u", 4)
    assert r.applied and r.units == 2
    assert r.decision.remaining == 5
    empty = lim.refund("5/hour", "u", 1)  # nothing charged: nothing to give
    assert empty.applied and empty.units == 0 and empty.decision.remaining == 5
    for _ in range(5):
        assert lim.hit("5/hour", "u")
    assert not lim.hit("5/hour", "u")


@pytest.mark.parametrize("strategy", RATE)
@pytest.mark.usefixtures("away_from_hour_boundary")
def test_a_refund_with_a_request_id_is_done_once(store: redcount.Store, strategy: Strategy) -> None:
    lim = redcount.Limiter(store, strategy)
    for _ in range(4):
        assert lim.hit("4/hour", "u")
    first = lim.refund("4/hour", "u", 1, request_id="req-1")
    assert first.status == "applied" and first.units == 1
    for _ in range(3):  # retries
        again = lim.refund("4/hour", "u", 1, request_id="req-1")
        assert again.status == "duplicate" and not again and again.units == 0
        assert again.decision.remaining == 1
    assert lim.refund("4/hour", "u", 1, request_id="req-2").applied
    assert left(lim, "4/hour", "u") == 2
    # The marker lives beside the state (same hash tag) for at least the window.
    markers = [k for k in all_keys(store, "redcount:lim:*") if b":refund:" in k]
    assert len(markers) == 2
    assert all(b"{u}" in k for k in markers)
    if not store.is_memory:
        assert all(3600 * 1000 <= store.execute("PTTL", k) <= 3601 * 1000 for k in markers)


@pytest.mark.parametrize("strategy", RATE)
def test_refunds_over_several_limits(clock_store: redcount.Store, strategy: Strategy) -> None:
    lim = redcount.Limiter(clock_store, strategy)
    limits = "2/second;5/hour"
    assert lim.hit(limits, "u") and lim.hit(limits, "u")
    assert not lim.hit(limits, "u")
    r = lim.refund(limits, "u", 1)
    assert r.units == 1 and r.decision.remaining == 1
    assert lim.hit(limits, "u")


def test_the_bucket_limits_clamp_a_refund_to_the_capacity(clock_store: redcount.Store) -> None:
    for strategy in ("token-bucket", "gcra"):
        lim = redcount.Limiter(clock_store, strategy)  # type: ignore[arg-type]
        assert lim.refund("10/minute burst 3", strategy, 5).units == 0
        assert lim.hit("10/minute burst 3", strategy, 3)
        r = lim.refund("10/minute burst 3", strategy, 5)
        assert r.units == 3 and r.decision.remaining == 3
        assert lim.hit("10/minute burst 3", strategy, 3)
        assert not lim.hit("10/minute burst 3", strategy)


def test_the_sliding_log_removes_the_newest_entries(clock: redcount.ManualClock, clock_store: redcount.Store) -> None:
    lim = redcount.Limiter(clock_store, "sliding-window")
    assert lim.hit("3/minute", "u")
    clock.advance(30)
    assert lim.hit("3/minute", "u", 2)
    assert lim.refund("3/minute", "u", 1).units == 1
    # What is left: the first hit (t=0) and one at t=30: the first frees up at t=60.
    clock.advance(29)
    assert lim.hit("3/minute", "u")
    d = lim.hit("3/minute", "u")
    assert not d and d.retry_after == pytest.approx(1.0, abs=0.01)


def test_concurrency_has_no_refunds(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, "concurrency")
    with pytest.raises(redcount.InvalidInputError, match="release"):
        lim.refund("5/minute", "u")
    with pytest.raises(redcount.InvalidInputError, match="acquire"):
        lim.reserve("5/minute", "u", 1)
    with pytest.raises(redcount.InvalidInputError, match="not available"):
        lim.settle("5/minute", "u", request_id="r", actual=1)


def test_bad_input_stores_nothing(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, "fixed-window")
    with pytest.raises(redcount.InvalidInputError, match="cost"):
        lim.refund("5/minute", "u", 0)
    with pytest.raises(redcount.InvalidInputError, match="request_id"):
        lim.refund("5/minute", "u", request_id="")
    with pytest.raises(redcount.InvalidInputError, match="exceeds"):
        lim.reserve("5/minute", "u", 6)
    with pytest.raises(redcount.InvalidInputError, match="deadline"):
        lim.reserve("5/minute", "u", 1, deadline=0)
    with pytest.raises(redcount.InvalidInputError, match="actual"):
        lim.settle("5/minute", "u", request_id="r", actual=-1)
    assert all_keys(store, "*") == []


# ------------------------------------------------------------------------ reservations


@pytest.mark.parametrize("strategy", RATE)
@pytest.mark.usefixtures("away_from_hour_boundary")
def test_reserve_then_settle_below_the_estimate(store: redcount.Store, strategy: Strategy) -> None:
    lim = redcount.Limiter(store, strategy)
    r = lim.reserve("10/hour", "t", 6, request_id="call-1", deadline=60)
    assert r and r.allowed and not r.duplicate
    assert r.estimate == 6 and r.request_id == "call-1"
    assert r.remaining == 4 and r.retry_after == 0
    assert left(lim, "10/hour", "t") == 4
    s = r.settle(2)
    assert s.status == "applied" and s.units == 4 and s.estimate == 6
    assert s.decision.remaining == 8
    for _ in range(3):  # retried settles change nothing
        again = r.settle(2)
        assert again.status == "duplicate" and again.estimate == 6
    assert lim.settle("10/hour", "t", request_id="call-1", actual=0).duplicate
    assert left(lim, "10/hour", "t") == 8


@pytest.mark.parametrize("strategy", RATE)
@pytest.mark.usefixtures("away_from_hour_boundary")
def test_settle_above_the_estimate_charges_the_difference(store: redcount.Store, strategy: Strategy) -> None:
    lim = redcount.Limiter(store, strategy)
    assert lim.reserve("10/hour", "t", 3, request_id="c")
    s = lim.settle("10/hour", "t", request_id="c", actual=8)
    assert s.applied and s.units == -5
    assert left(lim, "10/hour", "t") == 2
    # Used is used: a settlement past the limit charges it all, the limit then refuses.
    assert lim.reserve("10/hour", "t", 2, request_id="d")
    assert lim.settle("10/hour", "t", request_id="d", actual=6).units == -4
    assert left(lim, "10/hour", "t") == 0
    assert not lim.hit("10/hour", "t")


@pytest.mark.parametrize("strategy", RATE)
@pytest.mark.usefixtures("away_from_hour_boundary")
def test_a_refused_reservation_charges_and_records_nothing(store: redcount.Store, strategy: Strategy) -> None:
    lim = redcount.Limiter(store, strategy)
    assert lim.hit("5/hour", "t", 3)
    r = lim.reserve("5/hour", "t", 3, request_id="big")
    assert not r and r.adjustment.status == "refused"
    assert r.retry_after > 0 and not r.decision.allowed
    assert left(lim, "5/hour", "t") == 2
    assert lim.settle("5/hour", "t", request_id="big", actual=0).status == "expired"
    assert left(lim, "5/hour", "t") == 2
    assert [k for k in all_keys(store, "redcount:lim:*") if b":reserve:" in k] == []


@pytest.mark.parametrize("strategy", RATE)
@pytest.mark.usefixtures("away_from_hour_boundary")
def test_a_repeated_reserve_charges_once(store: redcount.Store, strategy: Strategy) -> None:
    lim = redcount.Limiter(store, strategy)
    first = lim.reserve("10/hour", "t", 4, request_id="once")
    second = lim.reserve("10/hour", "t", 4, request_id="once")
    assert first.adjustment.status == "applied"
    assert second and second.duplicate and second.estimate == 4
    assert left(lim, "10/hour", "t") == 6
    assert second.settle(1).units == 3
    assert left(lim, "10/hour", "t") == 9


@pytest.mark.parametrize("strategy", RATE)
def test_past_the_deadline_the_reservation_settles_at_the_estimate(
    clock: redcount.ManualClock, clock_store: redcount.Store, strategy: Strategy
) -> None:
    lim = redcount.Limiter(clock_store, strategy)
    r = lim.reserve("10/day", "t", 5, request_id="slow", deadline=30)
    assert r
    clock.advance(31)
    s = r.settle(1)
    assert s.status == "expired" and not s and s.units == 0
    assert left(lim, "10/day", "t") == 5
    # Within the deadline it settles.
    assert lim.reserve("10/day", "t", 5, request_id="fast", deadline=30)
    clock.advance(29)
    assert lim.settle("10/day", "t", request_id="fast", actual=1).units == 4
    assert left(lim, "10/day", "t") == 4


def test_a_reservation_settled_by_another_limiter(store: redcount.Store) -> None:
    one = redcount.Limiter(store, "gcra")
    other = redcount.Limiter(store, "gcra")
    r = one.reserve("100/hour", "t", 40)
    assert r and len(r.request_id) == 32  # a fresh id when none is given
    assert other.settle("100/hour", "t", request_id=r.request_id, actual=10).units == 30
    assert r.settle(10).duplicate
    assert left(one, "100/hour", "t") == 90


@pytest.mark.parametrize("strategy", RATE)
def test_async_refund_reserve_settle(store: redcount.Store, strategy: Strategy) -> None:
    async def main() -> None:
        lim = aio.Limiter(store, strategy)
        assert await lim.hit("5/day", "a", 5)
        r = await lim.refund("5/day", "a", 2, request_id="x")
        assert r.applied and r.units == 2
        assert (await lim.refund("5/day", "a", 2, request_id="x")).duplicate
        res = await lim.reserve("5/day", "a", 2, request_id="y")
        assert res and res.remaining == 0
        assert not await lim.reserve("5/day", "a", 1, request_id="z")
        s = await res.settle(1)
        assert s.applied and s.units == 1 and s.decision.remaining == 1
        assert (await lim.settle("5/day", "a", request_id="y", actual=1)).duplicate

    asyncio.run(main())
