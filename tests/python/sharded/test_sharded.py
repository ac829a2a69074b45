"""redcount.ShardedCounter: one suite over the memory store and a real redis-server,
plus the Redis-only checks: many processes, ambiguous failures, the retry queue."""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import socket
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from concurrent.futures import ProcessPoolExecutor

import pytest
import redcount
import redcount.aio
from conftest import RedisServer
from helpers import snapshot, wait_until
from sharded_workers import incr_ids

Factory = Callable[..., RedisServer]


# --------------------------------------------------------------------------- both stores


def test_incr_decr_and_value(store: redcount.Store) -> None:
    c = redcount.ShardedCounter(store, "likes", shards=8)
    assert c.value() == 0
    assert c.incr() is True
    assert c.incr(10) is True
    assert c.decr(3) is True
    assert c.incr(-2) is True
    assert c.value() == 6
    assert sum(c.shard_values()) == 6 and len(c.shard_values()) == 8


def test_request_ids_count_once_on_a_stable_shard(store: redcount.Store) -> None:
    c = redcount.ShardedCounter(store, "views", shards=16)
    assert c.incr(request_id="req-1") is True
    assert c.incr(request_id="req-1") is False
    assert c.incr(5, request_id="req-1") is False
    assert c.decr(request_id=b"req-2") is True
    assert c.value() == 0
    shard = c.shard_of("req-1")
    assert 0 <= shard < 16 and shard == c.shard_of("req-1")
    per = c.shard_values()
    assert per[shard] == 1 - (shard == c.shard_of("req-2"))
    # The id key sits on the shard's hash tag, with the idempotency TTL.
    rid_key = c.key_of(shard, "rid:req-1")
    assert rid_key == "{redcount:views:%d}:rid:req-1" % shard
    assert 86_300_000 < store.execute("PTTL", rid_key) <= 86_400_000  # type: ignore[operator]
    assert store.execute("PTTL", c.key_of(shard)) == -1
    # A shard's keys share its hash tag; each shard has its own.
    assert {c.key_of(shard, s).split("}")[0] for s in ("", "log", "rid:x")} == {"{redcount:views:%d" % shard}


def test_every_applied_delta_is_in_its_shards_log(store: redcount.Store) -> None:
    c = redcount.ShardedCounter(store, "audit", shards=4, log_maxlen=100)
    writes = [(3, "a"), (-1, "b"), (3, "a"), (7, None)]
    for amount, rid in writes:
        c.incr(amount, request_id=rid)
    logged = 0
    for shard in range(4):
        for _id, fields in store.execute("XRANGE", c.key_of(shard, "log"), "-", "+"):  # type: ignore[misc, union-attr]
            # delta and request id only: the counter and shard are the log's key
            assert fields[::2] == [b"delta", b"request_id"]
            f = dict(zip(fields[::2], fields[1::2]))
            logged += int(f[b"delta"])
    assert logged == c.value() == 9


def test_incr_many_over_counters_and_values(store: redcount.Store) -> None:
    a = redcount.ShardedCounter(store, "a", shards=4)
    got = a.incr_many([("a", 2, "x"), ("b", 5), ("a", 2, "x"), ("c", -1, None), ("b", 1, "x")])
    assert got == [True, True, False, True, True]
    assert a.values(["a", "b", "c", "none"]) == {"a": 2, "b": 6, "c": -1, "none": 0}
    assert a.incr_many([]) == []


def test_read_caches_for_max_staleness(store: redcount.Store) -> None:
    c = redcount.ShardedCounter(store, "hot")
    c.incr(10)
    first = c.read(60)
    assert first.value == 10 and first.staleness_ms >= 0
    c.incr(1)
    cached = c.read(max_staleness=60)
    assert cached.value == 10  # served from the cache
    value, staleness = cached
    assert staleness >= first.staleness_ms
    assert c.read(0).value == 11  # max_staleness 0: always fresh
    assert c.read(60).value == 11


