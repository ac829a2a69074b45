"""Refunds, reservations and settlements never admit past a limit: a Hypothesis state
machine per rate strategy, on memory:// and a real Redis server, interleaves hits, refunds
(given the hit's Decision), reserves and settles (at or below the estimate) with clock
advances across window boundaries, and checks after every step that no stretch of time
admitted more than the strategy admits without refunds.

The model keeps every admission (a hit, or a reservation's estimate) at the time it was
charged, less what refunds and settlements reported giving back to it: the state is then
as if that charge had been smaller from the start, and the strategy's own bound must hold
for that history."""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import redcount
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from redcount.limiter import Strategy
from redcount.tools.servers import RedisServer

RATE: list[Strategy] = ["fixed-window", "sliding-window", "sliding-window-approx", "token-bucket", "gcra"]
# Minutes, not seconds: Redis expires the keys by its own clock, which the ManualClock runs
# ahead of; a relative TTL (a bucket's time to refill, a log's window) must outlast any
# stall of a loaded machine between two steps, or Redis would drop state the limiter's time
# still holds.
LIMIT = "4/10 minutes"
AMOUNT, WINDOW_MS = 4, 600_000
SUB_BUCKETS = 2  # sliding-window-approx: 5-minute sub-buckets
# The emission interval of GCRA (window / amount, µs), its burst the amount.
INTERVAL_US = WINDOW_MS * 1000 // AMOUNT

# Steps that land on, just before and just after window and sub-bucket boundaries: in
# whole 10 s, so that what a bucket or a GCRA arrival time has left to run (its key's TTL
# on Redis, counted by the server's clock) is never less than 10 s either.
STEPS_MS = [0, 10_000, 140_000, 150_000, 290_000, 300_000, 310_000, 590_000, 600_000, 750_000, 1_800_000]


@dataclass
class Charge:
    at_ms: int
    units: int  # what the state still holds of it (refunds and settlements take it down)
    decision: redcount.Decision | None = None  # a hit's (refund(decision=) finds it by it)
    reservation: redcount.Reservation | None = None
    settled: bool = False


