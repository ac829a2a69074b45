"""SlidingWindowCounter on both stores: millisecond-exact windows, events of one millisecond
that never collide, distinct items, weighted adds, keys that always carry a TTL."""

from __future__ import annotations

import threading
import time

import pytest
import redcount
from conftest import RedisServer
from helpers import all_keys


def test_counts_the_last_window_to_the_millisecond(clock_store: redcount.Store, clock: redcount.ManualClock) -> None:
    c = redcount.SlidingWindowCounter(clock_store, "req", 10)
    assert c.add("k") == 1
    clock.advance(4)
    assert c.add("k") == 2
    clock.advance(5.999)
    assert c.count("k") == 2  # the first event is 9.999 s old
    clock.advance(0.001)
    assert c.count("k") == 1  # 10 s old: gone
    assert c.add("k") == 2
    clock.advance(10)
    assert c.count("k") == 0


def test_events_in_one_millisecond_never_overwrite_each_other(store: redcount.Store) -> None:
    c = redcount.SlidingWindowCounter(store, "req", 60)
    for i in range(1, 501):
        assert c.add("k") == i
    assert c.count("k") == 500
    events, _, _ = c.storage_keys("k")
    assert store.execute("ZCARD", events) == 500


def test_threads_lose_no_event(store: redcount.Store) -> None:
    c = redcount.SlidingWindowCounter(store, "req", 60)

    def work() -> None:
        for _ in range(300):
            c.add("shared")

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert c.count("shared") == 1200


def test_weighted_adds_are_one_member_each(clock_store: redcount.Store, clock: redcount.ManualClock) -> None:
    c = redcount.SlidingWindowCounter(clock_store, "bytes", 10)
    assert c.add("k", 1000) == 1000
    clock.advance(3)
    assert c.add("k") == 1001
    assert c.add("k", 50) == 1051
    events, weight, _ = c.storage_keys("k")
    assert clock_store.execute("ZCARD", events) == 3
    clock.advance(7)  # the 1000 leaves
    assert c.count("k") == 51
    assert c.add("k", 2) == 53
    clock.advance(10)
    assert c.count("k") == 0
    assert c.add("k") == 1
    assert clock_store.execute("EXISTS", weight) == 0  # no weighted event left: no weight key


def test_distinct_items(clock_store: redcount.Store, clock: redcount.ManualClock) -> None:
    c = redcount.SlidingWindowCounter(clock_store, "visitors", 60)
    assert c.add_unique("page", "ip1") == 1
    assert c.add_unique("page", "ip2") == 2
    assert c.add_unique("page", "ip1") == 2  # seen again: not new, but its time is refreshed
    clock.advance(30)
    assert c.add_unique("page", "ip3") == 3
    clock.advance(30)  # ip1 and ip2 were last seen 60 s ago: both leave
    assert c.count_unique("page") == 1
    assert c.add_unique("page", "ip1") == 2
    assert c.count("page") == 0  # distinct items and events are separate sets
    assert c.add_unique("page", b"\xd0\xba") == 3  # bytes items (UTF-8)


def test_refreshing_an_item_keeps_it(clock_store: redcount.Store, clock: redcount.ManualClock) -> None:
    c = redcount.SlidingWindowCounter(clock_store, "v", 10)
    c.add_unique("k", "a")
    clock.advance(9)
    c.add_unique("k", "a")
    clock.advance(9)
    assert c.count_unique("k") == 1


def test_granularities_of_one_key_are_separate(store: redcount.Store) -> None:
    minute = redcount.SlidingWindowCounter(store, "req", 60)
    hour = redcount.SlidingWindowCounter(store, "req", 3600)
    minute.add("k")
    hour.add("k", 5)
    assert (minute.count("k"), hour.count("k")) == (1, 5)
    assert minute.storage_keys("k")[0] == "redcount:req:{k}:60000:log"
    assert hour.storage_keys("k")[0] == "redcount:req:{k}:3600000:log"


def test_clear(store: redcount.Store) -> None:
    c = redcount.SlidingWindowCounter(store, "req", 60)
    c.add("k", 3)
    c.add_unique("k", "x")
    c.add("other")
    c.clear("k")
    assert (c.count("k"), c.count_unique("k"), c.count("other")) == (0, 0, 1)
    assert all_keys(store) == [b"redcount:req:{other}:60000:log"]


