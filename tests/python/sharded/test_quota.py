"""redcount.Quota (strong mode): one suite over both stores, the exact hand-out
under concurrency, and durable=N against a real replica."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

import pytest
import redcount
import redcount.aio
from conftest import RedisServer
from helpers import snapshot
from sharded_workers import take_until_empty

Factory = Callable[..., RedisServer]


def test_take_is_refused_at_the_floor_and_changes_nothing(store: redcount.Store) -> None:
    q = redcount.Quota(store, "credits", floor=0, ceiling=100)
    assert q.value() == 0
    assert not q.take()
    assert q.set(50)
    r = q.take(45)
    assert r and r.applied and r.value == 5 and not r.duplicate
    r = q.take(6)
    assert not r and r.value == 5
    assert q.value() == 5
    assert q.take(5).value == 0
    assert not q.give(101)
    assert q.give(100).value == 100
    assert not q.give(1)
    assert q.value() == 100
    assert q.storage_key() == "redcount:quota:{credits}"


def test_negative_floor_for_overdraft(store: redcount.Store) -> None:
    q = redcount.Quota(store, "overdraft", floor=-10)
    assert q.take(10).value == -10
    assert not q.take(1)
    assert q.value() == -10


def test_soft_threshold_reports_without_refusing(store: redcount.Store) -> None:
    q = redcount.Quota(store, "soft", soft=20)
    q.set(30)
    r = q.take(5)
    assert r and not r.soft_exceeded
    r = q.take(10)
    assert r and r.soft_exceeded and r.value == 15
    assert "soft_exceeded=True" in repr(r)


def test_take_with_a_request_id_is_idempotent(store: redcount.Store) -> None:
    q = redcount.Quota(store, "stock")
    q.set(10)
    assert not q.take(11, request_id="order-1")
    r = q.take(4, request_id="order-1")  # a refused take did not use up the id
    assert r.applied and not r.duplicate and r.value == 6
    r = q.take(4, request_id="order-1")
    assert r.applied and r.duplicate and r.value == 6
    assert q.give(4, request_id="refund-1").value == 10
    assert q.give(4, request_id="refund-1").duplicate
    assert q.value() == 10


def test_bad_input_is_refused_and_stores_nothing(store: redcount.Store) -> None:
    q = redcount.Quota(store, "bad", floor=0, ceiling=10)
    before = snapshot(store)
    for call in (lambda: q.take(0), lambda: q.take(-1), lambda: q.give(0), lambda: q.set(11),
                 lambda: q.set(-1), lambda: q.take(2**60), lambda: q.take(1, request_id="")):
        with pytest.raises(redcount.InvalidInputError):
            call()
    for kwargs in ({"ceiling": -1}, {"floor": 2**60}, {"durable": -1}, {"idempotency_ttl": 0},
                   {"durable": 1, "durable_timeout": 0}):
        with pytest.raises(redcount.InvalidInputError):
            redcount.Quota(store, "x", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(redcount.InvalidInputError, match="name"):
        redcount.Quota(store, "a{b}")
    assert snapshot(store) == before


def test_durable_on_the_memory_store_reports_no_replicas(memory_store: redcount.Store) -> None:
    q = redcount.Quota(memory_store, "d", durable=1)
    r = q.set(5)
    assert r.replicas == 0 and not r.durable_ok
    assert q.take().replicas == 0
    assert redcount.Quota(memory_store, "nd").set(1).replicas == -1


def test_async_twin(store: redcount.Store) -> None:
    async def main() -> None:
        q = redcount.aio.Quota(store, "aq")
        assert (await q.set(3)).applied
        assert (await q.take(2, request_id="x")).value == 1
        assert (await q.take(2, request_id="x")).duplicate
        assert not await q.take(2)
        assert (await q.give(1)).value == 2
        assert await q.value() == 2
        assert q.sync.value() == 2

    asyncio.run(main())


def test_threads_hand_out_exactly_the_quota(store: redcount.Store) -> None:
    q = redcount.Quota(store, "threads")
    q.set(2_000)
    taken = [0] * 8

    def run(t: int) -> None:
        n = 1 + t % 5
        while True:
            r = q.take(n)
            if r:
                taken[t] += n
            elif r.value == 0:
                return
            else:
                n = 1

    ts = [threading.Thread(target=run, args=(t,)) for t in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert sum(taken) == 2_000 and q.value() == 0


@pytest.mark.redis_only
@pytest.mark.slow
def test_two_processes_eight_threads_hand_out_exactly_the_quota(redis_server: RedisServer,
                                                               redis_store: redcount.Store) -> None:
    q = redcount.Quota(redis_store, "race")
    q.set(10_000)
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=2, mp_context=ctx) as pool:
        futures = [pool.submit(take_until_empty, redis_server.url, "race", 8, p) for p in range(2)]
        results = [f.result(timeout=120) for f in futures]
    assert sum(taken for taken, _ in results) == 10_000
    assert all(below == 0 for _, below in results)
    assert q.value() == 0


def _replica_synced(replica: RedisServer) -> bool:
    return b"master_link_status:up" in replica_info(replica)


def replica_info(replica: RedisServer) -> bytes:
    store = redcount.connect(replica.url)
    try:
        return store.execute("INFO", "replication")  # type: ignore[return-value]
    finally:
        store.close()


@pytest.mark.redis_only
def test_durable_waits_for_a_real_replica(redis_factory: Factory) -> None:
    master = redis_factory()
    replica = redis_factory(["--replicaof", "127.0.0.1", str(master.port)])
    deadline = time.monotonic() + 15
    while not _replica_synced(replica):
        assert time.monotonic() < deadline, "the replica never synced"
        time.sleep(0.01)
    store = redcount.connect(master.url)
    q = redcount.Quota(store, "inventory", durable=1, durable_timeout=5)
    r = q.set(100)
    assert r.replicas == 1 and r.durable_ok
    r = q.take(30, request_id="o-1")
    assert r and r.replicas == 1 and r.durable_ok
    reader = redcount.connect(replica.url)
    assert reader.execute("GET", q.storage_key()) == b"70"  # acknowledged = on the replica
    reader.close()
    # Asking for more replicas than exist: applied on the master, reported as not durable.
    two = redcount.Quota(store, "inventory", durable=2, durable_timeout=0.05)
    r = two.take(1)
    assert r and r.replicas == 1 and not r.durable_ok
    # The replica gone: nobody acknowledges.
    replica.kill()
    r = redcount.Quota(store, "inventory", durable=1, durable_timeout=0.05).take(1)
    assert r and r.replicas == 0 and not r.durable_ok
    store.close()