def over_limit(strategy: Strategy, charges: list[Charge]) -> str | None:
    """The first stretch of time that admitted more than `strategy` admits under LIMIT
    without refunds, described; None when there is none."""
    held = sorted((c.at_ms, c.units) for c in charges if c.units > 0)
    if strategy == "fixed-window":
        per: dict[int, int] = {}
        for t, u in held:
            per[t // WINDOW_MS] = per.get(t // WINDOW_MS, 0) + u
        bad = [w for w, n in per.items() if n > AMOUNT]
        return f"window {bad[0]} admitted {per[bad[0]]}" if bad else None
    if strategy == "sliding-window-approx":
        # At each admission the sub-buckets cur-k+1 .. cur held at most the amount.
        bucket = WINDOW_MS // SUB_BUCKETS
        per = {}
        for t, u in held:
            per[t // bucket] = per.get(t // bucket, 0) + u
        for b in per:
            n = sum(per.get(b - j, 0) for j in range(SUB_BUCKETS))
            if n > AMOUNT:
                return f"sub-buckets {b - SUB_BUCKETS + 1}..{b} admitted {n}"
        return None
    for i, (a, _) in enumerate(held):
        total = 0
        for b, u in held[i:]:
            total += u
            if strategy == "sliding-window":
                ok = b - a >= WINDOW_MS or total <= AMOUNT  # a hit counts while now - t < window
            elif strategy == "token-bucket":
                ok = total * WINDOW_MS <= AMOUNT * WINDOW_MS + (b - a) * AMOUNT
            else:  # gcra
                ok = total * INTERVAL_US <= AMOUNT * INTERVAL_US + (b - a) * 1000
            if not ok:
                return f"{total} admitted from {a} to {b} ms"
    return None


class AdmitsNoMore(RuleBasedStateMachine):
    """Set `store`, `clock` and `strategy` on the class before running it."""

    store: redcount.Store
    clock: redcount.ManualClock
    start: float  # every example starts here (the start of an hour): replays decide alike
    strategy: Strategy

    def __init__(self) -> None:
        super().__init__()
        self.clock.set(self.start)
        approx = self.strategy == "sliding-window-approx"
        self.lim = redcount.Limiter(self.store, self.strategy, sub_buckets=SUB_BUCKETS if approx else 1)
        self.key = uuid.uuid4().hex  # a fresh state for every example
        self.charges: list[Charge] = []

    def now_ms(self) -> int:
        return round(self.clock.now() * 1000)

    @rule(ms=st.sampled_from(STEPS_MS))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms / 1000)

    @rule(cost=st.integers(1, 3))
    def hit(self, cost: int) -> None:
        d = self.lim.hit(LIMIT, self.key, cost)
        if d:
            assert d.charged_at is not None
            at = round(d.charged_at * 1000)
            assert at == self.now_ms()
            self.charges.append(Charge(at, cost, decision=d))
        else:
            assert d.charged_at is None

    @precondition(lambda self: any(c.decision is not None and c.units > 0 for c in self.charges))
    @rule(data=st.data(), with_id=st.booleans())
    def refund(self, data: st.DataObject, with_id: bool) -> None:
        c = data.draw(st.sampled_from([c for c in self.charges if c.decision is not None and c.units > 0]))
        cost = data.draw(st.integers(1, c.units))
        rid = uuid.uuid4().hex if with_id else None
        r = self.lim.refund(LIMIT, self.key, cost, request_id=rid, decision=c.decision)
        assert r.applied and 0 <= r.units <= cost
        c.units -= r.units
        if rid is not None:
            again = self.lim.refund(LIMIT, self.key, cost, request_id=rid, decision=c.decision)
            assert again.duplicate and again.units == 0

    @rule(estimate=st.integers(1, 4), deadline=st.sampled_from([1.0, 600.0, 7200.0]))
    def reserve(self, estimate: int, deadline: float) -> None:
        r = self.lim.reserve(LIMIT, self.key, estimate, deadline=deadline)
        if r:
            self.charges.append(Charge(self.now_ms(), estimate, reservation=r))

    @precondition(lambda self: any(c.reservation is not None and not c.settled for c in self.charges))
    @rule(data=st.data())
    def settle(self, data: st.DataObject) -> None:
        open_ones = [c for c in self.charges if c.reservation is not None and not c.settled]
        c = data.draw(st.sampled_from(open_ones))
        assert c.reservation is not None
        estimate = c.reservation.estimate
        actual = data.draw(st.integers(0, estimate))
        s = c.reservation.settle(actual)
        c.settled = True
        if s.status == "applied":
            assert 0 <= s.units <= estimate - actual
            c.units -= s.units
        else:  # past its deadline (by the store's clock): settled at the estimate
            assert s.status == "expired" and s.units == 0
        assert c.reservation.settle(actual).units == 0  # settled once

    @invariant()
    def never_past_the_limit(self) -> None:
        problem = over_limit(self.strategy, self.charges)
        assert problem is None, f"{self.strategy}: {problem}"


def next_hour() -> float:
    return math.ceil(time.time() / 3600) * 3600 + 3600.0


@pytest.fixture(params=["memory", "redis"])
def moving(request: pytest.FixtureRequest) -> Iterator[tuple[redcount.Store, redcount.ManualClock]]:
    """A store whose limiters read a ManualClock, on each backend; for Redis the clock runs
    ahead of the server's, so that keys never expire before the limiter's time says."""
    clock = redcount.ManualClock(next_hour())
    if request.param == "memory":
        s = redcount.connect(clock=clock)
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        s = redcount.connect(f"redis://127.0.0.1:{server.port}/0", clock=clock)
    try:
        yield s, clock
    finally:
        s.close()


@pytest.mark.parametrize("strategy", RATE)
def test_refunds_and_settlements_never_admit_past_the_limit(
    moving: tuple[redcount.Store, redcount.ManualClock], strategy: Strategy
) -> None:
    store, clock = moving
    machine = type(
        f"AdmitsNoMore_{strategy.replace('-', '_')}",
        (AdmitsNoMore,),
        {"store": store, "clock": clock, "start": clock.now(), "strategy": strategy},
    )
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=100,
            stateful_step_count=50,
            deadline=None,
            derandomize=True,
            suppress_health_check=[HealthCheck.too_slow],
            database=None,
        ),
    )
