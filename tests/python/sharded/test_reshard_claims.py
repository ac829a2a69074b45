"""Request ids stay exactly once across a reshard on every store, Redis Cluster included.

On one server (and ``memory://``) a write with a request id checks and records the id in
every generation's shard in one script. On Redis Cluster the generations' shards are in
different hash slots, so for ``idempotency_ttl`` + 60 s after a reshard such a write first
claims the id in the older shards (``sharded_claim.lua``), then writes its own shard. These
tests write through a reshard with writers on both layouts, retries and a claim left by a
crash, and check that the final value is the number of distinct ids.
"""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import redcount
from conftest import RedisServer
from helpers import wait_until
from topologies import Cluster

CLAIM_LUA = (Path(__file__).resolve().parents[3] / "cpp" / "lua" / "sharded_claim.lua").read_text()
ID_TTL_MS = 60_000


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis_only),
                        pytest.param("cluster", marks=pytest.mark.redis_only)])
def any_store(request: pytest.FixtureRequest) -> Iterator[redcount.Store]:
    """The embedded store, one redis-server, and the shared 3-master Redis Cluster."""
    if request.param == "memory":
        s = redcount.connect()
    elif request.param == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        s = redcount.connect(f"redis://127.0.0.1:{server.port}/0")
        s.execute("FLUSHALL")
    else:
        cluster: Cluster = request.getfixturevalue("redis_cluster")
        s = redcount.connect(cluster.url)
    try:
        yield s
    finally:
        s.close()


def claim_alone(store: redcount.Store, key: str) -> None:
    """The claim step of a write whose writer crashed before the write itself."""
    try:
        store.execute("EVAL", CLAIM_LUA, 1, key, ID_TTL_MS)
    except redcount.RedcountError as e:
        # memory:// runs no Lua text (it recognises redcount's own script calls and runs
        # their native twins, which the C++ tests compare with this file): write what the
        # claim writes on an id key it finds empty.
        if "EVAL" not in str(e).upper():
            raise
        store.execute("SET", key, "n", "PX", ID_TTL_MS, "NX")


def counter(store: redcount.Store, shards: int = 4) -> redcount.ShardedCounter:
    return redcount.ShardedCounter(store, "claims", shards=shards)


def test_writers_with_request_ids_through_a_reshard(any_store: redcount.Store) -> None:
    applied: Counter[str] = Counter()
    lock = threading.Lock()
    stop = threading.Event()
    written = [0]
    errors: list[BaseException] = []

    def write(t: int) -> None:
        rng = random.Random(t)
        c = counter(any_store)
        recent: list[str] = []
        i = 0
        try:
            while not stop.is_set() or i < 100:
                rid = f"t{t}-{i}"
                i += 1
                ids = [rid]
                if rng.random() < 0.3 and recent:
                    ids.append(rng.choice(recent[-300:]))  # a retry, often across the reshard
                oks = [c.incr(request_id=r) for r in ids]
                if rng.random() < 0.1:
                    oks += c.incr_many([("claims", 1, f"m{t}-{i}"), ("claims", 1, rid)])
                    ids += [f"m{t}-{i}", rid]
                recent.append(rid)
                with lock:
                    for r, ok in zip(ids, oks):
                        applied[r] += ok
                    written[0] += 1
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    threads = [threading.Thread(target=write, args=(t,)) for t in range(3)]
    for th in threads:
        th.start()
    wait_until(lambda: written[0] >= 200 or bool(errors), timeout=60, what="writes before the reshard")
    counter(any_store).reshard(16)
    wait_until(lambda: sum(counter(any_store).shard_values()[4:]) >= 200 or bool(errors), timeout=60,
               what="writes to the new generation")
    stop.set()
    for th in threads:
        th.join()
    assert errors == []
    assert max(applied.values()) == 1, "an id was counted twice"
    distinct = len(applied)
    assert sum(applied.values()) == distinct, "every id applied once"
    assert counter(any_store).value() == distinct
    # Every id again, from a fresh writer on the new layout: all duplicates.
    c = counter(any_store)
    assert not any(c.incr_many([("claims", 1, r) for r in sorted(applied)]))
    assert c.value() == distinct


def test_a_stale_writer_on_the_old_layout(any_store: redcount.Store) -> None:
    fresh, stale = counter(any_store), counter(any_store)
    assert stale.value() == 0  # `stale` holds the first layout for up to a second
    fresh.reshard(8)
    assert stale.cached_layout.version == 1
    # The stale writer's new ids go to the first generation's (now frozen) shards while it
    # believes that layout: each counts once, whichever layout its retries are on.
    assert all(stale.incr(request_id=f"b{i}") for i in range(20))
    assert not any(fresh.incr(request_id=f"b{i}") for i in range(20))
    assert not any(stale.incr(request_id=f"b{i}") for i in range(20))
    # Ids the up-to-date writer applied (on a cluster: claimed in their old shards first):
    # a writer on the old layout meets them and does not count them again.
    stale_again = counter(any_store)
    assert stale_again.value() == 20
    assert stale_again.cached_layout.version == 2
    assert all(fresh.incr(request_id=f"a{i}") for i in range(20))
    assert not any(stale.incr(request_id=f"a{i}") for i in range(20))
    assert fresh.value() == 40 and counter(any_store).value() == 40


