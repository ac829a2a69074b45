"""A client-side hash ring over three standalone redis-servers (the ``redis_ring`` fixture),
and the circuit breaker per node on a ring and on a Redis Cluster.

The slot table is recomputed here from its documented definition (rendezvous hashing over
the node names: FNV-1a 64 of the name, splitmix64's finalizer with the slot), so the tests
check where keys really land on the servers against an independent implementation.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence

import pytest

import redcount
from helpers import wait_until
from topologies import POLL, TRANSIENT, Node, Ring, key_slot

SLOTS = 16384
M64 = (1 << 64) - 1


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & M64
    return h


def weight(name_hash: int, slot: int) -> int:
    z = (name_hash + 0x9E3779B97F4A7C15 * (slot + 1)) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return z ^ (z >> 31)


def table(names: Sequence[str]) -> list[str]:
    """slot -> the name of the node that owns it."""
    hashes = [(fnv1a64(n.encode()), n) for n in names]
    out = []
    for slot in range(SLOTS):
        best = max(hashes, key=lambda hn: (weight(hn[0], slot), [-ord(c) for c in hn[1]]))
        out.append(best[1])
    return out


def key_per_slot() -> list[str]:
    """One key for each of the 16384 slots."""
    keys: list[str | None] = [None] * SLOTS
    missing = SLOTS
    i = 0
    while missing:
        k = f"ring-key-{i}"
        s = key_slot(k)
        if keys[s] is None:
            keys[s] = k
            missing -= 1
        i += 1
    return [k for k in keys if k is not None]


def keys_on(node: Node) -> set[str]:
    return {k if isinstance(k, str) else k.decode() for k in node.call("KEYS", "*")}


NAMES = ["cache-a", "cache-b", "cache-c"]


@pytest.fixture
def ring_store(redis_ring: Ring) -> Iterator[redcount.Store]:
    store = redcount.connect(redis_ring.urls, routing="ring", names=NAMES)
    yield store
    store.close()


def test_bad_combinations_are_refused(redis_ring: Ring) -> None:
    with pytest.raises(redcount.InvalidInputError, match="routing='ring'"):
        redcount.connect(redis_ring.urls)
    with pytest.raises(redcount.InvalidInputError, match="list of server URLs"):
        redcount.connect(redis_ring.urls[0], routing="ring")
    with pytest.raises(redcount.InvalidInputError, match="routing must be 'ring'"):
        redcount.connect(redis_ring.urls, routing="cluster")
    with pytest.raises(redcount.InvalidInputError, match="names applies"):
        redcount.connect(redis_ring.urls[0], names=["a"])
    with pytest.raises(redcount.InvalidInputError, match="one name per server"):
        redcount.connect(redis_ring.urls, routing="ring", names=["a", "b"])
    with pytest.raises(redcount.InvalidInputError, match="given twice"):
        redcount.connect(redis_ring.urls, routing="ring", names=["a", "b", "a"])
    with pytest.raises(redcount.InvalidInputError, match="distinct servers"):
        redcount.connect([redis_ring.urls[0], redis_ring.urls[0]], routing="ring")
    with pytest.raises(redcount.InvalidInputError, match="redis://, rediss:// or redis\\+sentinel://"):
        redcount.connect([redis_ring.urls[0], "memory://"], routing="ring")
    with pytest.raises(redcount.InvalidInputError, match="at least one"):
        redcount.connect([], routing="ring")
    # ValueError too, for callers that catch that.
    with pytest.raises(ValueError):
        redcount.connect(redis_ring.urls, routing="ring", names=["a", ""])


def test_each_key_lands_where_the_table_says(redis_ring: Ring, ring_store: redcount.Store) -> None:
    owner = table(NAMES)
    by_name = dict(zip(NAMES, redis_ring.nodes))
    keys = [f"user:{i}" for i in range(600)]
    ring_store.execute_many([("SET", k, str(i)) for i, k in enumerate(keys)])
    for node in redis_ring.nodes:
        held = keys_on(node)
        want = {k for k in keys if by_name[owner[key_slot(k)]] is node}
        assert held == want
        assert 100 < len(held) < 300  # spread over the three
    assert ring_store.execute_many([("GET", k) for k in keys]) == [str(i).encode() for i in range(len(keys))]
    # Store.nodes(): one per member, in the order given.
    nodes = ring_store.nodes()
    assert [n.address for n in nodes] == [n.addr for n in redis_ring.nodes]
    assert sorted(n.execute("DBSIZE") for n in nodes) == sorted(len(keys_on(n)) for n in redis_ring.nodes)
    assert ring_store.url.startswith("ring:cache-a=redis://")
    # Default names: "host:port".
    plain = redcount.connect(redis_ring.urls, routing="ring")
    try:
        default_owner = table([n.addr for n in redis_ring.nodes])
        plain.execute("SET", "plain-key", "1")
        holder = next(n for n in redis_ring.nodes if "plain-key" in keys_on(n))
        assert holder.addr == default_owner[key_slot("plain-key")]
    finally:
        plain.close()


def test_counters_limiters_and_sharded_counters(redis_ring: Ring, ring_store: redcount.Store) -> None:
    owner = table(NAMES)
    by_name = dict(zip(NAMES, redis_ring.nodes))
    c = redcount.FixedWindowCounter(ring_store, "ring-fw", 60)
    for i in range(60):
        assert c.incr(f"page:{i}", 2) == 2
    assert c.incr("page:0", 3, request_id="r1") == 5
    assert c.incr("page:0", 3, request_id="r1") == 5
    lim = redcount.Limiter(ring_store, "sliding-window")
    for i in range(30):
        assert lim.hit("2/minute", f"ip:{i}").allowed
        assert lim.hit("2/minute", f"ip:{i}").allowed
        assert not lim.hit("2/minute", f"ip:{i}").allowed
    gcra = redcount.Limiter(ring_store, "gcra")
    assert gcra.hit("5/second", "gcra-key").allowed
    sharded = redcount.ShardedCounter(ring_store, "ring-sharded", shards=16)
    for i in range(200):
        assert sharded.incr(request_id=f"id-{i}")
    assert not sharded.incr(request_id="id-7")  # already applied
    assert sharded.value() == 200

    # Every stored key is on the server the table gives its slot, and the keys that share a
    # hash tag (the keys of one call) share a server.
    tags: dict[str, set[str]] = {}
    for node in redis_ring.nodes:
        for k in keys_on(node):
            assert by_name[owner[key_slot(k)]] is node, k
            if "{" in k:
                tags.setdefault(k[k.index("{") : k.index("}") + 1], set()).add(node.addr)
    assert tags and all(len(holders) == 1 for holders in tags.values())
    # The sharded counter's shards spread over the three servers.
    shard_servers = {
        node.addr for node in redis_ring.nodes for k in keys_on(node) if "ring-sharded" in k
    }
    assert len(shard_servers) == 3


def test_adding_a_node_moves_a_quarter_of_the_slots_all_to_it(redis_ring: Ring) -> None:
    """Measured on where keys really are: one key per slot written through a 3-node ring,
    read through a 4-node ring (the 3 plus a new server); then the 4th removed again."""
    keys = key_per_slot()
    fourth = Node(name="ring").start()
    try:
        three = redcount.connect(redis_ring.urls, routing="ring", names=NAMES)
        four = redcount.connect([*redis_ring.urls, f"redis://{fourth.addr}/0"], routing="ring",
                                names=[*NAMES, "cache-d"])
        try:
            for i in range(0, SLOTS, 2048):
                three.execute_many([("SET", k, "3") for k in keys[i : i + 2048]])
            found: list[object] = []
            for i in range(0, SLOTS, 2048):
                found += four.execute_many([("GET", k) for k in keys[i : i + 2048]])
            moved = [k for k, v in zip(keys, found) if v is None]
            fraction = len(moved) / SLOTS
            assert 0.22 <= fraction <= 0.28, fraction
            # Nothing moved between the old nodes: every key still found is where it was, and
            # every moved key, written again through the 4-node ring, lands on the new node.
            assert keys_on(fourth) == set()
            four.execute_many([("SET", k, "4") for k in moved])
            assert keys_on(fourth) == set(moved)
            assert fraction == pytest.approx(table([*NAMES, "cache-d"]).count("cache-d") / SLOTS)
            print(f"\nring: adding a 4th node moved {len(moved)} of {SLOTS} slots ({fraction:.2%}), all to it")

            # Removing it again: only its slots move (back to where they were), the rest stay.
            back = three.execute_many([("GET", k) for k in keys])
            assert all(v == b"3" for v in back)
            assert sum(1 for k in keys if four.execute("GET", k) == b"4") == len(moved)
        finally:
            three.close()
            four.close()
    finally:
        fourth.cleanup()


def _owned_keys(owner: list[str], name: str, n: int, prefix: str) -> list[str]:
    out = []
    i = 0
    while len(out) < n:
        k = f"{prefix}{i}"
        if owner[key_slot(k)] == name:
            out.append(k)
        i += 1
    return out


def test_a_killed_node_fails_fast_the_others_serve_and_it_recovers(redis_ring: Ring) -> None:
    owner = table(NAMES)
    victim = redis_ring.nodes[1]  # cache-b
    dead_keys = _owned_keys(owner, "cache-b", 20, "dk")
    live_keys = _owned_keys(owner, "cache-a", 10, "lk") + _owned_keys(owner, "cache-c", 10, "lk")
    store = redcount.connect(redis_ring.urls, routing="ring", names=NAMES, budget=0.1)
    assert isinstance(store, redcount.ResilientStore)
    try:
        store.execute_many([("SET", k, "1") for k in dead_keys + live_keys])
        assert store.node_breakers and set(store.node_breakers.values()) == {"closed"}
        victim.kill()

        # The first calls find it dead; then its breaker opens and its keys fail fast.
        t_kill = time.monotonic()
        calls_to_open = 0
        while "open" not in store.node_breakers.values() and time.monotonic() - t_kill < 5:
            calls_to_open += 1
            try:
                store.execute("INCR", dead_keys[0])
            except redcount.Unavailable:
                pass
        t_open = time.monotonic() - t_kill
        opened = [w for w, s in store.node_breakers.items() if s == "open"]
        assert len(opened) == 1 and "cache-b" in opened[0]
        t = time.monotonic()
        for k in dead_keys:
            with pytest.raises(redcount.Unavailable, match="circuit breaker is open"):
                store.execute("INCR", k)
        fast = (time.monotonic() - t) / len(dead_keys)
        assert fast < 0.05  # far below the budget: nothing waits on the dead server
        t = time.monotonic()
        for _ in range(20):
            store.execute_many([("INCR", k) for k in live_keys])
        live = (time.monotonic() - t) / 20
        # The other servers keep serving, alone and in batches.
        assert store.execute_many([("INCR", k) for k in live_keys]) == [22] * len(live_keys)
        # A batch over all three: the live servers' requests complete; the dead one's were not sent.
        with pytest.raises(redcount.Unavailable) as info:
            store.execute_many([("INCR", k) for k in live_keys + dead_keys[:3]])
        outcomes = info.value.outcomes
        assert outcomes is not None
        assert outcomes[: len(live_keys)] == [23] * len(live_keys)
        assert outcomes[len(live_keys) :] == ["not sent"] * 3
        # The enum members, equal to the strings above.
        assert all(o is redcount.Outcome.NOT_SENT for o in outcomes[len(live_keys) :])
        assert info.value.maybe_applied is False
        # A limiter: keys stored on the dead server are decided by its policy, at once; the
        # others by Redis.
        lim = redcount.Limiter(store, on_unavailable="allow")
        decisions = [lim.hit("5/minute", f"who-{i}") for i in range(60)]
        unavailable = sum(1 for d in decisions if d.unavailable)
        assert 5 < unavailable < 40
        assert all(d.allowed for d in decisions)
        assert all(d.remaining == 4 for d in decisions if not d.unavailable)
        assert store.breaker_state == "open"

        # Back: the probe closes the breaker and its keys are served again.
        victim.start()
        t_up = time.monotonic()

        def served() -> bool:
            try:
                return store.execute("INCR", dead_keys[0]) == 1  # restarted empty (no persistence)
            except redcount.Unavailable:
                return False
        assert wait_until(served, 10, what="cache-b serving again", interval=POLL, ignore=TRANSIENT)
        back = time.monotonic() - t_up
        print(f"\nring, a member SIGKILLed (budget 100 ms): breaker open after {calls_to_open} calls "
              f"({t_open * 1000:.0f} ms); then {fast * 1e6:.0f} us per refused call, the other members "
              f"{live * 1000:.2f} ms per 20-key batch; served again {back * 1000:.0f} ms after its restart")
        assert set(store.node_breakers.values()) == {"closed"}
        assert store.breaker_state == "closed"
        assert store.breaker_switches >= 2
    finally:
        store.close()
        if not victim.alive:
            victim.start()


def test_a_killed_node_goes_to_the_fallback_for_its_keys_only(redis_ring: Ring) -> None:
    owner = table(NAMES)
    victim = redis_ring.nodes[2]  # cache-c
    dead_keys = _owned_keys(owner, "cache-c", 6, "fk")
    live_keys = _owned_keys(owner, "cache-a", 5, "fl")
    store = redcount.connect(redis_ring.urls, routing="ring", names=NAMES, budget=0.1, fallback="memory://")
    try:
        store.execute_many([("SET", k, "10") for k in dead_keys + live_keys])
        victim.kill()

        def opened() -> bool:
            try:
                store.execute("INCR", dead_keys[0])
            except redcount.Unavailable:
                pass  # written just before the server died: may have run, so not rerun
            return store.breaker_state == "open"

        assert wait_until(opened, 5, what="cache-c's breaker open", interval=POLL, ignore=TRANSIENT)
        assert store.using_fallback
        # One batch over both: cache-a's requests run on Redis, cache-c's (refused by its
        # breaker, so never sent) on the fallback, which starts empty.
        fresh = dead_keys[1:]
        replies = store.execute_many([("INCR", k) for k in live_keys + fresh])
        assert replies == [11] * len(live_keys) + [1] * len(fresh)
        c = redcount.FixedWindowCounter(store, "fb", 60)
        for k in fresh + live_keys:
            assert c.incr(k) == 1
        assert store.node_breakers and sorted(store.node_breakers.values()) == ["closed", "closed", "open"]
    finally:
        store.close()
        if not victim.alive:
            victim.start()


def test_a_stopped_cluster_master_fails_fast_through_its_own_breaker(redis_cluster_factory) -> None:  # type: ignore[no-untyped-def]
    """On a Redis Cluster (no replicas, full coverage not required, so the others keep their
    slots): a SIGSTOPped master times out, its breaker opens, its keys fail fast, the other
    masters keep serving; SIGCONT and it serves again."""
    cluster = redis_cluster_factory(masters=3, replicas=0, node_timeout_ms=5000,
                                    config=["cluster-require-full-coverage no"])
    store = redcount.connect(cluster.url, budget=0.2)
    assert isinstance(store, redcount.ResilientStore)
    masters = cluster.masters()
    victim = masters[0]
    by_master: dict[int, list[str]] = {m.port: [] for m in masters}
    i = 0
    while any(len(v) < 5 for v in by_master.values()):
        k = f"ck{i}"
        port = cluster.node_for_key(k).port
        if len(by_master[port]) < 5:
            by_master[port].append(k)
        i += 1
    dead_keys = by_master[victim.port]
    live_keys = [k for port, ks in by_master.items() if port != victim.port for k in ks]
    try:
        store.execute_many([("SET", k, "1") for k in dead_keys + live_keys])
        cluster.stop(victim)
        t_stop = time.monotonic()
        calls_to_open = 0
        while store.breaker_state != "open" and time.monotonic() - t_stop < 5:
            calls_to_open += 1
            try:
                store.execute("INCR", dead_keys[0])
            except redcount.Unavailable:
                pass
        t_open = time.monotonic() - t_stop
        assert store.breaker_state == "open"
        opened = [w for w, s in store.node_breakers.items() if s == "open"]
        assert opened == [f"redis://{victim.addr}"]
        t = time.monotonic()
        for k in dead_keys:
            with pytest.raises(redcount.Unavailable, match="circuit breaker is open"):
                store.execute("GET", k)
        fast = (time.monotonic() - t) / len(dead_keys)
        assert fast < 0.1
        assert store.execute_many([("INCR", k) for k in live_keys]) == [2] * len(live_keys)
        cluster.cont(victim)
        t_cont = time.monotonic()

        def served() -> bool:
            try:
                return store.execute("GET", dead_keys[1]) == b"1"
            except redcount.Unavailable:
                return False

        assert wait_until(served, 10, what="the master serving again", interval=POLL, ignore=TRANSIENT)
        print(f"\ncluster, a master SIGSTOPped (budget 200 ms): breaker open after {calls_to_open} calls "
              f"({t_open * 1000:.0f} ms); then {fast * 1e6:.0f} us per refused call; served again "
              f"{(time.monotonic() - t_cont) * 1000:.0f} ms after SIGCONT")
        assert store.breaker_state == "closed"
    finally:
        if victim.paused:
            cluster.cont(victim)
        store.close()
