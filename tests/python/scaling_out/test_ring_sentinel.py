"""A client-side hash ring whose members are Sentinel groups (``redis+sentinel://`` URLs),
beside a standalone server: keys land on each group's master where the ring's table says;
counters, limiters and sharded counters run on it, sync and asyncio; a ``SENTINEL FAILOVER``
and a SIGKILL of one group's master are followed by that member alone (its writers lose
nothing acknowledged and count nothing twice) while the other members' writers go on.

Run with ``-s`` to see the measured figures:

    pytest -s tests/python/scaling_out/test_ring_sentinel.py
"""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from failover_harness import FailoverHarness, Report
from test_ring import _owned_keys, table
from test_sentinel import fail_over_in_sync, redcount_writer, settled_master, tls_client_url, tls_files
from test_sentinel import state as sentinel_state
from helpers import wait_until
from topologies import HOST, POLL, TRANSIENT, Ring, SentinelGroup, key_slot

import redcount
import redcount.aio as aio

_testing = pytest.importorskip("redcount._core._testing")

pytestmark = pytest.mark.redis_only

NAMES = ["group-a", "group-b", "plain-c"]
RATE = 200.0  # writes/s per writer


def owned_tags(owner: str, n: int, prefix: str) -> list[str]:
    """``n`` hash tags ("{prefix<i>}") whose slot the ring's table gives to ``owner``: keys
    built on one (``{tag}:rid:...``) stay on that member."""
    return [f"{{{k}}}" for k in _owned_keys(table(NAMES), owner, n, prefix)]


@pytest.fixture(scope="module")
def groups(redis_sentinel_factory: Callable[..., SentinelGroup]) -> tuple[SentinelGroup, SentinelGroup]:
    """Two groups for the non-destructive tests (different services, sentinels and servers)."""
    return redis_sentinel_factory(replicas=1, service="ring-a"), redis_sentinel_factory(replicas=1, service="ring-b")


def ring_urls(a: SentinelGroup, b: SentinelGroup, plain: Ring) -> list[str]:
    return [a.url, b.url, plain.urls[0]]


@pytest.fixture
def store(groups: tuple[SentinelGroup, SentinelGroup], redis_ring: Ring) -> Iterator[redcount.Store]:
    a, b = groups
    s = redcount.connect(ring_urls(a, b, redis_ring), routing="ring", names=NAMES)
    for n in s.nodes():
        n.execute("FLUSHALL")
    try:
        yield s
    finally:
        s.close()


def test_keys_land_on_each_groups_master_where_the_table_says(
    groups: tuple[SentinelGroup, SentinelGroup], redis_ring: Ring, store: redcount.Store
) -> None:
    a, b = groups
    where = {"group-a": a.master(), "group-b": b.master(), "plain-c": redis_ring.nodes[0]}
    t = table(NAMES)
    keys = [f"k{i}" for i in range(600)]
    store.execute_many([("SET", k, k) for k in keys])
    for k in keys:
        owner = t[key_slot(k)]
        assert where[owner].call("GET", k) == k, f"{k} (slot {key_slot(k)}) is not on {owner}'s master"
        for other, node in where.items():
            if other != owner:
                assert node.call("EXISTS", k) == 0
    assert {t[key_slot(k)] for k in keys} == set(NAMES)  # every member got keys
    # Nothing was written to a replica or a sentinel: each group's replica holds exactly its
    # master's keys (replicated), the sentinels none.
    for g in groups:
        [replica] = g.replicas()
        assert replica.call("DBSIZE") == g.master().call("DBSIZE") > 0


def test_the_url_names_and_nodes(groups: tuple[SentinelGroup, SentinelGroup], redis_ring: Ring) -> None:
    a, b = groups
    with redcount.connect(ring_urls(a, b, redis_ring), routing="ring") as s:
        # Default names: "service@host:port" of each group's first sentinel.
        first_a, first_b = a.sentinels[0], b.sentinels[0]
        plain = redis_ring.nodes[0].addr
        assert s.url == (f"ring:ring-a@{HOST}:{first_a.port}={a.url}/0,ring-b@{HOST}:{first_b.port}={b.url}/0,"
                         f"{plain}=redis://{plain}/0")
        assert s.execute("PING") == "PONG"
        na, nb, nc = s.nodes()
        assert na.url == a.url + "/0" and nb.url == b.url + "/0"
        assert na.execute("ROLE")[0] == b"master"
        assert sentinel_state(na) == (f"{HOST}:{a.master().port}", 0)
        assert nc.execute("PING") == "PONG"
        na.close()  # a node's store is a view: closing it leaves the ring's member open
        assert s.execute("SET", owned_tags("group-a", 1, "v")[0], "1") == "OK"


