"""A client process that is not running (stopped, or starved of CPU) spends none of its
budget and never opens the circuit breaker.

A child process holds a store with a budget and decides limits with it, synchronously or on
asyncio. Each round, deterministically, without depending on the machine's load:

1. the test freezes redis-server (SIGSTOP), so the child's request stays unanswered;
2. the child sends it, and a thread of its own stops the whole child (SIGSTOP) as soon as
   the request is waiting in Redis's socket, well before its deadline;
3. the test keeps both frozen for three budgets, so the child's deadline is long gone;
4. the test thaws Redis, which answers into the stopped child's socket, then thaws the child.

The decision must be the reply that arrived, counted exactly, and the breaker must stay
closed. A second test leaves Redis frozen, so the child wakes to no reply: that timeout is
the child's own stop, not Redis failing, and three in a row (the breaker's threshold) must
not open the breaker.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import RedisServer
from helpers import reply_waiting_for, wait_until

pytestmark = pytest.mark.redis_only

BUDGET = 0.5  # long enough that the child surely stops itself before its deadline
ROUNDS = 3  # the breaker's default failure threshold
LIMIT = 10

CHILD = textwrap.dedent(
    """
    import asyncio, json, os, signal, sys, threading, time
    import redcount, redcount.aio

    url, budget, port, mode = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    store = redcount.connect(url, budget=budget)
    limiter = redcount.Limiter(store, "sliding-window")  # exact, wherever a minute begins
    alimiter = redcount.aio.Limiter.from_sync(limiter)

    def hit():
        if mode == "sync":
            return limiter.hit("%(limit)d/minute", "starved")
        return asyncio.run(alimiter.hit("%(limit)d/minute", "starved"))

    def redis_has_unread():
        # A connection to Redis's port with bytes Redis has not read: our request.
        want = ":%%04X" %% port
        with open("/proc/net/tcp") as f:
            for line in f.readlines()[1:]:
                parts = line.split()
                if parts[1].endswith(want) and int(parts[4].split(":")[1], 16) > 0:
                    return True
        return False

    hit()  # connected, script loaded
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        stopped = {}

        def stop_once_sent():
            while not redis_has_unread():
                time.sleep(0.0005)
            stopped["at"] = time.monotonic()
            print(json.dumps({"stopping": stopped["at"]}), flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)

        watcher = threading.Thread(target=stop_once_sent)
        started = time.monotonic()
        watcher.start()
        out = {}
        try:
            d = hit()
            out.update(decided=not d.unavailable, allowed=d.allowed, remaining=d.remaining)
        except redcount.ConnectionError as e:
            out.update(error=type(e).__name__, message=str(e))
        watcher.join()
        out.update(stopped_after=stopped["at"] - started, breaker=store.breaker_state)
        print(json.dumps(out), flush=True)
    """
) % {"limit": LIMIT}


class Child:
    """The child process, its stdout read line by line on a thread (reads never hang the test)."""

    def __init__(self, script: Path, server: RedisServer, mode: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(script), server.url, str(BUDGET), str(server.port), mode],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)

    def next(self) -> dict[str, Any]:
        while True:
            line = self.lines.get(timeout=60)
            if line.startswith("{"):
                return dict(json.loads(line))
            print("child:", line, end="")  # a traceback, shown with the failure

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def state(self) -> str:
        # /proc/<pid>/stat: "pid (comm) S ..."; T is stopped.
        return Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()[0]

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(30)
        self._reader.join(30)  # EOF once the child is gone
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def setup(redis_factory: Callable[..., RedisServer], tmp_path: Path) -> Iterator[Callable[[str], tuple[RedisServer, Child]]]:
    started: list[tuple[RedisServer, Child]] = []
    script = tmp_path / "starved_child.py"
    script.write_text(CHILD)

    def make(mode: str) -> tuple[RedisServer, Child]:
        server = redis_factory()
        child = Child(script, server, mode)
        started.append((server, child))
        assert child.next() == {"ready": True}
        return server, child

    try:
        yield make
    finally:
        for server, child in started:
            if server.proc is not None and server.proc.poll() is None:
                os.kill(server.proc.pid, signal.SIGCONT)
            child.close()


def freeze_child_with_request_in_flight(server: RedisServer, child: Child) -> float:
    """Steps 1 and 2: Redis frozen, the child's request sent, the child stopped. Returns when
    it stopped (time.monotonic(), the same clock in every process)."""
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    child.send("go\n")
    at = float(child.next()["stopping"])
    wait_until(lambda: child.state() == "T", timeout=30, what="the child to stop")
    # Both frozen for three budgets: the child's deadline passes while it is stopped, and it
    # wakes well past twice its budget (what the breaker leaves out, with room to spare).
    wait_until(lambda: time.monotonic() > at + 3 * BUDGET, timeout=30, interval=0.05, what="the budget to pass")
    return at


@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_a_reply_that_arrived_while_the_client_was_stopped_is_used(setup: Any, mode: str) -> None:
    server, child = setup(mode)
    assert server.proc is not None
    for n in range(ROUNDS):
        freeze_child_with_request_in_flight(server, child)
        os.kill(server.proc.pid, signal.SIGCONT)  # Redis answers into the stopped child's socket
        wait_until(lambda: reply_waiting_for(server.port), timeout=30, what="Redis's reply in the child's socket")
        os.kill(child.proc.pid, signal.SIGCONT)
        out = child.next()
        assert out["stopped_after"] < BUDGET / 2, f"the child stopped itself too late to test anything: {out}"
        # Decided by Redis, counted once: the warm-up hit and one per round so far.
        assert out.get("decided") is True, out
        assert out["allowed"] and out["remaining"] == LIMIT - 2 - n, out
        assert out["breaker"] == "closed", out


@pytest.mark.parametrize("mode", ["sync", "asyncio"])
def test_timeouts_the_client_was_stopped_through_never_open_the_breaker(setup: Any, mode: str) -> None:
    server, child = setup(mode)
    assert server.proc is not None
    for _ in range(ROUNDS):
        freeze_child_with_request_in_flight(server, child)
        # Redis stays frozen: the child wakes to no reply at all, a budget and more late.
        os.kill(child.proc.pid, signal.SIGCONT)
        out = child.next()
        assert out["stopped_after"] < BUDGET / 2, f"the child stopped itself too late to test anything: {out}"
        assert out.get("error") == "Unavailable", out  # no decision: the web layer's "undecided"
        assert out["breaker"] == "closed", out
        os.kill(server.proc.pid, signal.SIGCONT)
