"""Foreign writes to redcount's keys, on both stores: every key redcount writes keeps a TTL
no longer than the documentation promises, and no foreign value wedges a key.

- an expiry far in the future (PEXPIRE 10^12) is cut back, not only a missing one restored
  (the hour-boundary flake test_ttl_invariants once had was this);
- request-id keys get their TTL back after a PERSIST;
- refused GCRA and fixed-window hits repair their keys (a stale GCRA time, a foreign
  count <= 0);
- a foreign value of another type, without a TTL, does not wedge a key: limiter and
  sliding-counter keys start afresh, a fixed-window counter's key raises ReplyError but
  ends with its window;
- the errors a foreign value causes are the same classes on both stores.
"""

from __future__ import annotations

import time

import pytest
import redcount
from helpers import all_keys, ms, wait_for_fresh_window

FAR = 10**12  # ms: about 31 years
STRATEGIES = ["fixed-window", "sliding-window", "sliding-window-approx", "token-bucket", "gcra", "concurrency"]


def bounded(store: redcount.Store, key: bytes | str, most_ms: int) -> None:
    """`key` exists with a TTL in (0, most_ms]."""
    left = store.execute("PTTL", key)
    assert 0 < left <= most_ms, f"{key!r}: PTTL {left}, at most {most_ms} expected"


def left_until(store: redcount.Store, t: float) -> int:
    return ms(t) - ms(store.now()) + 1


# --------------------------------------------------------------- far expiries


@pytest.mark.parametrize("mode", ["script", "commands"])
def test_a_far_foreign_expiry_on_a_counter_key_is_cut_back(store: redcount.Store, mode: str) -> None:
    c = redcount.FixedWindowCounter(store, "far", 60, grace=1.0, mode=mode)  # type: ignore[arg-type]
    wait_for_fresh_window(store, 60, 2)
    assert c.incr("k") == 1
    key = c.storage_key("k")
    store.execute("PEXPIRE", key, FAR)
    assert c.incr("k") == 2
    _, end = c.current_window("k")
    bounded(store, key, left_until(store, end + 1.0))
    assert c.incr_many({"k": 1, "j": 1}) == {"k": 3, "j": 1}
    store.execute("PEXPIRE", key, FAR)
    c.incr_many({"k": 1})
    bounded(store, key, left_until(store, end + 1.0))


@pytest.mark.parametrize("mode", ["script", "commands"])
def test_a_foreign_ttl_longer_than_the_window_is_cut_back_at_any_time_of_day(store: redcount.Store, mode: str) -> None:
    # test_ttl_invariants' test_foreign_set_with_a_short_ttl_keeps_a_bounded_ttl gave the key
    # 100 s on an hourly window: within 100 s of the hour that outlived window + grace, and
    # the old scripts kept it. A 60 s window makes that moment every minute, deterministically.
    c = redcount.FixedWindowCounter(store, "short", 60, grace=1.0, mode=mode)  # type: ignore[arg-type]
    wait_for_fresh_window(store, 60, 2)
    key = c.storage_key("k")
    store.execute("SET", key, "5", "PX", 100_000)
    assert c.incr("k") == 6
    _, end = c.current_window("k")
    bounded(store, key, left_until(store, end + 1.0))