def test_a_retry_of_a_maybe_applied_write_after_the_reshard(
    any_store: redcount.Store, request: pytest.FixtureRequest
) -> None:
    c = counter(any_store)
    # A first attempt that landed before the reshard (its caller saw maybe_applied=True),
    # retried with the same id after it.
    assert c.incr(request_id="landed")
    counter(any_store).reshard(8)
    assert not c.incr(request_id="landed")
    assert not counter(any_store).incr(request_id="landed")
    kind = request.node.callspec.params["any_store"]
    if kind == "memory":
        assert c.value() == 1
        return
    # A real one, after the reshard: the servers hold writes for longer than the writer's
    # timeout, then run them. On a cluster the timeout may fall in the claim step or in the
    # write: either way the retries with the same id bring the id to exactly one.
    if kind == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        url = f"redis://127.0.0.1:{server.port}/0"
    else:
        cluster: Cluster = request.getfixturevalue("redis_cluster")
        url = cluster.url
    impatient = redcount.connect(url, command_timeout=0.3)
    try:
        w = redcount.ShardedCounter(impatient, "claims", shards=4)
        assert w.layout().version == 2
        for n in any_store.nodes() or [any_store]:
            n.execute("CLIENT", "PAUSE", "1000", "WRITE")
        with pytest.raises(ConnectionError) as info:
            w.incr(request_id="timed-out")
        assert info.value.maybe_applied
        counter(any_store).reshard(16)  # waits for the pause to end, after the held write ran
        oks = [w.incr(request_id="timed-out"), counter(any_store).incr(request_id="timed-out")]
        assert sum(oks) <= 1
    finally:
        impatient.close()
    assert counter(any_store).value() == 2


def test_a_crash_between_the_claim_and_the_write(any_store: redcount.Store) -> None:
    fresh, stale = counter(any_store), counter(any_store)
    assert all(fresh.incr(request_id=f"old{i}") for i in range(10))
    assert stale.value() == 10  # `stale` holds the first layout
    ids = [f"c{i}" for i in range(20)]
    first_gen = {r: stale.key_of(stale.shard_of(r), f"rid:{r}") for r in ids}
    fresh.reshard(8)
    # The claim step alone, in each id's first-generation shard: writers that crashed
    # between the two steps.
    for r in ids:
        claim_alone(any_store, first_gen[r])
    # The retries: half from a writer on the new layout, half from the stale writer (which
    # meets the claim, reads the layout again and writes where the claim points).
    assert all(fresh.incr(request_id=r) for r in ids[:10])
    assert all(stale.incr(request_id=r) for r in ids[10:])
    assert stale.cached_layout.version == 2
    # A claim again after the write (a retry that crashed in between), then more retries.
    for r in ids:
        claim_alone(any_store, first_gen[r])
    assert not any(fresh.incr(request_id=r) for r in ids)
    assert not any(counter(any_store).incr(request_id=r) for r in ids + [f"old{i}" for i in range(10)])
    assert fresh.value() == 10 + len(ids)


def _script_usec(store: redcount.Store) -> tuple[int, int]:
    """Server CPU (microseconds) and calls of EVALSHA/EVAL over every master since the last
    CONFIG RESETSTAT, from INFO commandstats (a script's usec include the commands it runs,
    which commandstats also lists under their own names: those are not added again)."""
    usec = calls = 0
    for n in store.nodes() or [store]:
        info = n.execute("INFO", "commandstats")
        text = info.decode() if isinstance(info, bytes) else str(info)
        for line in text.splitlines():
            if line.startswith(("cmdstat_evalsha:", "cmdstat_eval:")):
                fields = dict(f.split("=") for f in line.split(":", 1)[1].split(","))
                usec += int(fields["usec"])
                calls += int(fields["calls"])
    return usec, calls


@pytest.mark.redis_only
@pytest.mark.parametrize("kind", ["redis", "cluster"])
def test_the_claim_steps_server_cost(kind: str, request: pytest.FixtureRequest) -> None:
    """Server CPU per write with a request id, without and with a reshard in the id window
    (one older generation), printed (run with -s); asserts counts only, never speed."""
    if kind == "redis":
        server: RedisServer = request.getfixturevalue("redis_server")
        store = redcount.connect(f"redis://127.0.0.1:{server.port}/0")
        store.execute("FLUSHALL")
    else:
        store = redcount.connect(request.getfixturevalue("redis_cluster").url)
    n = 2000
    try:
        figures = {}
        for case in ("plain", "after a reshard"):
            c = redcount.ShardedCounter(store, f"cost-{case[0]}", shards=16)
            if case != "plain":
                c.reshard(32)
            assert c.incr(request_id="warm")
            for node in store.nodes() or [store]:
                node.execute("CONFIG", "RESETSTAT")
            assert all(c.incr(request_id=f"{case}-{i}") for i in range(n))
            usec, calls = _script_usec(store)
            figures[case] = (usec / n, calls / n)
            assert c.value() == n + 1
        plain, claimed = figures["plain"], figures["after a reshard"]
        print(f"\n{kind}: server CPU per write with a request id: {plain[0]:.1f} us ({plain[1]:.2f} calls) "
              f"without a reshard, {claimed[0]:.1f} us ({claimed[1]:.2f} calls) in the id window after one "
              f"(+{claimed[0] - plain[0]:.1f} us, x{claimed[0] / plain[0]:.2f})")
        # One script call per write; on a cluster a claim call more in the id window.
        assert plain[1] < 1.01
        assert (1.99 < claimed[1] < 2.01) if kind == "cluster" else (claimed[1] < 1.01)
    finally:
        store.close()
