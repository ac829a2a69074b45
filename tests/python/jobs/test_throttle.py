"""redcount.jobs.throttle: blocking and non-blocking, sync and asyncio, on both stores."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import redcount
import redcount.aio
from redcount.jobs import throttle


def test_blocking_waits_its_turn_and_returns_the_wait(store: redcount.Store) -> None:
    limiter = redcount.Limiter(store, "sliding-window")
    started = time.monotonic()
    waits = [throttle(limiter, "5/second", "emails") for _ in range(8)]
    assert all(w < 0.5 for w in waits[:5]), waits  # the first five pass at once
    assert time.monotonic() - started >= 0.9  # the sixth waited for the window to slide
    assert sum(waits[5:]) >= 0.9, waits
    assert limiter.stats("5/second", "emails")[0].count <= 5


def test_non_blocking_returns_the_delay_and_charges_nothing_when_refused(store: redcount.Store) -> None:
    limiter = redcount.Limiter(store, "sliding-window")
    assert [throttle(limiter, "3/minute", "q", block=False) for _ in range(3)] == [0.0] * 3
    delay = throttle(limiter, "3/minute", "q", block=False)
    assert 55 < delay <= 60
    assert throttle(limiter, "3/minute", "q", cost=1, block=False) > 0
    assert limiter.stats("3/minute", "q")[0].count == 3  # the refusals stored nothing


def test_max_wait_and_impossible_costs(store: redcount.Store) -> None:
    limiter = redcount.Limiter(store, "sliding-window")
    throttle(limiter, "1/minute", "k")
    with pytest.raises(redcount.WaitTimeout, match="max_wait=0.1"):
        throttle(limiter, "1/minute", "k", max_wait=0.1)
    for block in (True, False):
        with pytest.raises(redcount.InvalidInputError, match="cost 2 exceeds the amount 1"):
            throttle(limiter, "1/minute", "k", cost=2, block=block)
    with pytest.raises(TypeError, match="redcount.Limiter or a redcount.aio.Limiter"):
        throttle(object(), "1/minute", "k")  # type: ignore[call-overload]


def test_threads_of_a_worker_share_the_rate(store: redcount.Store) -> None:
    limiter = redcount.Limiter(store, "sliding-window")
    admitted: list[float] = []
    lock = threading.Lock()

    def loop() -> None:
        for _ in range(5):
            throttle(limiter, "10/second", "loop")
            with lock:
                admitted.append(time.monotonic())

    threads = [threading.Thread(target=loop) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    admitted.sort()
    assert len(admitted) == 15
    # 15 at 10/second: the last five waited for the first second to slide by (0.1 s of slack
    # for reading the clock after the decision, as in the shaping tests).
    assert admitted[10] - admitted[0] >= 0.9


def test_async_blocking_and_non_blocking(store: redcount.Store) -> None:
    alimiter = redcount.aio.Limiter(store, "sliding-window")

    async def main() -> tuple[list[float], float, float]:
        waits = await asyncio.gather(*(throttle(alimiter, "4/second", "a") for _ in range(6)))
        free = await throttle(alimiter, "2/minute", "b", block=False)
        await throttle(alimiter, "2/minute", "b", block=False)
        refused = await throttle(alimiter, "2/minute", "b", block=False)
        return list(waits), free, refused

    started = time.monotonic()
    waits, free, refused = asyncio.run(main())
    assert time.monotonic() - started >= 0.9
    assert sorted(waits)[:4] == pytest.approx([0.0] * 4, abs=0.5) and max(waits) >= 0.9
    assert free == 0.0 and 55 < refused <= 60


def test_async_errors_are_raised_before_waiting(store: redcount.Store) -> None:
    alimiter = redcount.aio.Limiter(store, "sliding-window")
    with pytest.raises(redcount.InvalidInputError, match="cost 3 exceeds"):
        throttle(alimiter, "2/second", "k", cost=3)  # raised by the call, not by awaiting it

    async def timeout() -> None:
        await throttle(alimiter, "1/minute", "t")
        await throttle(alimiter, "1/minute", "t", max_wait=0.05)

    with pytest.raises(redcount.WaitTimeout):
        asyncio.run(timeout())
