"""FixedWindowCounter and SlidingWindowCounter against plain-Python models.

Hypothesis drives each counter with random increments (with and without request ids,
repeated ids included), reads, clears and, on ``memory://``, clock steps chosen around the
window's edges; after every step the counter must answer what a dictionary of windows (or a
list of timestamped events) says. The same machines run on a real redis-server, where the
clock is the wall clock and the windows are long enough that nothing turns over.
"""

from __future__ import annotations

from collections import defaultdict

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

KEYS = st.sampled_from(["a", "b", "ü", "{tag}c"])
REQUEST_IDS = st.none() | st.sampled_from(["r1", "r2", "r3"])
ITEMS = st.sampled_from(["x", "y", "z", "w"])


def fixed_window_machine(backend: Backend) -> type[RuleBasedStateMachine]:
    # An irregular window on the manual clock, so alignment is really computed; a day on the
    # wall clock, so a run almost never meets a boundary (and stops comparing when it does).
    window_s = 7 if backend.movable else 86400

    class FixedWindowModel(RuleBasedStateMachine):
        @initialize()
        def open(self) -> None:
            self.counter = redcount.FixedWindowCounter(backend.store, unique("fw"), window=window_s)
            self.counts: dict[tuple[str, int], int] = defaultdict(int)
            self.ids: set[tuple[str, int, str]] = set()

        def window(self) -> int:
            return backend.now_ms() // (window_s * 1000)

        @rule(key=KEYS, amount=st.integers(1, 5), request_id=REQUEST_IDS)
        def incr(self, key: str, amount: int, request_id: str | None) -> None:
            w = self.window()
            got = self.counter.incr(key, amount, request_id=request_id)
            if request_id is None or (key, w, request_id) not in self.ids:
                self.counts[key, w] += amount
                if request_id is not None:
                    self.ids.add((key, w, request_id))
            if not backend.turned_over(window_s):
                assert got == self.counts[key, w]

        @rule(key=KEYS)
        def get(self, key: str) -> None:
            got = self.counter.get(key)
            if not backend.turned_over(window_s):
                assert got == self.counts[key, self.window()]

        @precondition(lambda self: backend.movable)
        @rule(
            ms=st.sampled_from([1, 999, 1000, window_s * 1000 - 1, window_s * 1000])
            | st.integers(0, 3 * window_s * 1000)
        )
        def advance(self, ms: int) -> None:
            backend.advance_ms(ms)

        @invariant()
        def window_is_aligned(self) -> None:
            if hasattr(self, "counter") and backend.movable:
                start, end = self.counter.current_window("a")
                assert round(start * 1000) == self.window() * window_s * 1000
                assert round((end - start) * 1000) == window_s * 1000

    return FixedWindowModel


def test_fixed_window_counter_matches_model(model_backend: Backend) -> None:
    run_state_machine_as_test(fixed_window_machine(model_backend), settings=MODEL_SETTINGS)


def sliding_window_machine(backend: Backend) -> type[RuleBasedStateMachine]:
    window_s = 5 if backend.movable else 3600
    window_ms = window_s * 1000

    class SlidingWindowModel(RuleBasedStateMachine):
        @initialize()
        def open(self) -> None:
            self.counter = redcount.SlidingWindowCounter(backend.store, unique("sw"), window=window_s)
            self.events: dict[str, list[tuple[int, int]]] = defaultdict(list)  # key -> [(ms, amount)]
            self.items: dict[str, dict[str, int]] = defaultdict(dict)  # key -> item -> last seen ms

        def live_count(self, key: str) -> int:
            now = backend.now_ms()
            # An event counts while it is less than a window old.
            return sum(a for t, a in self.events[key] if now - t < window_ms)

        def live_items(self, key: str) -> int:
            now = backend.now_ms()
            return sum(1 for t in self.items[key].values() if now - t < window_ms)

        @rule(key=KEYS, amount=st.integers(1, 5) | st.just(2**32))
        def add(self, key: str, amount: int) -> None:
            got = self.counter.add(key, amount)
            self.events[key].append((backend.now_ms(), amount))
            assert got == self.live_count(key)

        @rule(key=KEYS)
        def count(self, key: str) -> None:
            assert self.counter.count(key) == self.live_count(key)

        @rule(key=KEYS, item=ITEMS)
        def add_unique(self, key: str, item: str) -> None:
            got = self.counter.add_unique(key, item)
            self.items[key][item] = backend.now_ms()
            assert got == self.live_items(key)

        @rule(key=KEYS)
        def count_unique(self, key: str) -> None:
            assert self.counter.count_unique(key) == self.live_items(key)

        @rule(key=KEYS)
        def clear(self, key: str) -> None:
            self.counter.clear(key)
            self.events.pop(key, None)
            self.items.pop(key, None)

        @precondition(lambda self: backend.movable)
        @rule(
            ms=st.sampled_from([1, window_ms - 1, window_ms, window_ms + 1])
            | st.integers(0, 2 * window_ms)
        )
        def advance(self, ms: int) -> None:
            backend.advance_ms(ms)

    return SlidingWindowModel


def test_sliding_window_counter_matches_model(model_backend: Backend) -> None:
    run_state_machine_as_test(sliding_window_machine(model_backend), settings=MODEL_SETTINGS)
