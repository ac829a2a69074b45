"""Every counter and limiter of redcount on a real Redis Cluster (3 masters + 3 replicas, the
shared ``redis_cluster`` fixture, flushed before each test), through
``redcount.connect("redis+cluster://...")``: sync and :mod:`redcount.aio`; replies in
order across nodes; a cross-slot script call refused before anything is sent; a reshard;
the flusher to SQLite, reconcile and restore.

Roles and owners are read from the cluster (``Store.nodes()``, CLUSTER NODES), never
assumed from a port.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redcount
import redcount.aio as aio
from redcount.limiter import Strategy
from topologies import Cluster, key_slot

SHARDS = 8


@pytest.fixture
def store(redis_cluster: Cluster) -> Iterator[redcount.Store]:
    s = redcount.connect(redis_cluster.url)
    yield s
    s.close()


def keys_per_node(store: redcount.Store) -> list[int]:
    sizes = [n.execute("DBSIZE") for n in store.nodes()]
    assert all(isinstance(n, int) for n in sizes)
    return [int(n) for n in sizes if isinstance(n, int)]


def node_keys(store: redcount.Store, pattern: str = "*") -> list[str]:
    out: list[str] = []
    for n in store.nodes():
        found = n.execute("KEYS", pattern)
        assert isinstance(found, list)
        out.extend(k.decode() if isinstance(k, bytes) else str(k) for k in found)
    return sorted(out)


# ---------------------------------------------------------------- the store


def test_nodes_are_the_masters(store: redcount.Store, redis_cluster: Cluster) -> None:
    nodes = store.nodes()
    masters = redis_cluster.masters()
    assert sorted(n.address for n in nodes) == sorted(m.addr for m in masters)
    assert all(n.ping() for n in nodes)
    assert all(n.nodes() == [n] or [x.address for x in n.nodes()] == [n.address] for n in nodes)
    for command in (("KEYS", "*"), ("SCAN", 0), ("INFO",), ("DBSIZE",), ("FLUSHALL",)):
        with pytest.raises(redcount.InvalidInputError, match="nodes"):
            store.execute(*command)


def test_a_single_server_s_nodes_are_itself(redis_store: redcount.Store) -> None:
    nodes = redis_store.nodes()
    assert len(nodes) == 1 and nodes[0].ping()
    assert isinstance(nodes[0].execute("DBSIZE"), int)


def test_replies_come_back_in_order_over_every_node(store: redcount.Store) -> None:
    cmds: list[tuple[str | bytes | int | float, ...]] = []
    for i in range(300):
        cmds.append(("SET", f"order-{i}", str(i)))
        cmds.append(("INCRBY", f"n-{i}", i))
        cmds.append(("GET", f"order-{i}"))
    replies = store.execute_many(cmds)
    assert replies[0::3] == ["OK"] * 300
    assert replies[1::3] == list(range(300))
    assert replies[2::3] == [str(i).encode() for i in range(300)]
    assert all(n > 0 for n in keys_per_node(store))  # every master took part


def test_a_cross_slot_script_call_is_refused_before_sending(store: redcount.Store) -> None:
    assert key_slot("foo") != key_slot("bar")
    before = keys_per_node(store)
    script = "redis.call('SET', KEYS[1], 1) redis.call('SET', KEYS[2], 1) return 1"
    with pytest.raises(redcount.InvalidInputError, match="slot") as e:
        store.execute("EVAL", script, 2, "foo", "bar")
    assert "foo" in str(e.value) and "bar" in str(e.value) and "nothing was sent" in str(e.value)
    with pytest.raises(redcount.InvalidInputError, match="slot"):
        # In a batch: the whole batch is refused, its other requests included.
        store.execute_many([("SET", "alone", 1), ("EVAL", script, 2, "foo", "bar")])
    with pytest.raises(redcount.InvalidInputError, match="slot"):
        store.execute_many([("MULTI",), ("SET", "foo", 1), ("SET", "bar", 1), ("EXEC",)])
    assert keys_per_node(store) == before
    assert store.execute("EVAL", script, 2, "{t}foo", "{t}bar") == 1


# ---------------------------------------------------------------- counters


def test_a_script_reloaded_after_ask_keeps_its_asking(store: redcount.Store, redis_cluster: Cluster) -> None:
    """A script call redirected by ASK to a node whose script cache was flushed meets
    NOSCRIPT there; the reload and the rerun carry ASKING again (ASKING admits one command),
    so the rerun runs on the importing node instead of being sent back with MOVED. A GCRA
    hit of one limit is a one-key script call (a multi-key one to keys the target does not
    have yet is answered TRYAGAIN there until the slot has moved, whatever its ASKING)."""
    limiter = redcount.Limiter(store, "gcra")
    who = "ask-noscript"
    tat_key = f"redcount:lim:gcra:{{{who}}}:60000"  # the limiter's key for "10/minute"
    slot = key_slot(tat_key)
    source = redis_cluster.node_for_slot(slot)
    target = next(m for m in redis_cluster.masters() if m.port != source.port)
    # A connection to every master, each with every script loaded by its handshake.
    for m in redis_cluster.masters():
        assert store.execute("INCR", redis_cluster.key_on(m, "warm")) == 1
    target.call("CLUSTER", "SETSLOT", slot, "IMPORTING", redis_cluster.node_id(source))
    source.call("CLUSTER", "SETSLOT", slot, "MIGRATING", redis_cluster.node_id(target))
    try:
        assert target.call("SCRIPT", "FLUSH") == "OK"
        before = store.cluster_stats()
        # Not on the source: ASK to the target, NOSCRIPT there, SCRIPT LOAD + ASKING + rerun.
        d = limiter.hit("10/minute", who)
        assert d.allowed and d.remaining == 9
        after = store.cluster_stats()
        assert after["ask"] > before["ask"]
        assert after["moved"] == before["moved"]  # never sent back to the source
        with target.conn() as c:  # it ran on the target (and the key name above is right)
            assert c.call("ASKING") == "OK" and c.call("EXISTS", tat_key) == 1
        assert source.call("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
        # Again, the script cache flushed a second time: the same path.
        assert target.call("SCRIPT", "FLUSH") == "OK"
        assert limiter.hit("10/minute", who).remaining == 8
        assert store.cluster_stats()["moved"] == before["moved"]
    finally:
        for n in (target, source):
            n.call("CLUSTER", "SETSLOT", slot, "STABLE")
        target.call("FLUSHALL")  # the key left on the target, in a slot it does not own


def test_fixed_window_counter(store: redcount.Store) -> None:
    c = redcount.FixedWindowCounter(store, "fw", 60)
    amounts = {f"user-{i}": i % 7 + 1 for i in range(200)}
    before = keys_per_node(store)
    assert c.incr_many(amounts) == amounts  # every reply back at its own key
    after = keys_per_node(store)
    assert all(b > a for a, b in zip(before, after)), (before, after)  # spread over every master
    assert c.get_many(list(amounts)) == amounts
    assert c.incr_many(amounts) == {k: 2 * v for k, v in amounts.items()}
    assert c.incr("user-3", 2, request_id="r-1") == 2 * amounts["user-3"] + 2
    assert c.incr("user-3", 2, request_id="r-1") == 2 * amounts["user-3"] + 2  # counted once
    for i in range(50):
        assert c.incr(f"id-key-{i}", 5, request_id=f"id-{i}") == 5
        assert c.incr(f"id-key-{i}", 5, request_id=f"id-{i}") == 5
    assert c.get("id-key-7") == 5


def test_sliding_window_counter(store: redcount.Store) -> None:
    c = redcount.SlidingWindowCounter(store, "sw", 60)
    for i in range(60):
        assert c.add(f"page-{i}", 2) == 2
        assert c.add(f"page-{i}") == 3
        assert c.count(f"page-{i}") == 3
        assert c.add_unique(f"visitors-{i}", "alice") == 1
        assert c.add_unique(f"visitors-{i}", "alice") == 1
        assert c.add_unique(f"visitors-{i}", "bob") == 2
    c.clear("page-0")
    assert c.count("page-0") == 0
    assert len({key_slot(c.storage_keys(f"page-{i}")[0]) for i in range(60)}) > 3


STRATEGIES: list[Strategy] = ["fixed-window", "sliding-window", "sliding-window-approx", "token-bucket", "gcra", "concurrency"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_limiter_every_strategy(store: redcount.Store, strategy: Strategy) -> None:
    assert sorted(redcount.strategies()) == sorted(STRATEGIES)
    lim = redcount.Limiter(store, strategy)
    for key in (f"client-{i}" for i in range(30)):
        decisions = [lim.hit("3/minute", key).allowed for _ in range(4)]
        assert decisions == [True, True, True, False], (strategy, key)
        assert not lim.test("3/minute", key).allowed
        lim.reset("3/minute", key)
        assert lim.hit("3/minute", key).allowed
    if strategy == "concurrency":
        leases = [lim.acquire(2, f"job-{i}") for i in range(20) for _ in range(2)]
        assert all(lease is not None for lease in leases)
        assert all(lim.acquire(2, f"job-{i}") is None for i in range(20))
        assert all(lim.release(lease) for lease in leases if lease is not None)
        assert all(lim.in_flight(f"job-{i}") == 0 for i in range(20))
    else:
        # Several limits in one call: decided together, all or nothing, on one node.
        multi = "2/second;3/minute"
        got = [lim.hit(multi, "multi").allowed for _ in range(4)]
        assert got.count(True) == 2 and got[:2] == [True, True]
        stats = lim.stats(multi, "multi")
        assert len(stats) == 2


def test_limiter_burst_strings(store: redcount.Store) -> None:
    strategies: list[Strategy] = ["token-bucket", "gcra"]
    for strategy in strategies:
        lim = redcount.Limiter(store, strategy, prefix=f"burst-{strategy}")
        for i in range(20):
            allowed = [lim.hit("1/minute burst 3", f"b-{i}").allowed for _ in range(4)]
            assert allowed == [True, True, True, False]


def test_sharded_counter_value_over_64_shards(store: redcount.Store) -> None:
    c = redcount.ShardedCounter(store, "wide", shards=64)
    for i in range(640):
        assert c.incr(1, request_id=f"w-{i}") is True
    for i in range(0, 640, 16):
        assert c.incr(1, request_id=f"w-{i}") is False  # a retry counts once
    assert c.value() == 640
    assert sum(c.shard_values()) == 640 and len(c.shard_values()) == 64
    slots = {key_slot(c.key_of(s)) for s in range(64)}
    owners = {n.address for n in store.nodes() for s in slots if n.execute("CLUSTER", "COUNTKEYSINSLOT", s) != 0}
    assert len(owners) == 3  # the shards live on every master
    items = [(f"many-{i % 150 % 20}", 1, f"m-{i % 150}") for i in range(300)]  # every id twice
    assert c.incr_many(items) == [True] * 150 + [False] * 150
    assert sum(c.values([f"many-{i}" for i in range(20)]).values()) == 150


def test_a_reshard_keeps_every_count(store: redcount.Store) -> None:
    c = redcount.ShardedCounter(store, "grow", shards=4)
    for i in range(200):
        assert c.incr(1, request_id=f"g-{i}")
    layout = c.reshard(32)
    assert layout.total == 36 and c.shards == 32
    for _ in range(200):
        c.incr(1)
    assert c.value() == 400
    assert sum(c.shard_values()) == 400
    stale = redcount.ShardedCounter(store, "grow", shards=4)  # a writer that has not seen it
    stale.incr(1)
    assert c.value() == 401
    assert len({key_slot(c.key_of(s)) for s in range(36)}) > 3


def test_a_write_with_a_request_id_after_a_reshard(store: redcount.Store) -> None:
    c = redcount.ShardedCounter(store, "grow-ids", shards=4)
    for i in range(50):
        assert c.incr(1, request_id=f"g-{i}")
    c.reshard(32)
    for i in range(50, 100):
        assert c.incr(1, request_id=f"g-{i}")
    for i in range(0, 100, 10):
        assert c.incr(1, request_id=f"g-{i}") is False
    assert c.value() == 100


def test_quota(store: redcount.Store) -> None:
    quotas = [redcount.Quota(store, f"seats-{i}", ceiling=10) for i in range(12)]
    for q in quotas:
        assert q.set(3).value == 3
        assert [bool(q.take(1, request_id=f"{q.name}-{k}")) for k in range(4)] == [True, True, True, False]
        again = q.take(1, request_id=f"{q.name}-0")
        assert again.applied and again.duplicate and q.value() == 0
        assert q.give(10).value == 10 and not q.give(1)
    assert len({key_slot(q.storage_key()) for q in quotas}) > 3


def test_quota_durable_reaches_a_replica(store: redcount.Store) -> None:
    q = redcount.Quota(store, "durable", durable=1, durable_timeout=2.0)
    assert q.set(5).value == 5
    r = q.take(2)
    assert r.applied and r.value == 3 and r.replicas >= 1 and r.durable_ok


def test_buffered_counter(store: redcount.Store) -> None:
    c = redcount.ShardedCounter(store, "buffered", shards=16)
    b = redcount.BufferedCounter(c, flush_every=0.05, max_pending=100)
    for _ in range(1000):
        b.incr(1)
    assert b.close(10.0) == 0
    assert c.value() == 1000
    assert b.stats().failed_units == 0


def test_pn_counter(store: redcount.Store, redis_store: redcount.Store) -> None:
    east = [redcount.PNCounter(store, f"pn-{i}", "east") for i in range(20)]
    for p in east:
        assert p.incr(5) == 5
        assert p.decr(2) == 2
        assert p.value() == 3
    west = redcount.PNCounter(redis_store, "pn-0", "west")  # another region, on a single server
    west.incr(10)
    east[0].merge(west)
    assert east[0].value() == 13
    assert east[0].components() == {"east": (5, 2), "west": (10, 0)}
    west.merge(east[0])
    assert west.value() == 13
    assert len({key_slot(p.storage_keys()[0]) for p in east}) > 3


def test_hot_keys_observe_every_node_s_requests(redis_cluster: Cluster) -> None:
    hk = redcount.HotKeys(100)
    s = redcount.connect(redis_cluster.url, hot_keys=hk)
    try:
        c = redcount.FixedWindowCounter(s, "hot", 60)
        for i in range(30):
            c.incr("hottest")
        c.incr_many({f"cold-{i}": 1 for i in range(30)})
        top = hk.top(1)[0]
        assert top.key == c.storage_key("hottest") and top.count == 30
        assert hk.total == 60
        assert len(s.nodes()) == 3
    finally:
        s.close()


# ---------------------------------------------------------------- asyncio


def test_asyncio_over_the_cluster(store: redcount.Store) -> None:
    astore = aio.AsyncStore(store)
    counter = aio.FixedWindowCounter(store, "aio-fw", 60)
    sliding = aio.SlidingWindowCounter(store, "aio-sw", 60)
    limiter = aio.Limiter(store, "sliding-window")
    sharded = aio.ShardedCounter(store, "aio-sharded", shards=16)
    quota = aio.Quota(store, "aio-quota")
    pn = aio.PNCounter(store, "aio-pn", "here")

    async def main() -> None:
        assert await astore.ping() is True
        replies = await astore.execute_many([("INCRBY", f"aio-{i}", i) for i in range(1, 201)])
        assert replies == list(range(1, 201))
        counts = await asyncio.gather(*(counter.incr(f"k-{i}") for i in range(100)))
        assert counts == [1] * 100
        assert await counter.incr_many({f"k-{i}": 2 for i in range(100)}) == {f"k-{i}": 3 for i in range(100)}
        assert await asyncio.gather(*(sliding.add(f"s-{i}", 1) for i in range(40))) == [1] * 40
        decisions = await asyncio.gather(*(limiter.hit("2/minute", f"c-{i % 20}") for i in range(60)))
        assert Counter(d.allowed for d in decisions) == {True: 40, False: 20}
        done = await asyncio.gather(*(sharded.incr(1, request_id=f"a-{i}") for i in range(100)))
        assert all(done)
        assert await sharded.incr(1, request_id="a-5") is False
        assert await sharded.value() == 100
        await quota.set(2)
        assert [bool(await quota.take(1)) for _ in range(3)] == [True, True, False]
        assert await pn.incr(4) == 4

    asyncio.run(main())


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_asyncio_limiter_every_strategy(store: redcount.Store, strategy: Strategy) -> None:
    lim = aio.Limiter(store, strategy)

    async def main() -> None:
        keys = [f"aio-client-{i}" for i in range(30)]
        rounds = [await asyncio.gather(*(lim.hit("3/minute", k) for k in keys)) for _ in range(4)]
        assert [[d.allowed for d in r] for r in rounds] == [[True] * 30] * 3 + [[False] * 30]
        assert not any(d.allowed for d in await asyncio.gather(*(lim.test("3/minute", k) for k in keys)))

    asyncio.run(main())


# ---------------------------------------------------------------- the flusher, reconcile, restore


def write(c: redcount.ShardedCounter, ids: range, prefix: str = "r") -> int:
    total = 0
    for i in ids:
        amount = (i % 7) - 2 or 5
        assert c.incr(amount, request_id=f"{prefix}{i}")
        total += amount
    return total


def logged_counter(store: redcount.Store, name: str = "likes") -> redcount.ShardedCounter:
    return redcount.ShardedCounter(store, name, shards=SHARDS, log_maxlen=1_000_000)


def test_the_flusher_reads_every_shard_s_log_on_every_node(
    store: redcount.Store, redis_cluster: Cluster, tmp_path: Path
) -> None:
    sql = f"sqlite:///{tmp_path / 'flush.db'}"
    c = logged_counter(store)
    # The shards' logs live on every master: one XREADGROUP naming them all would span slots.
    assert len({redis_cluster.node_for_key(c.key_of(s, "log")).port for s in range(SHARDS)}) == 3
    total = write(c, range(400))
    with redcount.Flusher(store, sql, [c], batch=64) as f:
        assert f.lag.entries == 400
        assert f.drain() == 400
        assert f.stats.applied == 400 and f.stats.skipped == 0
        assert f.lag.entries == 0
        total += write(c, range(400, 450))
        assert f.run_once() == 50
    with redcount.SnapshotStore(sql) as snaps:
        value, _ = snaps.total("likes")
        assert value == total == c.value()
        assert [s.value for s in snaps.shard_values("likes")] == c.shard_values()
        seen = Counter(d.request_id for d in snaps.deltas("likes"))
        assert len(seen) == 450 and max(seen.values()) == 1


def test_reconcile_finds_and_repairs_drift(store: redcount.Store, tmp_path: Path) -> None:
    sql = f"sqlite:///{tmp_path / 'rec.db'}"
    c = logged_counter(store)
    total = write(c, range(80))
    with redcount.Flusher(store, sql, [c]) as f:
        f.drain()
    rep = redcount.reconcile(store, sql, "likes")
    assert rep.ok and rep.drift == 0 and rep.live == total
    store.execute("INCRBY", c.key_of(5), 9)  # a write that bypassed the delta log
    rep = redcount.reconcile(store, sql, "likes")
    assert {r.shard: r.drift for r in rep.rows if r.drift} == {5: 9}
    fixed = redcount.reconcile(store, sql, "likes", repair=True)
    assert fixed.repaired and fixed.corrections == 9
    assert c.value() == total
    assert redcount.reconcile(store, sql, "likes").ok


def test_restore_after_every_master_was_flushed(store: redcount.Store, tmp_path: Path) -> None:
    sql = f"sqlite:///{tmp_path / 'restore.db'}"
    c = logged_counter(store)
    total = write(c, range(200))
    with redcount.Flusher(store, sql, [c]) as f:
        f.drain()
    for node in store.nodes():
        node.execute("FLUSHALL")
    assert c.value() == 0
    rep = redcount.restore(store, sql, "likes")
    assert rep.lost_streams == list(range(SHARDS)) and rep.from_log == 0
    assert c.value() == total == rep.total
    write(c, range(200, 220))
    with redcount.Flusher(store, sql, [c]) as f:
        f.drain()
        assert f.snapshots.total("likes")[0] == c.value()


def test_restore_adds_what_was_logged_after_the_snapshot(store: redcount.Store, tmp_path: Path) -> None:
    sql = f"sqlite:///{tmp_path / 'restore2.db'}"
    c = logged_counter(store)
    write(c, range(100))
    with redcount.Flusher(store, sql, [c]) as f:
        f.drain()
    write(c, range(100, 160))  # logged, never flushed
    expected = c.shard_values()
    store.execute_many([("DEL", c.key_of(s)) for s in range(SHARDS)])  # values lost, logs kept
    rep = redcount.restore(store, sql, "likes")
    assert rep.lost_streams == [] and rep.log_entries == 60
    assert c.shard_values() == expected


def test_a_cluster_node_opened_with_redis_url_says_to_use_redis_cluster(redis_cluster: Cluster) -> None:
    """``redis://`` to one node of a cluster: a key of another node's slot is answered MOVED,
    which a store on one server cannot follow; the error says what the server is and which
    URL to use, sync, through redcount.aio and in a limiter's decision."""
    node = redis_cluster.masters()[0]
    key = next(k for k in (f"k{i}" for i in range(1000)) if redis_cluster.node_for_key(k).port != node.port)
    hint = rf"^MOVED {key_slot(key)} \S+ \(127\.0\.0\.1:{node.port} is a Redis Cluster node.*open the cluster with redis\+cluster://127\.0\.0\.1:{node.port} "
    plain = redcount.connect(f"redis://127.0.0.1:{node.port}/0")
    try:
        with pytest.raises(redcount.ReplyError, match=hint):
            plain.execute("SET", key, "1")
        with pytest.raises(redcount.ReplyError, match=hint):
            redcount.Limiter(plain, "sliding-window").hit("5/second", key)
        with pytest.raises(redcount.ReplyError, match=hint):
            asyncio.run(aio.AsyncStore(plain).execute("GET", key))
        [reply] = plain.execute_many([("GET", key)])
        assert isinstance(reply, str) and "is a Redis Cluster node" in reply
    finally:
        plain.close()
    # The cluster store follows the same redirect (its replies are the router's, untouched).
    with redcount.connect(redis_cluster.url) as routed:
        assert routed.execute("SET", key, "1") == "OK" and routed.execute("GET", key) == b"1"
