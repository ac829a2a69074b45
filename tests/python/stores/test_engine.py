"""The I/O engine under the Redis store, against real redis-server processes: auto-pipelining
on a fixed number of connections, per-request deadlines, the failure contract request by
request (not written: resent; written but unanswered: ConnectionError with maybe_applied and
never resent; "did not run" rejections: retried), reconnect backoff on a wrong password,
refused connection-state commands, close, and fork safety."""

from __future__ import annotations

import multiprocessing
import os
import signal
import socket
import threading
import time
import warnings
from collections.abc import Callable

import pytest
import redcount
from conftest import RedisServer
from helpers import server_rx_queued, wait_until
from redcount import _core
from redcount.errors import StoreClosed

pytestmark = pytest.mark.redis_only

Factory = Callable[..., RedisServer]


def open_store(url: str, connections: int = 1, command_timeout: float = 2.0,
               max_connections: int | None = None) -> redcount.Store:
    # The binding, as redcount.connect() calls it; max_connections defaults to connections
    # here (a fixed number of sockets), not to connect()'s connections + 16.
    return _core.open_store(url, connect_timeout=2.0, command_timeout=command_timeout,
                            max_connections=max(connections, 1) if max_connections is None else max_connections,
                            keepalive=True, pool_timeout=2.0, clock=None, sweep_interval=0.1,
                            connections=connections)


def redcount_clients(admin: redcount.Store) -> int:
    listing = admin.execute("CLIENT", "LIST")
    assert isinstance(listing, bytes)
    return sum(1 for line in listing.decode().splitlines() if " name=redcount " in f" {line} ")


# --------------------------------------------------------------------------- pipelining


def _sixteen_threads_increment(counter: redcount.FixedWindowCounter, on_step: Callable[[], None] | None = None) -> None:
    """16 threads x 300 increments on 7 keys, started together; exact totals checked.
    ``on_step`` runs every 50 increments of the first thread."""
    threads, each = 16, 300
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def work(t: int) -> None:
        try:
            start.wait()
            for i in range(each):
                counter.incr(f"k{(i + t) % 7}", 1 + i % 3)
                if on_step is not None and t == 0 and i % 50 == 0:
                    on_step()
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errors, errors
    assert sum(counter.get(f"k{j}") for j in range(7)) == threads * sum(1 + i % 3 for i in range(each))


@pytest.mark.parametrize("connections", [1, 2])
def test_threads_share_a_fixed_number_of_connections_exact_totals(redis_factory: Factory, connections: int) -> None:
    server = redis_factory()
    store = open_store(server.url, connections=connections)
    _sixteen_threads_increment(redcount.FixedWindowCounter(store, "pipe", 3600))
    admin = redcount.connect(server.url)
    assert redcount_clients(admin) == connections + 1  # this store's, and the admin's one
    admin.close()
    store.close()
    wait_until(lambda: redcount_clients(redcount.connect(server.url)) <= 1, what="the connections to close")


@pytest.mark.parametrize("connections", [1, 2])
def test_thread_connections_stay_under_max_connections_exact_totals(redis_factory: Factory, connections: int) -> None:
    server = redis_factory()
    cap = connections + 3
    store = redcount.connect(server.url, connections=connections, max_connections=cap)
    admin = redcount.connect(server.url)
    most = [0]

    def sample() -> None:
        most[0] = max(most[0], redcount_clients(admin) - 1)

    _sixteen_threads_increment(redcount.FixedWindowCounter(store, "threads", 3600), sample)
    sample()
    assert connections <= most[0] <= cap
    store.close()
    wait_until(lambda: redcount_clients(admin) <= 1, what="the connections to close")
    admin.close()


def test_the_default_store_opens_thread_connections_for_threads_calling_at_once(redis_factory: Factory) -> None:
    server = redis_factory()
    store = redcount.connect(server.url)  # max_connections defaults to connections + 16
    admin = redcount.connect(server.url, max_connections=1)
    most = [0]

    def sample() -> None:
        most[0] = max(most[0], redcount_clients(admin) - 1)

    _sixteen_threads_increment(redcount.FixedWindowCounter(store, "threads", 3600), sample)
    sample()
    assert 2 <= most[0] <= 1 + 16, most[0]
    store.close()
    admin.close()


def test_invalid_connection_count_is_refused(redis_server: RedisServer) -> None:
    for n in (0, 5):
        with pytest.raises(redcount.InvalidInputError, match="connections must be 1 to 4"):
            open_store(redis_server.url, connections=n)


