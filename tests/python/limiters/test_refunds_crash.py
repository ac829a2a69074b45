"""Reservations through a crash: a process that reserved is killed (SIGKILL) before it
settles; another process settles by request id, or the deadline passes and the estimate
stands. On a real Redis server (memory:// lives in one process; there another Limiter on
the same store plays the other process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redcount
from redcount.limiter import Strategy

RATE: list[Strategy] = ["fixed-window", "sliding-window", "sliding-window-approx", "token-bucket", "gcra"]

# Reserves, says so, then waits to be killed (it never settles).
CHILD = """
import sys, time
import redcount
store = redcount.connect(sys.argv[1])
lim = redcount.Limiter(store, sys.argv[2])
r = lim.reserve("100/day", "tenant", 30, request_id=sys.argv[3], deadline=float(sys.argv[4]))
print("reserved" if r else "refused", flush=True)
time.sleep(600)
"""


def reserve_and_die(url: str, strategy: str, request_id: str, deadline: float) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(redcount.__file__).parent.parent), env.get("PYTHONPATH", "")])
    with subprocess.Popen(
        [sys.executable, "-c", CHILD, url, strategy, request_id, str(deadline)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    ) as child:
        try:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "reserved"
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL


def left(lim: redcount.Limiter) -> int:
    return lim.test("100/day", "tenant").remaining


@pytest.mark.redis_only
@pytest.mark.parametrize("strategy", RATE)
def test_another_process_settles_after_a_kill(redis_store: redcount.Store, strategy: Strategy) -> None:
    url = redis_store.url
    reserve_and_die(url, strategy, "job-7", 300)
    lim = redcount.Limiter(redis_store, strategy)
    assert left(lim) == 70
    s = lim.settle("100/day", "tenant", request_id="job-7", actual=12)
    assert s.status == "applied" and s.units == 18 and s.estimate == 30
    for _ in range(3):  # the settling process retries too: once only
        assert lim.settle("100/day", "tenant", request_id="job-7", actual=12).status == "duplicate"
    assert left(lim) == 88


@pytest.mark.redis_only
@pytest.mark.parametrize("strategy", ["fixed-window", "gcra"])
def test_after_a_kill_the_deadline_settles_at_the_estimate(redis_store: redcount.Store, strategy: Strategy) -> None:
    reserve_and_die(redis_store.url, strategy, "job-8", 0.3)
    lim = redcount.Limiter(redis_store, strategy)
    record = [k for k in redis_store.execute("KEYS", "*:reserve:job-8")]
    assert len(record) == 1
    # Wait for the record's TTL to run out (a wait for the deadline, polled, not a fixed sleep).
    end = time.monotonic() + 10
    while redis_store.execute("EXISTS", record[0]) and time.monotonic() < end:
        time.sleep(0.05)
    s = lim.settle("100/day", "tenant", request_id="job-8", actual=0)
    assert s.status == "expired" and not s
    assert left(lim) == 70  # the estimate stands


def test_memory_store_another_limiter_settles(memory_store: redcount.Store) -> None:
    lim = redcount.Limiter(memory_store, "token-bucket")
    r = lim.reserve("100/day", "tenant", 30, request_id="job-9")
    assert r
    del lim, r  # the reserving side is gone
    other = redcount.Limiter(memory_store, "token-bucket")
    assert other.settle("100/day", "tenant", request_id="job-9", actual=40).units == -10
    assert other.settle("100/day", "tenant", request_id="job-9", actual=40).duplicate
    assert left(other) == 60
