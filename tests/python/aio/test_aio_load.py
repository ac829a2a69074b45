"""redcount.aio under load against a real redis-server: 1,000 concurrent
coroutines on one loop, with a probe measuring how late the loop runs a timer.

The probe is what an asyncio web app feels: if awaiting redcount blocked the loop (a
round trip on the loop's thread, a lock held across I/O), every other coroutine would wait
behind it and the probe's lateness would grow with the load. The bound is generous against
scheduling noise on a shared CI machine; the totals are exact.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable

import pytest
import redcount
import redcount.aio as aio
import uvloop
from conftest import RedisServer

COROUTINES = 1000
CALLS_EACH = 20
PROBE_PERIOD = 0.001
P99_BOUND = 0.005  # seconds: the promised bound on the loop's p99 lag (5 ms)
MIN_CPU_SHARE = 0.85  # below this share of a CPU for a spinning thread, the machine is too loaded


async def _probe(lags: list[float], stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + PROBE_PERIOD
        await asyncio.sleep(PROBE_PERIOD)
        lags.append(max(0.0, loop.time() - due))


def _cpu_share(seconds: float = 0.3) -> float:
    """The share of a CPU this thread gets while it spins: about 1.0 on a machine with a
    core to spare, less when other processes compete for every core."""
    wall, cpu = time.perf_counter(), time.thread_time()
    while time.perf_counter() - wall < seconds:
        pass
    return (time.thread_time() - cpu) / (time.perf_counter() - wall)


def _p99(values: list[float]) -> float:
    return statistics.quantiles(values, n=100)[98]


def _run_load(store: redcount.Store, new_loop: Callable[[], asyncio.AbstractEventLoop]) -> tuple[list[float], float]:
    """One run: 1,000 coroutines of counter and limiter calls on a fresh loop, with the probe
    beside them. The totals are checked here; the probe's lags are returned."""
    store.execute("FLUSHALL")
    counter = aio.FixedWindowCounter(store, "load", 3600)
    limiter = aio.Limiter(store, "sliding-window")
    allowed = 0
    lags: list[float] = []

    async def worker(i: int) -> None:
        nonlocal allowed
        for j in range(CALLS_EACH):
            await counter.incr(f"k{i % 10}")
            if await limiter.hit("5000/hour", "shared"):
                allowed += 1

    async def main() -> float:
        stop = asyncio.Event()
        probe = asyncio.create_task(_probe(lags, stop))
        await asyncio.sleep(0.05)  # a few idle samples first
        started = time.perf_counter()
        # Started 50 per loop iteration, as requests reach a server over time: creating all
        # 1,000 tasks at once would run 1,000 first steps in one iteration, a stall of the
        # test's own making. All 1,000 are still in flight together.
        tasks = []
        for i in range(COROUTINES):
            tasks.append(asyncio.ensure_future(worker(i)))
            if i % 50 == 49:
                await asyncio.sleep(0)
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - started
        stop.set()
        await probe
        return elapsed

    loop = new_loop()
    try:
        elapsed = loop.run_until_complete(main())
    finally:
        loop.close()
    total = COROUTINES * CALLS_EACH
    # Exact totals: every increment counted once, the limit admitted exactly.
    assert sum(redcount.FixedWindowCounter(store, "load", 3600).get_many([f"k{i}" for i in range(10)]).values()) == total
    assert allowed == 5000
    assert len(lags) >= 20, f"the probe ran only {len(lags)} times in {elapsed:.2f} s: the loop was starved"
    return lags, elapsed


@pytest.mark.redis_only
@pytest.mark.parametrize("new_loop", [asyncio.new_event_loop, uvloop.new_event_loop], ids=["asyncio", "uvloop"])
def test_thousand_coroutines_keep_the_loop_responsive(
    redis_server: RedisServer, new_loop: Callable[[], asyncio.AbstractEventLoop]
) -> None:
    # A machine whose CPUs other processes keep busy preempts the loop's thread for whole
    # scheduler slices (10 ms and more): it cannot judge a 5 ms bound, whatever redcount does.
    share = _cpu_share()
    if share < MIN_CPU_SHARE:
        pytest.skip(f"this thread got {share:.0%} of a CPU while spinning: the machine is too loaded "
                    "to judge the loop-lag bound")
    store = redcount.connect(redis_server.url)
    try:
        # The bound must hold in one of two runs. A loop blocked by redcount (a round trip on
        # the loop's thread, a lock held across I/O) lags by milliseconds in every run; a
        # neighbour's burst on a shared machine rarely lands on both.
        seen = []
        for _ in range(2):
            lags, _elapsed = _run_load(store, new_loop)
            seen.append(f"p99 {_p99(lags) * 1000:.2f} ms over {len(lags)} samples; top {sorted(lags)[-8:]}")
            if _p99(lags) < P99_BOUND:
                break
        else:
            pytest.fail("loop lag over the bound in both runs: " + " | ".join(seen))
    finally:
        store.close()
