"""Regression tests for issue 8 items 18 (the same error classes on both stores) and 5
(the work one call can make the server do is bounded).

Each test fails on the code before the fix.
"""

from __future__ import annotations

import pytest
import redcount
from helpers import all_keys

# ----------------------------------------------------------------- item 18: error classes


def _error_of(call: object) -> BaseException:
    try:
        call()  # type: ignore[operator]
    except redcount.RedcountError as e:
        return e
    raise AssertionError("did not raise")


@pytest.mark.parametrize("mode", ["script", "commands"])
def test_a_counter_key_holding_a_foreign_value_raises_reply_error_on_both_stores(
        memory_store: redcount.Store, redis_store: redcount.Store, mode: str) -> None:
    # get() used to raise ProtocolError for a valid reply holding no number; every call
    # now raises the same ReplyError (never ScriptError: no script failed) on both stores.
    seen: dict[str, list[tuple[type, str]]] = {}
    for name, store in (("memory", memory_store), ("redis", redis_store)):
        c = redcount.FixedWindowCounter(store, "e", 3600, mode=mode)  # type: ignore[arg-type]
        for value in ("junk", "1.5"):
            store.execute("SET", c.storage_key("k"), value)
            for call in (lambda: c.get("k"), lambda: c.get_many(["k"]), lambda: c.incr("k")):
                err = _error_of(call)
                assert type(err) is redcount.ReplyError, err
                seen.setdefault(name, []).append((type(err), str(err)))
        store.execute("DEL", c.storage_key("k"))
        store.execute("HSET", c.storage_key("k"), "f", "v")
        for call in (lambda: c.get("k"), lambda: c.incr("k")):
            err = _error_of(call)
            assert type(err) is redcount.ReplyError and str(err).startswith("WRONGTYPE"), err
            seen[name].append((type(err), str(err)))
    assert seen["memory"] == seen["redis"]


STRATEGIES = ["fixed-window", "sliding-window", "sliding-window-approx", "token-bucket", "gcra", "concurrency"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_no_limiter_call_raises_on_a_foreign_value_on_either_store(store: redcount.Store, strategy: str) -> None:
    # WRONGTYPE inside a limiter script was ScriptError on Redis and a plain ReplyError on
    # memory; a foreign value is now garbage that every call copes with, on both.
    lim = redcount.Limiter(store, strategy)  # type: ignore[arg-type]
    lim.hit("3/minute", "k")
    (key,) = all_keys(store)
    for foreign in (("SET", key, "x"), ("HSET", key, "f", "v"), ("ZADD", key, 1, "m")):
        store.execute("DEL", key)
        store.execute(*foreign)
        assert lim.test("3/minute", "k")
        assert lim.stats("3/minute", "k")[0].remaining == 3
        assert lim.hit("3/minute", "k").remaining == 2


def test_sliding_counter_never_raises_on_a_foreign_value(store: redcount.Store) -> None:
    c = redcount.SlidingWindowCounter(store, "e", 60)
    keys = c.storage_keys("k")
    for key in keys:
        for foreign in (("SET", key, "x"), ("HSET", key, "f", "v"), ("ZADD", key, 1, "m")):
            store.execute("DEL", *keys)
            store.execute(*foreign)
            assert c.count("k") == 0
            assert c.add("k", 2) == 2
            assert c.count_unique("k") == 0 or key != keys[2]
            assert c.add_unique("k", "a") >= 1


# ------------------------------------------------------------ item 5: bounded server work


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
