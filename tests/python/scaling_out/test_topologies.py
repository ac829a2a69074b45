"""The topology fixtures prove themselves with an independent client (redis-py): the cluster
is healthy and covered, faults do what the server promises (promotion, manual failover, slot
migration, Sentinel switch), the TLS cluster takes a client certificate, the ring servers are
up; and the failover harness counts what a SIGKILL costs a writer with request ids.

Run with ``-s`` to see the measured promotion times and the harness report.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from failover_harness import FailoverHarness, WriteFn
from redis.backoff import NoBackoff
from redis.cluster import ClusterNode, RedisCluster
from redis.retry import Retry
from redis.sentinel import Sentinel
from helpers import wait_until
from topologies import POLL, SLOTS, TOPOLOGY_TIMEOUT, TRANSIENT, Cluster, Node, Ring, SentinelGroup, key_slot

pytestmark = pytest.mark.redis_only


def cluster_client(c: Cluster, **kw: object) -> RedisCluster:
    return RedisCluster(startup_nodes=[ClusterNode(h, p) for h, p in c.startup_nodes], decode_responses=True,
                        socket_timeout=1.0, socket_connect_timeout=0.5, **kw)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def fresh_cluster(redis_cluster_factory: Callable[..., Cluster]) -> Cluster:
    """One fresh 3+3 cluster for this module's destructive tests; each test heals it first."""
    c = redis_cluster_factory()
    print(f"\nfresh 3+3 cluster ready in {c.started_in:.2f} s")
    return c


@pytest.fixture
def broken_ok(fresh_cluster: Cluster) -> Iterator[Cluster]:
    fresh_cluster.heal()
    fresh_cluster.flushall()
    yield fresh_cluster


# --- the shared cluster ---------------------------------------------------------------------------


def test_key_slot_matches_the_server(redis_cluster: Cluster) -> None:
    node = redis_cluster.masters()[0]
    for key in ["foo", "{user1000}.following", "foo{}{bar}", "foo{{bar}}", "", "{}", "a{b}c{d}"]:
        assert key_slot(key) == node.call("CLUSTER", "KEYSLOT", key), key
    vectors = {"foo": 12182, "{user1000}.following": 3443, "foo{}{bar}": 8363, "foo{{bar}}": 4015}
    assert {k: key_slot(k) for k in vectors} == vectors


def test_cluster_is_healthy_with_three_masters_and_three_replicas(redis_cluster: Cluster) -> None:
    rc = cluster_client(redis_cluster)
    try:
        nodes = rc.cluster_nodes()
        masters = {a for a, n in nodes.items() if "master" in n["flags"]}
        replicas = {a for a, n in nodes.items() if "slave" in n["flags"]}
        assert len(masters) == 3 and len(replicas) == 3
        assert {f"127.0.0.1:{n.port}" for n in redis_cluster.masters()} == masters
        assert {f"127.0.0.1:{n.port}" for n in redis_cluster.replicas()} == replicas
        for m in redis_cluster.masters():
            assert len(redis_cluster.replicas(of=m)) == 1
        covered = sum(end - start + 1 for (start, end) in rc.cluster_slots())
        assert covered == SLOTS
        # Keys spread over every master, written and read back through the cluster client.
        keys = [f"key-{i}" for i in range(300)]
        for k in keys:
            rc.set(k, k)
        assert [rc.get(k) for k in keys] == keys
        per_master = Counter(redis_cluster.node_for_key(k).port for k in keys)
        assert len(per_master) == 3
        for m in redis_cluster.masters():
            assert m.call("DBSIZE") == per_master[m.port]
    finally:
        rc.close()


def test_shared_cluster_is_flushed_between_tests(redis_cluster: Cluster) -> None:
    assert sum(m.call("DBSIZE") for m in redis_cluster.masters()) == 0


# --- faults on a fresh cluster ----------------------------------------------------------------------


