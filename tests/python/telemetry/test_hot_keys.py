"""redcount.HotKeys: the Space-Saving table from Python, the store hook on
memory:// and real Redis (the keys a workload of counters and limiters touches show up with
the right counts, for sync and asyncio callers), and fork (the child starts empty)."""

from __future__ import annotations

import asyncio
import os
import random
from collections import Counter

import pytest

import redcount
import redcount.aio
from conftest import RedisServer


def test_exact_counts_under_capacity_and_the_api() -> None:
    hk = redcount.HotKeys(capacity=10)
    assert hk.capacity == 10 and hk.total == 0 and hk.top() == []
    for key, n in [("a", 3), ("b", 5), ("a", 4), ("c", 1)]:
        hk.observe(key, n)
    hk.observe(b"c")
    top = hk.top(2)
    assert [(k.key, k.count, k.error) for k in top] == [("a", 7, 0), ("b", 5, 0)]
    assert isinstance(top[0], redcount.HotKey)
    assert hk.total == 14 and len(hk) == 3
    hk.reset()
    assert hk.total == 0 and hk.top() == []


def test_guarantee_on_a_zipf_stream() -> None:
    hk = redcount.HotKeys(capacity=50)
    rng = random.Random(7)
    keys = [f"k{i}" for i in range(3000)]
    weights = [1.0 / (i + 1) ** 1.2 for i in range(3000)]
    exact = Counter(rng.choices(keys, weights, k=50_000))
    stream = list(exact.elements())
    rng.shuffle(stream)
    for k in stream:
        hk.observe(k)
    bound = hk.total / hk.capacity
    table = {k.key: k for k in hk.top(hk.capacity)}
    assert len(table) == 50
    for k in table.values():
        assert k.count - k.error <= exact[k.key] <= k.count
        assert k.error <= bound
    heavy = [k for k, n in exact.items() if n > bound]
    assert heavy and all(k in table for k in heavy)


@pytest.mark.parametrize(
    ("args", "call"),
    [
        ((0,), None),
        ((-1,), None),
        ((10**7,), None),
        ((10,), lambda hk: hk.observe("")),
        ((10,), lambda hk: hk.observe("k", 0)),
        ((10,), lambda hk: hk.observe("k", -3)),
        ((10,), lambda hk: hk.top(-1)),
    ],
)
def test_bad_input(args: tuple[int, ...], call: object) -> None:
    if call is None:
        with pytest.raises(redcount.InvalidInputError):
            redcount.HotKeys(*args)
        return
    hk = redcount.HotKeys(*args)
    with pytest.raises(redcount.InvalidInputError):
        call(hk)  # type: ignore[operator]
    assert hk.total == 0
    with pytest.raises(TypeError):
        redcount.connect(hot_keys=object())  # type: ignore[arg-type]


def workload(store: redcount.Store) -> dict[str, int]:
    """Counters and a limiter on `store`; returns the storage keys and how often each was touched."""
    views = redcount.FixedWindowCounter(store, "views", window=3600)
    likes = redcount.ShardedCounter(store, "likes", shards=4)
    limiter = redcount.Limiter(store, "fixed-window")
    for _ in range(30):
        views.incr("page:home")
    for _ in range(5):
        views.incr("page:about")
    for i in range(12):
        likes.incr(request_id=f"r{i % 4}")  # 4 ids: each to its shard, 3 times
    for _ in range(8):
        limiter.hit("100/minute", "ip:1")
    per_shard = Counter(likes.key_of(likes.shard_of(f"r{i}")) for i in range(4))
    expected = {views.storage_key("page:home"): 30, views.storage_key("page:about"): 5}
    for key, n in per_shard.items():
        expected[key] = 3 * n
    return expected


def test_store_hook_sees_counters_and_limiters(store: redcount.Store) -> None:
    hk = redcount.HotKeys(capacity=100)
    url = "memory://" if store.is_memory else store.url
    observed = redcount.connect(url, hot_keys=hk)
    try:
        expected = workload(observed)
        table = {k.key: k.count for k in hk.top(100)}
        for key, n in expected.items():
            assert table.get(key) == n, (key, table)
        assert hk.top(1)[0].key == next(k for k, n in expected.items() if n == 30)
        # The limiter's window key was observed once per hit (a script call, KEYS[1]).
        assert sorted(table.values()).count(8) >= 1
        assert all(k.error == 0 for k in hk.top(100))
        assert observed.url == store.url and observed.is_memory == store.is_memory
    finally:
        observed.close()


def test_store_hook_on_asyncio(redis_server: RedisServer) -> None:
    hk = redcount.HotKeys(capacity=100)

    async def main() -> str:
        astore = redcount.aio.connect(redis_server.url, hot_keys=hk)
        try:
            views = redcount.aio.FixedWindowCounter(astore, "aviews", window=3600)
            await asyncio.gather(*(views.incr("p") for _ in range(20)))
            return str(views.storage_key("p"))
        finally:
            astore.close()

    key = asyncio.run(main())
    assert hk.top(1)[0].key == key and hk.top(1)[0].count == 20


def test_without_hot_keys_the_store_is_not_wrapped() -> None:
    s = redcount.connect()
    try:
        assert not isinstance(s, redcount._core.HotKeysStore)
    finally:
        s.close()


def test_resilient_store_attributes_read_through(redis_server: RedisServer) -> None:
    hk = redcount.HotKeys()
    s = redcount.connect(redis_server.url, budget=0.5, hot_keys=hk)
    try:
        assert s.breaker_state == "closed"  # type: ignore[attr-defined]
        redcount.FixedWindowCounter(s, "r", window=60).incr("k")
        assert hk.total == 1
    finally:
        s.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_a_forked_child_starts_empty() -> None:
    hk = redcount.HotKeys(capacity=10)
    store = redcount.connect(hot_keys=hk)
    c = redcount.FixedWindowCounter(store, "f", window=60)
    for _ in range(5):
        c.incr("k")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report what it sees, then count its own
        try:
            before = hk.total
            c.incr("k")
            after = [(k.key, k.count) for k in hk.top()]
            os.write(w, repr((before, after)).encode())
        finally:
            os._exit(0)
    os.close(w)
    data = b""
    while chunk := os.read(r, 4096):
        data += chunk
    os.close(r)
    os.waitpid(pid, 0)
    before, after = eval(data.decode())  # our own repr of ints and strings
    assert before == 0
    assert after == [(c.storage_key("k"), 1)]
    assert hk.total == 5  # the parent's table is untouched
    store.close()


def test_a_key_that_is_not_utf8_comes_back_as_text() -> None:
    hk = redcount.HotKeys()
    store = redcount.connect(hot_keys=hk)
    try:
        store.execute("SET", b"raw\xff", "1")
        assert hk.top(1)[0].key == b"raw\xff".decode("utf-8", "surrogateescape")
        assert "raw" in repr(hk.top(1)[0])
    finally:
        store.close()
