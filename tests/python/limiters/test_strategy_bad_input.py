"""Bad input to the limiter strategies: a clear, specific error, and nothing stored; and the
caps that bound the work one call can make the server do."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redcount
from helpers import all_keys

RATE = ["fixed-window", "sliding-window", "sliding-window-approx", "token-bucket", "gcra"]


def refused(store: redcount.Store, call: Callable[[], object], match: str) -> None:
    with pytest.raises(redcount.InvalidInputError, match=match) as info:
        call()
    assert isinstance(info.value, ValueError)
    assert all_keys(store) == [], "a refused call stored something"


@pytest.mark.parametrize("strategy", RATE)
@pytest.mark.parametrize("cost", [0, -1, -(2**63)])
def test_cost_below_one(store: redcount.Store, strategy: str, cost: int) -> None:
    lim = redcount.Limiter(store, strategy)  # type: ignore[arg-type]
    refused(store, lambda: lim.hit("5/minute", "k", cost), "cost must be >= 1")
    refused(store, lambda: lim.test("5/minute", "k", cost), "cost must be >= 1")


@pytest.mark.parametrize("strategy", ["fixed-window", "sliding-window", "sliding-window-approx", "concurrency"])
def test_cost_over_the_limit_says_why(store: redcount.Store, strategy: str) -> None:
    lim = redcount.Limiter(store, strategy)  # type: ignore[arg-type]
    refused(store, lambda: lim.hit("5/minute", "k", 6), "cost 6 exceeds the limit '5/minute': such a hit could never be allowed")


@pytest.mark.parametrize("strategy", ["token-bucket", "gcra"])
def test_cost_over_the_capacity_says_why(store: redcount.Store, strategy: str) -> None:
    lim = redcount.Limiter(store, strategy)  # type: ignore[arg-type]
    refused(store, lambda: lim.hit("5/minute burst 8", "k", 9), "exceeds the capacity of '5/minute burst 8'")
    assert lim.hit("5/minute burst 8", "k", 8)  # the burst, not the amount, bounds the cost


@pytest.mark.parametrize(
    ("limit", "match"),
    [
        ("0/second", "amount must be >= 1"),
        ("10/0 seconds", "window multiple must be >= 1"),
        ("10/second burst 0", "burst must be >= 1"),
        ("10/second burst x", "burst 'x' is not a whole number"),
        ("10/fortnight", "unknown time unit"),
        ("", "empty"),
        ("ten/second", "not a whole number"),
    ],
)
def test_zero_capacity_or_rate_and_malformed_limits(store: redcount.Store, limit: str, match: str) -> None:
    for strategy in ("token-bucket", "gcra"):
        lim = redcount.Limiter(store, strategy)  # type: ignore[arg-type]
        refused(store, lambda: lim.hit(limit, "k"), match)


@pytest.mark.parametrize("strategy", ["fixed-window", "sliding-window", "sliding-window-approx", "concurrency"])
def test_burst_only_for_buckets(store: redcount.Store, strategy: str) -> None:
    lim = redcount.Limiter(store, strategy)  # type: ignore[arg-type]
    refused(store, lambda: lim.hit("5/second burst 10", "k"), "a burst applies only to strategy='token-bucket' or 'gcra'")


def test_unknown_strategy(store: redcount.Store) -> None:
    refused(
        store,
        lambda: redcount.Limiter(store, "leaky-bucket"),  # type: ignore[arg-type]
        "unknown rate-limit strategy 'leaky-bucket' \\(known: fixed-window, sliding-window, sliding-window-approx, "
        "token-bucket, gcra, concurrency\\)",
    )


@pytest.mark.parametrize("k", [0, -1, 61])
def test_sub_buckets_out_of_range(store: redcount.Store, k: int) -> None:
    refused(store, lambda: redcount.Limiter(store, "sliding-window-approx", sub_buckets=k), "sub_buckets must be between 1 and 60")


def test_sub_buckets_that_do_not_divide_the_window(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, "sliding-window-approx", sub_buckets=7)
    refused(store, lambda: lim.hit("10/second", "k"), "7 sub-buckets do not divide its window of 1000 ms")
    refused(store, lambda: redcount.Limiter(store, "gcra", sub_buckets=4), "sub_buckets applies only to")


def test_limits_too_large_for_exact_arithmetic(store: redcount.Store) -> None:
    approx = redcount.Limiter(store, "sliding-window-approx")
    refused(store, lambda: approx.hit("9007199254740991/year", "k"), "too large for strategy='sliding-window-approx'")
    tb = redcount.Limiter(store, "token-bucket")
    refused(store, lambda: tb.hit("1/year burst 9007199254740991", "k"), "too large for strategy='token-bucket'")
    gcra = redcount.Limiter(store, "gcra")
    refused(store, lambda: gcra.hit("1/year burst 9007199254740991", "k"), "too large for strategy='gcra'")


def test_concurrency_bad_input(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, "concurrency")
    refused(store, lambda: lim.acquire(0, "k"), "max_in_flight must be between 1 and 100000")
    refused(store, lambda: lim.acquire(-5, "k"), "max_in_flight must be between 1 and 100000")
    refused(store, lambda: lim.acquire(3, "k", lease_timeout=0), "lease_timeout")
    refused(store, lambda: lim.acquire(3, "k", lease_timeout=-1), "lease_timeout")
    refused(store, lambda: lim.acquire(3, "k", lease_timeout=0.0002), "lease_timeout")
    refused(store, lambda: lim.hit("1/second;5/minute", "k"), "takes exactly one limit")
    refused(store, lambda: lim.acquire(3, ""), "key")
    refused(store, lambda: lim.acquire(3, b"\xff"), "UTF-8")


def test_releasing_a_lease_twice(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, "concurrency")
    lease = lim.acquire(2, "k")
    assert lease is not None
    assert lim.release(lease)
    before = all_keys(store)
    with pytest.raises(redcount.InvalidInputError, match=f"lease {lease.id} of key 'k' was already released"):
        lim.release(lease)
    assert all_keys(store) == before
    other = redcount.Limiter(store, "concurrency", prefix="elsewhere")
    lease2 = lim.acquire(2, "k")
    assert lease2 is not None
    with pytest.raises(redcount.InvalidInputError, match="belongs to another limiter"):
        other.release(lease2)
    assert lim.in_flight("k") == 1  # the failed release did not free it
    with pytest.raises(TypeError):
        lim.release("not a lease")  # type: ignore[arg-type]


@pytest.mark.parametrize("strategy", RATE + ["concurrency"])
@pytest.mark.parametrize("key", ["", "x" * 1025, b"\xc3\x28"])
def test_bad_keys(store: redcount.Store, strategy: str, key: str | bytes) -> None:
    lim = redcount.Limiter(store, strategy)  # type: ignore[arg-type]
    refused(store, lambda: lim.hit("5/minute", key), "key")
    refused(store, lambda: lim.stats("5/minute", key), "key")
    refused(store, lambda: lim.reset("5/minute", key), "key")


# ---------------------------------------------------------------- bounded server work per call


@pytest.mark.parametrize("strategy", ["sliding-window", "concurrency"])
def test_member_strategies_refuse_costs_past_the_per_call_cap(store: redcount.Store, strategy: str) -> None:
    # cost=1_000_000 (inside the old caps) made one script add a million members: seconds
    # during which Redis served nobody. One call now adds at most 10,000.
    lim = redcount.Limiter(store, strategy)  # type: ignore[arg-type]
    limit = "100000/hour" if strategy == "sliding-window" else "100000/hour"
    for cost in (10_001, 100_000):
        for call in (lim.hit, lim.test):
            with pytest.raises(redcount.InvalidInputError, match="at most 10000"):
                call(limit, "k", cost=cost)
    assert all_keys(store) == []
    d = lim.hit(limit, "k", cost=10_000)
    assert d and d.remaining == 90_000


@pytest.mark.parametrize("strategy", ["sliding-window", "concurrency"])
def test_member_strategies_cap_amounts_at_100000(store: redcount.Store, strategy: str) -> None:
    lim = redcount.Limiter(store, strategy)  # type: ignore[arg-type]
    with pytest.raises(redcount.InvalidInputError, match="100000"):
        lim.hit("100001/hour", "k")
    if strategy == "concurrency":
        with pytest.raises(redcount.InvalidInputError, match="100000"):
            lim.acquire(100_001, "k")
    assert all_keys(store) == []


@pytest.mark.parametrize("strategy", ["sliding-window-approx", "token-bucket", "gcra", "fixed-window"])
def test_strategies_whose_work_does_not_grow_with_the_cost_keep_big_costs(store: redcount.Store,
                                                                          strategy: str) -> None:
    lim = redcount.Limiter(store, strategy)  # type: ignore[arg-type]
    assert lim.hit("2000000/hour", "k", cost=1_000_000)