def test_sigkilled_master_is_replaced_by_its_replica(broken_ok: Cluster) -> None:
    c = broken_ok
    victim = c.masters()[0]
    replica = c.replicas(of=victim)[0]
    key = c.key_on(victim, "survivor")
    # WAIT counts replicas that acknowledged the last write of *its own connection*, so the
    # SET and the WAIT share one: on a fresh connection WAIT proves nothing about the key.
    with victim.conn() as conn:
        assert conn.call("SET", key, "v") == "OK"
        assert conn.call("WAIT", 1, 2000) == 1  # replicated before the crash
    t0 = c.kill(victim)
    took = c.wait_for_promotion(replica, since=t0)
    print(f"\nSIGKILL of a master (cluster-node-timeout {c.node_timeout_ms} ms): "
          f"replica promoted in {took:.2f} s")
    assert c.node_for_key(key) is replica
    assert len(c.masters()) == 3
    c.wait_healthy()
    rc = cluster_client(c)
    try:
        assert rc.get(key) == "v"
        rc.set(key, "w")
    finally:
        rc.close()
    # The old master comes back as a replica of the node that replaced it.
    healed = c.heal()
    assert c.replicas(of=replica) == [victim]
    print(f"killed node restarted and resynced in {healed:.2f} s")


@pytest.mark.parametrize("mode", [None, "FORCE"])
def test_manual_cluster_failover(broken_ok: Cluster, mode: str | None) -> None:
    c = broken_ok
    old = c.masters()[1]
    replica = c.replicas(of=old)[0]
    slots = c.slots_of(old)
    took = c.failover(replica, mode)
    print(f"\nCLUSTER FAILOVER {mode or ''}: promoted in {took * 1000:.0f} ms")
    assert c.slots_of(replica) == slots
    c.wait_healthy(expect=(3, 3))
    assert c.replicas(of=replica) == [old]
    rc = cluster_client(c)
    try:
        key = c.key_on(replica, "after-failover")
        rc.set(key, 1)
        assert replica.call("GET", key) == "1"
    finally:
        rc.close()