def test_bad_input_is_refused_and_stores_nothing(store: redcount.Store) -> None:
    c = redcount.ShardedCounter(store, "bad")
    before = snapshot(store)
    with pytest.raises(redcount.InvalidInputError, match="amount must not be 0"):
        c.incr(0)
    with pytest.raises(redcount.InvalidInputError, match="request_id"):
        c.incr(request_id="")
    with pytest.raises(redcount.InvalidInputError, match="request_id"):
        c.incr(request_id="x" * 300)
    with pytest.raises(redcount.InvalidInputError, match="amount"):
        c.incr(2**60)
    with pytest.raises(TypeError, match="amount must be an int"):
        c.incr(1.5)  # type: ignore[arg-type]
    with pytest.raises(redcount.InvalidInputError, match="name"):
        c.incr_many([("ok", 1), ("bad{tag}", 1)])
    with pytest.raises(redcount.InvalidInputError):
        c.incr_many([("ok", 1, "id", "extra")])  # type: ignore[list-item]
    with pytest.raises(redcount.InvalidInputError, match="max_staleness"):
        c.read(-1)
    for kwargs in ({"shards": 0}, {"shards": 5000}, {"idempotency_ttl": 0}, {"route": "hash"},
                   {"log_maxlen": 0}, {"on_error": "ignore"}):
        with pytest.raises(redcount.InvalidInputError):
            redcount.ShardedCounter(store, "x", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(redcount.InvalidInputError, match="route='request-id'"):
        redcount.ShardedCounter(store, "r", route="random").incr(request_id="id")
    assert snapshot(store) == before


def test_id_keys_expire_after_idempotency_ttl_memory(clock: redcount.ManualClock,
                                                     clock_store: redcount.Store) -> None:
    c = redcount.ShardedCounter(clock_store, "ttl", idempotency_ttl=60)
    assert c.incr(request_id="r")
    clock.advance(59.9)
    assert not c.incr(request_id="r")
    clock.advance(0.2)
    assert clock_store.execute("EXISTS", c.key_of(c.shard_of("r"), "rid:r")) == 0
    assert c.incr(request_id="r")  # a new write once the id is forgotten
    assert c.value() == 2


def test_async_twin_has_the_same_results(store: redcount.Store) -> None:
    async def main() -> None:
        c = redcount.aio.ShardedCounter(store, "aio", shards=4)
        assert await c.incr(request_id="r") is True
        assert await c.incr(request_id="r") is False
        assert await c.decr(2) is True
        assert await c.incr_many([("aio", 5, "s"), ("other", 1)]) == [True, True]
        assert await c.value() == 4
        assert sum(await c.shard_values()) == 4
        assert await c.values(["aio", "other"]) == {"aio": 4, "other": 1}
        r = await c.read(0)
        assert r.value == 4
        assert c.sync.value() == 4
        shared = redcount.aio.ShardedCounter.from_sync(c.sync)
        assert await shared.incr(request_id="r") is False

    asyncio.run(main())


def test_threads_never_count_an_id_twice(store: redcount.Store) -> None:
    c = redcount.ShardedCounter(store, "threads", shards=8)
    ids = [f"id-{i % 700}" for i in range(2100)]
    applied = [0] * 8

    def run(t: int) -> None:
        for rid in ids[t::8]:
            applied[t] += c.incr(request_id=rid)

    ts = [threading.Thread(target=run, args=(t,)) for t in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sum(applied) == 700 == c.value()


# --------------------------------------------------------------------------- Redis only


@pytest.mark.redis_only
@pytest.mark.slow
def test_four_processes_four_threads_count_distinct_ids(redis_server: RedisServer,
                                                        redis_store: redcount.Store) -> None:
    distinct = 10_000 // 3 + 1
    ids = [f"req-{i % distinct}" for i in range(10_000)]
    ids = ids[0::2] + ids[1::2]  # each id's 3 copies land in different processes and threads
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=4, mp_context=ctx) as pool:
        futures = [pool.submit(incr_ids, redis_server.url, "multi", 16, ids[p::4], 4) for p in range(4)]
        applied = sum(f.result(timeout=120) for f in futures)
    c = redcount.ShardedCounter(redis_store, "multi", shards=16)
    assert c.value() == distinct == applied
    assert all(v > 0 for v in c.shard_values())


@pytest.mark.redis_only
def test_id_keys_expire_after_idempotency_ttl_redis(redis_store: redcount.Store) -> None:
    c = redcount.ShardedCounter(redis_store, "ttl", idempotency_ttl=0.3)
    assert c.incr(request_id="r")
    key = c.key_of(c.shard_of("r"), "rid:r")
    assert 0 < redis_store.execute("PTTL", key) <= 300  # type: ignore[operator]
    wait_until(lambda: redis_store.execute("EXISTS", key) == 0, what="the id key to expire")
    assert c.incr(request_id="r")
    assert c.value() == 2


class ReplyDropper:
    """A TCP proxy in front of a redis-server that can lose the next reply: with `drop` set,
    the next bytes from the server are thrown away and the client's connection is closed, as
    when a server dies after running a command and before its reply arrives."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream = upstream_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.drop = threading.Event()
        self.dropped = threading.Event()
        self._closing = False
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _accept(self) -> None:
        while not self._closing:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._pump, args=(client, server, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, True), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, replies: bool) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                if replies and self.drop.is_set():
                    self.drop.clear()
                    self.dropped.set()
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            s.close()

    def close(self) -> None:
        self._closing = True
        self.listener.close()


@pytest.fixture
def dropper(redis_server: RedisServer) -> Iterator[ReplyDropper]:
    d = ReplyDropper(redis_server.port)
    try:
        yield d
    finally:
        d.close()


def _reconnected(store: redcount.Store) -> bool:
    try:
        return store.ping()
    except redcount.ConnectionError:
        return False


@pytest.mark.redis_only
def test_a_write_whose_reply_was_lost_is_counted_once_when_retried(
        redis_store: redcount.Store, dropper: ReplyDropper) -> None:
    store = redcount.connect(dropper.url)
    c = redcount.ShardedCounter(store, "ambiguous", shards=4)
    assert c.incr(2, request_id="warmup")
    dropper.drop.set()
    with pytest.raises(redcount.ConnectionError) as info:
        c.incr(5, request_id="pay-1")
    assert info.value.maybe_applied is True
    assert dropper.dropped.is_set()
    # It did run: the server has it. The caller cannot know, so it retries with the same id.
    truth = redcount.ShardedCounter(redis_store, "ambiguous", shards=4)
    assert truth.value() == 7
    wait_until(lambda: _reconnected(store), what="the store to reconnect")
    assert c.incr(5, request_id="pay-1") is False  # already applied: not counted again
    assert truth.value() == 7
    store.close()


@pytest.mark.redis_only
def test_queued_retry_of_an_ambiguous_write_is_exactly_once(
        redis_store: redcount.Store, dropper: ReplyDropper) -> None:
    store = redcount.connect(dropper.url)
    c = redcount.ShardedCounter(store, "queued", shards=4, on_error="queue", retry_backoff=0.01,
                                retry_backoff_max=0.2)
    assert c.incr(1, request_id="a")
    dropper.drop.set()
    assert c.incr(5, request_id="pay-1") is True  # queued: it will be applied exactly once
    assert c.stats().queued == 1
    assert c.flush(timeout=10) == 0
    s = c.stats()
    assert s.delivered == 1 and s.failed == 0 and s.pending == 0
    assert redcount.ShardedCounter(redis_store, "queued", shards=4).value() == 6
    # Without a request id a retry could count twice, so the failure is raised, not queued.
    wait_until(lambda: _reconnected(store), what="the store to reconnect")
    dropper.drop.set()
    with pytest.raises(redcount.ConnectionError):
        c.incr(3)
    assert c.stats().queued == 1
    c.close()
    store.close()


@pytest.mark.redis_only
def test_queue_holds_writes_while_the_server_is_down(redis_factory: Factory) -> None:
    server = redis_factory()
    store = redcount.connect(server.url)
    c = redcount.ShardedCounter(store, "down", shards=4, on_error="queue", retry_backoff=0.01,
                                retry_backoff_max=0.1)
    assert c.incr(1, request_id="before")
    server.stop(save=True)
    for i in range(5):
        assert c.incr(2, request_id=f"while-{i}") is True
    assert c.incr(2, request_id="while-0") is True  # a repeat, queued too; counted once
    assert c.pending == 6
    server.start()
    assert c.flush(timeout=15) == 0
    assert c.value() == 11
    assert c.stats().delivered == 6
    c.close()
    store.close()


# --------------------------------------------------------------------------- BufferedCounter


def test_buffered_writes_on_max_pending_flush_and_close(store: redcount.Store) -> None:
    c = redcount.ShardedCounter(store, "buffered", shards=4)
    b = redcount.BufferedCounter(c, flush_every=3600, max_pending=10)  # no timed flush in this test
    for _ in range(9):
        b.incr()
    assert b.pending == 9 and c.value() == 0
    b.incr()  # the 10th unit wakes the flusher
    wait_until(lambda: c.value() == 10, what="the max_pending flush")
    b.incr(5)
    b.incr(-2)
    assert b.flush() == 0 and c.value() == 13
    b.incr(4)
    assert b.close() == 0
    assert c.value() == 17
    s = b.stats()
    assert s.flushed_units == 17 and s.failed_units == 0 and s.pending == 0
    with pytest.raises(redcount.RedcountError, match="closed"):
        b.incr()
    with pytest.raises(redcount.InvalidInputError):
        redcount.BufferedCounter(c, flush_every=0)
    with pytest.raises(redcount.InvalidInputError):
        redcount.BufferedCounter(c, max_pending=0)


def test_buffered_flushes_within_flush_every(store: redcount.Store) -> None:
    c = redcount.ShardedCounter(store, "timed")
    with redcount.BufferedCounter(c, flush_every=0.02, max_pending=10**9) as b:
        b.incr(3)
        # Nothing but time triggers this write.
        wait_until(lambda: c.value() == 3, what="the timed flush")
        assert b.pending == 0
        assert b.stats().flushes == 1


def test_buffered_bad_amounts(memory_store: redcount.Store) -> None:
    b = redcount.BufferedCounter(redcount.ShardedCounter(memory_store, "bad"))
    for amount in (0, 2**41, -(2**41)):
        with pytest.raises(redcount.InvalidInputError):
            b.incr(amount)
    with pytest.raises(redcount.InvalidInputError, match="route"):
        redcount.BufferedCounter(redcount.ShardedCounter(memory_store, "r", route="random"))
    assert b.close() == 0


@pytest.mark.redis_only
def test_buffered_fork_child_starts_empty(redis_store: redcount.Store, redis_server: RedisServer) -> None:
    import os

    store = redcount.connect(redis_server.url)
    c = redcount.ShardedCounter(store, "forked")
    b = redcount.BufferedCounter(c, flush_every=3600, max_pending=10**9)
    b.incr(5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork of a threaded process
        pid = os.fork()
    if pid == 0:  # the child: its own pending sum, written by its own flusher
        code = 1
        try:
            child = redcount.connect(redis_server.url)
            cb = redcount.BufferedCounter(redcount.ShardedCounter(child, "forked"), flush_every=3600)
            ok = b.pending == 0
            b.incr(2)
            cb.incr(1)
            code = 0 if ok and b.close() == 0 and cb.close() == 0 else 2
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert c.value() == 3  # the child wrote its own 2 + 1, not the parent's 5
    assert b.close() == 0
    assert c.value() == 8
    store.close()


def test_buffered_forks_after_flushes_never_hang_the_child() -> None:
    # The parent's flusher waits on a condition variable when the fork happens; a child that
    # reuses it as it was (waiters that do not exist there) hung in close() most times.
    import os

    store = redcount.connect("memory://")
    c = redcount.ShardedCounter(store, "forks")
    b = redcount.BufferedCounter(c, flush_every=3600, max_pending=10**9)
    hung = failed = 0
    for _ in range(10):
        b.incr(1)
        b.flush()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork of a threaded process
            pid = os.fork()
        if pid == 0:
            code = 1
            try:
                b.incr(2)
                code = 0 if b.close() == 0 else 2
            finally:
                os._exit(code)
        deadline = time.monotonic() + 10
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                failed += os.waitstatus_to_exitcode(status) != 0
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                hung += 1
                break
            time.sleep(0.01)
    assert (hung, failed) == (0, 0)
    assert b.close() == 0
    assert c.value() == 10  # the parent's own; each child wrote to its own memory store
    store.close()


@pytest.mark.redis_only
def test_buffered_crash_loses_at_most_the_reported_pending(redis_server: RedisServer,
                                                            redis_store: redcount.Store) -> None:
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import os, time, redcount
        store = redcount.connect({redis_server.url!r})
        b = redcount.BufferedCounter(redcount.ShardedCounter(store, "crash"), flush_every=3600, max_pending=100)
        for _ in range(250):
            b.incr()
        deadline = time.monotonic() + 10
        while b.pending >= 100 and time.monotonic() < deadline:
            time.sleep(0.001)  # polling: the flusher writes whenever 100 units piled up
        print(b.pending, flush=True)
        os._exit(0)  # a crash: no close(), no atexit
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True)
    pending = int(out.stdout.strip())
    value = redcount.ShardedCounter(redis_store, "crash").value()
    assert 250 - pending <= value <= 250
    # What is left is under max_pending: a flush takes the whole sum when it runs, so the
    # batches are not always 100 (the increments race it), but 100 units always wake it.
    assert pending < 100
