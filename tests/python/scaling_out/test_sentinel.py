"""redcount behind Redis Sentinel (``redis+sentinel://``), on real sentinels and servers that
the fixtures start: counters, a limiter and a sharded counter with request ids; what a
SIGKILL of the master and a ``SENTINEL FAILOVER`` cost writers that retry with request ids
(double counts, lost acknowledged increments, the unavailability window against Sentinel's
own switch time); ``min-replicas-to-write 1`` with two replicas; the limits scheme; a TLS
group (``rediss+sentinel://``) through a failover.

Run with ``-s`` to see the measured figures (docs/scaling-out.md, "Redis Sentinel", quotes them):

    pytest -s tests/python/scaling_out/test_sentinel.py
"""

from __future__ import annotations

import asyncio
import os
import queue
import re
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from failover_harness import FailoverHarness, Report, WriteFn
from helpers import wait_until
from topologies import HOST, Conn, Node, SentinelGroup, SwitchMaster, TlsFiles

import redcount
import redcount.aio as aio

_testing = pytest.importorskip("redcount._core._testing")

pytestmark = pytest.mark.redis_only

# Increment once per request id: the marker (SET NX) makes a retried request a no-op, and the
# applied log (RPUSH in the same script, so replicated or lost together with the increment)
# lets the report say exactly which acknowledged ids survived.
INCR_ONCE = """
if redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[3]) then
  redis.call('RPUSH', KEYS[3], ARGV[2])
  return redis.call('INCRBY', KEYS[1], ARGV[1])
end
return -1
"""

KEYS = ["{w0}", "{w1}"]
RATE = 200.0  # writes/s per writer


def state(store: redcount.Store) -> tuple[str, int]:
    master, switches = _testing.sentinel_state(store)
    return str(master), int(switches)


def redcount_writer(store: redcount.Store) -> Callable[[], WriteFn]:
    """Every writer thread shares the one store (one I/O thread, one watcher), as an app does."""

    def make() -> WriteFn:
        def write(key: str, rid: str, amount: int) -> object:
            return store.execute("EVAL", INCR_ONCE, 3, key, f"{key}:rid:{rid}", f"{key}:applied", amount, rid,
                                 120_000)

        return write

    return make


@dataclass
class SeenSwitch:
    """When this client's store started sending to another master (polled every ms)."""

    at: float = 0.0
    master: str = ""


@contextmanager
def switch_seen_by(store: redcount.Store) -> Iterator[SeenSwitch]:
    seen = SeenSwitch()
    before = state(store)[1]
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            master, switches = state(store)
            if switches > before:
                seen.at, seen.master = time.monotonic(), master
                return
            time.sleep(0.001)  # polling the store's state, not waiting for the server

    t = threading.Thread(target=poll, daemon=True)
    t.start()
    try:
        yield seen
    finally:
        stop.set()
        t.join()


def settled_master(g: SentinelGroup) -> Node:
    """The master once the failover has ended: every live sentinel names it and it says
    master. (The sentinel that ran a failover names the new master last, up to a second
    after the others; asked before that, it names the old master, whose data stops at the
    switch.)"""

    def agreed() -> Node | None:
        named = {g.master(via=s).port for s in g.sentinels if s.reachable}
        if len(named) != 1:
            return None
        node = g.node_by_port(named.pop())
        return node if node.reachable and node.call("ROLE")[0] == "master" else None

    return wait_until(agreed, 15, what="every sentinel naming the same master")


def final_report(g: SentinelGroup, h: FailoverHarness) -> Report:
    master = settled_master(g)
    final = {k: int(master.call("GET", k) or 0) for k in KEYS}
    applied = {k: Counter(str(x) for x in master.call("LRANGE", f"{k}:applied", 0, -1)) for k in KEYS}
    return h.report(final, applied)


def lost_ids(g: SentinelGroup, h: FailoverHarness) -> set[str]:
    master = settled_master(g)
    present = {str(x) for k in KEYS for x in master.call("LRANGE", f"{k}:applied", 0, -1)}
    return {a.request_id for w in h.writers for a in w.acked if a.request_id not in present}


