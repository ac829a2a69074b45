"""End to end: a Django app whose workers are starved of CPU still admits exactly its limit.

The project of ``e2e_project/`` under gunicorn (WSGI, 2 threaded workers) and uvicorn (ASGI,
2 workers), on a real redis-server, with the documented default budget (100 ms) and the
default failure policy (``fail open``). Each request to ``/mw/deco/...`` is decided twice:
by ``RateLimitMiddleware`` (a generous site limit), then by the view's own
``@redcount.django.limit`` (``ROUTE`` per minute).

While a burst runs, every worker process is stopped and continued over and over (SIGSTOP for
several budgets, SIGCONT for a moment): the workers spend most of the burst not running,
with requests and replies in flight, as on a machine whose CPU other processes take. Time
the worker was not running is not time spent waiting for Redis: every request is decided by
Redis (no ``RateLimit-Undecided``), exactly ``ROUTE`` are admitted in every round, and the
circuit breaker never opens (it would log it).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from redcount.tools.servers import RedisServer
from django_e2e import KINDS, WORKERS, burst, ready, start, statuses
from helpers import AppServer

pytestmark = [pytest.mark.redis_only, pytest.mark.slow]

ROUTE = 4
REQUESTS = 36
CLIENTS = 4
ROUNDS = 4
STOPPED = 0.3  # each freeze: three budgets
RUNNING = 0.03
VIEW = {"gunicorn": "/mw/deco/sync", "uvicorn": "/mw/deco/async"}


@pytest.fixture(scope="module")
def servers(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, AppServer]]:
    logs = tmp_path_factory.mktemp("django-e2e-starved")
    started = {
        kind: start(kind, logs, redis_server.url, STRATEGY="sliding-window", LIMIT="100000/minute",
                    ROUTE_LIMIT=f"{ROUTE}/minute", BUDGET="0.1")
        for kind in KINDS
    }
    try:
        ready(list(started.values()))
        yield started
    finally:
        for srv in started.values():
            srv.stop()


def workers_of(server: AppServer) -> list[int]:
    pid = server.proc.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    found = [int(c) for c in children]
    assert len(found) >= WORKERS, (pid, found)
    return found


class Starver:
    """Stops and continues ``pids`` in a loop until stopped; leaves them running."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = pids
        self.cycles = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _signal(self, sig: signal.Signals) -> None:
        for pid in self.pids:
            os.kill(pid, sig)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._signal(signal.SIGSTOP)
                self._stop.wait(STOPPED)
                self._signal(signal.SIGCONT)
                self.cycles += 1
                self._stop.wait(RUNNING)
        finally:
            self._signal(signal.SIGCONT)

    def __enter__(self) -> Starver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)


@pytest.mark.parametrize("kind", KINDS)
def test_starved_workers_admit_exactly_the_limit(servers: dict[str, AppServer], redis_server: RedisServer,
                                                 kind: str) -> None:
    server = servers[kind]
    url = server.url + VIEW[kind]
    # Every worker connected and its scripts loaded (a site-limited view: the route's count
    # stays untouched), so the rounds below measure deciding, not connecting.
    seen: set[str] = set()
    with httpx.Client(timeout=30, headers={"Connection": "close"}) as c:
        for _ in range(200):
            seen.add(c.get(server.url + "/mw/sync").headers["X-Worker"])
            if len(seen) == WORKERS:
                break
    assert len(seen) == WORKERS
    pids = workers_of(server)
    for _ in range(ROUNDS):
        redis_server.command("FLUSHALL")
        start_at = time.monotonic()
        with Starver(pids) as starver:
            responses = burst(url, REQUESTS, CLIENTS)
        took = time.monotonic() - start_at
        undecided = [r.headers["RateLimit-Undecided"] for r in responses if "RateLimit-Undecided" in r.headers]
        print(f"\n{kind}: {statuses(responses)} in {took:.1f} s over {starver.cycles} stop/continue cycles; "
              f"undecided: {undecided}")
        assert starver.cycles >= 1, "the burst ended before the workers were continued once"
        assert undecided == [], statuses(responses)
        assert statuses(responses) == {200: ROUTE, 429: REQUESTS - ROUTE}
        admitted = [r for r in responses if r.status_code == 200]
        assert sorted(int(r.headers["X-RateLimit-Remaining"]) for r in admitted) == list(range(ROUTE))
    log = server.log.read_text()
    assert "circuit breaker open" not in log, log
    assert "rate-limit store failed" not in log, log
