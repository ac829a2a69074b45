"""Rate limits for job queues other than Celery and for plain worker loops.

```python
limiter = redcount.Limiter(store, "sliding-window")

while True:                                  # a worker loop: blocks until admitted
    job = queue.get()
    redcount.jobs.throttle(limiter, "20/second", "emails")
    send(job)

delay = redcount.jobs.throttle(limiter, "20/second", "emails", block=False)
if delay:                                    # not admitted, nothing charged
    queue.put_back(job, delay=delay)         # e.g. RQ's enqueue_in, SQS's DelaySeconds

await redcount.jobs.throttle(alimiter, "20/second", "emails")   # a redcount.aio.Limiter
```

Blocking waits go through [`redcount.Limiter.wait`][redcount.limiter.Limiter.wait] (and its asyncio twin): the waiters of
one process queue in order of arrival and only the first talks to the store, so a hundred
threads of one worker cost one store call per retry, not a hundred.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, overload

from . import _enforcement
from ._core import Decision, LimitSet
from .limiter import Limiter
from .shaping import check_wait_args

if TYPE_CHECKING:
    from . import aio

__all__ = ["throttle"]


@overload
def throttle(
    limiter: Limiter,
    limit: str | LimitSet,
    key: str | bytes,
    cost: int = 1,
    *,
    block: bool = True,
    max_wait: float | None = None,
) -> float: ...


@overload
def throttle(
    limiter: aio.Limiter,
    limit: str | LimitSet,
    key: str | bytes,
    cost: int = 1,
    *,
    block: bool = True,
    max_wait: float | None = None,
) -> Awaitable[float]: ...


def throttle(
    limiter: Limiter | aio.Limiter,
    limit: str | LimitSet,
    key: str | bytes,
    cost: int = 1,
    *,
    block: bool = True,
    max_wait: float | None = None,
) -> float | Awaitable[float]:
    """Charge ``cost`` against ``key`` under ``limit`` before a job runs.

    ``block=True`` (default): wait until the limiter admits it ([`redcount.Limiter.wait`][redcount.limiter.Limiter.wait]),
    charge it and return the seconds waited (0.0 when admitted at once). ``max_wait``:
    seconds, or None (default) to wait as long as it takes; when the job cannot be admitted
    in time, [`WaitTimeout`][redcount.errors.WaitTimeout] is raised and nothing is charged.

    ``block=False``: one decision, no waiting: 0.0 when admitted (charged: run the job now),
    else the seconds to wait before asking again (nothing charged: put the job back with
    that delay). ``max_wait`` is not used then.

    ``limiter``: a [`redcount.Limiter`][redcount.limiter.Limiter] (the call blocks its thread) or a
    [`redcount.aio.Limiter`][redcount.aio.Limiter] (the call returns an awaitable: ``await throttle(...)``,
    which waits without blocking the loop). A ``cost`` the limit can never admit raises
    [`InvalidInputError`][redcount.errors.InvalidInputError] at once in both modes. Store errors follow the
    limiter's ``on_unavailable``. While [`redcount.testing.disable_limits`][redcount.testing.disable_limits] is in
    force it returns 0.0 at once and charges nothing.
    """
    if isinstance(limiter, Limiter):
        check_wait_args(limit, key, cost, limiter.strategy, max_wait if block else None)
        if _enforcement.suspended:  # redcount.testing.disable_limits(): no wait, nothing counted
            return 0.0
        if block:
            started = time.monotonic()
            limiter.wait(limit, key, cost, max_wait=max_wait)
            return time.monotonic() - started
        return _delay(limiter.hit(limit, key, cost))
    from . import aio  # here: plain worker loops need not load the asyncio layer

    if not isinstance(limiter, aio.Limiter):
        raise TypeError(f"limiter must be a redcount.Limiter or a redcount.aio.Limiter, got {type(limiter).__name__}")
    check_wait_args(limit, key, cost, limiter.strategy, max_wait if block else None)
    return _throttle_async(limiter, limit, key, cost, block, max_wait)


async def _throttle_async(
    limiter: aio.Limiter, limit: str | LimitSet, key: str | bytes, cost: int, block: bool, max_wait: float | None
) -> float:
    if _enforcement.suspended:
        return 0.0
    if block:
        started = time.monotonic()
        await limiter.wait(limit, key, cost, max_wait=max_wait)
        return time.monotonic() - started
    return _delay(await limiter.hit(limit, key, cost))


def _delay(decision: Decision) -> float:
    # A refusal never reports 0 (the next call would come too early to be admitted).
    return 0.0 if decision.allowed else max(decision.retry_after, 0.001)
