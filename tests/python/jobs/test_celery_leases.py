"""Leased limits in a real Celery prefork pool whose processes are recycled under load
(``--max-tasks-per-child``), on a redis-server of its own: a pool process ends with
``os._exit`` (no atexit), and redcount.celery gives its unused units back when Celery
announces its end (``worker_process_shutdown``), so over the window the tasks admit exactly
the limit: nothing lost to recycled processes, nothing over."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redcount

from celery_workers import CeleryWorker
from conftest import RedisServer, new_server
from helpers import wait_for_fresh_window

import jobs_app

pytestmark = [pytest.mark.redis_only, pytest.mark.slow]

LIMIT = 60  # per day: the window never ends during the test (see wait_for_fresh_window)
BATCH = 16
BUDGET = 10 * LIMIT  # tasks sent at most before giving up on reaching the limit


@pytest.fixture(scope="module")
def base() -> Iterator[str]:
    server: RedisServer = new_server()
    server.die_with_owner = True  # like the worker: gone with the test process, however it ends
    server.start()
    try:
        yield f"redis://127.0.0.1:{server.port}"
    finally:
        server.cleanup()


@pytest.fixture(scope="module")
def data(base: str) -> Iterator[redcount.Store]:
    store = redcount.connect(f"{base}/2")
    try:
        yield store
    finally:
        store.close()


@pytest.fixture(scope="module")
def worker(
    base: str, data: redcount.Store, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CeleryWorker]:
    jobs_app.configure(base)
    log = Path(tmp_path_factory.mktemp("celery-leases")) / "worker.log"
    w = CeleryWorker(base, log, concurrency=2, extra_args=("--max-tasks-per-child=4",))
    try:
        w.start(data)
        yield w
    finally:
        w.stop()
        jobs_app.app.close()
        jobs_app.configure(base)  # closes the app's own store connection


def test_recycled_pool_processes_lose_no_leased_units(worker: CeleryWorker, data: redcount.Store) -> None:
    key = f"hot:{uuid.uuid4().hex[:8]}"
    limit = f"{LIMIT}/day"
    wait_for_fresh_window(data, 86400, 600)  # the run takes well under 10 minutes

    def run(first: int) -> list[bool]:
        results = [jobs_app.leased_hit.delay(n, limit, key) for n in range(first, first + BATCH)]
        return [bool(r.get(timeout=120)) for r in results]

    decided: list[bool] = []
    while decided.count(True) < LIMIT and len(decided) < BUDGET:
        decided += run(len(decided))
    after = run(len(decided))  # over the limit: no pool process admits any more
    records = [json.loads(x) for x in data.execute("LRANGE", "jobs:leased", 0, -1)]
    pids = {r["pid"] for r in records if r["key"] == key}
    assert len(pids) > 4, f"pool processes were not recycled: {pids}\n{worker.log()}"
    assert decided.count(True) == LIMIT, f"{decided.count(True)} admitted of {LIMIT} in {len(decided)} tasks"
    assert not any(after)
    lim = redcount.Limiter(data, prefix="jobs:leased")
    assert lim.stats(limit, key)[0].count == LIMIT
