"""Limiter decisions stepped through with a ManualClock: exact windows, retry_after that
really admits, all-or-nothing multi-limits, and the limit-string parser."""

from __future__ import annotations

import random
from collections import Counter

import pytest
import redcount
from helpers import all_keys, ms, snapshot


@pytest.fixture
def lim(clock_store: redcount.Store) -> redcount.Limiter:
    return redcount.Limiter(clock_store)


def window_end(clock: redcount.ManualClock, seconds: int) -> float:
    now_ms = ms(clock.now())
    w = seconds * 1000
    return (now_ms // w + 1) * w / 1000


def test_decision_truthiness(lim: redcount.Limiter) -> None:
    d = lim.hit("1/minute", "k")
    assert d.allowed is True and bool(d) is True
    if not d:
        pytest.fail("an allowed decision must be truthy")
    d = lim.hit("1/minute", "k")
    assert d.allowed is False and bool(d) is False
    assert not d
    assert "allowed=False" in repr(d)


def test_fields_under_a_frozen_clock(clock: redcount.ManualClock, lim: redcount.Limiter) -> None:
    end = window_end(clock, 60)
    left = ms(end) - ms(clock.now())
    for i in range(1, 4):
        d = lim.hit("3/minute", "k")
        assert (d.allowed, d.limit, d.remaining, ms(d.reset_after), d.retry_after) == (True, 3, 3 - i, left, 0.0)
    d = lim.hit("3/minute", "k")
    assert (d.allowed, d.limit, d.remaining, ms(d.reset_after), ms(d.retry_after)) == (False, 3, 0, left, left)
    (s,) = lim.stats("3/minute", "k")
    assert (s.count, s.remaining, ms(s.reset_after), s.limit.amount) == (3, 0, left, 3)


def test_waiting_retry_after_admits(clock: redcount.ManualClock, lim: redcount.Limiter) -> None:
    for _ in range(5):
        lim.hit("5/minute", "k")
    d = lim.hit("5/minute", "k")
    assert not d
    clock.advance(d.retry_after - 0.001)
    still = lim.hit("5/minute", "k")
    assert not still  # a millisecond early: still refused
    assert ms(still.retry_after) == 1
    clock.advance(still.retry_after)
    assert lim.hit("5/minute", "k")


def test_retry_after_for_the_binding_limit(clock: redcount.ManualClock, lim: redcount.Limiter) -> None:
    limits = "2/second;3/minute"
    clock.set(1_699_999_990.0)  # a whole second, 10 s into a minute (1_699_999_980 = 60 x 28_333_333)
    assert lim.hit(limits, "k") and lim.hit(limits, "k")
    d = lim.hit(limits, "k")
    assert not d and d.limit == 2 and ms(d.retry_after) == 1000  # the second limit binds
    clock.advance(d.retry_after)
    d = lim.hit(limits, "k")
    assert d and d.remaining == 0 and d.limit == 3  # 1 left in this second, 0 in the minute
    d = lim.hit(limits, "k")
    assert not d and d.limit == 3
    assert ms(d.retry_after) == 49_000  # the minute limit binds: until 11 s + 49 s = the minute's end
    assert ms(d.reset_after) == 49_000
    clock.advance(d.retry_after)
    assert lim.hit(limits, "k")


def test_a_client_that_honours_retry_after_is_always_admitted(clock: redcount.ManualClock,
                                                              lim: redcount.Limiter) -> None:
    limits = "5/second;12/minute;30/hour"
    rng = random.Random(1234)
    per_window: dict[int, Counter[int]] = {1: Counter(), 60: Counter(), 3600: Counter()}
    admitted = 0
    for _ in range(300):
        cost = rng.choice([1, 1, 2, 3])
        d = lim.hit(limits, "client", cost)
        if not d:
            assert d.retry_after > 0
            clock.advance(d.retry_after)
            d = lim.hit(limits, "client", cost)
            assert d, "waited retry_after and was still refused"
        admitted += cost
        now = ms(clock.now())
        for w, tally in per_window.items():
            tally[now // (w * 1000)] += cost
        clock.advance(rng.choice([0, 0.01, 0.2, 0.9]))
    assert max(per_window[1].values()) <= 5
    assert max(per_window[60].values()) <= 12
    assert max(per_window[3600].values()) <= 30
    assert admitted > 30  # it ran through several hours


def test_multi_limit_all_or_nothing(clock: redcount.ManualClock, clock_store: redcount.Store,
                                    lim: redcount.Limiter) -> None:
    limits = "3/second;5/minute"
    clock.set(1_700_000_040.0)
    assert [bool(lim.hit(limits, "k")) for _ in range(4)] == [True, True, True, False]
    assert [s.count for s in lim.stats(limits, "k")] == [3, 3]  # the refused hit charged neither
    clock.advance(1)
    before = snapshot(clock_store)
    d = lim.hit(limits, "k", 3)  # the second allows 3, the minute only 2
    assert not d and d.limit == 5 and d.remaining == 2
    assert snapshot(clock_store) == before  # not even the new second's key was created
    assert [s.count for s in lim.stats(limits, "k")] == [0, 3]
    assert lim.hit(limits, "k", 2).remaining == 0
    assert [s.count for s in lim.stats(limits, "k")] == [2, 5]
    assert not lim.test(limits, "k")
    clock.advance(1)
    before = snapshot(clock_store)
    assert not lim.hit(limits, "k")
    assert snapshot(clock_store) == before


def test_test_does_not_charge(clock_store: redcount.Store, lim: redcount.Limiter) -> None:
    for _ in range(10):
        assert lim.test("2/minute", "k")
    assert all_keys(clock_store) == []
    lim.hit("2/minute", "k", 2)
    d = lim.test("2/minute", "k")
    assert not d and d.retry_after > 0
    assert lim.test("2/minute", "k", 1).remaining == 0
    assert lim.stats("2/minute", "k")[0].count == 2


def test_reset(clock: redcount.ManualClock, clock_store: redcount.Store, lim: redcount.Limiter) -> None:
    lim.hit("2/minute;10/hour", "k", 2)
    lim.hit("2/minute;10/hour", "other", 1)
    assert not lim.hit("2/minute;10/hour", "k")
    lim.reset("2/minute;10/hour", "k")
    assert [s.count for s in lim.stats("2/minute;10/hour", "k")] == [0, 0]
    assert [s.count for s in lim.stats("2/minute;10/hour", "other")] == [1, 1]  # untouched
    assert lim.hit("2/minute;10/hour", "k")


def test_keys_are_isolated_by_key_prefix_and_limit(clock_store: redcount.Store) -> None:
    a = redcount.Limiter(clock_store, prefix="a")
    b = redcount.Limiter(clock_store, prefix="b")
    assert a.hit("1/minute", "k") and not a.hit("1/minute", "k")
    assert b.hit("1/minute", "k")  # another prefix: its own budget
    assert a.hit("1/minute", "j")  # another key
    assert a.hit("2/minute", "k")  # another limit
    assert a.hit("1/hour", "k")  # same amount, another window
    assert not a.hit("1 per minute", "k")  # the same limit, written differently: same budget
    assert {k.split(b":")[0] for k in all_keys(clock_store)} == {b"a", b"b"}


def test_parse_limits() -> None:
    (r,) = redcount.parse_limits("10/minute").limits
    assert (r.amount, r.multiple, r.unit, r.window, str(r)) == (10, 1, "minute", 60.0, "10/minute")
    assert repr(r) == "RateLimit('10/minute')"
    (r,) = redcount.parse_limits("100/5 minutes").limits
    assert (r.amount, r.multiple, r.unit, r.window, str(r)) == (100, 5, "minute", 300.0, "100/5 minutes")
    (r,) = redcount.parse_limits("10 per minute").limits
    assert (r.amount, r.window) == (10, 60.0)
    (r,) = redcount.parse_limits("  7 PER 2 Hours  ").limits
    assert (r.amount, r.multiple, r.unit, r.window) == (7, 2, "hour", 7200.0)
    ls = redcount.parse_limits("5/second;100/hour")
    assert len(ls) == 2 and ls.text == "5/second;100/hour" and str(ls) == "5/second;100/hour"
    assert repr(ls) == "LimitSet('5/second;100/hour')"
    assert [(x.amount, x.window) for x in ls.limits] == [(5, 1.0), (100, 3600.0)]
    ls = redcount.parse_limits("5/s, 10/m, 20/h, 30/d, 40/month, 50/yr, 60/sec, 70/min, 80/hr")
    assert [x.window for x in ls.limits] == [1, 60, 3600, 86400, 30 * 86400, 365 * 86400, 1, 60, 3600]
    assert [x.unit for x in ls.limits][:6] == ["second", "minute", "hour", "day", "month", "year"]
    assert str(redcount.parse_limits("3/1 second").limits[0]) == "3/second"
    assert isinstance(redcount.parse_limits("1/second"), redcount.LimitSet)
    assert redcount.parse_limits(b"2/minute").limits[0].amount == 2
    assert redcount.parse_limits(f"{2**53 - 1}/second").limits[0].amount == 2**53 - 1
    with pytest.raises(redcount.InvalidInputError, match="2\\^53"):
        redcount.parse_limits(f"{2**53}/second")


def test_a_bad_limit_string_is_quoted_once() -> None:
    # A single limit is named once; in a list, the bad part and the whole list each once.
    with pytest.raises(redcount.InvalidInputError) as one:
        redcount.parse_limits("10/foo")
    assert str(one.value).count("10/foo") == 1, str(one.value)
    with pytest.raises(redcount.InvalidInputError) as listed:
        redcount.parse_limits("5/second;abc")
    assert "'abc' in '5/second;abc'" in str(listed.value), str(listed.value)


def test_strategies(clock_store: redcount.Store) -> None:
    assert redcount.strategies() == [
        "fixed-window",
        "sliding-window",
        "sliding-window-approx",
        "token-bucket",
        "gcra",
        "concurrency",
    ]
    for name in redcount.strategies():
        lim = redcount.Limiter(clock_store, name)
        assert lim.strategy == name
        assert lim.hit("1/minute", "k")
    with pytest.raises(redcount.InvalidInputError, match="fixed-window"):
        redcount.Limiter(clock_store, "leaky-bucket")  # type: ignore[arg-type]


def test_limitset_object_and_string_agree(lim: redcount.Limiter) -> None:
    ls = redcount.LimitSet("2/minute")
    assert lim.hit(ls, "k").remaining == 1
    assert lim.hit("2/minute", "k").remaining == 0
    assert not lim.hit(ls, "k")
    assert lim.stats(ls, "k")[0].count == 2
