"""One rate limit shared by every RQ worker of every host.

RQ runs whatever it dequeues. Mark a job function with [`limited`][redcount.rq.limited] and run the
workers as [`LimitedWorker`][redcount.rq.LimitedWorker] with the scheduler: the worker asks the shared store before
it starts a limited job, and a job the limit refuses is not run and not lost: it is scheduled
again, the same job (same id, arguments, meta and options), for when the limiter says it
could pass.

```python
@redcount.rq.limited("100/minute", store="redis://cache:6379/0")
def send_email(to: str) -> None: ...

queue.enqueue(send_email, "ada@example.com")
# rq worker --with-scheduler --worker-class redcount.rq.LimitedWorker
```

The first refusal's time travels in the job's ``meta``, so that after ``max_wait`` seconds of
refusals the job fails, not run, with [`MaxWaitExceeded`][redcount.rq.MaxWaitExceeded]. These re-schedules leave the
job's own ``Retry`` untouched.

RQ is typed, but its worker internals used here are not part of its documented API; the RQ
objects in signatures are typed ``Any``.
"""

from __future__ import annotations

import logging
import time
import traceback
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any, TypeVar

try:
    from rq.intermediate_queue import IntermediateQueue
    from rq.job import JobStatus
    from rq.worker import SimpleWorker, Worker
except ImportError as exc:
    raise ImportError(f"redcount.rq needs RQ ({exc.name} is missing): pip install 'redcount[rq]'") from exc

from . import _job_limits
from ._core import LimitSet
from ._job_limits import JobLimit, KeyFunction, jittered, job_limit
from .errors import WaitTimeout
from .limiter import OnUnavailable, Strategy
from .store import Store

