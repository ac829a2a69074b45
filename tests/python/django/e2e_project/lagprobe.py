"""Event-loop lag of the worker process it runs in.

A task sleeps ``INTERVAL`` again and again and records how late each wake-up was. A view or
middleware that blocks the loop (a synchronous Redis round trip on the loop's thread) makes
the wake-ups late by as long as it blocks. Each sample also records, over the same sleep, the
loop thread's time on a CPU and its time runnable but not running (its run-queue wait), from
``/proc/thread-self/schedstat``: lateness the thread spent computing (other requests' Python
code) or waiting for a CPU the operating system gave to other processes is not the loop
waiting on I/O, and a reader can take either out.
"""

from __future__ import annotations

import asyncio
import collections
import os
import time

INTERVAL = 0.002
_samples: collections.deque[tuple[float, float, float, float]] = collections.deque(maxlen=100_000)
_task: asyncio.Task[None] | None = None


def _schedstat() -> tuple[float, float]:
    """Seconds this thread has spent on a CPU, and runnable but not running, since it started."""
    with open("/proc/thread-self/schedstat", "rb") as f:
        on_cpu, waiting = f.read().split()[:2]
    return int(on_cpu) / 1e9, int(waiting) / 1e9


async def _probe() -> None:
    while True:
        cpu0, wait0 = _schedstat()
        t0 = time.monotonic()
        await asyncio.sleep(INTERVAL)
        t1 = time.monotonic()
        cpu1, wait1 = _schedstat()
        _samples.append((t1, t1 - t0 - INTERVAL, cpu1 - cpu0, wait1 - wait0))


def ensure_started() -> None:
    """Start the probe on the running loop (once per process)."""
    global _task
    if _task is None:
        _task = asyncio.get_running_loop().create_task(_probe())


def samples(since: float, until: float) -> dict[str, object]:
    """The samples whose wake-up fell in [since, until] (time.monotonic(), which every process
    of the machine shares): [lag, time on a CPU, run-queue wait] triples, in seconds."""
    return {"pid": os.getpid(), "samples": [[lag, cpu, wait] for t, lag, cpu, wait in list(_samples) if since <= t <= until]}
