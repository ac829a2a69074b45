"""The RQ jobs and worker class the RQ tests run in real ``rq worker`` processes.

Configured by the environment the test sets: ``JOBS_BROKER`` (the RQ broker,
``redis://127.0.0.1:PORT/0``; its database 1 holds the records the tests read) and
``JOBS_STORE`` (redcount's store, on a redis-server of its own so that a test can stop it).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from rq import get_current_job

import redcount.rq

BROKER = os.environ.get("JOBS_BROKER", "redis://127.0.0.1:1/0")
STORE = os.environ.get("JOBS_STORE", "redis://127.0.0.1:1/0")

_records: redis.Redis | None = None


def records() -> redis.Redis:
    global _records
    if _records is None:
        _records = redis.Redis.from_url(BROKER.rsplit("/", 1)[0] + "/1")
    return _records


def record(name: str, **fields: Any) -> None:
    records().rpush(f"jobs:{name}", json.dumps(fields))


@redcount.rq.limited("5/second", store=STORE)
def burst(n: int) -> int:
    job = get_current_job()
    record("runs", n=n, id=job.id if job else None, t=time.time(), pid=os.getpid())
    return n


@redcount.rq.limited("1/hour", store=STORE, max_wait=2)
def hourly(n: int) -> int:
    record("hourly", n=n)
    return n


@redcount.rq.limited("100/second", store=STORE, limit_key=lambda args, kwargs: f"deny:{args[0]}")
def when_down_deny(n: int) -> int:
    record("deny", n=n, t=time.time())
    return n


@redcount.rq.limited("100/second", store=STORE, on_unavailable="allow", limit_key=lambda args, kwargs: "allow")
def when_down_allow(n: int) -> int:
    record("allow", n=n, t=time.time())
    return n


class RecordingWorker(redcount.rq.LimitedWorker):
    """LimitedWorker that records each admission with the times before and after its
    decision (the limiter reads its clock inside), and its worker's name."""

    def _admit(self, job: Any, queue: Any) -> bool:
        before = time.time()
        admitted = super()._admit(job, queue)
        after = time.time()
        if admitted:
            record("admitted", id=job.id, before=before, after=after, worker=self.name)
        else:
            record("deferred", id=job.id, status=job.get_status(refresh=True), worker=self.name)
        return admitted
