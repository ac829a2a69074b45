"""The public classes wrap their ``_core`` object instead of subclassing it."""

from __future__ import annotations

import redcount
from redcount import _core


def test_public_classes_hold_their_core(memory_store: redcount.Store) -> None:
    limiter = redcount.Limiter(memory_store)
    counter = redcount.FixedWindowCounter(memory_store, "c", 60)
    sliding = redcount.SlidingWindowCounter(memory_store, "s", 60)
    assert not isinstance(limiter, _core.LimiterCore) and isinstance(limiter._core, _core.LimiterCore)
    assert not isinstance(counter, _core.FixedWindowCounter)
    assert not isinstance(sliding, _core.SlidingWindowCounter)
    # The hot calls go straight to the core (no Python frame in between).
    assert limiter.hit.__self__ is limiter._core  # type: ignore[attr-defined]
    assert counter.incr.__self__ is counter._core  # type: ignore[attr-defined]
    assert sliding.count.__self__ is sliding._core  # type: ignore[attr-defined]
    # ... and agree with the documented methods of the class.
    assert limiter.hit("2/minute", "k").remaining == 1
    assert redcount.Limiter.hit(limiter, "2/minute", "k").remaining == 0
    assert counter.incr("k") == 1 and redcount.FixedWindowCounter.incr(counter, "k", 2) == 3
    assert sliding.add("k") == 1 and redcount.SlidingWindowCounter.count(sliding, "k") == 1


def test_properties_and_reprs_delegate(memory_store: redcount.Store) -> None:
    counter = redcount.FixedWindowCounter(memory_store, "views", 60, mode="commands", grace=2.5)
    assert (counter.name, counter.window, counter.mode, counter.grace, counter.on_error, counter.prefix) == (
        "views", 60.0, "commands", 2.5, "raise", "redcount")
    assert counter.store is not None and counter.store.url == "memory://"
    assert repr(counter) == "FixedWindowCounter(name='views', window=60.0, mode='commands', on_error='raise', store='memory://')"
    sliding = redcount.SlidingWindowCounter(memory_store, "s", 30)
    assert repr(sliding) == "SlidingWindowCounter(name='s', window=30.0, clock='client', store='memory://')"
    limiter = redcount.Limiter(memory_store, "gcra")
    assert repr(limiter) == "Limiter(strategy='gcra', clock='client', store='memory://')"
    assert redcount.Limiter.hit.__doc__ and "Decision" in redcount.Limiter.hit.__doc__


def test_a_subclass_override_is_not_shadowed(memory_store: redcount.Store) -> None:
    calls: list[str] = []

    class Audited(redcount.Limiter):
        def hit(self, limit: str | redcount.LimitSet, key: str | bytes, cost: int = 1) -> redcount.Decision:
            calls.append(str(key))
            return super().hit(limit, key, cost)

    lim = Audited(memory_store)
    assert lim.hit("5/minute", "a").allowed and calls == ["a"]
    assert lim.test("5/minute", "a").remaining == 4  # not overridden: still the fast path


def test_dropping_the_wrapper_frees_the_core(memory_store: redcount.Store) -> None:
    import weakref

    counter = redcount.FixedWindowCounter(memory_store, "c", 60)
    core_ref = weakref.ref(counter._core)
    del counter  # no reference cycle between the wrapper and its core: freed at once
    assert core_ref() is None