def test_bad_input(groups: tuple[SentinelGroup, SentinelGroup], redis_ring: Ring) -> None:
    a, _ = groups
    with pytest.raises(redcount.InvalidInputError, match="given twice"):
        redcount.connect([a.url, a.url], routing="ring")
    with pytest.raises(redcount.InvalidInputError, match="no ring server is a redis\\+sentinel"):
        redcount.connect(redis_ring.urls, routing="ring", sentinel_password="x")
    with pytest.raises(redcount.InvalidInputError, match="sentinel_username needs sentinel_password"):
        redcount.connect([a.url, redis_ring.urls[0]], routing="ring", sentinel_username="u")
    with pytest.raises(redcount.InvalidInputError, match="must be a redis://, rediss:// or redis\\+sentinel://"):
        redcount.connect([a.url, "unix:///tmp/x.sock"], routing="ring")


def test_sentinel_keywords_reach_every_group(redis_sentinel_factory: Callable[..., SentinelGroup],
                                              redis_ring: Ring) -> None:
    g = redis_sentinel_factory(replicas=1, service="ring-pw")
    for s in g.sentinels:
        assert s.call("ACL", "SETUSER", "default", "resetpass", ">s-secret") == "OK"
    urls, names = [g.url, redis_ring.urls[0]], ["a", "b"]
    keys = [f"p{i}" for i in range(64)]  # both members' slots
    with redcount.connect(urls, routing="ring", names=names, command_timeout=0.5) as bad, \
            pytest.raises(redcount.ConnectionError, match="NOAUTH"):
        bad.execute_many([("SET", k, 1) for k in keys])
    with redcount.connect(urls, routing="ring", names=names, sentinel_password="s-secret") as good:
        assert good.execute_many([("SET", k, 1) for k in keys]) == ["OK"] * 64
    assert g.first_master.call("DBSIZE") > 0


def test_counters_limiters_and_sharded_counters(store: redcount.Store) -> None:
    counter = redcount.FixedWindowCounter(store, "hits", 3600)
    keys = [f"user{i}" for i in range(50)]
    for _ in range(3):
        counter.incr_many({k: 1 for k in keys})
    assert counter.get_many(keys) == {k: 3 for k in keys}
    assert counter.incr("user0", 2, request_id="r1") == 5
    assert counter.incr("user0", 2, request_id="r1") == 5  # a retry: counted once
    lim = redcount.Limiter(store, "sliding-window")
    assert sum(bool(lim.hit("10/minute", k)) for k in keys for _ in range(12)) == 500
    sharded = redcount.ShardedCounter(store, "views", shards=16)
    for i in range(40):
        assert sharded.incr(request_id=f"r{i}")
    assert not sharded.incr(request_id="r7")  # already applied
    assert sharded.value() == 40
    # Every member holds some of the state: the sharded counter's shards spread over them.
    assert all(n.execute("DBSIZE") > 0 for n in store.nodes())


def test_asyncio_calls(store: redcount.Store) -> None:
    async def main() -> int:
        counter = aio.FixedWindowCounter(store, "aio", 3600)
        await asyncio.gather(*(counter.incr(f"k{i % 30}") for i in range(300)))
        return sum((await counter.get_many([f"k{i}" for i in range(30)])).values())

    assert asyncio.run(main()) == 300


# --- a failover in one member while the others serve ---------------------------------------------


def ring_report(a: SentinelGroup, b: SentinelGroup, h: FailoverHarness) -> Report:
    masters = {"group-a": settled_master(a), "group-b": settled_master(b)}
    t = table(NAMES)
    final, applied = {}, {}
    for k in h.keys:
        m = masters[t[key_slot(k)]]
        final[k] = int(m.call("GET", k) or 0)
        applied[k] = Counter(str(x) for x in m.call("LRANGE", f"{k}:applied", 0, -1))
    return h.report(final, applied)


@pytest.mark.parametrize("fault", ["sentinel-failover", "sigkill"])
def test_one_member_fails_over_the_others_go_on(redis_sentinel_factory: Callable[..., SentinelGroup],
                                                 redis_ring: Ring, fault: str) -> None:
    a = redis_sentinel_factory(replicas=1, service="ring-fa")
    b = redis_sentinel_factory(replicas=1, service="ring-fb")
    old = a.master()
    [replica] = a.replicas()
    on_a, on_b = owned_tags("group-a", 1, "fa")[0], owned_tags("group-b", 1, "fb")[0]
    store = redcount.connect(ring_urls(a, b, redis_ring), routing="ring", names=NAMES, command_timeout=3.0)
    try:
        member_a = store.nodes()[0]
        with FailoverHarness(redcount_writer(store), [on_a, on_b], rate=RATE) as h:
            h.wait_acked(200)
            with a.watch() as w:
                if fault == "sigkill":
                    _, t0 = a.kill_master()
                else:
                    t0 = a.sentinel_failover()
                event = w.wait()
            h.wait_acked(100, each=True)
        report = ring_report(a, b, h)
        wa, wb = h.writers
        print(f"\n[ring of Sentinel groups] {fault}: Sentinel switched {event.at - t0:.2f} s after the fault; "
              f"group-a writer: {len(wa.acked)} acknowledged, longest gap {report.keys[0].max_gap * 1000:.0f} ms, "
              f"lost {report.keys[0].lost}, errors {report.keys[0].errors}; group-b writer: {len(wb.acked)} "
              f"acknowledged, longest gap {report.keys[1].max_gap * 1000:.0f} ms, errors {report.keys[1].errors}")
        assert (event.old_port, event.new_port) == (old.port, replica.port)
        # The ring's member followed its group's new master; the other group was untouched.
        assert sentinel_state(member_a) == (f"{HOST}:{replica.port}", 1)
        assert sentinel_state(store.nodes()[1])[1] == 0
        assert report.doubled == 0
        assert all(k.unaccounted == 0 for k in report.keys)
        assert report.keys[1].lost == 0 and not report.keys[1].errors  # group-b never noticed
        if fault == "sentinel-failover":
            # The failover hold: nothing acknowledged by the old master after Sentinel chose
            # the replica, so nothing lost.
            assert report.keys[0].lost == 0
            holds, early, _ = _testing.sentinel_holds(member_a)
            assert (holds, early) == (1, 1)
        assert replica.call("GET", on_a) is not None  # group-a's writes reached the new master
    finally:
        store.close()


