"""ShardedCounter against a plain-Python model: a total and the set of request ids seen.

Hypothesis writes through ``incr``, ``decr``, ``adjust`` and ``incr_many`` (with and without
request ids, ids repeated across calls and inside one batch, two counters in one batch) and
reads ``value``, ``shard_values`` and ``values``; every write must be applied exactly when
the model says its id is new, and every read must be the model's total. On ``memory://``
the clock may also jump past the idempotency TTL, after which an id counts again.
"""

from __future__ import annotations

import redcount
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from model_support import MODEL_SETTINGS, Backend, unique
from model_support import model_backend  # noqa: F401  (a fixture)

AMOUNTS = st.integers(-5, 5).filter(bool)
REQUEST_IDS = st.none() | st.sampled_from(["r1", "r2", "r3", "r4", "é"])
TTL_S = 30


def sharded_machine(backend: Backend) -> type[RuleBasedStateMachine]:
    class ShardedModel(RuleBasedStateMachine):
        @initialize(shards=st.sampled_from([1, 3, 16]))
        def open(self, shards: int) -> None:
            base = unique("sc")
            self.names = [base, base + "-2"]
            self.counters = [
                redcount.ShardedCounter(backend.store, n, shards=shards, idempotency_ttl=TTL_S)
                for n in self.names
            ]
            self.totals = [0, 0]
            self.seen: list[set[str]] = [set(), set()]

        def apply(self, which: int, amount: int, request_id: str | None) -> bool:
            if request_id is not None and request_id in self.seen[which]:
                return False
            self.totals[which] += amount
            if request_id is not None:
                self.seen[which].add(request_id)
            return True

        @rule(which=st.integers(0, 1), amount=AMOUNTS, request_id=REQUEST_IDS)
        def incr(self, which: int, amount: int, request_id: str | None) -> None:
            expected = self.apply(which, amount, request_id)
            assert self.counters[which].incr(amount, request_id=request_id) is expected

        @rule(amount=st.integers(1, 5), request_id=REQUEST_IDS)
        def decr(self, amount: int, request_id: str | None) -> None:
            expected = self.apply(0, -amount, request_id)
            assert self.counters[0].decr(amount, request_id=request_id) is expected

        @rule(delta=AMOUNTS, request_id=REQUEST_IDS)
        def adjust(self, delta: int, request_id: str | None) -> None:
            expected = self.apply(0, delta, request_id)
            assert self.counters[0].adjust(delta, "model correction", request_id=request_id) is expected

        @rule(items=st.lists(st.tuples(st.integers(0, 1), AMOUNTS, REQUEST_IDS), min_size=1, max_size=6))
        def incr_many(self, items: list[tuple[int, int, str | None]]) -> None:
            batch: list[tuple[str, int] | tuple[str, int, str]] = [
                (self.names[w], a) if rid is None else (self.names[w], a, rid) for w, a, rid in items
            ]
            # In order: a repeat of an id inside the batch is a repeat like any other.
            expected = [self.apply(w, a, rid) for w, a, rid in items]
            assert self.counters[0].incr_many(batch) == expected

        @rule()
        def read(self) -> None:
            assert self.counters[0].values(self.names) == dict(zip(self.names, self.totals))

        @precondition(lambda self: backend.movable)
        @rule(ms=st.sampled_from([1, 100]))
        def tick(self, ms: int) -> None:
            backend.advance_ms(ms)

        @precondition(lambda self: backend.movable)
        @rule()
        def ids_expire(self) -> None:
            # Far past the TTL (the ticks above add at most 2.5 s): every id is new again.
            backend.advance_ms((TTL_S + 5) * 1000)
            self.seen = [set(), set()]

        @invariant()
        def totals_agree(self) -> None:
            if hasattr(self, "counters"):
                for counter, total in zip(self.counters, self.totals):
                    assert counter.value() == total
                    assert sum(counter.shard_values()) == total

    return ShardedModel


def test_sharded_counter_matches_model(model_backend: Backend) -> None:
    run_state_machine_as_test(sharded_machine(model_backend), settings=MODEL_SETTINGS)