def describe_loss(g: SentinelGroup, h: FailoverHarness, lost: set[str], t: float) -> str:
    """Where the lost writes sit in time (ms from ``t``) and what each data node holds: for
    the message of a failed assertion."""
    times = sorted((a.acked_at - t) * 1000 for w in h.writers for a in w.acked if a.request_id in lost)
    nodes = []
    for n in g.data:
        if not n.reachable:
            nodes.append(f"{n.port} down")
            continue
        role = n.call("ROLE")
        sizes = [n.call("LLEN", f"{k}:applied") for k in KEYS]
        nodes.append(f"{n.port} {role[0]} applied={sizes} offset={role[1] if role[0] == 'master' else role[4]}")
    span = f"{times[0]:.0f}..{times[-1]:.0f} ms" if times else "-"
    return f"{len(lost)} lost, acknowledged {span} from the event; nodes: {'; '.join(nodes)}"


def first_ack_after(h: FailoverHarness, t: float) -> float:
    """Seconds from ``t`` to the first write acknowledged after it, the slowest writer's."""
    return max(min(a.acked_at for a in w.acked if a.acked_at > t) - t for w in h.writers)


def print_figures(what: str, sentinel_switch: float, seen: SeenSwitch, event: SwitchMaster, report: Report,
                  h: FailoverHarness, leader: int | None) -> None:
    """``leader``: the port of the sentinel that was asked for the failover (SENTINEL FAILOVER
    runs it on the sentinel it is sent to, the first in the URL; the store's watcher listens
    to every sentinel and follows the first announcement); None when the sentinels elected
    one."""
    by = "" if leader is None else f", {'the' if event.sentinel_port == leader else 'not the'} one that ran it"
    after_event = first_ack_after(h, event.at)
    print(f"\n{what}: +switch-master {sentinel_switch * 1000:.0f} ms after the fault (first from sentinel "
          f"{event.sentinel_port}{by}); redcount switched "
          f"{(seen.at - event.at) * 1000:+.0f} ms from the event; first acknowledged write "
          f"{after_event * 1000:.0f} ms after the event (slowest writer); longest gap "
          f"{max(k.max_gap for k in report.keys) * 1000:.0f} ms\n{report.summary()}")


@pytest.fixture(scope="module")
def group(redis_sentinel_factory: Callable[..., SentinelGroup]) -> SentinelGroup:
    """One group for the non-destructive tests."""
    g = redis_sentinel_factory(replicas=1)
    print(f"\nsentinel group ready in {g.started_in:.2f} s")
    return g


@pytest.fixture
def store(group: SentinelGroup) -> Iterator[redcount.Store]:
    s = redcount.connect(group.url)
    s.execute("FLUSHALL")
    try:
        yield s
    finally:
        s.close()


# --- the URL, the options and the handshake ------------------------------------------------------


def test_the_store_finds_the_master_and_names_it(group: SentinelGroup) -> None:
    with redcount.connect(group.url) as store:
        assert state(store) == ("", 0)  # nothing asked before the first call
        assert store.execute("PING") == "PONG"
        master = group.master()
        assert state(store) == (f"{HOST}:{master.port}", 0)
        assert store.url == group.url + "/0"
        assert store.execute("SET", "k", "v") == "OK"
        assert master.call("GET", "k") == "v"  # written on the master, not the replica


