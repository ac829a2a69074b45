"""Quota(durable=N) on real replicas: the WAIT after a write reports how many replicas
acknowledged it (``replicas``, ``durable_ok``) and never raises for too few; it runs on a
connection of its own, so the store's other callers never wait behind it; and the call's
deadline is command_timeout + durable_timeout, so a durable_timeout above command_timeout
is a result, not a TimeoutError. On one server (no replica, one, one stopped), on a cluster
and behind Sentinel."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redcount
import redcount.aio
from conftest import RedisServer
from helpers import wait_for_fresh_window, wait_until

pytestmark = pytest.mark.redis_only

Factory = Callable[..., RedisServer]

COMMAND_TIMEOUT = 1.0
DURABLE_TIMEOUT = 2.0  # above COMMAND_TIMEOUT on purpose


def _info(server_url: str, section: str) -> str:
    s = redcount.connect(server_url)
    try:
        return bytes(s.execute("INFO", section)).decode()  # type: ignore[arg-type]
    finally:
        s.close()


def _blocked_clients(server_url: str) -> int:
    for line in _info(server_url, "clients").splitlines():
        if line.startswith("blocked_clients:"):
            return int(line.split(":")[1])
    raise AssertionError("INFO clients has no blocked_clients")


def _master_with_replica(redis_factory: Factory) -> tuple[RedisServer, RedisServer]:
    master = redis_factory()
    replica = redis_factory(["--replicaof", "127.0.0.1", str(master.port)])
    wait_until(lambda: "master_link_status:up" in _info(replica.url, "replication"), timeout=15,
               what="the replica to sync")
    return master, replica


@pytest.fixture
def paused() -> Iterator[list[int]]:
    """Pids a test SIGSTOPs; continued at the end whatever happens."""
    pids: list[int] = []
    yield pids
    for pid in pids:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


class DurableCall(threading.Thread):
    """One durable call on its own thread; keeps its result, error and duration."""

    def __init__(self, call: Callable[[], Any]) -> None:
        super().__init__(daemon=True)
        self.call = call
        self.result: Any = None
        self.error: BaseException | None = None
        self.seconds = 0.0

    def run(self) -> None:
        t0 = time.monotonic()
        try:
            self.result = self.call()
        except BaseException as e:  # the test reports it
            self.error = e
        self.seconds = time.monotonic() - t0


def _others_meanwhile(store: redcount.Store, durable: DurableCall, blocked: Callable[[], bool]) -> list[float]:
    """Calls of every kind on `store` from this thread, sync and asyncio, while `durable`
    waits in WAIT; returns their durations. Each must be answered while the WAIT still
    blocks: they did not queue behind it."""
    counter = redcount.FixedWindowCounter(store, "others", window=60)
    plain = redcount.Quota(store, "plain-quota")
    seconds: list[float] = []

    def timed(call: Callable[[], object]) -> None:
        t0 = time.monotonic()
        call()
        seconds.append(time.monotonic() - t0)

    for i in range(5):
        timed(lambda: counter.incr("k"))
        timed(lambda: plain.give(1, request_id=f"p-{i}"))
        timed(store.ping)

    async def async_calls() -> None:
        acounter = redcount.aio.FixedWindowCounter.from_sync(counter)
        for _ in range(5):
            t0 = time.monotonic()
            await acounter.incr("k")
            seconds.append(time.monotonic() - t0)

    asyncio.run(async_calls())
    assert durable.is_alive() and blocked(), "the WAIT ended before the other calls did: nothing was shown"
    assert counter.get("k") == 10
    return seconds


def test_no_replica_is_a_result_and_the_write_counts_once(redis_factory: Factory) -> None:
    master = redis_factory()
    store = redcount.connect(master.url, command_timeout=COMMAND_TIMEOUT)
    try:
        q = redcount.Quota(store, "alone", durable=1, durable_timeout=0.2)
        r = q.set(10)
        assert r.applied and r.replicas == 0 and not r.durable_ok
        r = q.take(3, request_id="order-1")
        assert r.applied and r.value == 7 and r.replicas == 0 and not r.durable_ok
        # The retry a caller makes after durable_ok=False changes nothing (and needs no replica).
        again = q.take(3, request_id="order-1")
        assert again.applied and again.duplicate and again.value == 7 and again.durable_ok
        assert q.value() == 7
        # Refused: nothing written, nothing to wait for.
        assert not q.take(100).applied
        assert q.value() == 7
    finally:
        store.close()


def test_one_replica_acknowledges(redis_factory: Factory) -> None:
    master, replica = _master_with_replica(redis_factory)
    store = redcount.connect(master.url, command_timeout=COMMAND_TIMEOUT)
    try:
        q = redcount.Quota(store, "replicated", durable=1, durable_timeout=DURABLE_TIMEOUT)
        assert q.set(50).durable_ok
        r = q.take(5, request_id="a")
        assert r.applied and r.value == 45 and r.replicas == 1 and r.durable_ok
        reader = redcount.connect(replica.url)
        try:
            assert reader.execute("GET", q.storage_key()) == b"45"  # acknowledged: on the replica
        finally:
            reader.close()
    finally:
        store.close()


def test_a_stopped_replica_blocks_only_the_durable_call(redis_factory: Factory, paused: list[int]) -> None:
    master, replica = _master_with_replica(redis_factory)
    store = redcount.connect(master.url, command_timeout=COMMAND_TIMEOUT)
    try:
        q = redcount.Quota(store, "stock", durable=1, durable_timeout=DURABLE_TIMEOUT)
        assert q.set(100).replicas == 1
        assert replica.proc is not None
        os.kill(replica.proc.pid, signal.SIGSTOP)
        paused.append(replica.proc.pid)

        durable = DurableCall(lambda: q.take(1, request_id="order-9"))
        durable.start()
        wait_until(lambda: _blocked_clients(master.url) == 1, timeout=DURABLE_TIMEOUT,
                   what="the durable call's WAIT to block")
        seconds = _others_meanwhile(store, durable, lambda: _blocked_clients(master.url) == 1)
        assert max(seconds) < COMMAND_TIMEOUT / 4, seconds  # bounded by a reply, not by the WAIT
        durable.join(timeout=COMMAND_TIMEOUT + DURABLE_TIMEOUT + 5)

        # durable_timeout > command_timeout: the WAIT's own timeout ended the call, with a result.
        assert durable.error is None, repr(durable.error)
        r = durable.result
        assert r.applied and not r.duplicate and r.value == 99
        assert r.replicas == 0 and not r.durable_ok
        assert durable.seconds >= DURABLE_TIMEOUT - 0.05
        assert q.value() == 99  # applied exactly once
        again = q.take(1, request_id="order-9")
        assert again.duplicate and q.value() == 99

        # The same through asyncio (Store.submit): a result, not a TimeoutError.
        async def async_take() -> redcount.QuotaResult:
            return await redcount.aio.Quota.from_sync(q).take(2, request_id="order-10")

        r = asyncio.run(async_take())
        assert r.applied and r.value == 97 and r.replicas == 0 and not r.durable_ok

        os.kill(replica.proc.pid, signal.SIGCONT)
        wait_until(lambda: q.take(1, request_id="order-11").durable_ok, timeout=10,
                   what="the continued replica to acknowledge")
        assert q.value() == 96
    finally:
        store.close()


def test_a_dead_replica_with_many_durable_callers(redis_factory: Factory) -> None:
    """Durable calls share the blocking connections among themselves: eight threads at once,
    each answered with durable_ok=False, none with an error, every write applied once."""
    master, replica = _master_with_replica(redis_factory)
    # A generous command_timeout: a caller queued behind others' WAITs spends its deadline
    # there, and on 2 loaded cores eight threads can take a second to be scheduled.
    store = redcount.connect(master.url, command_timeout=5.0, max_connections=16)
    try:
        q = redcount.Quota(store, "many", durable=1, durable_timeout=0.3)
        q.set(1000)
        replica.kill()
        calls = [DurableCall(lambda i=i: q.take(1, request_id=f"m-{i}")) for i in range(8)]
        for c in calls:
            c.start()
        for c in calls:
            c.join(timeout=30)
        assert [c.error for c in calls] == [None] * 8
        assert all(c.result.applied and not c.result.durable_ok and c.result.replicas == 0 for c in calls)
        assert q.value() == 992
    finally:
        store.close()


def _wait_off_the_node_connection(store: redcount.Store, q: redcount.Quota, master: Any, replica: Any,
                                  counter_key: Callable[[redcount.FixedWindowCounter], str],
                                  command_timeout: float, durable_timeout: float) -> None:
    """With `replica` stopped, a durable take blocks in WAIT on `master` while a counter on
    the same master, through the same store, is answered; the take then reports
    durable_ok=False (no exception) and counted once."""
    master_url = f"redis://{master.addr}"
    before = q.value()
    counter = redcount.FixedWindowCounter(store, "others", window=60)
    key = counter_key(counter)
    # The counter's minute must hold until it is read back below (the take may wait out both
    # timeouts first): a minute that ended in between would read 0.
    wait_for_fresh_window(store, 60, command_timeout + 2 * durable_timeout + 10)
    replica.pause()
    try:
        durable = DurableCall(lambda: q.take(1, request_id="c-1"))
        durable.start()
        wait_until(lambda: _blocked_clients(master_url) == 1, timeout=durable_timeout,
                   what="the durable call's WAIT to block")
        t0 = time.monotonic()
        for _ in range(5):
            counter.incr(key)
        elapsed = time.monotonic() - t0
        assert durable.is_alive() and _blocked_clients(master_url) == 1, "the WAIT ended first"
        assert elapsed < command_timeout, elapsed
        durable.join(timeout=command_timeout + durable_timeout + 5)
    finally:
        replica.resume()
    assert durable.error is None, repr(durable.error)
    r = durable.result
    assert r.applied and r.value == before - 1 and r.replicas == 0 and not r.durable_ok
    assert q.value() == before - 1
    assert counter.get(key) == 5


# Below the cluster's node timeout (2 s): the stopped replica stays a member (Sentinel only
# marks it down, which starts no failover).
TOPOLOGY_COMMAND_TIMEOUT = 0.5
TOPOLOGY_DURABLE_TIMEOUT = 1.2


def test_on_a_cluster_the_wait_leaves_the_node_connection_free(redis_cluster: Any) -> None:
    store = redcount.connect(redis_cluster.url, command_timeout=TOPOLOGY_COMMAND_TIMEOUT)
    try:
        q = redcount.Quota(store, "clustered", durable=1, durable_timeout=TOPOLOGY_DURABLE_TIMEOUT)
        master = redis_cluster.node_for_key(q.storage_key())
        replica = redis_cluster.replicas(of=master)[0]
        r = q.set(20)
        assert r.replicas == 1 and r.durable_ok

        def on_master(counter: redcount.FixedWindowCounter) -> str:
            # A counter key on the quota's master: it shares that node's connection.
            return next(f"k{i}" for i in range(10_000)
                        if redis_cluster.node_for_key(counter.storage_key(f"k{i}")) == master)

        _wait_off_the_node_connection(store, q, master, replica, on_master,
                                      TOPOLOGY_COMMAND_TIMEOUT, TOPOLOGY_DURABLE_TIMEOUT)
    finally:
        store.close()


def test_behind_sentinel_the_wait_runs_on_the_master_off_its_shared_connection(
        redis_sentinel_factory: Callable[..., Any]) -> None:
    group = redis_sentinel_factory(replicas=1)
    store = redcount.connect(group.url, command_timeout=TOPOLOGY_COMMAND_TIMEOUT)
    try:
        q = redcount.Quota(store, "followed", durable=1, durable_timeout=TOPOLOGY_DURABLE_TIMEOUT)
        wait_until(lambda: q.set(20).durable_ok, timeout=10, what="the replica to acknowledge")
        _wait_off_the_node_connection(store, q, group.master(), group.replicas()[0], lambda c: "k",
                                      TOPOLOGY_COMMAND_TIMEOUT, TOPOLOGY_DURABLE_TIMEOUT)
    finally:
        store.close()
