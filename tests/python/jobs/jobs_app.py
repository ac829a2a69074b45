"""The Celery app the job-queue tests run in a real worker pool (``celery -A jobs_app worker``).

Configured by the environment the test fixture sets: ``JOBS_REDIS`` (``redis://127.0.0.1:PORT``,
a redis-server of the test session: database 0 is the broker, 1 the result backend, 2 the
limiter's state and the tasks' records). Every task records what it saw in Redis lists, so
that the test process can check starts, arguments, ids and worker pids.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
import threading
import time
from typing import Any

from celery import Celery
from celery.signals import task_prerun, worker_process_init, worker_ready

import redcount
import redcount.celery

app = Celery("jobs_app")
app.conf.update(
    redcount_prefix="jobs:lim",
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
)

DATA_URL = ""
_store: redcount.Store | None = None


def configure(base: str) -> None:
    """Point the app at the redis-server ``base`` (``redis://127.0.0.1:PORT``)."""
    global DATA_URL, _store
    DATA_URL = f"{base}/2"
    app.conf.update(broker_url=f"{base}/0", result_backend=f"{base}/1", redcount_url=DATA_URL)
    # The app's connection pool, its producer pool and its result backend keep the server they
    # were made for: drop them (the first two as Celery does after a fork), so the next task and
    # result go to this server (a test module that ran before may have pointed the app at a
    # server it has since stopped).
    app.close()
    amqp = app.__dict__.get("amqp")
    if amqp is not None:
        amqp._producer_pool = None
    app._backend_cache = None
    app._local = threading.local()
    if _store is not None:
        _store.close()
        _store = None


def store() -> redcount.Store:
    global _store
    if _store is None:
        _store = redcount.connect(DATA_URL)
    return _store


if "JOBS_REDIS" in os.environ:  # the worker
    configure(os.environ["JOBS_REDIS"])


def record(name: str, **fields: Any) -> None:
    store().execute("RPUSH", f"jobs:{name}", json.dumps(fields))


@worker_process_init.connect
def _die_with_the_worker(**_: Any) -> None:
    # A pool process must not outlive its worker, even one SIGKILLed with the test run
    # (Linux: prctl(PR_SET_PDEATHSIG, SIGKILL); the worker itself dies with the test process).
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)


@worker_ready.connect
def _ready(**_: Any) -> None:
    record("ready", pid=os.getpid())


@task_prerun.connect
def _attempt(task_id: str, task: Any, args: Any, kwargs: Any, **_: Any) -> None:
    # Every attempt, the refused ones included (task_prerun fires before the limit is asked).
    if task.name.startswith("jobs_app.keep"):
        record("attempts", id=task_id, args=list(args), kwargs=kwargs, retries=task.request.retries)


class TimedTask(redcount.celery.LimitedTask):
    """Notes when the limiter's decision was asked for and answered (the admission's time,
    read by the limiter inside that interval)."""

    def _hit(self, key: str | bytes) -> tuple[bool, float, int]:
        before = time.time()
        got = super()._hit(key)
        self.request.decided = (before, time.time())
        return got


@app.task(bind=True, base=TimedTask, limit="20/second")
def burst(self: Any, n: int) -> int:
    """The 300-task burst: records its start and when it was admitted."""
    before, after = self.request.decided
    record("starts", n=n, t=time.time(), before=before, after=after, pid=os.getpid())
    return n


@app.task(bind=True, base=redcount.celery.LimitedTask, limit="1/second", max_retries=0)
def keep(self: Any, a: int, b: str, *, c: list[int]) -> str:
    """Refused re-schedules must keep the id and arguments and not count as retries (its
    max_retries is 0)."""
    record("kept", id=self.request.id, args=[a, b], kwargs={"c": c}, retries=self.request.retries)
    return f"{a}-{b}-{sum(c)}"


@redcount.celery.limited("1/minute", app=app, max_wait=2.0)
def hourly(x: int) -> int:
    """max_wait shorter than the limit's retry_after: fails at its first refusal."""
    return x


@redcount.celery.limited(app=app, concurrency=1, concurrency_retry=0.2, max_wait=1.5,
                         limit_key=lambda args, kwargs: f"gate:{args[0]}")
def gated(gate: str) -> str:
    """The test holds the only slot of the gate: refused until max_wait, then fails."""
    return gate


@redcount.celery.limited(app=app, concurrency=1, concurrency_retry=0.05, lease_timeout=30)
def one_at_a_time(i: int, fail: bool) -> int:
    """At most one running: records [start, end]; some fail (the lease is released anyway)."""
    start = time.time()
    time.sleep(0.1)
    record("serial", i=i, start=start, end=time.time(), pid=os.getpid())
    if fail:
        raise ValueError(f"task {i} fails on purpose")
    return i


@redcount.celery.limited(app=app, concurrency=2, lease_timeout=2.0, concurrency_retry=0.2)
def hold(tag: str) -> str:
    """Holds its lease (sleeps) until its worker process is killed."""
    record("holding", tag=tag, pid=os.getpid(), t=time.time())
    time.sleep(60)
    return tag


_leased: redcount.Limiter | None = None


@app.task
def leased_hit(n: int, limit: str, key: str) -> bool:
    """A leased hit of one hot key in a pool process (the test recycles them every few tasks
    with --max-tasks-per-child): records whether it was admitted."""
    global _leased
    if _leased is None:
        _leased = redcount.Limiter(store(), prefix="jobs:leased")
    admitted = bool(_leased.hit(limit, key, lease=10))
    record("leased", n=n, key=key, allowed=admitted, pid=os.getpid())
    return admitted