def test_sentinel_options_and_url_errors(group: SentinelGroup) -> None:
    with pytest.raises(redcount.InvalidInputError, match="sentinel_password applies to Redis Sentinel only"):
        redcount.connect("redis://127.0.0.1:6379", sentinel_password="x")
    with pytest.raises(redcount.InvalidInputError, match="missing the service name"):
        redcount.connect("redis+sentinel://127.0.0.1:26379")
    with pytest.raises(TypeError, match="sentinel_username must be a str"):
        redcount.connect(group.url, sentinel_username=1)  # type: ignore[arg-type]
    with pytest.raises(redcount.InvalidInputError, match="sentinel_username needs sentinel_password"):
        redcount.connect(group.url, sentinel_username="u")
    # A service no sentinel knows: the call fails with what each sentinel said, nothing sent.
    s = redcount.connect(group.url.rsplit("/", 1)[0] + "/no-such-service", command_timeout=0.5)
    with pytest.raises(redcount.ConnectionError) as e:
        s.execute("PING")
    assert e.value.maybe_applied is False
    s.close()


def test_sentinels_with_a_password(redis_sentinel_factory: Callable[..., SentinelGroup]) -> None:
    g = redis_sentinel_factory(replicas=1)
    for s in g.sentinels:
        assert s.call("ACL", "SETUSER", "default", "resetpass", ">s-secret") == "OK"
    with pytest.raises(redcount.ConnectionError, match="NOAUTH") as e:
        redcount.connect(g.url, command_timeout=0.5).execute("PING")
    assert e.value.maybe_applied is False
    with redcount.connect(g.url, sentinel_password="s-secret") as s:
        assert s.execute("INCR", "n") == 1
    with redcount.connect(g.url + "?sentinel_password=s-secret") as s:
        assert s.execute("INCR", "n") == 2


def test_a_connection_to_a_replica_is_refused_in_the_handshake(
        redis_sentinel_factory: Callable[..., SentinelGroup]) -> None:
    """Sentinels that name a replica as the master (stale, or wrong): every connection checks
    ROLE in its handshake, so nothing is written there and the call fails, not applied."""
    g = redis_sentinel_factory(replicas=1)
    [replica] = g.replicas()
    for s in g.sentinels:
        assert s.call("SENTINEL", "REMOVE", g.service) == "OK"
        assert s.call("SENTINEL", "MONITOR", g.service, HOST, str(replica.port), "2") == "OK"
    store = redcount.connect(g.url, command_timeout=0.5)
    try:
        with pytest.raises(redcount.ConnectionError, match="not the master") as e:
            store.execute("SET", "must-not-land", "1")
        assert e.value.maybe_applied is False
        assert state(store)[0] == f"{HOST}:{replica.port}"
    finally:
        store.close()
    with redcount.connect(f"redis://{replica.addr}/0") as plain:  # the same server, as itself
        assert plain.execute("ROLE")[0] == b"slave"


def subscribers(sentinel: Node) -> int:
    """Clients of ``sentinel`` subscribed to a channel (``sub=N`` with N > 0 in CLIENT LIST)."""
    listing = sentinel.call("CLIENT", "LIST")
    return sum(1 for line in str(listing).splitlines() if re.search(r" sub=[1-9]", f" {line} "))


def test_the_store_subscribes_on_every_sentinel_and_follows_when_one_dies(
        redis_sentinel_factory: Callable[..., SentinelGroup]) -> None:
    """The store's watcher holds a ``+switch-master`` subscription on each of the three
    sentinels; when one dies the others keep serving, so a failover right after is followed
    without a new subscription first; closing the store ends every subscription."""
    g = redis_sentinel_factory(replicas=1)
    [replica] = g.replicas()
    store = redcount.connect(g.url, command_timeout=2.0)
    try:
        assert store.execute("INCR", "n") == 1
        # Replication is asynchronous: the failover below keeps the write only once the
        # replica has it.
        wait_until(lambda: str(replica.call("GET", "n")) in ("1", "b'1'"), 10, what="the write to reach the replica")
        wait_until(lambda: [subscribers(s) for s in g.sentinels] == [1, 1, 1], 10,
                   what="a subscriber on every sentinel")
        g.sentinels[0].kill()
        with g.watch() as w:
            g.sentinel_failover()
            event = w.wait()
        wait_until(lambda: state(store)[1] == 1, 15, what="the store switched masters")
        assert event.new_port == replica.port
        assert state(store)[0] == f"{HOST}:{replica.port}"
        assert store.execute("INCR", "n") == 2
        # The harness's own subscriptions (g.watch()) are closed; the store's remain.
        wait_until(lambda: [subscribers(s) for s in g.sentinels[1:]] == [1, 1], 10,
                   what="the store's subscriptions on the live sentinels")
    finally:
        store.close()
    wait_until(lambda: [subscribers(s) for s in g.sentinels[1:]] == [0, 0], 10, what="the subscriptions closed")