def test_every_key_has_a_ttl_of_the_window_and_gets_it_back(store: redcount.Store) -> None:
    c = redcount.SlidingWindowCounter(store, "req", 30)
    c.add("k", 4)
    c.add_unique("k", "x")
    keys = all_keys(store)
    assert len(keys) == 3
    for k in keys:
        assert 29_000 < store.execute("PTTL", k) <= 30_000
        store.execute("PERSIST", k)
    c.add("k", 2)
    c.add_unique("k", "y")
    for k in all_keys(store):
        assert 29_000 < store.execute("PTTL", k) <= 30_000, k


@pytest.mark.redis_only
def test_real_time_on_redis(redis_store: redcount.Store) -> None:
    c = redcount.SlidingWindowCounter(redis_store, "rt", 0.3)
    assert c.add("k") == 1
    assert c.add("k") == 2
    time.sleep(0.35)
    assert c.count("k") == 0
    assert c.add("k") == 1


@pytest.mark.redis_only
def test_server_clock_ignores_a_skewed_client(redis_server: RedisServer) -> None:
    skewed = redcount.connect(redis_server.url, clock=redcount.ManualClock(time.time() - 3600))
    skewed.execute("FLUSHALL")
    fine = redcount.connect(redis_server.url)
    a = redcount.SlidingWindowCounter(skewed, "s", 60, clock="server")
    b = redcount.SlidingWindowCounter(fine, "s", 60, clock="server")
    a.add("k")
    b.add("k")
    assert a.count("k") == b.count("k") == 2
    (key,) = all_keys(fine)
    (_, score) = fine.execute("ZRANGE", key, 0, 0, "WITHSCORES")
    assert abs(float(score) / 1000 - time.time()) < 5  # stamped with the server's time
    skewed.close()
    fine.close()


@pytest.mark.parametrize(
    ("amount", "match"),
    [(0, "amount must be between 1 and 2\\^32"), (-3, "between 1"), (2**32 + 1, "between 1"), (2**70, "amount")],
)
def test_bad_amounts(store: redcount.Store, amount: int, match: str) -> None:
    c = redcount.SlidingWindowCounter(store, "req", 60)
    with pytest.raises(redcount.InvalidInputError, match=match):
        c.add("k", amount)
    assert all_keys(store) == []


@pytest.mark.parametrize("window", [0, -1, 0.0004, float("nan"), float("inf")])
def test_bad_windows(store: redcount.Store, window: float) -> None:
    with pytest.raises(redcount.InvalidInputError):
        redcount.SlidingWindowCounter(store, "req", window)


@pytest.mark.parametrize("key", ["", "x" * 1025, b"\xff\xfe"])
def test_bad_keys_and_items(store: redcount.Store, key: str | bytes) -> None:
    c = redcount.SlidingWindowCounter(store, "req", 60)
    for call in (lambda: c.add(key), lambda: c.count(key), lambda: c.add_unique(key, "i"), lambda: c.add_unique("k", key)):
        with pytest.raises(redcount.InvalidInputError):
            call()
    assert all_keys(store) == []


def test_a_foreign_value_is_garbage_and_the_key_starts_afresh(store: redcount.Store) -> None:
    # The next call deletes a foreign value of another type (or a weight
    # that is no number) and counts from nothing.
    c = redcount.SlidingWindowCounter(store, "req", 60)
    events, weight, uniq = c.storage_keys("k")
    store.execute("SET", events, "x")
    assert c.add("k") == 1
    assert store.execute("TYPE", events) == "zset" and store.execute("PTTL", events) > 0
    store.execute("SET", weight, "nope")
    assert c.count("k") == 1
    assert store.execute("EXISTS", weight) == 0
    store.execute("HSET", weight, "f", "v")
    assert c.add("k", 3) == 4
    assert store.execute("GET", weight) == b"2"
    store.execute("SET", uniq, "x")
    assert c.count_unique("k") == 0
    store.execute("SET", uniq, "x")
    assert c.add_unique("k", "a") == 1
