"""A quick check of redcount on a real 3-master Redis Cluster (the shared topology fixtures).

Counters, a limiter and a sharded counter with request ids run across the masters through
``redcount.connect("redis+cluster://...")``; a batch over 200 keys is split per node and
its replies come back in order; a script call whose keys span slots is refused before
anything is sent; what is about one node goes through ``Store.nodes()``; a reply that
arrives after its call timed out is discarded and the store keeps serving.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redcount
import redcount.aio as aio
from topologies import Cluster

@pytest.fixture
def cluster_url(redis_cluster: Cluster) -> str:
    return redis_cluster.url


@pytest.fixture
def store(cluster_url: str) -> Iterator[redcount.Store]:
    s = redcount.connect(cluster_url)
    yield s
    s.close()


def _keys_per_node(store: redcount.Store) -> list[int]:
    sizes = [n.execute("DBSIZE") for n in store.nodes()]
    assert all(isinstance(n, int) for n in sizes)
    return [int(n) for n in sizes if isinstance(n, int)]


def test_url_and_nodes(store: redcount.Store, cluster_url: str) -> None:
    assert store.url.startswith("redis+cluster://127.0.0.1:")
    nodes = store.nodes()
    assert len(nodes) == 3
    assert all(n.ping() for n in nodes)
    assert len({n.address for n in nodes}) == 3
    with pytest.raises(redcount.InvalidInputError, match="nodes"):
        store.execute("KEYS", "*")


def test_fixed_window_counter_incr_many_over_200_keys(store: redcount.Store) -> None:
    c = redcount.FixedWindowCounter(store, "smoke-fw", 60)
    amounts = {f"user-{i}": i % 7 + 1 for i in range(200)}
    before = _keys_per_node(store)
    got = c.incr_many(amounts)
    assert got == amounts  # every reply back at its own key
    after = _keys_per_node(store)
    assert all(b > a for a, b in zip(before, after)), (before, after)  # spread over every master
    assert c.incr("user-3", 2, request_id="r-1") == amounts["user-3"] + 2
    assert c.incr("user-3", 2, request_id="r-1") == amounts["user-3"] + 2  # counted once
    assert c.get_many(["user-0", "user-199"]) == {"user-0": 1, "user-199": 199 % 7 + 1}


def test_limiter(store: redcount.Store) -> None:
    lim = redcount.Limiter(store)
    for key in (f"client-{i}" for i in range(30)):
        decisions = [lim.hit("3/minute", key).allowed for _ in range(4)]
        assert decisions == [True, True, True, False]


def test_sharded_counter_with_request_ids(store: redcount.Store) -> None:
    c = redcount.ShardedCounter(store, "smoke-sharded", shards=16)
    for i in range(300):
        assert c.incr(2, request_id=f"req-{i}") is True
    for i in range(0, 300, 10):
        assert c.incr(2, request_id=f"req-{i}") is False  # a retry counts once
    assert c.value() == 600
    items = [(f"many-{i % 150 % 20}", 1, f"m-{i % 150}") for i in range(300)]  # every id twice
    got = c.incr_many(items)
    assert got == [True] * 150 + [False] * 150
    values = c.values([f"many-{i}" for i in range(20)])
    assert sum(values.values()) == 150


def test_cross_slot_script_is_refused_before_sending(store: redcount.Store) -> None:
    before = _keys_per_node(store)
    with pytest.raises(redcount.InvalidInputError, match="slot"):
        store.execute("EVAL", "redis.call('SET', KEYS[1], 1) redis.call('SET', KEYS[2], 1)", 2, "foo", "bar")
    assert _keys_per_node(store) == before
    assert store.execute("EVAL", "return redis.call('INCR', KEYS[1])", 1, "{t}foo") == 1


def test_batches_over_many_nodes_keep_their_order(store: redcount.Store) -> None:
    cmds: list[tuple[str | bytes | int | float, ...]] = []
    for i in range(100):
        cmds.append(("SET", f"order-{i}", str(i)))
        cmds.append(("GET", f"order-{i}"))
    replies = store.execute_many(cmds)
    assert replies[1::2] == [str(i).encode() for i in range(100)]
    assert all(r == "OK" for r in replies[0::2])


def test_a_forked_child_opens_its_own_connections(store: redcount.Store) -> None:
    store.execute("SET", "fork-key", "0")
    pid = os.fork()
    if pid == 0:  # the child: its own router and engines; the parent's are never touched
        try:
            ok = store.execute_many([("INCR", "fork-key"), ("INCR", "{x}other")])[0] == 1
        except BaseException:  # noqa: BLE001 - reported through the exit code
            ok = False
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.execute("INCR", "fork-key") == 2  # the parent keeps working


def test_asyncio_over_the_cluster(store: redcount.Store) -> None:
    astore = aio.AsyncStore(store)
    counter = aio.FixedWindowCounter(store, "smoke-aio", 60)
    limiter = aio.Limiter(store)

    async def main() -> None:
        assert await astore.ping() is True
        replies = await astore.execute_many([("INCRBY", f"aio-{i}", i) for i in range(1, 101)])
        assert replies == list(range(1, 101))
        counts = await asyncio.gather(*(counter.incr(f"k-{i}") for i in range(50)))
        assert counts == [1] * 50
        assert (await limiter.hit("2/minute", "aio-client")).allowed

    asyncio.run(main())


def _pause_writes(store: redcount.Store, ms: int = 700) -> None:
    """Holds every master's writes for ``ms``: they run, and are answered, when it ends."""
    for n in store.nodes():
        n.execute("CLIENT", "PAUSE", str(ms), "WRITE")


