"""redcount.dramatiq in two real ``dramatiq`` worker processes on a redis-server broker, with
redcount's store on a second redis-server that the tests stop and start.

The broker, middleware and actors (tests/python/jobs/dramatiq_jobs.py) record what they saw in
the broker's database 1: admissions (with the times around their decision), runs, deferrals.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import redis
from dramatiq.results import ResultFailure

from conftest import RedisServer, new_server
from helpers import tightest_span, wait_until
from queue_workers import QueueWorker, start_all, worker_env

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
def jobs(broker_server: RedisServer, store_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[ModuleType]:  # fmt: skip
    env = {
        "JOBS_BROKER": f"redis://127.0.0.1:{broker_server.port}/0",
        "JOBS_STORE": f"redis://127.0.0.1:{store_server.port}/0",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    module = importlib.import_module("dramatiq_jobs")  # the test process sends through its broker
    logs = Path(tmp_path_factory.mktemp("dramatiq"))
    ws = [
        QueueWorker(["dramatiq", "dramatiq_jobs", "--processes", "1", "--threads", "2"], worker_env(env),
                    logs / f"w{i}.log")
        for i in range(2)
    ]  # fmt: skip
    control = redis.Redis(port=broker_server.port)
    # Ready: each worker process's broker has sent its heartbeat.
    start_all(ws, lambda: control.zcard("dramatiq:__heartbeats__") >= 2)
    try:
        yield module
    finally:
        for w in ws:
            w.stop()
        control.close()
        module.broker.close()
        sys.modules.pop("dramatiq_jobs", None)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture
def data(broker_server: RedisServer, store_server: RedisServer, jobs: ModuleType) -> Iterator[redis.Redis]:
    if not store_server.running:
        store_server.start()
    redis.Redis(port=store_server.port).flushall()
    conn = redis.Redis(port=broker_server.port, db=1)
    for key in conn.keys("jobs:*"):
        conn.delete(key)
    yield conn
    conn.close()


def records(data: redis.Redis, name: str) -> list[dict[str, Any]]:
    return [json.loads(x) for x in data.lrange(f"jobs:{name}", 0, -1)]


def test_20_messages_at_5_per_second_across_two_workers(jobs: ModuleType, data: redis.Redis) -> None:
    sent = [jobs.burst.send(n) for n in range(20)]
    ids = sorted(m.message_id for m in sent)
    wait_until(lambda: len(records(data, "runs")) >= 20, 60, "all 20 messages to run")
    runs = records(data, "runs")
    # None lost, none run twice, each under the id it was sent with, and the re-enqueues did
    # not count as retries (the actor has max_retries=0).
    assert Counter(r["n"] for r in runs) == Counter(range(20))
    assert sorted(r["id"] for r in runs) == ids
    assert {r["retries"] for r in runs} == {0}
    admitted = records(data, "admitted")
    assert sorted(a["id"] for a in admitted) == ids
    deferred = records(data, "deferred")
    # Refused messages were enqueued again (not run) and came back. (How many depends on how
    # fast the workers took them: 15 or more when all 20 are decided within a second.)
    assert deferred and {d["id"] for d in deferred} <= set(ids)
    decided = [(a["before"], a["after"]) for a in admitted]
    assert tightest_span(decided, 6) >= 1.0 - 0.001
    assert len({d["pid"] for d in admitted + deferred}) == 2, "both workers decided on messages"
    times = sorted(a["before"] for a in admitted)
    per_window = max(sum(1 for t in times if s <= t < s + 1.0) for s in times)
    print(f"\nDramatiq: 20 messages at 5/second on 2 workers: at most {per_window} admitted in any 1 s; "
          f"{len(deferred)} deferrals; {times[-1] - times[0]:.2f} s from first to last start; admitted per "
          f"worker {sorted(Counter(a['pid'] for a in admitted).values())}")  # fmt: skip


def test_max_wait_fails_the_message_without_running_it(jobs: ModuleType, data: redis.Redis) -> None:
    assert jobs.hourly.send(1).get_result(block=True, timeout=30_000) == 1
    started = time.monotonic()
    second = jobs.hourly.send(2)
    with pytest.raises(ResultFailure) as e:
        second.get_result(block=True, timeout=30_000)
    assert e.value.orig_exc_type == "MaxWaitExceeded"
    assert "not run: refused for 0.000 s" in e.value.orig_exc_msg
    assert "would pass max_wait=2.0 s" in e.value.orig_exc_msg
    assert time.monotonic() - started < 2.0 + 10
    assert [r["n"] for r in records(data, "hourly")] == [1]


def test_store_down_deny_waits_and_runs_when_it_is_back(
    jobs: ModuleType, data: redis.Redis, store_server: RedisServer
) -> None:
    store_server.stop()
    ids = [jobs.when_down_deny.send(n).message_id for n in range(4)]
    wait_until(lambda: Counter(d["id"] for d in records(data, "deferred")) >= Counter({i: 2 for i in ids}), 30,
               "every message to be deferred twice")  # fmt: skip
    assert records(data, "deny") == []
    # The first refusal's time travels with the message: the same on every re-enqueue.
    firsts: dict[str, set[float]] = {}
    for d in records(data, "deferred"):
        if d["first"] is not None:
            firsts.setdefault(d["id"], set()).add(d["first"])
    assert all(len(v) == 1 for v in firsts.values()) and set(firsts) == set(ids)
    store_server.start()
    wait_until(lambda: len(records(data, "deny")) >= 4, 30, "the messages to run once the store is back")
    assert sorted(r["n"] for r in records(data, "deny")) == [0, 1, 2, 3]


def test_store_down_allow_runs_unlimited(jobs: ModuleType, data: redis.Redis, store_server: RedisServer) -> None:
    store_server.stop()
    for n in range(4):
        jobs.when_down_allow.send(n)
    wait_until(lambda: len(records(data, "allow")) >= 4, 30, "the messages to run without the store")
    assert sorted(r["n"] for r in records(data, "allow")) == [0, 1, 2, 3]
    assert records(data, "deferred") == []
    store_server.start()
