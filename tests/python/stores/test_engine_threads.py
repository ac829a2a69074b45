"""Many threads calling one store at once, against a real redis-server: every call
completes, each thread's calls take effect in the order it made them, and every failure
says truthfully whether its request may have run, through deadlines that expire while the
server is stopped (SIGSTOP) and while it is busy (DEBUG SLEEP). On the default store (up to
16 thread connections beside the multiplexed socket; a lone caller polls before it sleeps),
on one multiplexed socket shared by every thread, and with a thread connection for every
thread."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable

import pytest
import redcount
from conftest import RedisServer

pytestmark = pytest.mark.redis_only

Factory = Callable[..., RedisServer]

THREADS = 16
CALLS = 50  # at least, per thread; the threads go on until the disturbance is over


class Outcomes:
    """What each thread saw, call by call: the reply, or the error's maybe_applied."""

    def __init__(self) -> None:
        self.replies: list[dict[int, int]] = [{} for _ in range(THREADS)]
        self.maybe: list[set[int]] = [set() for _ in range(THREADS)]
        self.not_sent: list[set[int]] = [set() for _ in range(THREADS)]
        self.calls = [0] * THREADS
        self.finished = [False] * THREADS
        self.unexpected: list[BaseException] = []


def _run_threads(store: redcount.Store, prefix: str, disturb: Callable[[], None]) -> Outcomes:
    out = Outcomes()
    start = threading.Barrier(THREADS + 1)
    over = threading.Event()

    def work(t: int) -> None:
        key = f"{prefix}:{t}"
        start.wait()
        seq = 0
        while seq < CALLS or not over.is_set():
            out.calls[t] = seq + 1
            try:
                n = store.execute("RPUSH", key, seq)
                assert isinstance(n, int)
                out.replies[t][seq] = n
            except (redcount.TimeoutError, redcount.ConnectionError) as e:
                (out.maybe if e.maybe_applied else out.not_sent)[t].add(seq)
            except BaseException as e:  # noqa: BLE001 - reported on the test's thread
                out.unexpected.append(e)
                return
            seq += 1
        out.finished[t] = True

    threads = [threading.Thread(target=work, args=(t,), daemon=True) for t in range(THREADS)]
    for th in threads:
        th.start()
    start.wait()
    disturb()
    over.set()
    for th in threads:
        th.join(timeout=60)
    assert not any(th.is_alive() for th in threads), "a thread never got its calls completed"
    return out


def _check(store: redcount.Store, prefix: str, out: Outcomes) -> None:
    assert not out.unexpected, out.unexpected
    assert all(out.finished), "a thread stopped before its last call"
    for t in range(THREADS):
        applied = [int(x) for x in store.execute("LRANGE", f"{prefix}:{t}", 0, -1)]  # type: ignore[union-attr]
        assert len(applied) == len(set(applied)), f"thread {t}: a request ran twice: {applied}"
        answered = out.replies[t]
        assert len(answered) + len(out.maybe[t]) + len(out.not_sent[t]) == out.calls[t]
        # Every answered call ran, and its reply is its own (the list's length just after it).
        for seq, length in answered.items():
            assert applied.index(seq) + 1 == length, f"thread {t}: call {seq} got another call's reply"
        # Answered calls took effect in the order the thread made them.
        order = [s for s in applied if s in answered]
        assert order == sorted(answered), f"thread {t}: answered calls out of order"
        # A call that failed as not sent never ran; whatever ran was asked for.
        assert not (set(applied) & out.not_sent[t]), f"thread {t}: a request reported as not sent ran"
        assert set(applied) <= set(answered) | out.maybe[t]


def _stores(url: str) -> dict[str, redcount.Store]:
    return {
        "default": redcount.connect(url, command_timeout=0.25),
        "one-socket": redcount.connect(url, command_timeout=0.25, max_connections=1),
        "thread-connections": redcount.connect(url, command_timeout=0.25, max_connections=1 + THREADS),
    }


@pytest.mark.parametrize("shape", ["default", "one-socket", "thread-connections"])
def test_threads_complete_in_order_through_a_stopped_server(
        redis_factory: Factory, stopped: list[RedisServer], shape: str) -> None:
    server = redis_factory()
    assert server.proc is not None
    store = _stores(server.url)[shape]
    others = [s for k, s in _stores(server.url).items() if k != shape]
    for s in others:
        s.close()

    def stall() -> None:
        time.sleep(0.05)
        for _ in range(2):  # two stalls, each longer than the deadline: calls time out, then resume
            os.kill(server.proc.pid, signal.SIGSTOP)  # type: ignore[union-attr]
            stopped.append(server)
            time.sleep(0.6)
            os.kill(server.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
            time.sleep(0.1)

    out = _run_threads(store, f"stop-{shape}", stall)
    _check(store, f"stop-{shape}", out)
    assert any(out.maybe), "no deadline expired during the stall: the test did not test it"
    store.close()


@pytest.mark.parametrize("shape", ["default", "one-socket", "thread-connections"])
def test_threads_complete_in_order_through_a_busy_server(redis_factory: Factory, shape: str) -> None:
    server = redis_factory(["--enable-debug-command", "yes"])
    store = _stores(server.url)[shape]
    for k, s in _stores(server.url).items():
        if k != shape:
            s.close()
    admin = redcount.connect(server.url)

    def busy() -> None:
        time.sleep(0.05)
        admin.execute("DEBUG", "SLEEP", "0.7")  # the server answers nobody meanwhile

    out = _run_threads(store, f"busy-{shape}", busy)
    _check(store, f"busy-{shape}", out)
    assert any(out.maybe), "no deadline expired while the server slept: the test did not test it"
    admin.close()
    store.close()