def test_the_hour_boundary_case_on_a_frozen_clock(clock: redcount.ManualClock, clock_store: redcount.Store) -> None:
    # The flake itself, replayed on the memory store 50 s before the top of an hour.
    clock.set((int(clock.now()) // 3600 + 1) * 3600 - 50.0)
    for mode in ("script", "commands"):
        c = redcount.FixedWindowCounter(clock_store, f"hour-{mode}", 3600, mode=mode)  # type: ignore[arg-type]
        key = c.storage_key("k")
        clock_store.execute("SET", key, "5", "PX", 100_000)
        assert c.incr("k") == 6
        assert clock_store.execute("PTTL", key) == 50_000 + 1_000  # window end + grace, exactly


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_far_foreign_expiry_on_a_limiter_key_is_cut_back(store: redcount.Store, strategy: str) -> None:
    lim = redcount.Limiter(store, strategy)  # type: ignore[arg-type]
    wait_for_fresh_window(store, 60, 2)
    assert lim.hit("2/minute", "k")
    (key,) = all_keys(store)
    # the window (+ 1 s grace for fixed windows; the approximation's oldest sub-bucket
    # weighs in for one more window)
    most = 120_000 if strategy == "sliding-window-approx" else 61_000
    # An allowed hit...
    store.execute("PEXPIRE", key, FAR)
    assert lim.hit("2/minute", "k")
    bounded(store, key, most)
    # ...and a refused one.
    store.execute("PEXPIRE", key, FAR)
    assert not lim.hit("2/minute", "k")
    bounded(store, key, most)


def test_a_far_foreign_expiry_on_sliding_counter_keys_is_cut_back(store: redcount.Store) -> None:
    c = redcount.SlidingWindowCounter(store, "far", 60)
    c.add("k", 3)
    c.add_unique("k", "a")
    events, weight, uniq = c.storage_keys("k")
    for key in (events, weight, uniq):
        store.execute("PEXPIRE", key, FAR)
    c.add("k", 2)
    c.add_unique("k", "b")
    for key in (events, weight, uniq):
        bounded(store, key, 60_000)


# ------------------------------------------------------------ request-id keys


@pytest.mark.parametrize("foreign", [("PERSIST",), ("PEXPIRE", FAR)])
def test_a_request_id_key_gets_its_ttl_back(store: redcount.Store, foreign: tuple[object, ...]) -> None:
    c = redcount.FixedWindowCounter(store, "ids", 60, grace=1.0)
    wait_for_fresh_window(store, 60, 2)
    assert c.incr("k", request_id="r1") == 1
    (rid,) = [k for k in all_keys(store) if b":rid:" in k]
    store.execute(foreign[0], rid, *foreign[1:])
    assert c.incr("k", request_id="r1") == 1  # a repeat: counts nothing, repairs the id's key
    _, end = c.current_window("k")
    bounded(store, rid, left_until(store, end + 1.0))
    bounded(store, c.storage_key("k"), left_until(store, end + 1.0))


# -------------------------------------------------------- refused hits repair


def test_a_refused_gcra_hit_repairs_a_stale_key(clock: redcount.ManualClock, clock_store: redcount.Store) -> None:
    # 1/hour refuses the second hit; the 1/second key then holds a time already past, and
    # had lost its TTL: the old script left it for ever (token-bucket repaired it).
    for strategy in ("gcra", "token-bucket"):
        lim = redcount.Limiter(clock_store, strategy, prefix=strategy)  # type: ignore[arg-type]
        assert lim.hit("1/hour;1/second", "k")
        for key in all_keys(clock_store, f"{strategy}:*"):
            clock_store.execute("PERSIST", key)
        clock.advance(10)
        assert not lim.hit("1/hour;1/second", "k")
        for key in all_keys(clock_store, f"{strategy}:*"):
            assert clock_store.execute("PTTL", key) != -1, (strategy, key)


@pytest.mark.redis_only
def test_a_refused_gcra_hit_repairs_a_stale_key_on_redis(redis_server: object) -> None:
    clock = redcount.ManualClock(time.time())
    store = redcount.connect(f"redis://127.0.0.1:{redis_server.port}/0", clock=clock)  # type: ignore[attr-defined]
    try:
        store.execute("FLUSHALL")
        lim = redcount.Limiter(store, "gcra")
        assert lim.hit("1/hour;1/second", "k")
        keys = all_keys(store)
        for key in keys:
            store.execute("PERSIST", key)
        clock.advance(10)
        assert not lim.hit("1/hour;1/second", "k")
        for key in keys:
            assert store.execute("PTTL", key) != -1, key
    finally:
        store.close()


@pytest.mark.parametrize("foreign", ["0", "-3"])
def test_a_refused_fixed_window_hit_repairs_a_foreign_count_of_at_most_zero(store: redcount.Store,
                                                                          foreign: str) -> None:
    lim = redcount.Limiter(store, prefix="L")
    wait_for_fresh_window(store, 60, 2)
    assert lim.hit("1/minute;5/hour", "k")
    (minute,) = [k for k in all_keys(store) if b":60000:" in k]
    (hour,) = [k for k in all_keys(store) if b":3600000:" in k]
    store.execute("SET", hour, foreign)  # no TTL
    assert not lim.hit("1/minute;5/hour", "k")  # refused by the minute
    bounded(store, hour, 3_601_000)


# ----------------------------------------------- values of another type


FOREIGN_OF: dict[str, tuple[object, ...]] = {"string": ("HSET", "f", "v"), "other": ("SET", "3")}


def _foreign(store: redcount.Store, key: bytes) -> str:
    kind = str(store.execute("TYPE", key))
    command = FOREIGN_OF["string" if kind == "string" else "other"]
    store.execute("DEL", key)
    store.execute(command[0], key, *command[1:])
    assert store.execute("PTTL", key) == -1
    return kind


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_a_foreign_write_of_another_type_does_not_wedge_a_limiter(store: redcount.Store, strategy: str) -> None:
    lim = redcount.Limiter(store, strategy)  # type: ignore[arg-type]
    assert lim.hit("2/minute", "k")
    (key,) = all_keys(store)
    kind = _foreign(store, key)
    s = lim.stats("2/minute", "k")[0]
    assert s.count == 0  # garbage counts nothing
    d = lim.hit("2/minute", "k")
    assert d and d.remaining == 1
    assert store.execute("TYPE", key) == kind
    bounded(store, key, 120_000 if strategy == "sliding-window-approx" else 61_000)


def test_a_foreign_write_of_another_type_does_not_wedge_leases(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, "concurrency")
    lease = lim.acquire(2, "job", lease_timeout=30)
    assert lease is not None
    (key,) = all_keys(store)
    _foreign(store, key)
    assert lim.in_flight("job") == 0
    assert lim.acquire(2, "job", lease_timeout=30) is not None
    bounded(store, key, 30_000)


def test_a_foreign_write_of_another_type_does_not_wedge_a_sliding_counter(store: redcount.Store) -> None:
    c = redcount.SlidingWindowCounter(store, "w", 60)
    c.add("k", 2)
    c.add_unique("k", "a")
    events, weight, uniq = c.storage_keys("k")
    for key in (events, uniq):
        _foreign(store, key)
    store.execute("DEL", weight)
    store.execute("HSET", weight, "f", "v")
    assert c.count("k") == 0
    assert c.add("k") == 1
    assert c.add_unique("k", "b") == 1
    for key in (events, uniq):
        bounded(store, key, 60_000)
    assert store.execute("EXISTS", weight) == 0


@pytest.mark.parametrize("mode", ["script", "commands"])
def test_a_foreign_write_on_a_counter_key_raises_but_ends_with_the_window(store: redcount.Store, mode: str) -> None:
    # A counter's key holds acknowledged counts, which are never thrown away: a foreign
    # value is an error (ReplyError), and the key gets its window's deadline, so it goes
    # with its window instead of living for ever.
    c = redcount.FixedWindowCounter(store, "fw", 60, grace=1.0, mode=mode)  # type: ignore[arg-type]
    wait_for_fresh_window(store, 60, 2)
    key = c.storage_key("k")
    for command in (("HSET", key, "f", "v"), ("SET", key, "junk")):
        store.execute("DEL", key)
        store.execute(*command)
        with pytest.raises(redcount.ReplyError) as err:
            c.incr("k")
        assert not isinstance(err.value, redcount.ScriptError)
        _, end = c.current_window("k")
        bounded(store, key, left_until(store, end + 1.0))


# ---------------------------------------------------- the same error classes on both stores


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
