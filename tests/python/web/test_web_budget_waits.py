"""The web budget bounds each wait for Redis, nothing else, and a request decided without
the store says so.

- The app's own work between two checks of one request (the middleware's, then the
  route's) spends none of the budget: both are decided by Redis, however long it took.
- A reply that arrived while the event loop was not running is used, not thrown away at the
  budget (the engine's own timer, on a store without a budget of its own).
- A request some limit decided without the store carries ``RateLimit-Undecided`` (``timeout``
  while the store waits its budget out, ``breaker-open`` once its breaker opened) and is
  counted in the web metrics and in ``redcount.metrics()``.

Against real redis-server processes; a frozen one is SIGSTOPped (connections stay open,
nothing answers).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import redcount
import redcount.aio
import redcount.fastapi
import redcount.flask
from conftest import RedisServer
from fastapi import Depends, FastAPI
from flask import Flask
from redcount.web.engine import FailurePolicy, decide_async
from redcount.web.spec import LimitSpec, remote_address, resolve_all

pytestmark = pytest.mark.redis_only

BUDGET = 0.05
# The app's own work between the middleware's check and the route's: several budgets long.
APP_WORK = 4 * BUDGET


class SlowApp:
    """ASGI middleware standing for the app's own work (routing, authentication, a busy
    worker) between the rate-limit middleware and the route: it holds the loop's thread."""

    def __init__(self, app: Any) -> None:
        self.app = app

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            time.sleep(APP_WORK)
        await self.app(scope, receive, send)


@pytest.mark.parametrize("store_budget", [BUDGET, None], ids=["store-budget", "engine-timer"])
def test_fastapi_app_work_between_the_checks_spends_no_budget(redis_server: RedisServer, store_budget: float | None) -> None:
    redis_server.command("FLUSHALL")
    store = redcount.connect(redis_server.url, budget=store_budget)
    rl = redcount.fastapi.RateLimiter(redcount.aio.Limiter(store, "sliding-window"), default="100/minute", budget=BUDGET)
    app = FastAPI()
    app.add_middleware(SlowApp)
    app.add_middleware(redcount.fastapi.RateLimitMiddleware, ratelimiter=rl)  # outermost: first

    @app.get("/search", dependencies=[Depends(rl.limit("3/minute"))])
    async def search() -> dict[str, str]:
        return {"ok": "yes"}

    async def main() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app, client=("198.51.100.7", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            return [await c.get("/search") for _ in range(5)]

    try:
        responses = asyncio.run(main())
    finally:
        store.close()
    assert [r.status_code for r in responses] == [200, 200, 200, 429, 429]
    for r in responses:
        assert "ratelimit-undecided" not in r.headers, r.headers
    assert [r.headers["ratelimit"].split(";")[1] for r in responses[:3]] == ["r=2", "r=1", "r=0"]


def test_a_reply_that_came_while_the_loop_was_blocked_is_used(redis_server: RedisServer) -> None:
    """The engine's own timer (the store has no budget): the loop is held past the budget
    while the reply comes in; the decision is Redis's, not the failure policy's."""
    redis_server.command("FLUSHALL")
    store = redcount.connect(redis_server.url)
    limiter = redcount.aio.Limiter(store, "sliding-window")
    checks = resolve_all([LimitSpec.build("2/minute", name="held", where="test")], _View(), remote_address)

    async def main() -> Any:
        await decide_async(limiter, checks, FailurePolicy("open"), budget=BUDGET)  # connected, scripts loaded
        task = asyncio.ensure_future(decide_async(limiter, checks, FailurePolicy("open"), budget=BUDGET))
        for _ in range(5):  # turns of the loop: the call is submitted and its wait begins
            await asyncio.sleep(0)
        time.sleep(APP_WORK)  # the loop is not running while the reply arrives
        return await task

    try:
        verdict = asyncio.run(main())
    finally:
        store.close()
    assert verdict.undecided is None and verdict.allowed
    assert [o.decision.remaining for o in verdict.outcomes] == [0]


class _View:
    native = None
    method = "GET"
    endpoint = "/held"
    client = "198.51.100.9"

    def header(self, name: str) -> str | None:
        return None


@pytest.fixture
def frozen(redis_factory: Callable[..., RedisServer]) -> Iterator[RedisServer]:
    """A server of the test's own, thawed after the test whatever happens."""
    server = redis_factory()
    try:
        yield server
    finally:
        if server.proc is not None and server.proc.poll() is None:
            os.kill(server.proc.pid, signal.SIGCONT)


def test_fastapi_marks_undecided_requests_and_counts_them(frozen: RedisServer) -> None:
    from prometheus_client import CollectorRegistry

    from redcount.web.metrics import PrometheusMetrics

    store = redcount.connect(frozen.url, budget=BUDGET)
    registry = CollectorRegistry()
    metrics = PrometheusMetrics(registry)
    rl = redcount.fastapi.RateLimiter(redcount.aio.Limiter(store, "sliding-window"), default="100/minute", metrics=metrics)
    app = FastAPI()
    app.add_middleware(redcount.fastapi.RateLimitMiddleware, ratelimiter=rl)

    @app.get("/search", dependencies=[Depends(rl.limit("10/minute"))])
    async def search() -> dict[str, str]:
        return {"ok": "yes"}

    async def main() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app, client=("198.51.100.7", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            first = await c.get("/search")
            assert first.status_code == 200 and "ratelimit-undecided" not in first.headers
            assert frozen.proc is not None
            os.kill(frozen.proc.pid, signal.SIGSTOP)
            # Three timeouts open the breaker (its default threshold); then nothing is asked.
            return [await c.get("/search") for _ in range(5)]

    redcount.metrics.reset()
    try:
        responses = asyncio.run(main())
    finally:
        store.close()
    assert all(r.status_code == 200 and "ratelimit" not in r.headers for r in responses)  # fail open
    reasons = [r.headers["ratelimit-undecided"] for r in responses]
    assert reasons == ["timeout"] * 3 + ["breaker-open"] * 2, reasons
    assert registry.get_sample_value("redcount_undecided_total", {"reason": "timeout"}) == 3
    assert registry.get_sample_value("redcount_undecided_total", {"reason": "breaker-open"}) == 2
    snap = redcount.metrics()
    assert snap.undecided_requests == 5 and snap.undecided_by_reason == {"timeout": 3, "breaker-open": 2}


def test_flask_marks_undecided_requests_fail_open_and_closed(frozen: RedisServer) -> None:
    for fail, status in (("open", 200), ("closed", 503)):
        app = Flask(__name__)
        app.config.update(REDCOUNT_URL=frozen.url, REDCOUNT_BUDGET=BUDGET, REDCOUNT_FAIL=fail)
        rl = redcount.flask.RateLimiter(app)

        @app.get("/search")
        @rl.limit("10/minute")
        def search() -> str:
            return "ok"

        c = app.test_client()
        assert c.get("/search").status_code == 200
        assert frozen.proc is not None
        os.kill(frozen.proc.pid, signal.SIGSTOP)
        try:
            r = c.get("/search")
        finally:
            os.kill(frozen.proc.pid, signal.SIGCONT)
        assert r.status_code == status and r.headers["RateLimit-Undecided"] == "timeout", (fail, r.headers)
        app.extensions["redcount"].limiter.store.close()