# --------------------------------------------------------------------------- deadlines


def test_a_timed_out_request_fails_alone_and_the_connection_stays_in_step(
        redis_factory: Factory, stopped: list[RedisServer]) -> None:
    server = redis_factory()
    store = open_store(server.url, command_timeout=0.3)
    store.execute("SET", "a", 10)
    conn_id = store.execute("CLIENT", "ID")
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    stopped.append(server)
    with pytest.raises(redcount.TimeoutError, match="may or may not have run") as info:
        store.execute("INCRBY", "a", 5)
    assert info.value.maybe_applied is True
    os.kill(server.proc.pid, signal.SIGCONT)
    # The late reply (15) is discarded: the next replies are the right ones, on the same
    # connection (no reconnect).
    assert store.execute("INCRBY", "b", 100) == 100
    assert store.execute("GET", "a") == b"15"
    assert store.execute("CLIENT", "ID") == conn_id
    store.close()


# --------------------------------------------------------------------------- failure contract


def test_written_but_unanswered_is_maybe_applied_and_never_resent(
        redis_factory: Factory, stopped: list[RedisServer]) -> None:
    server = redis_factory(["--appendonly", "yes", "--appendfsync", "always"])
    store = open_store(server.url, command_timeout=10)
    store.execute("SET", "k", 10)
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    stopped.append(server)
    outcome: list[BaseException] = []

    def call() -> None:
        try:
            store.execute("INCRBY", "k", 5)
        except BaseException as e:  # noqa: BLE001 - inspected below
            outcome.append(e)

    t = threading.Thread(target=call)
    t.start()
    wait_until(lambda: server_rx_queued(server.port), what="the INCRBY to reach the stopped server")
    server.kill()  # it never reads it
    t.join(15)
    assert len(outcome) == 1
    err = outcome[0]
    assert isinstance(err, redcount.ConnectionError) and not isinstance(err, redcount.TimeoutError), err
    assert err.maybe_applied is True
    assert "may or may not have run" in str(err)
    server.start()  # the AOF brings back k = 10
    wait_until(lambda: _pings(store), what="the store to reconnect")
    assert store.execute("GET", "k") == b"10"  # not applied, and not resent behind our back
    store.close()


def _pings(store: redcount.Store) -> bool:
    try:
        return store.ping()
    except redcount.ConnectionError:
        return False