# --- counters, limiter, sharded counter through Sentinel -----------------------------------------


def test_counters_limiter_and_sharded_counter(store: redcount.Store) -> None:
    c = redcount.FixedWindowCounter(store, "s-fw", 60)
    amounts = {f"user-{i}": i % 5 + 1 for i in range(50)}
    assert c.incr_many(amounts) == amounts
    assert c.incr("user-3", 2, request_id="r-1") == amounts["user-3"] + 2
    assert c.incr("user-3", 2, request_id="r-1") == amounts["user-3"] + 2  # counted once
    lim = redcount.Limiter(store)
    assert [lim.hit("3/minute", "client").allowed for _ in range(4)] == [True, True, True, False]
    sc = redcount.ShardedCounter(store, "s-sharded", shards=8)
    for i in range(100):
        assert sc.incr(2, request_id=f"req-{i}") is True
    for i in range(0, 100, 10):
        assert sc.incr(2, request_id=f"req-{i}") is False  # a retry counts once
    assert sc.value() == 200


def test_asyncio_and_a_forked_child(store: redcount.Store) -> None:
    astore = aio.AsyncStore(store)
    counter = aio.FixedWindowCounter(store, "s-aio", 60)

    async def main() -> None:
        replies = await astore.execute_many([("INCRBY", f"aio-{i}", i) for i in range(1, 51)])
        assert replies == list(range(1, 51))
        assert await asyncio.gather(*(counter.incr(f"k-{i}") for i in range(20))) == [1] * 20

    asyncio.run(main())
    assert store.execute("INCR", "fork-key") == 1
    pid = os.fork()
    if pid == 0:  # the child asks the sentinels itself and has its own watcher
        os._exit(0 if store.execute("INCR", "fork-key") == 2 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert store.execute("INCR", "fork-key") == 3  # the parent keeps working


def test_the_limits_scheme(group: SentinelGroup) -> None:
    limits = pytest.importorskip("limits")
    import redcount.contrib.limits as rcl

    uri = "redcount+" + group.url
    storage = limits.storage.storage_from_string(uri)
    assert isinstance(storage, rcl.RedcountStorage)
    limiter = limits.strategies.FixedWindowRateLimiter(storage)
    item = limits.parse("2/minute")
    assert [limiter.hit(item, "sentinel-user") for _ in range(3)] == [True, True, False]
    assert storage.get(item.key_for("sentinel-user")) == 3  # limits counts the refused hit too
    assert storage.check()
    assert isinstance(limits.storage.storage_from_string("async+" + uri), rcl.AsyncRedcountStorage)
    # limits' own Sentinel storage spells the sentinels' password this way.
    s = limits.storage.storage_from_string(uri, sentinel_kwargs={"password": "x"})
    assert isinstance(s, rcl.RedcountStorage)


# --- failovers under load ------------------------------------------------------------------------


def test_sigkill_of_the_master(redis_sentinel_factory: Callable[..., SentinelGroup]) -> None:
    g = redis_sentinel_factory(replicas=1)
    old = g.master()
    [replica] = g.replicas()
    store = redcount.connect(g.url, command_timeout=2.0)
    try:
        with FailoverHarness(redcount_writer(store), KEYS, rate=RATE) as h, switch_seen_by(store) as seen:
            h.wait_acked(200)
            with g.watch() as w:
                _, t0 = g.kill_master()
                event = w.wait()
            h.wait_acked(100, each=True)
        report = final_report(g, h)
        print_figures("SIGKILL of the master", event.at - t0, seen, event, report, h, None)
        lost = lost_ids(g, h)
        if lost:
            print(describe_loss(g, h, lost, event.at))
        assert (event.old_port, event.new_port) == (old.port, replica.port)
        assert state(store) == (f"{HOST}:{replica.port}", 1)
        assert report.doubled == 0
        assert all(k.unaccounted == 0 for k in report.keys)
        # Nothing sent to the new master is lost.
        assert not {a.request_id for w in h.writers for a in w.acked if a.first_try > seen.at} & lost_ids(g, h)
    finally:
        store.close()


def test_sentinel_failover(redis_sentinel_factory: Callable[..., SentinelGroup]) -> None:
    g = redis_sentinel_factory(replicas=1)
    store = redcount.connect(g.url, command_timeout=2.0)
    try:
        with FailoverHarness(redcount_writer(store), KEYS, rate=RATE) as h, switch_seen_by(store) as seen:
            h.wait_acked(200)
            with g.watch() as w:
                t0 = g.sentinel_failover()
                event = w.wait()
            h.wait_acked(200, each=True)
        report = final_report(g, h)
        print_figures("SENTINEL FAILOVER", event.at - t0, seen, event, report, h, g.sentinels[0].port)
        lost = lost_ids(g, h)
        holds, early, _ = _testing.sentinel_holds(store)
        print(f"failover holds {holds}, switched to the promoted replica before any announcement: {early}; "
              f"acknowledged and lost: {len(lost)}")
        assert report.doubled == 0
        assert all(k.unaccounted == 0 for k in report.keys)
        # The store stopped sending to the old master when Sentinel selected the replica, and
        # followed the replica the moment it was master: no acknowledged write is lost.
        assert lost == set(), describe_loss(g, h, lost, event.at)
        assert (holds, early) == (1, 1)
        assert state(store)[1] == 1
    finally:
        store.close()


def test_sentinel_failover_with_min_replicas_to_write_and_two_replicas(
        redis_sentinel_factory: Callable[..., SentinelGroup]) -> None:
    """``min-replicas-to-write 1`` alone does not make a ``SENTINEL FAILOVER`` lossless:
    Sentinel promotes one replica (which stops replicating), and until it has moved the other
    replica to the new master, the old master still has one replica and still acknowledges
    writes; they reach only that replica, which then resynchronises in full from the new
    master and drops them. The failover hold is what keeps them: from Sentinel's selection
    of the replica to its promotion nothing is sent to the old master. The new master refuses
    writes (NOREPLICAS) until the other replica follows it; the engine retries those within
    the deadline."""
    g = redis_sentinel_factory(replicas=2, min_replicas_to_write=1)
    store = redcount.connect(g.url, command_timeout=2.0)
    try:
        with FailoverHarness(redcount_writer(store), KEYS, rate=RATE) as h, switch_seen_by(store) as seen:
            h.wait_acked(200)
            with g.watch() as w:
                t0 = g.sentinel_failover()
                event = w.wait()
            h.wait_acked(200, each=True)
        report = final_report(g, h)
        print_figures("SENTINEL FAILOVER, min-replicas-to-write 1, two replicas", event.at - t0, seen, event,
                      report, h, g.sentinels[0].port)
        lost = lost_ids(g, h)
        print(f"acknowledged and lost: {len(lost)}; failover holds, early switches, aborted: "
              f"{_testing.sentinel_holds(store)}")
        assert report.doubled == 0
        assert all(k.unaccounted == 0 for k in report.keys)
        assert lost == set(), describe_loss(g, h, lost, event.at)
    finally:
        store.close()


@pytest.mark.parametrize("fault", ["sentinel-failover", "sigkill"])
def test_asyncio_calls_follow_a_sentinel_failover(redis_sentinel_factory: Callable[..., SentinelGroup],
                                                  fault: str) -> None:
    """asyncio writers with request ids through a ``SENTINEL FAILOVER`` and a SIGKILL of the
    master: a call of which nothing ran (the old master refuses it, its connection is
    refused, or the ROLE check refuses a demoted master) waits for the new master and is
    sent there, as a synchronous one is, so no caller sees an error for a call that was
    never sent; a call that was written and lost its reply (``maybe_applied=True``) is
    retried by the writer with its request id, and nothing counts twice. (After the SIGKILL
    every call made before the switch meets a refused connection: that is the case that
    failed when asyncio calls were not resent.)"""
    g = redis_sentinel_factory(replicas=1)
    # Longer than Sentinel takes to switch (about 1 s here): a call that waits for the new
    # master is still within its deadline when it comes.
    store = redcount.connect(g.url, command_timeout=5.0)
    astore = aio.AsyncStore(store)
    tasks_n = 8
    acked: list[tuple[str, float]] = []
    unsent_errors: list[str] = []  # ConnectionError(maybe_applied=False): what must not happen
    maybe_retries = 0
    other_errors: list[str] = []
    stop = asyncio.Event()

    async def writer(n: int) -> None:
        nonlocal maybe_retries
        key = KEYS[n % len(KEYS)]
        i = 0
        while not stop.is_set():
            rid = f"a{n}-{i}"
            i += 1
            while True:
                try:
                    await astore.execute("EVAL", INCR_ONCE, 3, key, f"{key}:rid:{rid}", f"{key}:applied", 1, rid,
                                         120_000)
                    acked.append((rid, time.monotonic()))
                    break
                except redcount.ConnectionError as e:
                    if not e.maybe_applied:
                        unsent_errors.append(f"{rid}: {e}")
                        break
                    maybe_retries += 1  # it may have run: the same request id again
                except redcount.ReplyError as e:
                    other_errors.append(f"{rid}: {e}")
                    break
            await asyncio.sleep(tasks_n / RATE)

    async def acked_at_least(n: int) -> None:
        while len(acked) < n:
            await asyncio.sleep(0.01)

    async def main() -> tuple[float, SwitchMaster]:
        tasks = [asyncio.create_task(writer(n)) for n in range(tasks_n)]
        await asyncio.wait_for(acked_at_least(200), 30)
        with g.watch() as w:
            t0 = g.sentinel_failover() if fault == "sentinel-failover" else g.kill_master()[1]
            event = await asyncio.to_thread(w.wait)
        await asyncio.wait_for(acked_at_least(len(acked) + 200), 30)
        stop.set()
        await asyncio.gather(*tasks)
        return t0, event

    try:
        with switch_seen_by(store) as seen:
            t0, event = asyncio.run(main())
        master = settled_master(g)
        applied = Counter(str(x) for k in KEYS for x in master.call("LRANGE", f"{k}:applied", 0, -1))
        doubled = sum(1 for c in applied.values() if c > 1)
        total = sum(int(master.call("GET", k) or 0) for k in KEYS)
        ids = {rid for rid, _ in acked}
        lost = ids - set(applied)
        after = {rid for rid, at in acked if at > seen.at}
        print(f"\nasyncio, {fault}: +switch-master {(event.at - t0) * 1000:.0f} ms after the fault; "
              f"{len(acked)} acknowledged, {maybe_retries} retried after maybe_applied=True, "
              f"{len(unsent_errors)} errors for unsent calls, {doubled} double counts, "
              f"{len(lost)} acknowledged lost (asynchronous replication), "
              f"{len(after & lost)} of them acknowledged after the client switched")
        assert unsent_errors == []
        assert other_errors == []
        assert doubled == 0
        assert total == sum(applied.values())  # the count is exactly the applied ids
        assert state(store)[1] == 1
        if fault == "sentinel-failover":
            assert lost == set()  # asyncio calls are held during the failover as well
    finally:
        store.close()


def test_the_failover_hold_ends_at_a_calls_deadline_and_at_its_limit(
        redis_sentinel_factory: Callable[..., SentinelGroup]) -> None:
    """While the replica Sentinel selected cannot be promoted (it is paused with SIGSTOP as
    soon as Sentinel names it), calls are held, not sent to the old master. A call whose
    deadline passes first fails with ``ConnectionError(maybe_applied=False)``, synchronous
    and asyncio alike, and nothing of it ran. After the hold's limit (2 s) calls go to the old
    master again, as they did before the failover began; once the replica runs again it is
    promoted and the store follows it."""
    g = redis_sentinel_factory(replicas=1, failover_timeout_ms=20_000)
    old = g.master()
    [replica] = g.replicas()
    store = redcount.connect(g.url, command_timeout=0.3)
    astore = aio.AsyncStore(store)
    try:
        assert store.execute("SET", "k", "0") == "OK"
        at = fail_over_with_the_replica_paused(g, store, replica)
        with pytest.raises(redcount.ConnectionError) as sync_error:
            store.execute("INCR", "k")
        assert not sync_error.value.maybe_applied
        assert "failing service 'mymaster' over" in str(sync_error.value)

        async def held() -> BaseException | None:
            try:
                await astore.execute("INCR", "k")
            except redcount.ConnectionError as e:
                return e
            return None

        async_error = asyncio.run(held())
        assert isinstance(async_error, redcount.ConnectionError) and not async_error.maybe_applied, async_error
        assert time.monotonic() - at < 2.0  # both failed within the hold, not after it
        assert old.call("GET", "k") == "0"  # nothing of them ran

        # Past the hold's limit, calls go to the old master (still the master: the replica is
        # paused). A failover that ends later loses what they write there.
        time.sleep(max(0.0, at + 2.1 - time.monotonic()))
        assert store.execute("INCR", "k") == 1
        assert _testing.sentinel_holds(store) == (1, 0, 0)
        assert state(store) == (f"{HOST}:{old.port}", 0)

        with g.watch() as w:
            replica.resume()
            event = w.wait()
        assert event.new_port == replica.port
        wait_until(lambda: state(store)[1] == 1, 15, what="the store switched masters")
        assert state(store)[0] == f"{HOST}:{replica.port}"
    finally:
        if replica.paused:
            replica.resume()
        store.close()


def test_the_failover_hold_ends_when_sentinel_aborts_the_failover(
        redis_sentinel_factory: Callable[..., SentinelGroup]) -> None:
    """A replica that is not promoted within ``failover-timeout`` (here it is paused as soon
    as Sentinel names it) makes Sentinel abort (``-failover-abort-slave-timeout``): the hold
    ends on that event, and calls go to the old master, which is still the master."""
    g = redis_sentinel_factory(replicas=1, failover_timeout_ms=500)
    old = g.master()
    [replica] = g.replicas()
    store = redcount.connect(g.url, command_timeout=0.3)
    try:
        assert store.execute("SET", "k", "0") == "OK"
        at = fail_over_with_the_replica_paused(g, store, replica)

        def incr() -> int | None:
            try:
                return int(store.execute("INCR", "k"))
            except redcount.ConnectionError as e:
                assert not e.maybe_applied, e  # held, never sent
                return None

        assert wait_until(incr, 10, what="a call answered after the abort") == 1
        print(f"\nthe hold ended by Sentinel's abort; first call answered {time.monotonic() - at:.2f} s after the "
              f"selection")
        assert _testing.sentinel_holds(store) == (1, 0, 1)
        assert state(store) == (f"{HOST}:{old.port}", 0)
        assert old.call("GET", "k") == "1"
    finally:
        if replica.paused:
            replica.resume()
        store.close()


def fail_over_with_the_replica_paused(g: SentinelGroup, store: redcount.Store, replica: Node) -> float:
    """``SENTINEL FAILOVER``, with ``replica`` paused (SIGSTOP) as soon as Sentinel selects it
    (it sends ``REPLICAOF NO ONE`` a timer tick later, so the replica is not promoted while
    paused); returns when the store holds, with the monotonic time of the selection."""
    wait_until(lambda: [subscribers(s) for s in g.sentinels] == [1, 1, 1], 10, what="a subscriber on every sentinel")
    leader = g.sentinels[0]  # SENTINEL FAILOVER runs on the sentinel it is sent to, the first
    selected: queue.Queue[float] = queue.Queue()
    with Conn(leader.port, leader.tls, timeout=None) as sub:
        sub.send("SUBSCRIBE", "+selected-slave")
        sub.read()

        def pause_the_selected_replica() -> None:
            msg = sub.read()
            replica.pause()
            selected.put(time.monotonic())
            assert msg[0] == "message" and str(msg[2]).split()[3] == str(replica.port), msg

        t = threading.Thread(target=pause_the_selected_replica, daemon=True)
        t.start()
        g.sentinel_failover()
        at = selected.get(timeout=10)
        t.join(5)
    wait_until(lambda: _testing.sentinel_holds(store)[0] == 1, 2, what="the store's hold")
    return at


# --- TLS -------------------------------------------------------------------------------------------


def tls_files(certs: Path) -> TlsFiles:
    """The data nodes' and sentinels' TLS files (``node``: serverAuth + clientAuth)."""
    return TlsFiles(certs / "ca.pem", certs / "node.pem", certs / "node.key")


def tls_client_url(g: SentinelGroup, certs: Path) -> str:
    """The group's ``rediss+sentinel://`` URL with the client's certificate in its query."""
    return (f"{g.url}?ssl_ca_certs={certs / 'ca.pem'}"
            f"&ssl_certfile={certs / 'client.pem'}&ssl_keyfile={certs / 'client.key'}")


def fail_over_in_sync(g: SentinelGroup) -> SwitchMaster:
    """``SENTINEL FAILOVER`` once the replica has every write so far (the command does not
    wait for that); returns the ``+switch-master`` event."""
    old = g.master()
    [replica] = g.replicas()
    wait_until(lambda: int(replica.info("replication")["slave_repl_offset"])
               >= int(old.info("replication")["master_repl_offset"]), 10, what="the replica in sync")
    with g.watch() as w:
        g.sentinel_failover()
        return w.wait()


def test_tls_sentinel_group_counter_limiter_and_failover(
        redis_sentinel_factory: Callable[..., SentinelGroup], topology_certs: Path) -> None:
    """``rediss+sentinel://``: TLS to the sentinels and to the master (client certificates
    required on both), a counter and a limiter, and the store follows a ``SENTINEL
    FAILOVER`` to the new master over TLS."""
    g = redis_sentinel_factory(replicas=1, tls=tls_files(topology_certs))
    assert g.url.startswith("rediss+sentinel://")
    url = tls_client_url(g, topology_certs)
    store = redcount.connect(url, command_timeout=5.0)
    try:
        old = g.master()
        counter = redcount.FixedWindowCounter(store, "tls-sentinel", window=3600)
        limiter = redcount.Limiter(store, "sliding-window")
        assert [counter.incr("k", request_id=f"r{i}") for i in range(5)] == [1, 2, 3, 4, 5]
        assert [bool(limiter.hit("3/minute", "who")) for _ in range(4)] == [True, True, True, False]
        assert state(store) == (f"{HOST}:{old.port}", 0)
        event = fail_over_in_sync(g)
        assert event.old_port == old.port
        wait_until(lambda: state(store)[1] == 1, 15, what="the store switched masters")
        new = g.node_by_port(event.new_port)
        assert state(store)[0] == f"{HOST}:{new.port}"
        # A write that runs into the old master's demotion is retried with its request id.
        n = None
        for _ in range(50):
            try:
                n = counter.incr("k", request_id="after-switch")
                break
            except redcount.ConnectionError as e:
                assert e.maybe_applied, e
        assert n == 6, n
        assert counter.incr("k", request_id="after-switch") == 6  # counted once
        assert counter.get("k") == 6
        assert not limiter.hit("3/minute", "who")  # the window's hits moved with the data
        assert new.call("ROLE")[0] == "master"
    finally:
        store.close()
