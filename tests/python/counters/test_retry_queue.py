"""The retry queue (on_error="queue") against a redis-server that goes away and comes back.

Each test gets its own redis-server (``redis_factory``), stops or kills it mid-run and
restarts it on the same port. Totals are read back from the server. Persistence is off,
so a plain restart starts empty; tests that need the data from before the outage stop
the server with SHUTDOWN SAVE, whose dump the restart loads.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redcount
import redcount.aio
from conftest import RedisServer
from helpers import ms, server_rx_queued, sum_keys, wait_for_fresh_window, wait_until

pytestmark = [pytest.mark.redis_only, pytest.mark.usefixtures("away_from_hour_boundary")]

Factory = Callable[..., RedisServer]


def queue_counter(store: redcount.Store, name: str = "q", window: float = 3600, **kw: object
                  ) -> redcount.FixedWindowCounter:
    kw.setdefault("retry_backoff", 0.01)
    kw.setdefault("retry_backoff_max", 0.2)
    return redcount.FixedWindowCounter(store, name, window, on_error="queue", **kw)  # type: ignore[arg-type]


def sleep_until(t: float) -> None:
    """Wait for a wall-clock time (a window's end), not for readiness."""
    while time.time() < t:
        time.sleep(min(0.05, max(0.0, t - time.time())))


def wait_reconnected(store: redcount.Store) -> None:
    """After a restart the store fails fast until its reconnect backoff (<= ~1 s) ends."""

    def ok() -> bool:
        try:
            return store.ping()
        except redcount.ConnectionError:
            return False

    wait_until(ok, what="the store to reconnect")


def server_total(server: RedisServer, pattern: str) -> int:
    store = redcount.connect(server.url)
    try:
        return sum_keys(store, pattern)
    finally:
        store.close()


@contextmanager
def server_asleep(server: RedisServer, seconds: float) -> Iterator[None]:
    """Block the whole server for `seconds` (DEBUG SLEEP), as a stall or long script would.
    Enters only once the server is really asleep: a probe PING then goes unanswered."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=seconds + 10) as s:
        s.sendall(b"*1\r\n$4\r\nPING\r\n")
        assert s.recv(64).startswith(b"+PONG")  # connection registered with the server
        arg = str(seconds).encode()
        s.sendall(b"*3\r\n$5\r\nDEBUG\r\n$5\r\nSLEEP\r\n$%d\r\n%s\r\n" % (len(arg), arg))
        deadline = time.monotonic() + 5
        while True:
            assert time.monotonic() < deadline, "the server never fell asleep"
            # An awake server answers a PING on loopback far within 0.25 s, even under load.
            with socket.create_connection(("127.0.0.1", server.port), timeout=0.25) as probe:
                probe.sendall(b"*1\r\n$4\r\nPING\r\n")
                try:
                    probe.recv(64)
                except TimeoutError:
                    break  # no answer: asleep
        yield
        assert s.recv(64).startswith(b"+OK")  # the sleep is over


# --------------------------------------------------------------------------- stop / restart


def test_queue_while_down_then_flush_after_restart(redis_factory: Factory) -> None:
    server = redis_factory()
    store = redcount.connect(server.url)
    c = queue_counter(store)
    assert c.incr("k", 2) == 2
    assert c.incr("k", request_id="r1") == 3
    assert c.pending == 0 and c.stats().queued == 0

    server.stop(save=True)  # keeps the 3 counted so far across the restart
    queued = []
    for i in range(5):
        assert c.incr("k") == 0  # not known yet: queued
        queued.append(c.stats().queued)
    assert queued == [1, 2, 3, 4, 5]
    assert c.pending == 5
    assert c.incr("k", 5, request_id="r1") == 0  # a retry of r1 by the caller: queued too
    assert c.incr_many({"k": 10, "j": 7}) == {"k": 0, "j": 0}
    assert c.incr("j", request_id="r2") == 0
    assert c.incr("j", request_id="r2") == 0  # the same id twice in the queue
    s = c.stats()
    assert s.queued == 10 and s.pending == 10 and s.delivered == 0
    assert "refused" in s.last_error or "closed" in s.last_error

    server.start()
    assert c.flush(10.0) == 0
    s = c.stats()
    assert (s.pending, s.delivered, s.dropped, s.failed, s.overflowed) == (0, 10, 0, 0, 0)
    assert c.pending == 0
    assert s.retried >= 10
    # k: 3 before + 5 x 1 + 10 (r1 already counted); j: 7 + 1 (r2 once).
    assert c.get("k") == 18
    assert c.get("j") == 8
    assert server_total(server, "redcount:q:*") == 26
    assert c.incr("k") == 19  # and business as usual
    c.close()
    store.close()


def test_sigkill_and_restart_delivers_the_queue(redis_factory: Factory) -> None:
    server = redis_factory()
    store = redcount.connect(server.url)
    c = queue_counter(store, mode="commands")
    assert c.incr("k") == 1
    server.kill()  # a crash: the data is gone, the queue must still land
    for _ in range(20):
        assert c.incr("k", 3) == 0
    assert c.incr_many({f"m{i}": i + 1 for i in range(10)}) == {f"m{i}": 0 for i in range(10)}
    assert c.pending == 30
    server.start()
    assert c.flush(10.0) == 0
    assert c.get("k") == 60
    assert c.get_many([f"m{i}" for i in range(10)]) == {f"m{i}": i + 1 for i in range(10)}
    assert c.stats().delivered == 30
    for key in store.execute("KEYS", "*"):
        assert store.execute("PTTL", key) > 0  # delivered increments carry their TTL
    c.close()
    store.close()


def test_flush_times_out_while_still_down(redis_factory: Factory) -> None:
    server = redis_factory()
    store = redcount.connect(server.url)
    c = queue_counter(store)
    c.incr("k")
    server.stop()
    for _ in range(3):
        c.incr("k")
    assert c.flush(0.3) == 3  # still down: all three still pending, nothing lost
    assert c.stats().pending == 3 and c.stats().failed == 0
    server.start()
    assert c.flush(10.0) == 0
    assert c.get("k") == 3  # (the restart lost the first one: no persistence)
    c.close()
    store.close()


def test_threads_through_an_outage_exact_total(redis_factory: Factory) -> None:
    """Threads keep incrementing while the server is shut down under them and restarted.
    Phase 1 runs while the shutdown happens (commands in flight), phase 2 entirely while
    the server is down, phase 3 after the restart. With request ids, an increment whose
    reply was lost in the shutdown is not counted twice when its retry lands."""
    server = redis_factory()
    store = redcount.connect(server.url)
    c = queue_counter(store, "out")
    threads, phases = 4, (200, 50, 50)
    done = [0] * threads
    errors: list[BaseException] = []
    stopped, restarted = threading.Event(), threading.Event()

    def work(t: int) -> None:
        try:
            i = 0
            for phase, count in enumerate(phases):
                if phase == 1:
                    assert stopped.wait(20), "the server was never stopped"
                if phase == 2:
                    assert restarted.wait(20), "the server was never restarted"
                for _ in range(count):
                    c.incr("k", 1 + i % 2, request_id=f"{t}-{i}")
                    i += 1
                    done[t] += 1
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    ts = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    wait_until(lambda: sum(done) >= threads * phases[0] // 4, what="a quarter of phase 1")
    server.stop(save=True)  # while phase 1 is still sending
    stopped.set()
    wait_until(lambda: all(d >= phases[0] + phases[1] for d in done) or bool(errors), what="phase 2")
    queued_while_down = c.stats().queued
    server.start()
    restarted.set()
    for t in ts:
        t.join()
    assert not errors, errors
    assert queued_while_down >= threads * phases[1]  # all of phase 2 went to the queue
    assert c.flush(10.0) == 0
    s = c.stats()
    assert s.dropped == 0 and s.failed == 0 and s.overflowed == 0
    assert s.delivered == s.queued
    n = sum(phases)
    expected = threads * sum(1 + i % 2 for i in range(n))
    assert server_total(server, "redcount:out:{k}:*") == expected
    c.close()
    store.close()


# --------------------------------------------------------------------------- raise mode


def test_raise_mode_raises_connection_error_while_down(redis_factory: Factory) -> None:
    server = redis_factory()
    store = redcount.connect(server.url)
    c = redcount.FixedWindowCounter(store, "r", 3600)  # on_error="raise"
    assert c.incr("k") == 1
    server.stop()
    for _ in range(3):
        with pytest.raises(redcount.ConnectionError) as info:
            c.incr("k")
        assert isinstance(info.value, ConnectionError)  # the builtin, too
        assert isinstance(info.value, redcount.RedcountError)
    with pytest.raises(ConnectionError):
        c.incr_many({"k": 1})
    with pytest.raises(ConnectionError):
        c.get("k")
    with pytest.raises(ConnectionError):
        store.ping()
    with pytest.raises(ConnectionError):
        redcount.Limiter(store).hit("5/hour", "k")
    assert c.pending == 0 and c.stats().queued == 0  # nothing was queued
    server.start()
    wait_reconnected(store)
    assert c.incr("k") == 1  # the failed increments were not applied (and the restart emptied it)
    store.close()


def test_non_transient_errors_are_not_queued(redis_factory: Factory) -> None:
    server = redis_factory()
    store = redcount.connect(server.url)
    c = queue_counter(store)
    store.execute("SET", c.storage_key("k"), "not a number")
    with pytest.raises(redcount.ReplyError):
        c.incr("k")
    assert c.pending == 0 and c.stats().queued == 0
    store.close()


# --------------------------------------------------------------------------- bounds


def test_queue_overflow_raises_and_is_counted(redis_factory: Factory) -> None:
    server = redis_factory()
    store = redcount.connect(server.url)
    c = queue_counter(store, queue_capacity=3)
    server.stop()
    assert [c.incr("k") for _ in range(3)] == [0, 0, 0]
    with pytest.raises(redcount.RetryQueueFull) as info:
        c.incr("k")
    assert isinstance(info.value, redcount.RedcountError)
    assert not isinstance(info.value, ConnectionError)
    assert "full" in str(info.value)
    assert c.stats().overflowed == 1
    with pytest.raises(redcount.RetryQueueFull):
        c.incr_many({"a": 1, "b": 1})  # all or nothing: neither is queued
    s = c.stats()
    assert (s.overflowed, s.queued, s.pending) == (3, 3, 3)
    server.start()
    assert c.flush(10.0) == 0
    assert c.get("k") == 3
    assert c.get_many(["a", "b"]) == {"a": 0, "b": 0}
    assert c.incr("k") == 4  # room again
    c.close()
    store.close()


def test_expired_window_is_dropped_not_counted_late(redis_factory: Factory) -> None:
    server = redis_factory()
    store = redcount.connect(server.url)
    c = queue_counter(store, "short", window=1, grace=0.2)
    server.stop()
    assert [c.incr("k") for _ in range(3)] == [0, 0, 0]
    _, end = c.current_window("k")
    sleep_until(end + c.grace + 0.1)  # keep the server down past the window's end + grace
    server.start()
    assert c.flush(10.0) == 0
    s = c.stats()
    assert s.dropped == 3 and s.delivered == 0 and s.pending == 0
    assert server.command("DBSIZE") == b":0"  # nothing landed late in any window
    wait_reconnected(store)
    assert c.incr("k") == 1
    c.close()
    store.close()


@pytest.mark.slow
def test_late_delivery_lands_in_its_own_window(redis_factory: Factory) -> None:
    """A queued increment is resolved to its window when made: delivered after that window
    ended (but within grace), it lands in the old window's key with the old deadline."""
    server = redis_factory()
    store = redcount.connect(server.url)
    c = queue_counter(store, "late", window=2, grace=30)
    server.stop()
    wait_for_fresh_window(store, 2.0, 1.0)
    old_key = c.storage_key("k")
    _, old_end = c.current_window("k")
    assert [c.incr("k", 2) for _ in range(4)] == [0] * 4
    sleep_until(old_end + 0.05)
    assert c.storage_key("k") != old_key  # a new window has begun
    server.start()
    assert c.flush(10.0) == 0
    assert store.execute("GET", old_key) == b"8"
    assert store.execute("PEXPIRETIME", old_key) == ms(old_end) + 30_000
    assert c.get("k") == 0  # nothing leaked into the current window
    c.close()
    store.close()


# --------------------------------------------------------------------------- close


def test_close_drains_the_queue(redis_factory: Factory) -> None:
    server = redis_factory()
    store = redcount.connect(server.url)
    c = queue_counter(store)
    server.stop()
    for _ in range(7):
        c.incr("k")
    server.start()
    assert c.close(10.0) == 0
    s = c.stats()
    assert (s.delivered, s.failed, s.pending) == (7, 0, 0)
    assert server_total(server, "redcount:q:*") == 7
    with pytest.raises(redcount.RedcountError, match="closed"):
        c.incr("k")
    assert c.close() == 0  # idempotent
    store.close()


def test_close_while_down_reports_losses(redis_factory: Factory) -> None:
    server = redis_factory()
    store = redcount.connect(server.url)
    c = queue_counter(store)
    server.stop()
    for _ in range(4):
        c.incr("k")
    assert c.close(0.2) == 4  # could not deliver: reported, never silently lost
    # An attempt still running when close(0.2) gave up is counted as failed when it ends
    # (the detached retry thread does it): wait for that, within a bound.
    deadline = time.monotonic() + 10
    while c.stats().pending and time.monotonic() < deadline:
        time.sleep(0.01)
    s = c.stats()
    assert s.failed == 4 and s.pending == 0 and s.delivered == 0
    server.start()
    assert server_total(server, "*") == 0
    store.close()


def test_context_manager_closes_and_drains(redis_factory: Factory) -> None:
    server = redis_factory()
    store = redcount.connect(server.url)
    with queue_counter(store) as c:
        server.stop()
        c.incr("k", 4)
        assert c.pending == 1
        server.start()
    assert c.pending == 0 and c.stats().delivered == 1
    assert server_total(server, "*") == 4
    store.close()


# --------------------------------------------------------------------------- timeouts


def test_timeout_but_ran_is_not_double_counted_with_request_id(redis_factory: Factory) -> None:
    """A command that timed out on the client may still run on the server. The queued retry
    must then not count it again: the request id makes the retry a no-op."""
    server = redis_factory(["--enable-debug-command", "yes"])
    store = redcount.connect(server.url, command_timeout=0.2)
    c = queue_counter(store, "slow")
    assert c.incr("k") == 1
    with server_asleep(server, 1.5):
        assert c.incr("k", 5, request_id="once") == 0  # timed out: queued for retry
        assert "timed out" in c.stats().last_error
    # The server woke up and ran the timed-out increment; the retry then found its id.
    assert c.flush(10.0) == 0
    assert c.stats().delivered == 1
    assert c.get("k") == 6
    c.close()
    store.close()


def test_raise_mode_timeout_error(redis_factory: Factory) -> None:
    server = redis_factory(["--enable-debug-command", "yes"])
    store = redcount.connect(server.url, command_timeout=0.2)
    c = redcount.FixedWindowCounter(store, "slow", 3600)
    c.incr("k")
    with server_asleep(server, 1.0), pytest.raises(redcount.TimeoutError) as info:
        c.incr("k")
    assert isinstance(info.value, TimeoutError)  # the builtin
    assert isinstance(info.value, redcount.ConnectionError)
    assert "may or may not have run" in str(info.value)
    store.close()


# --------------------------------------------------------------------------- interpreter exit

EXIT_CHILD = """
import sys, redcount
store = redcount.connect(sys.argv[1])
# A first retry 60 s away: only the drain at exit can deliver before the child is gone.
c = redcount.FixedWindowCounter(store, "exitq", 3600, on_error="queue",
                                retry_backoff=60.0, retry_backoff_max=60.0)
for _ in range(7):
    assert c.incr("k") == 0
print("queued", c.pending, flush=True)
how = sys.stdin.readline().strip()  # the parent brings the server back, then lets us exit
# No flush or close here: interpreter exit must deliver what is queued.
if how == "abrupt":
    import os
    os._exit(0)  # skips every exit handler: the control case, nothing may arrive
"""


@pytest.mark.parametrize(("how", "delivered"), [("normal", 7), ("abrupt", 0)])
def test_interpreter_exit_drains_the_queue(redis_factory: Factory, how: str, delivered: int) -> None:
    server = redis_factory()
    server.stop()
    child = subprocess.Popen([sys.executable, "-c", EXIT_CHILD, server.url], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdin is not None
        assert child.stdout.readline().strip() == "queued 7"
        server.start()
        child.stdin.write(how + "\n")
        child.stdin.flush()
        _, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
    assert child.returncode == 0, err
    assert server_total(server, "redcount:exitq:*") == delivered


# ------------------------------------------------------------- close against a stalled server


def _queueing(kind: str, store: redcount.Store) -> tuple[Callable[[int], object], Any]:
    """A counter of `kind` with on_error="queue" and a way to make its i-th write."""
    # No retry falls due during the test: the test decides when one runs (flush), so none
    # can land between the restart and SIGSTOP.
    backoff = {"retry_backoff": 30.0, "retry_backoff_max": 30.0}
    if kind.startswith("fixed"):
        mode = "commands" if kind.endswith("commands") else "script"
        fc = redcount.FixedWindowCounter(store, "stall", 3600, on_error="queue", mode=mode,  # type: ignore[arg-type]
                                         **backoff)
        return (lambda i: fc.incr("k")), fc
    sc = redcount.ShardedCounter(store, "stall", shards=4, on_error="queue", **backoff)  # type: ignore[arg-type]
    return (lambda i: sc.incr(1, request_id=f"r{i}")), sc


@pytest.mark.parametrize("kind", ["fixed-script", "fixed-commands", "sharded", "fixed-aio", "sharded-aio"])
def test_close_with_a_timeout_returns_while_the_server_is_stalled(redis_factory: Factory, kind: str) -> None:
    """With command_timeout=0 an attempt sent to a SIGSTOPped server never ends by itself;
    close(timeout=0.5) still returns about then, and counts every write it gave up
    (queued or in that attempt) as failed at once, never twice."""
    server = redis_factory()
    store = redcount.connect(server.url, command_timeout=0)
    write, counter = _queueing(kind.removesuffix("-aio"), store)
    writes = 6
    server.stop()  # refused: every write goes to the queue
    for i in range(writes):
        write(i)
    assert counter.stats().queued == writes
    server.start()
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        # A flush makes the retry thread try now; once reconnected it sends to the stalled
        # server and stays stuck (until then an attempt fails fast and is queued again).
        wait_until(lambda: counter.flush(0.05) >= 0 and server_rx_queued(server.port), timeout=20,
                   what="a retry to reach the stalled server")
        started = time.monotonic()
        if kind.endswith("-aio"):
            twin = (redcount.aio.FixedWindowCounter if kind.startswith("fixed")
                    else redcount.aio.ShardedCounter).from_sync(counter)
            left = asyncio.run(twin.close(0.5))
        else:
            left = counter.close(0.5)
        elapsed = time.monotonic() - started
        # Generous slack for a loaded machine: without the fix close() never returns.
        assert elapsed < 10, f"close(0.5) took {elapsed:.1f} s"
        assert left == writes
        s = counter.stats()
        assert (s.queued, s.failed, s.pending, s.delivered) == (writes, writes, 0, 0)
        with pytest.raises(redcount.RedcountError, match="closed"):
            write(writes)
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    # The abandoned attempt may now land; what close() gave up is not counted again.
    time.sleep(0.2)  # a window for a double count to show, not a readiness wait
    after = counter.stats()
    assert (after.failed, after.delivered) == (s.failed, s.delivered)
    store.close()
    server.stop()