def test_late_replies_are_discarded_and_the_store_keeps_serving(store: redcount.Store, cluster_url: str) -> None:
    impatient = redcount.connect(cluster_url, command_timeout=0.3, breaker=False)
    keys = [f"late-{i}" for i in range(8)]
    try:
        impatient.execute_many([("SET", k, "before") for k in keys])  # connections to every node are open
        _pause_writes(store)
        with pytest.raises(redcount.TimeoutError) as one:
            impatient.execute("SET", keys[0], "late")
        assert one.value.maybe_applied is True
        with pytest.raises(redcount.TimeoutError) as many:
            impatient.execute_many([("SET", k, "late") for k in keys])
        assert many.value.maybe_applied is True
        time.sleep(0.9)  # the pause is over: the SETs run and their replies arrive, late
        for n in range(1, 4):  # each reply is the one asked for: the connections are in step
            assert impatient.execute_many([("INCR", f"{k}:n") for k in keys]) == [n] * len(keys)
        assert impatient.execute_many([("GET", k) for k in keys]) == [b"late"] * len(keys)

        astore = aio.AsyncStore(impatient)

        async def main() -> None:
            _pause_writes(store)
            with pytest.raises(redcount.TimeoutError) as info:
                await astore.execute_many([("SET", k, "later") for k in keys])
            assert info.value.maybe_applied is True
            with pytest.raises(redcount.TimeoutError) as single:
                await astore.execute("SET", keys[1], "later")
            assert single.value.maybe_applied is True
            await asyncio.sleep(0.9)
            for n in range(1, 4):
                got = await asyncio.gather(*(astore.execute("INCR", f"{k}:m") for k in keys))
                assert got == [n] * len(keys)
            assert await astore.execute_many([("GET", k) for k in keys]) == [b"later"] * len(keys)
            assert await astore.ping() is True

        asyncio.run(main())
    finally:
        impatient.close()


def test_tls_cluster_checks_each_node_certificate_against_its_address(
    redis_tls_cluster: Cluster, topology_certs: Path
) -> None:
    certs = topology_certs
    url = (f"{redis_tls_cluster.url}?ssl_ca_certs={certs / 'ca.pem'}"
           f"&ssl_certfile={certs / 'client.pem'}&ssl_keyfile={certs / 'client.key'}")
    store = redcount.connect(url)
    assert store.execute_many([("INCR", f"tls-{i}") for i in range(30)]) == [1] * 30
    assert len(store.nodes()) == 3  # every node's certificate names its IP address
    store.close()
    wrong = redcount.connect(url + "&ssl_server_name=redis.invalid", breaker=False, command_timeout=1.0)
    with pytest.raises(redcount.ConnectionError, match="hostname mismatch"):
        wrong.execute("GET", "tls-1")
    wrong.close()


def test_a_killed_master_is_replaced_by_its_replica_within_the_deadline(
    redis_cluster_factory: Callable[..., Cluster],
) -> None:
    cluster = redis_cluster_factory(masters=3, replicas=1)
    store = redcount.connect(cluster.url, command_timeout=20.0, breaker=False)
    key = "failover-key"
    assert store.execute("INCR", key) == 1
    owner = cluster.node_for_key(key)
    assert owner.addr in {n.address for n in store.nodes()}
    cluster.kill(owner)  # reaped: its sockets are closed, nothing in flight
    t0 = time.monotonic()
    # Refused connections to the dead master: the router refreshes the table and sends
    # to the promoted replica once the cluster has failed over (node timeout 2 s).
    got = store.execute("INCR", key)
    took = time.monotonic() - t0
    assert got in (1, 2)  # 2 unless the replica had not received the first write
    assert took < 20.0
    after = store.nodes()
    assert len(after) == 3
    assert owner.addr not in {n.address for n in after}
    store.close()


def test_a_node_lost_after_the_write_fails_only_its_requests(redis_cluster_factory: Callable[..., Cluster]) -> None:
    # Destructive (kills a master): a cluster of its own.
    cluster = redis_cluster_factory(masters=3, replicas=0)
    store = redcount.connect(cluster.url, command_timeout=5.0, breaker=False)
    victim = cluster.node_by_port(int(store.nodes()[0].address.rsplit(":", 1)[1]))
    keys = [f"lost-{i}" for i in range(60)]
    store.execute_many([("SET", k, "0") for k in keys])  # connections to every node are open
    cluster.stop(victim)  # SIGSTOP: it takes the write, then never answers
    result: list[BaseException] = []

    def call() -> None:
        try:
            store.execute_many([("INCR", k) for k in keys])
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            result.append(e)

    t = threading.Thread(target=call)
    t.start()
    time.sleep(0.3)
    cluster.kill(victim)
    t.join(10)
    assert not t.is_alive()
    assert len(result) == 1 and isinstance(result[0], redcount.ConnectionError), result
    err = result[0]
    assert err.maybe_applied is True
    assert err.outcomes is not None and len(err.outcomes) == len(keys)
    lost = {k for k, o in zip(keys, err.outcomes) if o == "maybe"}
    answered = [o for o in err.outcomes if o != "maybe"]
    assert lost and answered, err.outcomes
    assert all(o == 1 for o in answered)  # the other masters' requests completed
    # The unanswered ones are the enum member, a str equal to "maybe".
    maybe = [o for o in err.outcomes if o == "maybe"]
    assert all(o is redcount.Outcome.MAYBE and isinstance(o, str) for o in maybe)
    assert str(redcount.Outcome.MAYBE) == "maybe" and f"{redcount.Outcome.NOT_SENT}" == "not sent"
    store.close()