def test_a_forked_child_opens_its_own_follower(store: redcount.Store) -> None:
    tag = owned_tags("group-a", 1, "fork")[0]
    store.execute("SET", tag, "0")
    pid = os.fork()
    if pid == 0:
        try:
            code = 0 if store.execute("INCR", tag) == 1 else 1
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.execute("GET", tag) == b"1"


def test_a_stopped_group_fails_fast_through_its_own_breaker(redis_sentinel_factory: Callable[..., SentinelGroup],
                                                            redis_ring: Ring) -> None:
    """With ``budget``, a Sentinel member has a breaker of its own: its master stopped (and no
    failover: ``down-after-milliseconds`` is long), its keys fail fast once the breaker opens
    while the other members serve; resumed, the probe closes it."""
    a = redis_sentinel_factory(replicas=1, service="ring-stop", down_after_ms=60_000)
    b = redis_sentinel_factory(replicas=1, service="ring-go")
    stuck = owned_tags("group-a", 5, "st")
    live = owned_tags("group-b", 5, "lv") + owned_tags("plain-c", 5, "lv")
    store = redcount.connect(ring_urls(a, b, redis_ring), routing="ring", names=NAMES, budget=0.1,
                             command_timeout=0.2)
    assert isinstance(store, redcount.ResilientStore)
    master = a.master()
    try:
        store.execute_many([("SET", k, "0") for k in stuck + live])
        master.pause()
        calls = 0
        while "open" not in store.node_breakers.values() and calls < 50:
            calls += 1
            try:
                store.execute("INCR", stuck[0])
            except (redcount.Unavailable, redcount.TimeoutError):
                pass
        opened = [w for w, s in store.node_breakers.items() if s == "open"]
        assert len(opened) == 1 and "group-a" in opened[0] and "ring-stop" in opened[0], store.node_breakers
        for k in stuck:
            with pytest.raises(redcount.Unavailable, match="circuit breaker is open"):
                store.execute("INCR", k)
        assert store.execute_many([("INCR", k) for k in live]) == [1] * len(live)
        master.resume()

        def served() -> bool:
            try:
                store.execute("INCR", stuck[1])
                return True
            except redcount.Unavailable:
                return False

        assert wait_until(served, 10, what="group-a serving again", interval=POLL, ignore=TRANSIENT)
        assert set(store.node_breakers.values()) == {"closed"}
    finally:
        if not master.reachable:
            master.resume()
        store.close()


def test_a_tls_group_beside_a_plain_server(redis_sentinel_factory: Callable[..., SentinelGroup],
                                           redis_ring: Ring, topology_certs: Path) -> None:
    """A ``rediss+sentinel://`` member (TLS to its sentinels and master, client certificates
    from its URL's query) beside a plain server: keys spread over both, and the member
    follows a ``SENTINEL FAILOVER`` over TLS while the plain server's keys are untouched."""
    g = redis_sentinel_factory(replicas=1, tls=tls_files(topology_certs), service="ring-tls")
    url = tls_client_url(g, topology_certs)
    names = ["secure", "plain"]
    redis_ring.nodes[0].call("FLUSHALL")
    store = redcount.connect([url, redis_ring.urls[0]], routing="ring", names=names, command_timeout=5.0)
    try:
        counter = redcount.FixedWindowCounter(store, "tls-ring", window=3600)
        keys = [f"k{i}" for i in range(40)]
        for k in keys:
            assert counter.incr(k, request_id=f"{k}-1") == 1
        # Both members hold some of the counts.
        assert g.master().call("DBSIZE") > 0 and redis_ring.nodes[0].call("DBSIZE") > 0
        event = fail_over_in_sync(g)
        wait_until(lambda: sentinel_state(store.nodes()[0])[1] == 1, 15, what="the member switched masters")
        for k in keys:
            n = None
            for _ in range(50):
                try:
                    n = counter.incr(k, request_id=f"{k}-2")
                    break
                except redcount.ConnectionError as e:
                    assert e.maybe_applied, e
            assert n == 2, (k, n)
        assert counter.get_many(keys) == {k: 2 for k in keys}
        assert g.node_by_port(event.new_port).call("ROLE")[0] == "master"
    finally:
        store.close()
