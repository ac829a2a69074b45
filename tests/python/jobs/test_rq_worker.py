"""redcount.rq in two real ``rq worker --with-scheduler`` processes on a redis-server broker,
with redcount's store on a second redis-server that the tests stop and start.

The jobs and the worker class (tests/python/jobs/rq_jobs.py) record what they saw in the
broker's database 1: admissions (with the times around their decision), runs, deferrals.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from rq import Queue
from rq.job import Job, JobStatus

from conftest import RedisServer, new_server
from helpers import tightest_span, wait_until
from queue_workers import QueueWorker, start_all, worker_env

import rq_jobs

pytestmark = pytest.mark.redis_only


def _server() -> Iterator[RedisServer]:
    server = new_server()
    server.die_with_owner = True  # like the workers: gone with the test process, however it ends
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture(scope="module")
def broker_server() -> Iterator[RedisServer]:
    yield from _server()


@pytest.fixture(scope="module")
def store_server() -> Iterator[RedisServer]:
    yield from _server()


@pytest.fixture(scope="module")
def broker(broker_server: RedisServer) -> Iterator[redis.Redis]:
    conn = redis.Redis(port=broker_server.port)
    yield conn
    conn.close()


@pytest.fixture(scope="module")
def data(broker_server: RedisServer) -> Iterator[redis.Redis]:
    conn = redis.Redis(port=broker_server.port, db=1)
    yield conn
    conn.close()


@pytest.fixture(scope="module")
def queue(broker: redis.Redis) -> Queue:
    return Queue("limited", connection=broker)


@pytest.fixture(scope="module")
def workers(
    broker_server: RedisServer, store_server: RedisServer, broker: redis.Redis, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[QueueWorker]]:
    url = f"redis://127.0.0.1:{broker_server.port}/0"
    env = worker_env({"JOBS_BROKER": url, "JOBS_STORE": f"redis://127.0.0.1:{store_server.port}/0"})
    logs = Path(tmp_path_factory.mktemp("rq"))
    ws = [
        QueueWorker(["rq.cli", "worker", "-u", url, "--with-scheduler", "-w", "rq_jobs.RecordingWorker",
                     "-n", f"w{i}", "limited"], env, logs / f"w{i}.log")
        for i in range(2)
    ]  # fmt: skip
    # Ready: both registered, and one of them holds the queue's scheduler lock.
    start_all(ws, lambda: len(broker.smembers("rq:workers")) == 2 and broker.exists("rq:scheduler-lock:limited"))
    try:
        yield ws
    finally:
        for w in ws:
            w.stop()


@pytest.fixture
def fresh(data: redis.Redis, store_server: RedisServer, workers: list[QueueWorker]) -> None:
    data.flushdb()
    if not store_server.running:
        store_server.start()
    redis.Redis(port=store_server.port).flushall()


def records(data: redis.Redis, name: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in data.lrange(f"jobs:{name}", 0, -1)]


def finished(jobs: list[Job]) -> bool:
    return all(j.get_status(refresh=True) in (JobStatus.FINISHED, JobStatus.FAILED) for j in jobs)


def test_20_jobs_at_5_per_second_across_two_workers(fresh: None, queue: Queue, data: redis.Redis) -> None:
    jobs = [queue.enqueue(rq_jobs.burst, n) for n in range(20)]
    wait_until(lambda: finished(jobs), 60, "all 20 jobs to finish")
    assert all(j.get_status() == JobStatus.FINISHED for j in jobs)
    runs = records(data, "runs")
    # None lost, none run twice, each under the id it was enqueued with.
    assert Counter(r["n"] for r in runs) == Counter(range(20))
    assert sorted(r["id"] for r in runs) == sorted(j.id for j in jobs)
    admitted = records(data, "admitted")
    assert sorted(a["id"] for a in admitted) == sorted(j.id for j in jobs)
    # Refused jobs were scheduled again (not run) and came back.
    deferred = records(data, "deferred")
    # (How many depends on how fast the workers took them: 15 or more when all 20 are decided
    # within a second.)
    assert deferred and {d["status"] for d in deferred} == {JobStatus.SCHEDULED.value}
    # No 6 admissions within one second, across both workers (each admission's time is
    # known to within its decision; the log keeps whole milliseconds).
    decided = [(a["before"], a["after"]) for a in admitted]
    assert tightest_span(decided, 6) >= 1.0 - 0.001
    assert len({d["worker"] for d in admitted + deferred}) == 2, "both workers decided on jobs"
    times = sorted(a["before"] for a in admitted)
    per_window = max(sum(1 for t in times if s <= t < s + 1.0) for s in times)
    print(f"\nRQ: 20 jobs at 5/second on 2 workers: at most {per_window} admitted in any 1 s; "
          f"{len(deferred)} deferrals; {times[-1] - times[0]:.2f} s from first to last start; admitted per "
          f"worker {sorted(Counter(a['worker'] for a in admitted).values())}")  # fmt: skip


def test_max_wait_fails_the_job_without_running_it(fresh: None, queue: Queue, data: redis.Redis) -> None:
    first = queue.enqueue(rq_jobs.hourly, 1)
    wait_until(lambda: finished([first]), 30, "the first hourly job")
    assert first.get_status() == JobStatus.FINISHED
    started = time.monotonic()
    second = queue.enqueue(rq_jobs.hourly, 2)
    wait_until(lambda: finished([second]), 30, "the second hourly job to fail")
    assert second.get_status() == JobStatus.FAILED
    result = second.latest_result()
    assert result is not None and result.exc_string is not None
    assert "redcount.rq.MaxWaitExceeded" in result.exc_string
    assert "not run: refused for 0.000 s" in result.exc_string and "would pass max_wait=2.0 s" in result.exc_string
    # It failed at its first refusal (retry_after is past max_wait), never run.
    assert time.monotonic() - started < 2.0 + 10
    assert [r["n"] for r in records(data, "hourly")] == [1]


def test_store_down_deny_waits_and_runs_when_it_is_back(
    fresh: None, queue: Queue, data: redis.Redis, store_server: RedisServer
) -> None:
    store_server.stop()
    jobs = [queue.enqueue(rq_jobs.when_down_deny, n) for n in range(4)]
    # Each is refused (the store cannot decide), scheduled again in about 1 s, refused again.
    wait_until(lambda: Counter(d["id"] for d in records(data, "deferred")) >= Counter({j.id: 2 for j in jobs}), 30,
               "every job to be deferred twice")  # fmt: skip
    assert records(data, "deny") == []
    assert all(j.get_status(refresh=True) in (JobStatus.SCHEDULED, JobStatus.QUEUED) for j in jobs)
    store_server.start()
    wait_until(lambda: finished(jobs), 30, "the jobs to run once the store is back")
    assert all(j.get_status() == JobStatus.FINISHED for j in jobs)
    assert sorted(r["n"] for r in records(data, "deny")) == [0, 1, 2, 3]


def test_store_down_allow_runs_unlimited(
    fresh: None, queue: Queue, data: redis.Redis, store_server: RedisServer
) -> None:
    store_server.stop()
    jobs = [queue.enqueue(rq_jobs.when_down_allow, n) for n in range(4)]
    wait_until(lambda: finished(jobs), 30, "the jobs to run without the store")
    assert all(j.get_status() == JobStatus.FINISHED for j in jobs)
    assert sorted(r["n"] for r in records(data, "allow")) == [0, 1, 2, 3]
    assert records(data, "deferred") == []
    store_server.start()
