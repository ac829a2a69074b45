"""The failure contract (docs/failures.md) request by request, through a fault-injecting
proxy (tests/python/fault_proxy.py) between redcount and a real redis-server: stalls, replies
split at every byte (TLS records too), a reply trickling in past the deadline, delays,
resets, a connection dropped after the request, a half-open connection, a silent handshake,
refused connections; on the synchronous path (one caller, which writes an idle connection
itself), from threads (the reactor's pipelined path) and through redcount.aio.

Every request is an INCR of a key of its own, so each one's fate can be read back:
- a request that succeeded ran exactly once;
- ``maybe_applied`` is False only for a request that never reached the server, and True
  only for one that was written (the proxy saw it);
- nothing written is ever resent: the proxy sees each request at most once, and the
  server's own count of INCR calls (INFO commandstats) equals what the proxy passed on;
- after the fault is lifted, the store serves again without being reopened.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pytest
import redcount
import redcount.aio
from conftest import REDIS_SERVER, RedisServer
from fault_proxy import FaultProxy
from helpers import wait_until
from redcount.tools.servers import make_certs

pytestmark = pytest.mark.redis_only

COMMAND_TIMEOUT = 1.0
DRIVERS = ["sync", "threads", "asyncio"]


@dataclass
class Outcome:
    key: str
    value: object = None  # the reply, when it succeeded
    error: redcount.ConnectionError | None = None


class Harness:
    """A store through the proxy, a direct admin store, and the bookkeeping of outcomes."""

    def __init__(self, server: RedisServer, proxy: FaultProxy, tag: str) -> None:
        self.proxy = proxy
        self.tag = tag
        self.admin = redcount.connect(server.url)
        self.admin.execute("FLUSHALL")
        self.admin.execute("CONFIG", "RESETSTAT")
        self.store = redcount.connect(proxy.url, command_timeout=COMMAND_TIMEOUT,
                                      connect_timeout=COMMAND_TIMEOUT)
        self.outcomes: list[Outcome] = []
        self.n = 0

    def close(self) -> None:
        self.store.close()
        self.admin.close()

    def keys(self, n: int) -> list[str]:
        out = [f"{self.tag}:{self.n + i}" for i in range(n)]
        self.n += n
        return out

    def run(self, driver: str, keys: list[str]) -> list[Outcome]:
        """INCR each key: one after another (sync), one thread each (threads), or all at once
        on an event loop (asyncio)."""
        outs = [Outcome(k) for k in keys]
        if driver == "sync":
            for o in outs:
                self._sync_one(o)
        elif driver == "threads":
            ts = [threading.Thread(target=self._sync_one, args=(o,)) for o in outs]
            for t in ts:
                t.start()
            for t in ts:
                t.join(COMMAND_TIMEOUT * 10)
                assert not t.is_alive(), "a call outlived its command_timeout many times over"
        else:
            astore = redcount.aio.AsyncStore(self.store)

            async def one(o: Outcome) -> None:
                try:
                    o.value = await asyncio.wait_for(astore.execute("INCR", o.key), COMMAND_TIMEOUT * 10)
                except redcount.ConnectionError as e:
                    o.error = e

            async def all_of() -> None:
                await asyncio.gather(*(one(o) for o in outs))

            asyncio.run(all_of())
        self.outcomes.extend(outs)
        return outs

    def _sync_one(self, o: Outcome) -> None:
        try:
            o.value = self.store.execute("INCR", o.key)
        except redcount.ConnectionError as e:
            o.error = e

    def in_background(self, driver: str, keys: list[str]) -> Callable[[], list[Outcome]]:
        """Starts run() on a thread; the returned function waits for its outcomes."""
        result: list[list[Outcome]] = []
        t = threading.Thread(target=lambda: result.append(self.run(driver, keys)))
        t.start()

        def join() -> list[Outcome]:
            t.join(COMMAND_TIMEOUT * 15)
            assert not t.is_alive() and result, "the calls did not return"
            return result[0]

        return join

    def recover(self) -> None:
        """After the fault is lifted: the same store serves again, and every request made
        then succeeds exactly once."""
        def serves() -> bool:
            try:
                return self.store.execute("PING") in ("PONG", b"PONG")
            except redcount.ConnectionError:
                return False

        wait_until(serves, timeout=10, what="the store to serve again through the healed proxy")
        for driver in DRIVERS:
            for o in self.run(driver, self.keys(4)):
                assert o.error is None and o.value == 1, (o.key, o.error)

    def check_contract(self) -> None:
        """Every outcome so far against what the proxy and the server saw."""
        # Let anything the proxy still holds for the server (a stall just lifted) land.
        wait_until(lambda: self.proxy.forwarded(b"INCR") == self._forwarded_settled(), timeout=5,
                   what="the proxy to settle")
        seen = _count(self.proxy.seen(b"INCR"))
        forwarded = _count(self.proxy.forwarded(b"INCR"))
        for o in self.outcomes:
            key = o.key.encode()
            assert seen.get(key, 0) <= 1, f"{o.key} was sent {seen[key]} times: a written request was resent"
            value = self.admin.execute("GET", o.key)
            assert value is None or isinstance(value, bytes)
            ran = int(value) if value is not None else 0
            assert ran == forwarded.get(key, 0), (o.key, ran, forwarded.get(key, 0))
            if o.error is None:
                assert o.value == 1 and ran == 1, (o.key, o.value, ran)
                continue
            assert isinstance(o.error, redcount.ConnectionError), (o.key, repr(o.error))
            # A request the proxy received (the server may have run it) is never reported as not
            # run. The converse cannot be checked request by request: a request the client wrote
            # while the proxy was closing the connection is maybe_applied although the proxy
            # never read it (the client cannot tell); refused connections check that side.
            if seen.get(key, 0) == 1:
                assert o.error.maybe_applied, (o.key, repr(o.error))
            if not o.error.maybe_applied:
                assert seen.get(key, 0) == 0 and ran == 0, (o.key, repr(o.error), seen.get(key, 0), ran)
        stats = self.admin.execute("INFO", "commandstats")
        assert isinstance(stats, bytes)
        calls = 0
        for line in stats.decode().splitlines():
            if line.startswith("cmdstat_incr:"):
                calls = int(line.split("calls=")[1].split(",")[0])
        assert calls == len(self.proxy.forwarded(b"INCR")), "the server ran INCRs the proxy did not pass on"

    def _forwarded_settled(self) -> list[tuple[bytes, ...]]:
        first = self.proxy.forwarded(b"INCR")
        time.sleep(0.05)  # two reads 50 ms apart agree: nothing is on its way
        return first


def _count(commands: list[tuple[bytes, ...]]) -> dict[bytes, int]:
    out: dict[bytes, int] = {}
    for c in commands:
        out[c[1]] = out.get(c[1], 0) + 1
    return out


@pytest.fixture
def harness(redis_server: RedisServer, fault_proxy: FaultProxy,
            request: pytest.FixtureRequest) -> Iterator[Harness]:
    h = Harness(redis_server, fault_proxy, request.node.name)
    try:
        yield h
    finally:
        h.close()


def warm(h: Harness, driver: str) -> None:
    """A first request, so the store has its connection before the fault."""
    for o in h.run(driver, h.keys(1)):
        assert o.error is None and o.value == 1


def errors_of(outs: list[Outcome]) -> list[redcount.ConnectionError]:
    return [o.error for o in outs if o.error is not None]


# --------------------------------------------------------------------------- faults that delay


@pytest.mark.parametrize("driver", DRIVERS)
def test_replies_split_at_every_byte(harness: Harness, driver: str) -> None:
    h = harness
    warm(h, driver)
    h.proxy.split()
    outs = h.run(driver, h.keys(6))
    assert not errors_of(outs)
    # Every kind of reply, one byte per segment: bulk, nil, status, error, array, script.
    store = h.store
    store.execute("SET", f"{h.tag}:s", "x" * 300)
    assert store.execute("GET", f"{h.tag}:s") == b"x" * 300
    assert store.execute("GET", f"{h.tag}:none") is None
    assert store.execute_many([("PING",), ("INCRBY", f"{h.tag}:m", 5), ("LPUSH", f"{h.tag}:s", 1),
                               ("MGET", f"{h.tag}:m", f"{h.tag}:none")]) == [
        "PONG", 5, "WRONGTYPE Operation against a key holding the wrong kind of value", [b"5", None]]
    counter = redcount.FixedWindowCounter(store, "split", 3600)
    assert [counter.incr("k") for _ in range(3)] == [1, 2, 3]
    # A new connection's handshake (AUTH/SELECT/INFO/SCRIPT LOAD replies), split too.
    h.proxy.reset()
    assert not errors_of(h.run(driver, h.keys(3)))
    assert counter.incr("k") == 4
    h.proxy.heal()
    h.recover()
    h.check_contract()


@pytest.mark.parametrize("driver", DRIVERS)
def test_delayed_chunks_within_the_deadline(harness: Harness, driver: str) -> None:
    h = harness
    warm(h, driver)
    h.proxy.delay(COMMAND_TIMEOUT / 10)
    assert not errors_of(h.run(driver, h.keys(5)))
    h.proxy.heal()
    h.recover()
    h.check_contract()


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_stall_past_the_deadline_times_out_and_the_connection_stays_in_step(
        harness: Harness, driver: str) -> None:
    h = harness
    warm(h, driver)
    h.proxy.stall()
    outs = h.run(driver, h.keys(1 if driver == "sync" else 4))
    # Written ones time out "may or may not have run"; from threads, those queued behind
    # the stalled connection time out "nothing was sent" (check_contract tells them apart).
    assert all(isinstance(e, redcount.TimeoutError) for e in errors_of(outs))
    assert len(errors_of(outs)) == len(outs)
    assert any(o.error is not None and o.error.maybe_applied for o in outs)
    h.proxy.heal()  # the held requests reach the server now, and their late replies are discarded
    h.recover()
    h.check_contract()
    # Held, not lost: the stalled requests that were written ran once each, after the fact.
    written = [o for o in outs if o.error is not None and o.error.maybe_applied]
    assert all(h.admin.execute("GET", o.key) == b"1" for o in written)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_reply_trickling_in_past_the_deadline_times_out(harness: Harness, driver: str) -> None:
    h = harness
    warm(h, driver)
    key = f"{h.tag}:slow"
    h.store.execute("SET", key, "v" * 100)
    h.proxy.split(COMMAND_TIMEOUT / 30)  # the reply's ~107 bytes take about 3.5 command timeouts
    outcomes: list[tuple[object, float]] = []

    def get() -> None:
        start = time.monotonic()
        try:
            outcomes.append((h.store.execute("GET", key), time.monotonic() - start))
        except redcount.RedcountError as e:
            outcomes.append((e, time.monotonic() - start))

    if driver == "sync":
        get()
    elif driver == "threads":
        ts = [threading.Thread(target=get) for _ in range(3)]
        for t in ts:
            t.start()
        for t in ts:
            t.join(COMMAND_TIMEOUT * 10)
    else:
        astore = redcount.aio.AsyncStore(h.store)

        async def one() -> None:
            start = time.monotonic()
            try:
                outcomes.append((await astore.execute("GET", key), time.monotonic() - start))
            except redcount.RedcountError as e:
                outcomes.append((e, time.monotonic() - start))

        async def three() -> None:
            await asyncio.gather(one(), one(), one())

        asyncio.run(three())
    assert outcomes
    # The reply's wait is bounded from the write. A thread that first opens a connection of its
    # own (through the same trickling proxy, whose handshake replies trickle too) waits up to
    # command_timeout for it before writing: two bounds, each of command_timeout.
    bound = COMMAND_TIMEOUT * (2 if driver == "threads" else 1) + 0.5
    for result, took in outcomes:
        assert isinstance(result, redcount.TimeoutError), (result, took)
        assert took < bound, f"a call took {took:.2f} s, command_timeout={COMMAND_TIMEOUT}"
    h.proxy.heal()
    h.recover()  # the late reply, arriving in full now, is discarded: the connection stays in step
    assert h.store.execute("GET", key) == b"v" * 100
    h.check_contract()


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_peer_that_stops_reading_during_a_large_write(harness: Harness, driver: str) -> None:
    """The request is written in part, the socket buffer fills, and the peer takes no more:
    the call times out at its deadline, "may or may not have run"; once the peer reads
    again the rest goes out on the same connection, the request runs once, and the
    connection stays in step."""
    h = harness
    warm(h, driver)
    size = 8 * 1024 * 1024
    value = b"f" * size
    h.proxy.freeze()
    keys = [f"{h.tag}:big{i}" for i in range(1 if driver == "sync" else 2)]
    results: list[tuple[object, float]] = []

    def set_one(key: str) -> None:
        start = time.monotonic()
        try:
            results.append((h.store.execute("SET", key, value), time.monotonic() - start))
        except redcount.ConnectionError as e:
            results.append((e, time.monotonic() - start))

    if driver == "asyncio":
        astore = redcount.aio.AsyncStore(h.store)

        async def one(key: str) -> None:
            start = time.monotonic()
            try:
                results.append((await astore.execute("SET", key, value), time.monotonic() - start))
            except redcount.ConnectionError as e:
                results.append((e, time.monotonic() - start))

        async def all_of() -> None:
            await asyncio.gather(*(one(k) for k in keys))

        asyncio.run(all_of())
    else:
        ts = [threading.Thread(target=set_one, args=(k,)) for k in keys]
        for t in ts:
            t.start()
        for t in ts:
            t.join(COMMAND_TIMEOUT * 10)
    assert len(results) == len(keys)
    for result, took in results:
        assert isinstance(result, redcount.TimeoutError), result
        assert took < COMMAND_TIMEOUT + 0.5, f"a call took {took:.2f} s, command_timeout={COMMAND_TIMEOUT}"
    h.proxy.heal()
    h.recover()
    for key in keys:
        sent = [c for c in h.proxy.seen(b"SET") if c[1] == key.encode()]
        assert len(sent) <= 1, f"{key} was sent {len(sent)} times"
        ran = h.admin.execute("STRLEN", key)
        assert ran == (size if sent else 0), (key, ran, len(sent))
    h.check_contract()


# --------------------------------------------------------------------------- faults that break


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_reset_of_an_idle_connection_costs_nothing(harness: Harness, driver: str) -> None:
    h = harness
    warm(h, driver)
    h.proxy.reset()
    outs = h.run(driver, h.keys(4))
    assert not errors_of(outs), errors_of(outs)  # never written on the dead connection: sent on a new one
    h.recover()
    h.check_contract()


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_reset_with_requests_in_flight_is_maybe_applied(harness: Harness, driver: str) -> None:
    h = harness
    warm(h, driver)
    h.proxy.stall()  # they reach the proxy, not the server
    keys = h.keys(1 if driver == "sync" else 4)
    join = h.in_background(driver, keys)
    wait_until(lambda: any(c[1].decode() in keys for c in h.proxy.seen(b"INCR")),
               timeout=COMMAND_TIMEOUT * 0.8, what="a request to reach the proxy")
    h.proxy.reset()
    h.proxy.heal()
    outs = join()
    # The written ones fail "may or may not have run"; any not written yet go out on a new
    # connection and succeed (check_contract tells them apart).
    assert all(isinstance(e, redcount.ConnectionError) for e in errors_of(outs))
    assert any(o.error is not None and o.error.maybe_applied for o in outs)
    h.recover()
    h.check_contract()


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_connection_dropped_after_the_request_is_maybe_applied_and_not_resent(
        harness: Harness, driver: str) -> None:
    h = harness
    warm(h, driver)
    h.proxy.drop_after_request()
    outs = h.run(driver, h.keys(1 if driver == "sync" else 4))
    dropped = [o for o in outs if o.error is not None]
    assert dropped, "the proxy dropped a connection after a request"
    for o in dropped:
        assert isinstance(o.error, redcount.ConnectionError)
        assert not isinstance(o.error, redcount.TimeoutError)
        assert o.error.maybe_applied, repr(o.error)
    # The request ran (the proxy waited for its reply before closing): maybe_applied was right.
    assert any(h.admin.execute("GET", o.key) == b"1" for o in dropped)
    h.recover()
    h.check_contract()


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_half_open_connection_times_out_and_is_replaced(harness: Harness, driver: str) -> None:
    h = harness
    warm(h, driver)
    h.proxy.half_open()
    outs = h.run(driver, h.keys(1 if driver == "sync" else 3))
    assert all(isinstance(e, redcount.TimeoutError) for e in errors_of(outs))
    assert len(errors_of(outs)) == len(outs)
    assert any(o.error is not None and o.error.maybe_applied for o in outs)
    h.proxy.heal()  # new connections work; the half-open one stays silent until the watchdog closes it
    h.recover()
    h.check_contract()
    assert all(h.admin.execute("GET", o.key) is None for o in outs)  # lost on the way: never ran


@pytest.mark.parametrize("driver", DRIVERS)
def test_refused_connections_were_not_applied(harness: Harness, driver: str) -> None:
    h = harness
    warm(h, driver)
    h.proxy.refuse()
    h.proxy.reset()
    outs = h.run(driver, h.keys(1 if driver == "sync" else 3))
    for e in errors_of(outs):
        assert isinstance(e, redcount.ConnectionError) and not e.maybe_applied, repr(e)
    assert len(errors_of(outs)) == len(outs)
    h.proxy.heal()
    h.recover()
    h.check_contract()


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_silent_server_during_the_handshake_was_not_applied(harness: Harness, driver: str) -> None:
    h = harness
    warm(h, driver)
    h.proxy.half_open()  # new connections are accepted and never answered
    h.proxy.reset()
    outs = h.run(driver, h.keys(1 if driver == "sync" else 3))
    for e in errors_of(outs):
        assert isinstance(e, redcount.TimeoutError) and not e.maybe_applied, repr(e)
    assert len(errors_of(outs)) == len(outs)
    h.proxy.heal()
    h.recover()
    h.check_contract()


# --------------------------------------------------------------------------- TLS through the proxy


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RedisServer, str]]:
    """A TLS-only redis-server and its CA file."""
    certs = make_certs(tmp_path_factory.mktemp("fault-proxy-certs"))
    server = RedisServer(REDIS_SERVER, tls=certs).start()
    try:
        yield server, certs.ca
    finally:
        server.cleanup()


@pytest.mark.tls
@pytest.mark.parametrize("driver", ["sync", "asyncio"])
def test_tls_records_split_at_every_byte(tls_server: tuple[RedisServer, str], driver: str) -> None:
    """TLS records (and the handshake) arriving one byte per segment: every read ends inside
    a record, and a large reply spans many records that reads leave partly inside OpenSSL."""
    server, ca = tls_server
    with FaultProxy(server.port, parse=False) as proxy:  # TLS bytes: nothing to count
        store = redcount.connect(f"rediss://127.0.0.1:{proxy.port}/0", ssl_ca_certs=ca,
                                 command_timeout=10, connect_timeout=10)
        try:
            value = bytes(range(256)) * 160  # 40 KB: three records
            store.execute("SET", "tls:split", value)
            proxy.split()
            proxy.reset()  # the next connection's handshake is split too

            async def via_aio() -> list[object]:
                astore = redcount.aio.AsyncStore(store)
                return [await astore.execute("GET", "tls:split"), await astore.execute("INCR", "tls:n"),
                        await astore.execute("DEL", "tls:n")]

            if driver == "sync":
                got = [store.execute("GET", "tls:split"), store.execute("INCR", "tls:n"),
                       store.execute("DEL", "tls:n")]
            else:
                got = asyncio.run(via_aio())
            assert got == [value, 1, 1]
        finally:
            store.close()


# --------------------------------------------------------------------------- what maybe_applied is for


@pytest.mark.parametrize("fault", ["drop_after_request", "reset_in_flight"])
def test_the_retry_queue_counts_a_maybe_applied_increment_once(harness: Harness, fault: str) -> None:
    """A ShardedCounter with on_error="queue": an increment whose connection died after it
    was written (it ran, or it did not) is retried with its request id and counted once."""
    h = harness
    counter = redcount.ShardedCounter(h.store, "retried", shards=4, prefix=h.tag, on_error="queue",
                                      retry_backoff=0.01, retry_backoff_max=0.05)
    try:
        assert counter.incr(1, request_id="warm")
        if fault == "drop_after_request":
            h.proxy.drop_after_request()  # it runs, the reply is lost
        else:
            h.proxy.stall()  # it reaches the proxy, never the server; then the connection dies
        done: list[bool] = []
        t = threading.Thread(target=lambda: done.append(counter.incr(5, request_id="r-1")))
        t.start()
        if fault == "reset_in_flight":
            wait_until(lambda: len(h.proxy.seen(b"EVALSHA")) >= 2, timeout=COMMAND_TIMEOUT * 0.8,
                       what="the increment to reach the proxy")
            h.proxy.reset()
            h.proxy.heal()
        t.join(COMMAND_TIMEOUT * 10)
        assert done == [True]  # accepted: applied, or queued for a retry that will apply it
        wait_until(lambda: counter.pending == 0, timeout=10, what="the retry queue to drain")
        stats = counter.stats()
        assert (stats.queued, stats.delivered) == (1, 1)  # the fault happened; the retry delivered it
        assert counter.value() == 6
        assert not counter.incr(5, request_id="r-1")  # the id was recorded: never twice
        assert counter.value() == 6
    finally:
        counter.close()
