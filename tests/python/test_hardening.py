"""Regression tests for the defects of issue 8 ("Hardening") fixed outside the I/O engine.

Each test names its item and fails on the code before the fix.
"""

from __future__ import annotations

import math
import time

import pytest
import redcount


# Item 14: non-finite clocks and huge numbers are InvalidInputError naming the argument.
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 1e300])
def test_manual_clock_refuses_non_finite_or_huge_start(bad: float) -> None:
    with pytest.raises(redcount.InvalidInputError, match="start"):
        redcount.ManualClock(bad)


@pytest.mark.parametrize("bad", [math.nan, math.inf, 1e300])
def test_manual_clock_set_and_advance_refuse_non_finite(bad: float) -> None:
    clock = redcount.ManualClock(100.0)
    with pytest.raises(redcount.InvalidInputError, match="t"):
        clock.set(bad)
    with pytest.raises(redcount.InvalidInputError, match="seconds"):
        clock.advance(bad)
    assert clock.now() == 100.0  # untouched


def test_manual_clock_advance_cannot_overflow() -> None:
    clock = redcount.ManualClock(8.9e15)
    with pytest.raises(redcount.InvalidInputError, match="range"):
        clock.advance(2e14)
    assert clock.now() == 8.9e15


@pytest.mark.parametrize("window", [10**400, -(10**400), math.nan, math.inf])
def test_huge_or_non_finite_window_is_invalid_input(memory_store: redcount.Store, window: float) -> None:
    with pytest.raises(redcount.InvalidInputError, match="window"):
        redcount.FixedWindowCounter(memory_store, "c", window)
    with pytest.raises(redcount.InvalidInputError, match="window"):
        redcount.SlidingWindowCounter(memory_store, "c", window)


def test_huge_timeout_is_invalid_input() -> None:
    with pytest.raises(redcount.InvalidInputError, match="command_timeout"):
        redcount.connect("redis://127.0.0.1:1", command_timeout=10**400)


# Item 16: a huge limit string is refused before it is parsed, with a short message.
def test_huge_limit_string_is_refused_quickly(memory_store: redcount.Store) -> None:
    limiter = redcount.Limiter(memory_store)
    text = "1/second;" * 900_000  # 8.1 MB
    started = time.perf_counter()
    with pytest.raises(redcount.InvalidInputError) as err:
        limiter.hit(text, "k")
    elapsed = time.perf_counter() - started
    assert len(str(err.value)) < 400
    assert "2048" in str(err.value)
    # Not a speed assertion on redcount: the old code parsed all 900,000 limits first, which
    # took far longer than a scan; this only guards against going back to a full parse.
    assert elapsed < 5.0


# Item 17: a NUL byte in a limit string or a name must not cut the error message.
def test_nul_in_limit_string_keeps_the_reason(memory_store: redcount.Store) -> None:
    limiter = redcount.Limiter(memory_store)
    with pytest.raises(redcount.InvalidInputError) as err:
        limiter.hit("10/min\x00ute", "k")
    message = str(err.value)
    assert "\\x00" in message
    assert "unknown time unit" in message


def test_nul_in_counter_name_keeps_the_reason(memory_store: redcount.Store) -> None:
    with pytest.raises(redcount.InvalidInputError) as err:
        redcount.FixedWindowCounter(memory_store, "a\x00{b}", 60)
    message = str(err.value)
    assert "\\x00" in message
    assert "hash tag" in message
