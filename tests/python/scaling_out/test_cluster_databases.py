"""Databases other than 0 on a cluster: ``redcount.connect("redis+cluster://.../1")``.

A Redis Cluster has one database and answers ``SELECT 1`` with an error; a Valkey 9 cluster
holds ``cluster-databases`` of them. redcount leaves the choice to the server: every
connection to every node SELECTs the URL's database, those opened after a MOVED, an ASK or a
new slot table included, and a server that refuses gets a message saying which servers do.
Each test asks the server binary the suite runs on (``REDCOUNT_TEST_REDIS_SERVER``) which
answer to expect: tests/run_all.sh runs this module on Redis 7 and on Valkey 9.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import redcount
from conftest import server_product
from helpers import wait_until
from topologies import HOST, POLL, TOPOLOGY_TIMEOUT, Cluster, Node, key_slot

PRODUCT = server_product()
NAME, VERSION = PRODUCT.split(" ", 1)
MULTI_DB = NAME == "Valkey" and int(VERSION.split(".")[0]) >= 9  # cluster-databases came in Valkey 9.0


def in_db(node: Node, db: int, *args: str | int, asking: bool = False) -> object:
    """One command on ``node`` in database ``db``, over a raw connection (not redcount's);
    ``asking``: for a slot ``node`` is importing."""
    with node.conn() as c:
        assert c.call("SELECT", db) == "OK"
        if asking:
            assert c.call("ASKING") == "OK"
        return c.call(*args)


@pytest.fixture(scope="module")
def multi_db_cluster(redis_cluster_factory: Callable[..., Cluster]) -> Cluster:
    return redis_cluster_factory(masters=3, replicas=0, config=["cluster-databases 16"])


@pytest.fixture
def stores(multi_db_cluster: Cluster) -> Iterator[tuple[redcount.Store, redcount.Store]]:
    multi_db_cluster.flushall()  # every database
    s0, s1 = redcount.connect(multi_db_cluster.url + "/0"), redcount.connect(multi_db_cluster.url + "/1")
    try:
        yield s0, s1
    finally:
        s0.close()
        s1.close()


@pytest.mark.skipif(MULTI_DB, reason=f"{PRODUCT} serves databases in cluster mode (the test below)")
def test_a_cluster_without_databases_refuses_database_1_clearly(redis_cluster: Cluster) -> None:
    store = redcount.connect(redis_cluster.url + "/1")
    try:
        assert store.url.endswith("/1")
        with pytest.raises(redcount.RedcountError) as err:
            store.execute("SET", "k", "v")
        text = str(err.value)
        assert "cannot select database 1" in text, text
        assert "does not support databases in cluster mode" in text, text
        assert "Valkey 9" in text and "cluster-databases" in text, text
    finally:
        store.close()
    assert redis_cluster.node_for_key("k").call("EXISTS", "k") == 0  # not written to database 0 instead


@pytest.mark.skipif(not MULTI_DB, reason=f"{PRODUCT} has no databases in cluster mode (the test above)")
def test_database_1_beyond_cluster_databases_is_refused(redis_cluster: Cluster) -> None:
    # The shared cluster runs with Valkey's default cluster-databases 1.
    store = redcount.connect(redis_cluster.url + "/1")
    try:
        with pytest.raises(redcount.RedcountError, match="cannot select database 1 .*check the /db part of the URL"):
            store.execute("SET", "k", "v")
    finally:
        store.close()


@pytest.mark.skipif(not MULTI_DB, reason=f"{PRODUCT} has no databases in cluster mode (the test above)")
def test_database_1_on_every_node_through_ask_moved_and_a_new_node(
    multi_db_cluster: Cluster, stores: tuple[redcount.Store, redcount.Store]
) -> None:
    c = multi_db_cluster
    s0, s1 = stores
    assert s1.url.endswith("/1") and s0.url.endswith("/0")
    a, b = c.masters()[:2]

    # ASK: a slot migrating from a to b; a key a does not hold is written on b, after ASKING.
    # (The store's first call: it reads the slot table of three masters.)
    asked = c.key_on(a, "asked")
    slot = key_slot(asked)
    b.call("CLUSTER", "SETSLOT", slot, "IMPORTING", c.node_id(a))
    a.call("CLUSTER", "SETSLOT", slot, "MIGRATING", c.node_id(b))
    assert s1.execute("SET", asked, "1") == "OK"
    assert in_db(b, 1, "GET", asked, asking=True) == "1"
    assert in_db(b, 0, "EXISTS", asked, asking=True) == 0
    for m in c.masters():
        m.call("CLUSTER", "SETSLOT", slot, "NODE", c.node_id(b))
    wait_until(lambda: all(c.node_for_slot(slot, via=n).port == b.port for n in c.reachable()),
               TOPOLOGY_TIMEOUT, what=f"slot {slot} on {b}", interval=POLL)

    # MOVED to a node that joined after the store read its slot table: its connections are
    # opened after the MOVED and the new table, and select database 1 too.
    d = Node(["cluster-databases 16", "cluster-node-timeout 2000"], cluster=True, name="cluster-node").start()
    c.nodes.append(d)  # killed with the cluster
    a.call("CLUSTER", "MEET", HOST, d.port, d.bus_port)
    wait_until(lambda: all(any(e.port == d.port for e in c.cluster_nodes(via=n)) for n in c.reachable()),
               TOPOLOGY_TIMEOUT, what=f"every node knows {d}", interval=POLL)
    moved = c.key_on(a, "moved")
    assert c.migrate_slot(key_slot(moved), d) == 0  # no key anywhere yet: nothing to carry
    assert s1.execute("SET", moved, "2") == "OK"
    assert in_db(d, 1, "GET", moved) == "2" and d.call("EXISTS", moved) == 0
    assert s1.execute("GET", moved) == b"2" and s0.execute("GET", moved) is None
    assert len(s1.nodes()) == 4

    # Counters over every master land in database 1 only.
    counter = redcount.FixedWindowCounter(s1, "dbs", 60)
    amounts = {f"user-{i}": 1 for i in range(200)}
    assert counter.incr_many(amounts) == amounts
    assert counter.get_many(list(amounts)) == amounts
    assert redcount.FixedWindowCounter(s0, "dbs", 60).get_many(list(amounts)) == dict.fromkeys(amounts, 0)
    assert all(n.execute("DBSIZE") == 0 for n in s0.nodes())
    for n in c.masters():
        assert in_db(n, 1, "DBSIZE") > 0 and n.call("DBSIZE") == 0, n
