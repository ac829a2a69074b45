"""Shaping instead of refusing: Limiter.wait (sync and asyncio) and the throttle decorator.

Every test runs on the memory store and on a real redis-server (the ``store`` fixture).
Times are measured with time.monotonic() right after a waiter is admitted, so each bound
below carries a slack for the scheduling delay between the store's decision and that
reading (SLACK); rates are checked on ``sliding-window``, whose guarantee (never more than
the amount in any window-length interval) is exact, so the check can fail for real.
"""

from __future__ import annotations

import asyncio
import math
import signal
import threading
import time
from typing import Any

import pytest
import redcount
import redcount.aio

from conftest import RedisServer

N = 30
RATE = "10/second"
SLACK = 0.1  # seconds between a decision in the store and the waiter reading the clock


class CountingLimiter(redcount.Limiter):
    """A limiter that counts its store calls: wait() reaches the store only through hit(),
    and an allowed decision is exactly one charge."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lock = threading.Lock()
        self.calls = 0
        self.allowed = 0

    def hit(self, limit: str | redcount.LimitSet, key: str | bytes, cost: int = 1) -> redcount.Decision:
        d = super().hit(limit, key, cost)
        with self.lock:
            self.calls += 1
            self.allowed += bool(d.allowed)
        return d


def count_async_hits(alim: redcount.aio.Limiter) -> dict[str, int]:
    """Count the store calls of an async limiter: its ``_hit`` is the one entry to the core."""
    counts = {"calls": 0, "allowed": 0}
    inner = alim._hit

    def note(d: redcount.Decision) -> None:
        counts["calls"] += 1
        counts["allowed"] += bool(d.allowed)

    def counted(*args: Any) -> Any:
        r = inner(*args)
        if isinstance(r, asyncio.Future):
            r.add_done_callback(lambda f: None if f.cancelled() or f.exception() else note(f.result()))
        else:
            note(r)
        return r

    alim._hit = counted
    return counts


def evalsha_calls(store: redcount.Store) -> int:
    info = store.execute("INFO", "commandstats")
    text = info.decode() if isinstance(info, bytes) else str(info)
    total = 0
    for line in text.splitlines():
        if line.startswith(("cmdstat_evalsha:", "cmdstat_eval:")):
            total += int(line.split("calls=")[1].split(",")[0])
    return total


def check_rate(times: list[float], amount: int) -> None:
    """No ``amount + 1`` admissions within one window (1 s) less the measuring slack."""
    ts = sorted(times)
    for i in range(len(ts) - amount):
        span = ts[i + amount] - ts[i]
        assert span >= 1.0 - SLACK, f"{amount + 1} admitted within {span:.3f} s"


def check_order(times: list[float]) -> None:
    """``times`` is indexed by arrival: an earlier arrival is never admitted later than a
    later one (beyond the measuring slack)."""
    for i in range(len(times)):
        for j in range(i + 1, len(times)):
            early = times[i] - times[j]
            assert early <= SLACK, f"waiter {j} admitted {early:.3f} s before waiter {i}"


def test_threads_pass_at_the_rate_in_arrival_order(store: redcount.Store) -> None:
    lim = CountingLimiter(store, "sliding-window")
    before = evalsha_calls(store) if store.url.startswith("redis") else 0
    admitted: list[float] = [math.nan] * N
    done = [0]
    done_lock = threading.Lock()

    def waiter(i: int) -> None:
        lim.wait(RATE, "api", max_wait=30)
        admitted[i] = time.monotonic()
        with done_lock:
            done[0] += 1

    start = time.monotonic()
    threads = []
    for i in range(N):
        t = threading.Thread(target=waiter, args=(i,))
        t.start()
        threads.append(t)
        # Waiter i has arrived once the queued plus the finished ones count i + 1: that makes
        # the arrival order the index order, with no sleep.
        deadline = time.monotonic() + 10
        while lim.waiting(RATE, "api") + done[0] < i + 1:
            assert time.monotonic() < deadline, "a waiter never queued"
            time.sleep(0.0005)
    for t in threads:
        t.join(30)
    elapsed = max(admitted) - start

    assert not any(math.isnan(t) for t in admitted)
    check_rate(admitted, 10)
    check_order(admitted)
    # 30 at 10/second: the first 10 at once, then two more windows.
    assert (N - 10) / 10 - SLACK <= elapsed <= N / 10 + 1.5
    assert lim.allowed == N
    # One call per admission plus the heads' retries, each after a reported retry_after;
    # polling would make hundreds.
    assert lim.calls <= 3 * N, lim.calls
    if store.url.startswith("redis"):
        assert evalsha_calls(store) - before <= lim.calls + 2
    assert lim.waiting(RATE, "api") == 0


def test_one_queue_per_meaning_of_the_limits(memory_store: redcount.Store) -> None:
    lim = redcount.Limiter(memory_store, "sliding-window")
    lim.hit("1/second", "k")
    waiter = threading.Thread(target=lambda: lim.wait("1/second", "k", max_wait=5))
    waiter.start()
    deadline = time.monotonic() + 10
    while lim.waiting("1 per 1 second", "k") < 1:  # another spelling, the same queue
        assert waiter.is_alive() and time.monotonic() < deadline
        time.sleep(0.0005)
    assert lim.waiting("1/second", "other") == 0 and lim.waiting("2/second", "k") == 0
    waiter.join(10)
    assert lim.waiting("1/second", "k") == 0


def test_coroutines_pass_at_the_rate_in_arrival_order(store: redcount.Store) -> None:
    alim = redcount.aio.Limiter(store, "sliding-window")
    counts = count_async_hits(alim)
    order: list[int] = []
    admitted: list[float] = [math.nan] * N

    async def waiter(i: int) -> None:
        await alim.wait(RATE, "api", max_wait=30)
        admitted[i] = time.monotonic()
        order.append(i)

    async def main() -> float:
        start = time.monotonic()
        # Tasks start in creation order and join the queue before their first await.
        await asyncio.gather(*(waiter(i) for i in range(N)))
        return start

    start = asyncio.run(main())
    # One loop: admission order is exactly arrival order.
    assert order == list(range(N))
    check_rate(admitted, 10)
    assert (N - 10) / 10 - SLACK <= max(admitted) - start <= N / 10 + 1.5
    assert counts["allowed"] == N
    assert counts["calls"] <= 3 * N, counts
    assert alim.waiting(RATE, "api") == 0


@pytest.mark.parametrize(
    "strategy, limit",
    [
        ("fixed-window", "2/second"),
        ("sliding-window-approx", "2/second"),
        ("token-bucket", "2/second burst 1"),
        ("gcra", "2/second burst 1"),
        ("concurrency", "2/second"),
    ],
)
def test_every_strategy_shapes(memory_store: redcount.Store, strategy: str, limit: str) -> None:
    lim = CountingLimiter(memory_store, strategy)
    n = 3
    admitted: list[float] = []

    def waiter() -> None:
        lim.wait(limit, "k", max_wait=10)
        admitted.append(time.monotonic())

    threads = [threading.Thread(target=waiter) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    assert len(admitted) == n and lim.allowed == n
    assert lim.calls <= 4 * n, lim.calls


@pytest.mark.parametrize("side", ["sync", "async"])
def test_max_wait_gives_up_at_once_when_retry_after_is_past_it(store: redcount.Store, side: str) -> None:
    lim = CountingLimiter(store, "sliding-window")
    for _ in range(3):
        assert lim.hit("3/minute", "k")
    with pytest.raises(redcount.WaitTimeout) as info:
        if side == "sync":
            lim.wait("3/minute", "k", max_wait=0.5)
        else:
            asyncio.run(redcount.aio.Limiter.from_sync(lim).wait("3/minute", "k", max_wait=0.5))
    e = info.value
    assert isinstance(e, redcount.RateLimitExceeded)
    assert e.key == "k" and e.limit == 3 and e.max_wait == 0.5
    assert e.retry_after is not None and 50 < e.retry_after <= 60
    assert e.waited < 0.5  # it did not sleep to the deadline: the limiter said it was hopeless
    assert "nothing was charged" in str(e)
    assert lim.stats("3/minute", "k")[0].count == 3


def test_max_wait_of_a_queued_waiter_charges_nothing(store: redcount.Store) -> None:
    lim = CountingLimiter(store, "sliding-window")
    for _ in range(2):
        assert lim.hit("2/second", "k")
    head_done = threading.Event()

    def head_waiter() -> None:
        lim.wait("2/second", "k", max_wait=10)
        head_done.set()

    head = threading.Thread(target=head_waiter)
    head.start()
    deadline = time.monotonic() + 10
    while lim.waiting("2/second", "k") < 1:
        assert time.monotonic() < deadline
        time.sleep(0.0005)
    with pytest.raises(redcount.WaitTimeout) as info:
        lim.wait("2/second", "k", max_wait=0.2)
    assert info.value.retry_after is None  # still behind the head
    assert info.value.waited >= 0.2
    assert lim.waiting("2/second", "k") == 1
    head.join(10)
    assert head_done.is_set()
    assert lim.allowed == 3  # the two hits and the head: the one that gave up took nothing


def test_async_max_wait_of_a_queued_waiter(store: redcount.Store) -> None:
    alim = redcount.aio.Limiter(store, "sliding-window")
    counts = count_async_hits(alim)

    async def main() -> None:
        for _ in range(2):
            assert await alim.hit("2/second", "k")
        head = asyncio.ensure_future(alim.wait("2/second", "k", max_wait=10))
        await asyncio.sleep(0)
        with pytest.raises(redcount.WaitTimeout) as info:
            await alim.wait("2/second", "k", max_wait=0.2)
        assert info.value.retry_after is None
        await head

    asyncio.run(main())
    assert counts["allowed"] == 3


def test_cancelled_coroutines_charge_nothing_and_block_nobody(store: redcount.Store) -> None:
    alim = redcount.aio.Limiter(store, "sliding-window")
    counts = count_async_hits(alim)
    order: list[int] = []

    async def waiter(i: int) -> None:
        await alim.wait("2/second", "k", max_wait=10)
        order.append(i)

    async def main() -> None:
        for _ in range(2):
            assert await alim.hit("2/second", "k")
        tasks = [asyncio.ensure_future(waiter(i)) for i in range(5)]
        # Let the head make its refused call and go to sleep on retry_after.
        while counts["calls"] < 3:
            await asyncio.sleep(0.001)
        assert alim.waiting("2/second", "k") == 5
        tasks[0].cancel()  # the head, sleeping
        tasks[2].cancel()  # one in the middle of the queue
        results = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(results[0], asyncio.CancelledError)
        assert isinstance(results[2], asyncio.CancelledError)

    asyncio.run(main())
    assert order == [1, 3, 4]
    assert counts["allowed"] == 2 + 3
    assert alim.waiting("2/second", "k") == 0


@pytest.mark.redis_only
def test_cancelled_during_the_store_call_hands_its_admission_on(
    redis_server: RedisServer, redis_store: redcount.Store
) -> None:
    alim = redcount.aio.Limiter(redis_store, "sliding-window")
    counts = count_async_hits(alim)

    async def main() -> None:
        # Hold every command for a while, so the first waiter's hit is certainly in flight
        # when it is cancelled.
        redis_server.command("CLIENT", "PAUSE", "300", "ALL")
        first = asyncio.ensure_future(alim.wait("5/second", "k"))
        await asyncio.sleep(0.05)
        assert not first.done() and counts["calls"] == 0
        second = asyncio.ensure_future(alim.wait("5/second", "k"))
        await asyncio.sleep(0)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        d = await second
        assert d.allowed

    asyncio.run(main())
    # One charge for the two waiters: the cancelled one's admission went to the next.
    assert counts["allowed"] == 1
    assert counts["calls"] == 1
    assert redcount.Limiter(redis_store, "sliding-window").stats("5/second", "k")[0].count == 1


def test_keyboard_interrupt_leaves_the_queue_and_charges_nothing(store: redcount.Store) -> None:
    lim = CountingLimiter(store, "sliding-window")
    for _ in range(2):
        assert lim.hit("2/second", "k")
    behind_done = threading.Event()

    def interrupt_when_queued() -> None:
        deadline = time.monotonic() + 10
        while lim.waiting("2/second", "k") < 2:
            if time.monotonic() > deadline:
                return
            time.sleep(0.0005)
        signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGINT)

    def behind() -> None:
        deadline = time.monotonic() + 10
        while lim.waiting("2/second", "k") < 1:  # queue behind the main thread
            if time.monotonic() > deadline:
                return
            time.sleep(0.0005)
        lim.wait("2/second", "k", max_wait=10)
        behind_done.set()

    helpers = [threading.Thread(target=behind), threading.Thread(target=interrupt_when_queued)]
    for t in helpers:
        t.start()
    with pytest.raises(KeyboardInterrupt):
        lim.wait("2/second", "k", max_wait=10)  # the head, sleeping on retry_after
    for t in helpers:
        t.join(10)
    assert behind_done.is_set()
    assert lim.allowed == 3
    assert lim.waiting("2/second", "k") == 0


@pytest.mark.parametrize("side", ["sync", "async"])
def test_a_cost_above_capacity_is_refused_at_once(store: redcount.Store, side: str) -> None:
    lim = CountingLimiter(store, "sliding-window")
    bucket = CountingLimiter(store, "gcra")
    alim = redcount.aio.Limiter.from_sync(lim)

    def wait(limiter: CountingLimiter, limit: str, cost: int, max_wait: Any = None) -> Any:
        if side == "sync":
            return limiter.wait(limit, "k", cost, max_wait=max_wait)
        return asyncio.run(redcount.aio.Limiter.from_sync(limiter).wait(limit, "k", cost, max_wait=max_wait))

    with pytest.raises(redcount.InvalidInputError, match="exceeds the amount 10 of '10/second'"):
        wait(lim, "10/second", 11)
    with pytest.raises(redcount.InvalidInputError, match="exceeds the amount 10 of '10/second;100/hour'"):
        wait(lim, "10/second;100/hour", 11)
    with pytest.raises(redcount.InvalidInputError, match="exceeds the capacity 20"):
        wait(bucket, "10/second burst 20", 21)
    assert wait(bucket, "10/second burst 20", 15).allowed
    for bad in (-1, -0.001, math.nan, math.inf):
        with pytest.raises(redcount.InvalidInputError, match="max_wait"):
            wait(lim, "10/second", 1, bad)
    for wrong in (True, "1"):
        with pytest.raises(TypeError, match="max_wait"):
            wait(lim, "10/second", 1, wrong)
    with pytest.raises(TypeError, match="cost"):
        wait(lim, "10/second", 1.0)  # type: ignore[arg-type]
    with pytest.raises(redcount.InvalidInputError, match="cost must be >= 1"):
        wait(lim, "10/second", 0)
    with pytest.raises(ValueError):
        wait(lim, "10/fortnight", 1)
    assert lim.calls == 0 and alim.waiting("10/second", "k") == 0


def test_throttle_keeps_results_exceptions_and_signatures(store: redcount.Store) -> None:
    lim = CountingLimiter(store, "sliding-window")

    @lim.throttle("5/second", key="api", max_wait=5)
    def add(a: int, b: int = 1) -> int:
        """Adds."""
        return a + b

    @lim.throttle("5/second", key="api", max_wait=5)
    def boom() -> None:
        raise KeyError("upstream said no")

    assert add(2, b=3) == 5
    assert add.__name__ == "add" and add.__doc__ == "Adds."
    with pytest.raises(KeyError, match="upstream said no"):
        boom()
    assert lim.allowed == 2

    alim = redcount.aio.Limiter.from_sync(lim)

    @alim.throttle("5/second", key="api", max_wait=5)
    async def aadd(a: int, b: int = 1) -> int:
        await asyncio.sleep(0)
        return a + b

    @lim.throttle("5/second", key="api", max_wait=5)  # the sync limiter's decorator, on a coroutine function
    async def aboom() -> None:
        raise KeyError("async no")

    @alim.throttle("5/second", key="api", max_wait=5)  # the async limiter's, on a plain function
    def plain() -> str:
        return "plain"

    async def main() -> None:
        assert await aadd(1, b=2) == 3
        with pytest.raises(KeyError, match="async no"):
            await aboom()

    asyncio.run(main())
    assert plain() == "plain"
    assert asyncio.iscoroutinefunction(aadd) and asyncio.iscoroutinefunction(aboom)
    assert lim.stats("5/second", "api")[0].count == 5


def test_throttle_gives_up_without_calling(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, "sliding-window")
    called: list[int] = []

    @lim.throttle("1/minute", key="api", max_wait=0)
    def f() -> None:
        called.append(1)

    f()
    with pytest.raises(redcount.WaitTimeout):
        f()
    assert called == [1]
    with pytest.raises(redcount.InvalidInputError):
        lim.throttle("1/minute", key="api", cost=2)  # checked when decorating
    with pytest.raises(ValueError):
        lim.throttle("1/fortnight", key="api")