def test_unwritten_requests_are_resent_after_a_connection_drop(redis_server: RedisServer) -> None:
    store = open_store(redis_server.url)
    admin = redcount.connect(redis_server.url)
    admin.execute("DEL", "{drop}k")
    for i in range(20):
        conn_id = store.execute("CLIENT", "ID")
        admin.execute("CLIENT", "KILL", "ID", conn_id)
        assert store.execute("INCR", "{drop}k") == i + 1  # no error: it had not been written
    threads_done = []

    def burst() -> None:
        for _ in range(50):
            store.execute("INCR", "{drop}k")
        threads_done.append(1)

    conn_id = store.execute("CLIENT", "ID")
    admin.execute("CLIENT", "KILL", "ID", conn_id)
    ts = [threading.Thread(target=burst) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert len(threads_done) == 4
    assert admin.execute("GET", "{drop}k") == b"220"
    store.close()
    admin.close()


def test_a_refused_connection_was_not_applied() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    store = redcount.connect(f"redis://127.0.0.1:{port}/0")
    with pytest.raises(redcount.ConnectionError, match="refused") as info:
        store.execute("INCR", "k")
    assert info.value.maybe_applied is False
    with pytest.raises(redcount.ConnectionError, match="backoff") as info:
        store.execute("INCR", "k")  # within the reconnect backoff: at once, nothing sent
    assert info.value.maybe_applied is False
    store.close()


def test_loading_is_retried_within_the_deadline(redis_factory: Factory) -> None:
    server = redis_factory(["--enable-debug-command", "yes", "--key-load-delay", "50",
                            "--loading-process-events-interval-bytes", "1024"])
    store = open_store(server.url, command_timeout=30)
    counter = redcount.FixedWindowCounter(store, "load", 3600)
    assert counter.incr("k") == 1
    store.execute("DEBUG", "POPULATE", 20000)
    store.execute("SAVE")

    def reload() -> None:
        with socket.create_connection(("127.0.0.1", server.port), timeout=60) as s:
            s.sendall(b"*3\r\n$5\r\nDEBUG\r\n$6\r\nRELOAD\r\n$6\r\nNOSAVE\r\n")
            s.recv(64)

    t = threading.Thread(target=reload)
    t.start()

    def loading() -> bool:
        try:
            return server.command("PING").startswith(b"-LOADING")
        except OSError:
            return False

    wait_until(loading, what="the server to be loading")
    assert counter.incr("k") == 2  # LOADING did not run it; retried until the load ended
    t.join(60)
    assert counter.get("k") == 2
    store.close()


def test_noscript_is_reloaded_and_rerun(redis_store: redcount.Store) -> None:
    counter = redcount.FixedWindowCounter(redis_store, "ns", 3600)
    for i in range(5):
        redis_store.execute("SCRIPT", "FLUSH")
        assert counter.incr("k") == i + 1
    limiter = redcount.Limiter(redis_store, strategy="sliding-window")
    redis_store.execute("SCRIPT", "FLUSH")
    assert limiter.hit("5/hour", "x")


# --------------------------------------------------------------------------- failures, misuse, close and fork


def test_wrong_password_backs_off(redis_factory: Factory) -> None:
    server = redis_factory(["--requirepass", "right"], password="right")
    admin = redcount.connect(f"redis://:right@127.0.0.1:{server.port}/0")

    def connections() -> int:
        info = admin.execute("INFO", "stats")
        assert isinstance(info, bytes)
        for line in info.decode().splitlines():
            if line.startswith("total_connections_received:"):
                return int(line.split(":")[1])
        raise AssertionError("no total_connections_received in INFO")

    store = redcount.connect(f"redis://:wrong@127.0.0.1:{server.port}/0")
    before = connections()
    calls = 0
    messages = set()
    end = time.monotonic() + 1.0
    while time.monotonic() < end:
        with pytest.raises(redcount.AuthenticationError) as info:
            store.execute("PING")
        messages.add("backoff" in str(info.value))
        calls += 1
    opened = connections() - before - 1  # the last INFO's own call is on the admin's connection
    assert calls > 100
    assert opened <= 20, f"{opened} connections in 1 s for {calls} calls"
    assert True in messages  # the error says it is retrying with backoff
    store.close()
    admin.close()


def test_connection_state_commands_are_refused(redis_store: redcount.Store) -> None:
    for args in (("SELECT", 1), ("select", 2), ("WATCH", "k"), ("SUBSCRIBE", "c"), ("CLIENT", "REPLY", "OFF"),
                 ("AUTH", "pw"), ("HELLO", 3), ("RESET",), ("MULTI",), ("EXEC",), ("BLPOP", "k", 0)):
        with pytest.raises(redcount.InvalidInputError, match="refused|transaction"):
            redis_store.execute(*args)
    with pytest.raises(redcount.InvalidInputError, match="in the URL"):
        redis_store.execute("SELECT", 1)
    assert redis_store.execute_many([("MULTI",), ("INCR", "tx"), ("EXEC",)])[-1] == [1]
    assert redis_store.execute("GET", "tx") == b"1"  # still database 0, still in step


def test_closed_store_raises_a_non_transient_error(store: redcount.Store) -> None:
    queueing = redcount.FixedWindowCounter(store, "q", 60, on_error="queue")
    store.close()
    with pytest.raises(StoreClosed, match="closed") as info:
        store.execute("PING")
    assert isinstance(info.value, redcount.ConnectionError)
    assert info.value.maybe_applied is False
    with pytest.raises(StoreClosed):
        queueing.incr("k")  # raised, not queued: a retry cannot help
    assert queueing.pending == 0
    queueing.close()


def test_close_from_many_threads_while_others_call(redis_server: RedisServer) -> None:
    for _ in range(5):
        store = redcount.connect(redis_server.url)
        counter = redcount.FixedWindowCounter(store, "closing", 3600)
        counter.incr("k")
        unexpected: list[BaseException] = []
        go = threading.Event()

        def call() -> None:
            go.wait()
            for _ in range(200):
                try:
                    counter.incr("k")
                except redcount.ConnectionError:
                    pass  # closed under it: StoreClosed, or in flight when it closed
                except BaseException as e:  # noqa: BLE001
                    unexpected.append(e)

        def close() -> None:
            go.wait()
            store.close()

        ts = [threading.Thread(target=call) for _ in range(4)] + [threading.Thread(target=close) for _ in range(8)]
        for t in ts:
            t.start()
        go.set()
        for t in ts:
            t.join(30)
            assert not t.is_alive()
        assert not unexpected, unexpected
        with pytest.raises(StoreClosed):
            counter.incr("k")


# --------------------------------------------------------------------------- fork


def _incr_n(counter: redcount.FixedWindowCounter, n: int) -> None:
    for i in range(n):
        counter.incr("k", 1 + i % 3)


def test_fork_children_and_parent_count_together(redis_server: RedisServer) -> None:
    store = redcount.connect(redis_server.url)
    counter = redcount.FixedWindowCounter(store, "fork", 3600)
    store.execute("DEL", counter.storage_key("k"), counter.storage_key("warm"))
    n = 300
    counter.incr("warm", 1)  # the parent's engine is running, with a connection
    pids = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (Python >= 3.12)
        for _ in range(4):
            pid = os.fork()
            if pid == 0:  # the child: its own engine, opened at its first call
                code = 1
                try:
                    _incr_n(counter, n)
                    code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
    _incr_n(counter, n)
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
    assert counter.get("k") == 5 * sum(1 + i % 3 for i in range(n))
    assert counter.incr("warm") == 2  # the parent's store still works
    store.close()


_POOL_COUNTER: redcount.FixedWindowCounter | None = None


def _pool_work(n: int) -> int:
    assert _POOL_COUNTER is not None
    _incr_n(_POOL_COUNTER, n)
    return n


def test_fork_pool_exact_totals(redis_server: RedisServer) -> None:
    global _POOL_COUNTER
    store = redcount.connect(redis_server.url)
    counter = redcount.FixedWindowCounter(store, "forkpool", 3600)
    store.execute("DEL", counter.storage_key("k"))
    counter.incr("k", 7)  # used in the parent before the pool forks
    _POOL_COUNTER = counter
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            with multiprocessing.get_context("fork").Pool(4) as pool:
                done = pool.map(_pool_work, [200] * 8)
                _incr_n(counter, 200)  # the parent too, while the pool may still run
    finally:
        _POOL_COUNTER = None
    assert done == [200] * 8
    assert counter.get("k") == 7 + 9 * sum(1 + i % 3 for i in range(200))
    store.close()


def test_a_host_name_is_resolved_off_the_reactor_and_each_address_tried(redis_server: RedisServer) -> None:
    # "localhost" is a name, so it goes through the resolver thread; it may resolve to ::1
    # first, where nothing listens (the server binds 127.0.0.1), and then 127.0.0.1.
    store = redcount.connect(f"redis://localhost:{redis_server.port}/0")
    counter = redcount.FixedWindowCounter(store, "byname", 3600)
    assert counter.incr("k") == 1
    assert counter.incr("k") == 2
    store.close()
    bad = redcount.connect("redis://no-such-host.redcount-test.invalid:6379/0", connect_timeout=5)
    with pytest.raises(redcount.ConnectionError, match="no-such-host.redcount-test.invalid"):
        bad.ping()
    bad.close()


# --------------------------------------------------------------------------- the poll before sleeping


@pytest.mark.parametrize("spin", [0.0, 0.001, None])
def test_a_lone_caller_polling_gets_every_reply_whole(redis_factory: Factory, spin: float | None) -> None:
    # Replies that arrive in pieces (1 MiB values) after the poll found their first bytes.
    server = redis_factory()
    store = redcount.connect(server.url, spin=spin)
    big = b"x" * (1 << 20)
    for i in range(20):
        store.execute("SET", f"big{i}", big + str(i).encode())
        assert store.execute("GET", f"big{i}") == big + str(i).encode()
        assert store.execute("INCR", "n") == i + 1
    store.close()


def test_a_lone_caller_polling_still_times_out_on_a_stopped_server(
        redis_factory: Factory, stopped: list[RedisServer]) -> None:
    server = redis_factory()
    assert server.proc is not None
    store = redcount.connect(server.url, command_timeout=0.3, spin=0.001, max_connections=1)
    assert store.execute("INCR", "n") == 1
    os.kill(server.proc.pid, signal.SIGSTOP)
    stopped.append(server)
    start = time.monotonic()
    with pytest.raises(redcount.TimeoutError) as info:
        store.execute("INCR", "n")
    waited = time.monotonic() - start
    os.kill(server.proc.pid, signal.SIGCONT)
    assert info.value.maybe_applied
    assert 0.25 <= waited < 2.0
    # The connection stays in step: the timed-out INCR's reply is not taken for the next call's.
    assert store.execute("INCR", "n") == 3
    store.close()