def test_slot_migrated_with_its_keys(broken_ok: Cluster) -> None:
    c = broken_ok
    rc = cluster_client(c)
    try:
        keys = [f"{{moving}}:{i}" for i in range(250)]
        slot = key_slot(keys[0])
        source = c.node_for_slot(slot)
        target = next(m for m in c.masters() if m is not source)
        for k in keys:
            rc.set(k, k)
        batches: list[int] = []
        moved = c.migrate_slot(slot, target, batch=100, on_batch=batches.append)
        assert moved == 250 and batches == [100, 200, 250]
        assert c.node_for_slot(slot) is target
        assert target.call("CLUSTER", "COUNTKEYSINSLOT", slot) == 250
        assert source.call("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
        assert [rc.get(k) for k in keys] == keys  # redis-py follows the MOVED
    finally:
        rc.close()
    c.wait_healthy(expect=(3, 3))


def test_replication_cut_leaves_writes_on_the_master_only(broken_ok: Cluster) -> None:
    c = broken_ok
    replica = c.replicas()[0]
    master = c.cut_replication(replica)
    key = c.key_on(master, "during-cut")
    with master.conn() as conn:
        assert conn.call("SET", key, "1") == "OK"
        assert conn.call("WAIT", 1, 100) == 0  # no replica acknowledges it
    c.cont(replica)
    c.wait_healthy(expect=(3, 3))
    assert wait_for_value(replica, key) == "1"


def wait_for_value(node: Node, key: str) -> str:
    """GET on a replica (READONLY: a replica serves reads of its master's slots) once set."""
    with node.conn() as conn:
        conn.call("READONLY")
        return str(wait_until(lambda: conn.call("GET", key), TOPOLOGY_TIMEOUT, what=f"{key} on {node}", interval=POLL, ignore=TRANSIENT))


def test_paused_master_stops_answering_and_resumes(broken_ok: Cluster) -> None:
    c = broken_ok
    m = c.masters()[2]
    c.stop(m)
    with pytest.raises(OSError):
        m.call("PING", timeout=0.3)
    c.cont(m)
    assert m.call("PING") == "PONG"


# --- the failover harness -----------------------------------------------------------------------

# Increment once per request id: the marker (SET NX, same hash tag) makes a retried request a
# no-op, and the applied log (RPUSH in the same script, so replicated or lost together with the
# increment) lets the report count exactly which acknowledged ids survived.
INCR_ONCE = """
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[3]) then
  redis.call('RPUSH', KEYS[3], ARGV[2])
  return redis.call('INCRBY', KEYS[1], ARGV[1])
end
return -1
"""


def redis_py_writer(c: Cluster) -> Callable[[], WriteFn]:
    def make() -> WriteFn:
        rc = cluster_client(c)
        script = rc.register_script(INCR_ONCE)

        def write(key: str, rid: str, amount: int) -> object:
            return script(keys=[key, f"{key}:rid:{rid}", f"{key}:applied"], args=[amount, rid, 120_000])

        return write

    return make


def test_harness_counts_losses_and_double_counts_through_a_sigkill(broken_ok: Cluster) -> None:
    c = broken_ok
    masters = c.masters()
    keys = [c.key_on(m, f"w{i}") for i, m in enumerate(masters)]
    victim = masters[0]
    replica = c.replicas(of=victim)[0]
    with FailoverHarness(redis_py_writer(c), keys, rate=200) as h:
        h.wait_acked(300)
        t0 = c.kill(victim)
        promoted = c.wait_for_promotion(replica, since=t0)
        h.wait_acked(100, each=True)  # every writer (the victim's too) is served again
    rc = cluster_client(c)
    try:
        final = {k: int(rc.get(k) or 0) for k in keys}
        applied = {k: Counter(rc.lrange(f"{k}:applied", 0, -1)) for k in keys}
    finally:
        rc.close()
    report = h.report(final, applied)
    print(f"\nSIGKILL under load: replica promoted in {promoted:.2f} s\n{report.summary()}")
    assert report.doubled == 0
    assert all(k.unaccounted == 0 for k in report.keys)
    assert report.keys[0].max_gap >= 1.0  # the victim's writer did see the outage
    c.heal()


def test_harness_counts_the_writes_a_replication_cut_loses(broken_ok: Cluster) -> None:
    """Writes acknowledged while the replica was cut off are lost when the master dies: the
    ledger finds each of them missing."""
    c = broken_ok
    victim = c.masters()[0]
    replica = c.replicas(of=victim)[0]
    key = c.key_on(victim, "cut")
    with FailoverHarness(redis_py_writer(c), [key], rate=300) as h:
        h.wait_acked(100)
        c.cut_replication(replica)
        t_cut = time.monotonic()
        h.wait_acked(150)
        t_kill = c.kill(victim)
        c.cont(replica)
        promoted = c.wait_for_promotion(replica, since=t_kill)
        h.wait_acked(50)
    during_cut = sum(1 for a in h.writers[0].acked if t_cut < a.acked_at < t_kill)
    rc = cluster_client(c)
    try:
        final = {key: int(rc.get(key) or 0)}
        applied = {key: Counter(rc.lrange(f"{key}:applied", 0, -1))}
    finally:
        rc.close()
    report = h.report(final, applied)
    print(f"\nreplication cut then SIGKILL: promoted in {promoted:.2f} s, {during_cut} writes acknowledged "
          f"during the cut\n{report.summary()}")
    assert report.doubled == 0 and report.keys[0].unaccounted == 0
    assert report.lost >= during_cut >= 150
    c.heal()


def test_harness_without_an_applied_log_reports_lower_bounds(broken_ok: Cluster) -> None:
    c = broken_ok
    keys = [c.key_on(m, f"lb{i}") for i, m in enumerate(c.masters())]
    with FailoverHarness(redis_py_writer(c), keys, rate=300) as h:
        h.wait_acked(150)
    rc = cluster_client(c)
    try:
        final = {k: int(rc.get(k) or 0) for k in keys}
    finally:
        rc.close()
    report = h.report(final)
    assert report.lost == 0 and report.doubled == 0
    assert [k.final for k in report.keys] == [k.acked for k in report.keys]
    assert not any(k.exact for k in report.keys)
    # A value short of the ledger is reported as lost, one above it (beyond the writes given
    # up on) as double counted.
    short = h.report({k: v - 1 for k, v in final.items()})
    assert short.lost == 3 and short.doubled == 0
    over = h.report({k: v + 2 for k, v in final.items()})
    assert over.lost == 0 and over.doubled == 6


# --- Sentinel ------------------------------------------------------------------------------------


def test_sentinel_follows_a_sigkilled_master(redis_sentinel_factory: Callable[..., SentinelGroup]) -> None:
    g = redis_sentinel_factory(replicas=1)
    print(f"\nsentinel group (1 replica) ready in {g.started_in:.2f} s")
    sentinel = Sentinel(g.sentinel_addrs, socket_timeout=1.0, decode_responses=True)
    old = g.master()
    assert sentinel.discover_master(g.service) == ("127.0.0.1", old.port)
    [replica] = g.replicas()
    with g.watch() as w:
        _, t0 = g.kill_master()
        event = w.wait()
    print(f"SIGKILL of the Sentinel master: +switch-master after {event.at - t0:.2f} s")
    assert (event.old_port, event.new_port) == (old.port, replica.port)
    g.wait_for_master(replica)
    assert g.master() is replica
    assert sentinel.discover_master(g.service) == ("127.0.0.1", replica.port)
    client = sentinel.master_for(g.service, socket_timeout=1.0, decode_responses=True)
    assert client.incr("after-switch") == 1


def test_sentinel_failover_with_two_replicas_and_min_replicas_to_write(
        redis_sentinel_factory: Callable[..., SentinelGroup]) -> None:
    g = redis_sentinel_factory(replicas=2, min_replicas_to_write=1)
    old = g.master()
    assert old.call("CONFIG", "GET", "min-replicas-to-write") == ["min-replicas-to-write", "1"]
    assert len(g.replicas()) == 2
    with g.watch() as w:
        t0 = g.sentinel_failover()
        event = w.wait()
    print(f"\nSENTINEL FAILOVER: +switch-master after {(event.at - t0) * 1000:.0f} ms")
    new = g.node_by_port(event.new_port)
    assert new is not old and event.old_port == old.port
    g.wait_for_master(new)
    assert g.master() is new
    g.wait_replicas_online(1)  # the other replica follows the new master at once
    client = redis.Redis(port=new.port, socket_timeout=1.0)
    assert client.incr("after-failover") == 1  # min-replicas-to-write 1 is met
    client.close()


# --- TLS cluster ---------------------------------------------------------------------------------


def test_tls_cluster_takes_a_client_certificate(redis_tls_cluster: Cluster, topology_certs: Path) -> None:
    c = redis_tls_cluster
    assert len(c.masters()) == 3 and c.replicas() == []
    rc = cluster_client(c, ssl=True, ssl_ca_certs=str(topology_certs / "ca.pem"),
                        ssl_certfile=str(topology_certs / "client.pem"),
                        ssl_keyfile=str(topology_certs / "client.key"))
    try:
        keys = [f"tls-{i}" for i in range(60)]
        for k in keys:
            rc.incr(k)
        assert [rc.get(k) for k in keys] == ["1"] * 60
        assert len({c.node_for_key(k).port for k in keys}) == 3
        assert sum(end - start + 1 for (start, end) in rc.cluster_slots()) == SLOTS
    finally:
        rc.close()
    # Without a client certificate the handshake is refused (tls-auth-clients yes).
    plain = redis.Redis(port=c.nodes[0].port, ssl=True, ssl_ca_certs=str(topology_certs / "ca.pem"),
                        socket_timeout=1.0, retry=Retry(NoBackoff(), 0))
    with pytest.raises(redis.ConnectionError):
        plain.ping()
    plain.close()


# --- ring ----------------------------------------------------------------------------------------


def test_ring_servers_are_independent_standalone_masters(redis_ring: Ring) -> None:
    clients = [redis.Redis.from_url(u, decode_responses=True) for u in redis_ring.urls]
    try:
        assert len({c.connection_pool.connection_kwargs["port"] for c in clients}) == 3
        for i, c in enumerate(clients):
            assert c.role()[0] == "master"
            assert c.info("cluster")["cluster_enabled"] == 0
            c.set("who", i)
        assert [c.get("who") for c in clients] == ["0", "1", "2"]
    finally:
        for c in clients:
            c.close()


def test_ring_is_flushed_between_tests_and_a_member_restarts_empty(redis_ring: Ring) -> None:
    assert [n.call("DBSIZE") for n in redis_ring.nodes] == [0, 0, 0]
    member = redis_ring.nodes[1]
    member.call("SET", "k", "v")
    member.kill()
    member.start()  # same port; persistence is off
    assert member.call("DBSIZE") == 0
