"""Limiter strategies against plain-Python models: fixed-window (one limit, and two limits
decided all-or-nothing), the exact sliding log, token-bucket and gcra.

Hypothesis hits, tests, resets and reads stats of a few keys with random costs and, on
``memory://``, moves the manual clock; every decision must be the model's. The bucket
models step the clock by nothing or by a whole window or more (a full refill), so they stay
exact without modelling fractional tokens. On a real redis-server the windows are an hour
or a day long and the wall clock barely moves during a run.
"""

from __future__ import annotations

from collections import defaultdict

import pytest
import redcount
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    precondition,
    rule,
    run_state_machine_as_test,
)
from model_support import MODEL_SETTINGS, Backend, unique
from model_support import model_backend  # noqa: F401  (a fixture)

KEYS = st.sampled_from(["ip:1", "ip:2", "user:ü"])
AMOUNTS = st.integers(1, 5)


def fixed_window_machine(backend: Backend, two_limits: bool) -> type[RuleBasedStateMachine]:
    window_s = 3 if backend.movable else 86400
    unit = "3 seconds" if backend.movable else "day"

    class FixedWindowLimiterModel(RuleBasedStateMachine):
        @initialize(first=AMOUNTS, second=AMOUNTS)
        def open(self, first: int, second: int) -> None:
            self.limiter = redcount.Limiter(backend.store, "fixed-window", prefix=unique("lim"))
            # (amount, window seconds) of each limit; the second one's window is twice as long.
            self.limits = [(first, window_s)] + ([(first + second, 2 * window_s)] if two_limits else [])
            text = f"{first}/{unit}"
            if two_limits:
                second_unit = f"{2 * window_s} seconds" if backend.movable else "2 days"
                text += f";{first + second}/{second_unit}"
            self.text = text
            self.counts: dict[tuple[str, int, int], int] = defaultdict(int)  # (key, limit, window) -> used

        def used(self, key: str, i: int) -> int:
            return self.counts[key, i, backend.now_ms() // (self.limits[i][1] * 1000)]

        def fits(self, key: str, cost: int) -> bool:
            return all(self.used(key, i) + cost <= amount for i, (amount, _) in enumerate(self.limits))

        @rule(key=KEYS, cost=st.integers(1, 3))
        def hit(self, key: str, cost: int) -> None:
            if cost > min(amount for amount, _ in self.limits):
                with pytest.raises(redcount.InvalidInputError):
                    self.limiter.hit(self.text, key, cost)
                return
            allowed = self.fits(key, cost)
            decision = self.limiter.hit(self.text, key, cost)
            if allowed:
                for i, (_, w) in enumerate(self.limits):
                    self.counts[key, i, backend.now_ms() // (w * 1000)] += cost
            if not backend.turned_over(window_s):
                assert decision.allowed == allowed
                left = [amount - self.used(key, i) for i, (amount, _) in enumerate(self.limits)]
                assert decision.remaining == min(left)

        @rule(key=KEYS)
        def test(self, key: str) -> None:
            decision = self.limiter.test(self.text, key, 1)
            if not backend.turned_over(window_s):
                assert decision.allowed == self.fits(key, 1)

        @rule(key=KEYS)
        def stats(self, key: str) -> None:
            stats = self.limiter.stats(self.text, key)
            if not backend.turned_over(window_s):
                assert [s.count for s in stats] == [self.used(key, i) for i in range(len(self.limits))]

        @rule(key=KEYS)
        def reset(self, key: str) -> None:
            self.limiter.reset(self.text, key)
            for k in [k for k in self.counts if k[0] == key]:
                del self.counts[k]

        @precondition(lambda self: backend.movable)
        @rule(
            ms=st.sampled_from([1, window_s * 1000 - 1, window_s * 1000])
            | st.integers(0, 3 * window_s * 1000)
        )
        def advance(self, ms: int) -> None:
            backend.advance_ms(ms)

    return FixedWindowLimiterModel


@pytest.mark.parametrize("two_limits", [False, True], ids=["one-limit", "two-limits"])
def test_fixed_window_limiter_matches_model(model_backend: Backend, two_limits: bool) -> None:
    run_state_machine_as_test(fixed_window_machine(model_backend, two_limits), settings=MODEL_SETTINGS)


def sliding_log_machine(backend: Backend) -> type[RuleBasedStateMachine]:
    window_s = 3 if backend.movable else 3600
    unit = "3 seconds" if backend.movable else "hour"
    window_ms = window_s * 1000

    class SlidingLogModel(RuleBasedStateMachine):
        @initialize(amount=AMOUNTS)
        def open(self, amount: int) -> None:
            self.limiter = redcount.Limiter(backend.store, "sliding-window", prefix=unique("lim"))
            self.amount = amount
            self.text = f"{amount}/{unit}"
            self.log: dict[str, list[tuple[int, int]]] = defaultdict(list)  # key -> [(ms, cost)]

        def used(self, key: str) -> int:
            now = backend.now_ms()
            return sum(c for t, c in self.log[key] if now - t < window_ms)

        @rule(key=KEYS, cost=st.integers(1, 3))
        def hit(self, key: str, cost: int) -> None:
            if cost > self.amount:
                with pytest.raises(redcount.InvalidInputError):
                    self.limiter.hit(self.text, key, cost)
                return
            allowed = self.used(key) + cost <= self.amount
            decision = self.limiter.hit(self.text, key, cost)
            if allowed:
                self.log[key].append((backend.now_ms(), cost))
            assert decision.allowed == allowed
            assert decision.remaining == self.amount - self.used(key)

        @rule(key=KEYS)
        def test(self, key: str) -> None:
            assert self.limiter.test(self.text, key, 1).allowed == (self.used(key) + 1 <= self.amount)

        @rule(key=KEYS)
        def stats(self, key: str) -> None:
            assert [s.count for s in self.limiter.stats(self.text, key)] == [self.used(key)]

        @rule(key=KEYS)
        def reset(self, key: str) -> None:
            self.limiter.reset(self.text, key)
            self.log.pop(key, None)

        @precondition(lambda self: backend.movable)
        @rule(ms=st.sampled_from([1, window_ms - 1, window_ms]) | st.integers(0, 2 * window_ms))
        def advance(self, ms: int) -> None:
            backend.advance_ms(ms)

    return SlidingLogModel


def test_sliding_window_limiter_matches_model(model_backend: Backend) -> None:
    run_state_machine_as_test(sliding_log_machine(model_backend), settings=MODEL_SETTINGS)


def bucket_machine(backend: Backend, strategy: str) -> type[RuleBasedStateMachine]:
    window_s = 2 if backend.movable else 86400
    unit = "2 seconds" if backend.movable else "day"

    class BucketModel(RuleBasedStateMachine):
        @initialize(amount=AMOUNTS, extra=st.integers(0, 3))
        def open(self, amount: int, extra: int) -> None:
            self.limiter = redcount.Limiter(backend.store, strategy, prefix=unique("lim"))
            self.amount = amount
            self.capacity = amount + extra
            self.text = f"{amount}/{unit}" + (f" burst {self.capacity}" if extra else "")
            self.tokens: dict[str, int] = defaultdict(lambda: self.capacity)

        @rule(key=KEYS, cost=st.integers(1, 3))
        def hit(self, key: str, cost: int) -> None:
            if cost > self.capacity:
                with pytest.raises(redcount.InvalidInputError):
                    self.limiter.hit(self.text, key, cost)
                return
            allowed = self.tokens[key] >= cost
            decision = self.limiter.hit(self.text, key, cost)
            if allowed:
                self.tokens[key] -= cost
            assert decision.allowed == allowed
            assert decision.remaining == self.tokens[key]

        @rule(key=KEYS)
        def test(self, key: str) -> None:
            assert self.limiter.test(self.text, key, 1).allowed == (self.tokens[key] >= 1)

        @rule(key=KEYS)
        def reset(self, key: str) -> None:
            self.limiter.reset(self.text, key)
            self.tokens.pop(key, None)

        # Whole refills only: a bucket of `capacity` tokens fills at `amount` per window.
        @precondition(lambda self: backend.movable)
        @rule(times=st.integers(1, 2))
        def refill(self, times: int) -> None:
            # gcra's emission interval is the window / amount rounded up to a whole µs (so
            # the rate is never exceeded): a full refill takes up to `capacity` µs longer than
            # the whole windows, hence the extra millisecond.
            backend.advance_ms(times * -(-self.capacity // self.amount) * window_s * 1000 + 1)
            self.tokens.clear()

    return BucketModel


@pytest.mark.parametrize("strategy", ["token-bucket", "gcra"])
def test_bucket_limiters_match_model(model_backend: Backend, strategy: str) -> None:
    run_state_machine_as_test(bucket_machine(model_backend, strategy), settings=MODEL_SETTINGS)