__all__ = [
    "DEFAULT_MAX_WAIT",
    "FIRST_REFUSED_META",
    "LIMIT_ATTRIBUTE",
    "LimitedSimpleWorker",
    "LimitedWorker",
    "LimitedWorkerMixin",
    "MaxWaitExceeded",
    "limit_of",
    "limited",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_WAIT: float = _job_limits.DEFAULT_MAX_WAIT
"""Seconds of refusals after which a job fails with [`MaxWaitExceeded`][redcount.rq.MaxWaitExceeded]."""
FIRST_REFUSED_META = "redcount_first_refused"
"""The key in a job's ``meta`` holding the epoch time of its first refusal."""
LIMIT_ATTRIBUTE = "__redcount_limit__"
"""The attribute [`limited`][redcount.rq.limited] sets on a job function."""

F = TypeVar("F", bound=Callable[..., Any])


class MaxWaitExceeded(WaitTimeout):
    """A job was refused for longer than its ``max_wait``: the worker fails it with this error
    (in the job's ``FailedJobRegistry`` entry and latest result) and does not run it. A
    [`WaitTimeout`][redcount.errors.WaitTimeout] (so a [`RedcountError`][redcount.errors.RedcountError]); ``key``, ``limit``, ``waited``
    (seconds since the first refusal), ``retry_after`` and ``max_wait`` as there."""

    def __init__(
        self,
        message: str,
        key: str | bytes = "",
        limit: int = 0,
        *,
        waited: float = 0.0,
        retry_after: float | None = None,
        max_wait: float = 0.0,
    ) -> None:
        super().__init__(message, key, limit, waited=waited, retry_after=retry_after, max_wait=max_wait)


def limited(
    limit: str | LimitSet,
    *,
    limit_key: KeyFunction | None = None,
    strategy: Strategy = "sliding-window",
    max_wait: float | None = DEFAULT_MAX_WAIT,
    on_unavailable: OnUnavailable = "deny",
    store: str | Store | None = None,
    prefix: str = "redcount:rq",
    clock: str = "client",
) -> Callable[[F], F]:
    """Mark a job function as limited: a [`LimitedWorker`][redcount.rq.LimitedWorker] starts its jobs only when the
    limit admits them. The function itself is returned unchanged (called directly, or by a
    plain ``Worker``, it runs unlimited); it composes with RQ's ``@job`` decorator either way
    round.

    - ``limit``: ``"100/minute"``, ``"5/second;100/hour"`` (all must hold) or a
      [`LimitSet`][redcount.limiter.LimitSet]: starts allowed per window.
    - ``limit_key``: ``callable(args, kwargs) -> str``, what the limit counts; the default is
      the function's dotted name (one limit for all its jobs). Jobs returning the same key
      under the same limit share one count.
    - ``strategy``: a [`Limiter`][redcount.limiter.Limiter] strategy but ``"concurrency"``; the default, the exact
      sliding log, lets no interval of one window length hold more starts than the limit.
    - ``max_wait``: seconds of refusals, from the first, after which the job fails with
      [`MaxWaitExceeded`][redcount.rq.MaxWaitExceeded] (None: no end).
    - ``on_unavailable``: when the store cannot decide: ``"deny"`` (scheduled again in 1 s,
      within ``max_wait``), ``"allow"`` (run, unlimited) or ``"raise"`` (the job fails with the
      store's error).
    - ``store``: a URL (each worker process connects once) or a [`Store`][redcount.store.Store]; None: the
      worker's ``redcount_store``.
    - ``prefix``, ``clock``: the [`Limiter`][redcount.limiter.Limiter]'s (``clock="server"`` for hosts whose clocks
      may disagree).

    A bad option fails here, naming the function and the option."""

    def decorate(fn: F) -> F:
        name = f"{fn.__module__}.{fn.__qualname__}"
        setattr(
            fn,
            LIMIT_ATTRIBUTE,
            job_limit(
                name, limit, limit_key=limit_key, strategy=strategy, max_wait=max_wait,
                on_unavailable=on_unavailable, store=store, prefix=prefix, clock=clock,
            ),
        )  # fmt: skip
        return fn

    return decorate


def limit_of(fn: object) -> JobLimit | None:
    """The limit [`limited`][redcount.rq.limited] recorded on ``fn`` (None for a function it did not mark)."""
    got = getattr(fn, LIMIT_ATTRIBUTE, None)
    return got if isinstance(got, JobLimit) else None


def _first_refused(job: Any) -> float | None:
    value = (job.meta or {}).get(FIRST_REFUSED_META)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


class LimitedWorkerMixin:
    """Asks a job's limit before the worker starts it (in the worker's own process, before
    a work horse is forked). Mixed into any RQ worker class; [`LimitedWorker`][redcount.rq.LimitedWorker] and
    [`LimitedSimpleWorker`][redcount.rq.LimitedSimpleWorker] are the two usual ones.

    ``redcount_store``: the store of jobs whose [`limited`][redcount.rq.limited] names none: a URL or a
    [`Store`][redcount.store.Store], given as a keyword argument of the worker or as a class attribute of a
    subclass (what ``rq worker --worker-class`` needs, since it passes no extra arguments)."""

    redcount_store: str | Store | None = None

    # Set by RQ's BaseWorker; declared for the type checker.
    connection: Any
    name: str
    log: logging.Logger

    def __init__(self, *args: Any, redcount_store: str | Store | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if redcount_store is not None:
            if not isinstance(redcount_store, (str, Store)):
                raise TypeError(
                    f"redcount_store must be a URL like 'redis://cache:6379/0' or a redcount.Store, got {redcount_store!r}"
                )
            self.redcount_store = redcount_store

    def execute_job(self, job: Any, queue: Any) -> None:
        if self._admit(job, queue):
            super().execute_job(job, queue)  # type: ignore[misc]

    def _admit(self, job: Any, queue: Any) -> bool:
        """True: start the job now. False: it was scheduled again, or failed, here."""
        try:
            fn = job.func
        except Exception:  # noqa: BLE001 - RQ reports a job it cannot import when it performs it
            return True
        jl = limit_of(fn)
        if jl is None:
            return True
        try:
            key = jl.key_for(job.args, job.kwargs)
            verdict = jl.decide(key, self.redcount_store)
        except Exception as e:  # noqa: BLE001 - a key function's error; a store's under on_unavailable="raise"
            self._fail(job, queue, e)
            return False
        if verdict.allowed:
            return True
        now = time.time()
        first = _first_refused(job)
        if first is None:
            first = now
        countdown = jittered(verdict.retry_after)
        if jl.past_max_wait(first, now, countdown):
            message = jl.max_wait_message(f"job {jl.name}[{job.id}]", key, first, now, verdict)
            error = MaxWaitExceeded(
                message, key, verdict.amount, waited=now - first, retry_after=verdict.retry_after,
                max_wait=float(jl.max_wait or 0),
            )  # fmt: skip
            self._fail(job, queue, error)
            return False
        job.meta[FIRST_REFUSED_META] = first
        when = datetime.now(timezone.utc) + timedelta(seconds=countdown)
        with self.connection.pipeline() as pipe:
            # The same job, scheduled: its id, arguments, meta and options are kept, and its
            # entry in the intermediate queue (where a single-queue worker moved it when it
            # dequeued it) goes in the same transaction.
            queue.schedule_job(job, when, pipeline=pipe)
            pipe.lrem(IntermediateQueue.get_intermediate_queue_key(queue.key), 1, job.id)
            pipe.execute()
        self.log.info(
            "Worker %s: job %s deferred: %s on key %r; scheduled again in %.3f s", self.name, job.id, verdict.why,
            key, countdown,
        )  # fmt: skip
        return False

    def _fail(self, job: Any, queue: Any, error: BaseException) -> None:
        """Fail ``job`` without running it: FAILED, in the failed registry with ``error``'s
        traceback as its latest result, and through the worker's exception handlers. The
        job's own ``Retry`` is not applied: it was never run."""
        exc_info = (type(error), error, error.__traceback__)
        exc_string = "".join(traceback.format_exception(*exc_info))
        with self.connection.pipeline() as pipe:
            job.set_status(JobStatus.FAILED, pipeline=pipe)
            job._handle_failure(exc_string, pipeline=pipe, worker_name=self.name)
            pipe.lrem(IntermediateQueue.get_intermediate_queue_key(queue.key), 1, job.id)
            pipe.execute()
        self.handle_exception(job, *exc_info)  # type: ignore[attr-defined]  # RQ's BaseWorker


class LimitedWorker(LimitedWorkerMixin, Worker):
    """RQ's forking ``Worker`` that starts a [`limited`][redcount.rq.limited] job only when its limit admits it,
    and otherwise schedules it again (same id) for the limiter's ``retry_after`` (plus up to
    10 % + 10 ms of jitter). Run it with the scheduler (``--with-scheduler``, or
    ``work(with_scheduler=True)``): the scheduler puts the deferred jobs back on their queue.
    See [`LimitedWorkerMixin`][redcount.rq.LimitedWorkerMixin] for ``redcount_store``."""


class LimitedSimpleWorker(LimitedWorkerMixin, SimpleWorker):
    """[`LimitedWorker`][redcount.rq.LimitedWorker] for RQ's ``SimpleWorker`` (jobs run in the worker's process)."""
