"""The web integrations' latency budget per request, under their documented defaults, against
a frozen redis-server (SIGSTOP: connections stay open, nothing answers).

Documented: a check waits for Redis at most the budget (100 ms by default) before the failure
policy decides, and once one has, the request's later checks are decided without waiting
again; so no request may take longer than the budget plus 50 ms.
That is a functional bound (a frozen Redis would otherwise hold each check for the store's
2 s ``command_timeout``), not a speed measurement. Each app has an app-wide limit and a route
limit, so a request makes two checks.
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
pytestmark = pytest.mark.redis_only

DOCUMENTED_BUDGET = 0.1
BOUND = DOCUMENTED_BUDGET + 0.05
REQUESTS = 8


@pytest.fixture
def frozen(redis_factory: Callable[..., RedisServer]) -> Iterator[Callable[[], None]]:
    """A server and a function that freezes it; it is thawed after the test whatever happens."""
    server = redis_factory()
    stopped = False

    def freeze() -> None:
        nonlocal stopped
        assert server.proc is not None
        os.kill(server.proc.pid, signal.SIGSTOP)
        stopped = True

    freeze.server = server  # type: ignore[attr-defined]
    try:
        yield freeze
    finally:
        if stopped:
            assert server.proc is not None
            os.kill(server.proc.pid, signal.SIGCONT)


def test_documented_default_budget() -> None:
    from redcount.web.engine import DEFAULT_BUDGET

    assert DEFAULT_BUDGET == DOCUMENTED_BUDGET
    assert redcount.fastapi.RateLimiter().settings.budget == DEFAULT_BUDGET
    app = Flask(__name__)
    redcount.flask.RateLimiter(app)
    assert app.extensions["redcount"].settings.budget == DEFAULT_BUDGET
    app = Flask(__name__)
    app.config["REDCOUNT_BUDGET"] = 0
    redcount.flask.RateLimiter(app)
    assert app.extensions["redcount"].settings.budget is None


def test_flask_frozen_redis_costs_a_request_at_most_its_budget(frozen: Any) -> None:
    server: RedisServer = frozen.server
    app = Flask(__name__)
    app.config["REDCOUNT_URL"] = server.url  # the documented configuration, nothing else
    app.config["REDCOUNT_APPLICATION"] = "1000/minute"
    rl = redcount.flask.RateLimiter(app)

    @app.get("/search")
    @rl.limit("10/minute")
    def search() -> str:
        return "ok"

    c = app.test_client()
    r = c.get("/search")  # connected, scripts loaded
    assert r.status_code == 200 and r.headers["RateLimit"].startswith('"search";r=9;')
    frozen()
    took = []
    for _ in range(REQUESTS):
        start = time.monotonic()
        r = c.get("/search")
        took.append(time.monotonic() - start)
        assert r.status_code == 200 and "RateLimit" not in r.headers  # fail open, the default
    assert max(took) < BOUND, [round(t, 3) for t in took]
    app.extensions["redcount"].limiter.store.close()


def test_fastapi_frozen_redis_costs_a_request_at_most_its_budget(frozen: Any) -> None:
    server: RedisServer = frozen.server
    store = redcount.connect(server.url)  # as in the documented example: no store budget
    rl = redcount.fastapi.RateLimiter(redcount.aio.Limiter(store), default="1000/minute")
    app = FastAPI()
    app.add_middleware(redcount.fastapi.RateLimitMiddleware, ratelimiter=rl)

    @app.get("/search", dependencies=[Depends(rl.limit("10/minute"))])
    async def search() -> dict[str, str]:
        return {"ok": "yes"}

    async def main() -> None:
        transport = httpx.ASGITransport(app=app, client=("198.51.100.7", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            r = await c.get("/search")
            assert r.status_code == 200 and r.headers["ratelimit"].startswith('"search";r=9;')
            frozen()
            took = []
            for _ in range(REQUESTS):
                start = time.monotonic()
                r = await c.get("/search")
                took.append(time.monotonic() - start)
                assert r.status_code == 200 and "ratelimit" not in r.headers
            assert max(took) < BOUND, [round(t, 3) for t in took]
            # Concurrent requests each get their own budget, not a queue of them.
            start = time.monotonic()
            rs = await asyncio.gather(*(c.get("/search") for _ in range(REQUESTS)))
            assert all(r.status_code == 200 for r in rs)
            assert time.monotonic() - start < BOUND

    asyncio.run(main())
    store.close()


def test_fastapi_route_check_gets_what_the_middleware_left(frozen: Any) -> None:
    """Once the middleware's check has waited its budget out, the route's is decided
    without waiting again (fail closed: a 503 at once)."""
    server: RedisServer = frozen.server
    store = redcount.connect(server.url)
    rl = redcount.fastapi.RateLimiter(redcount.aio.Limiter(store), default="1000/minute", fail="closed")
    app = FastAPI()
    app.add_middleware(redcount.fastapi.RateLimitMiddleware, ratelimiter=rl)

    @app.get("/search", dependencies=[Depends(rl.limit("10/minute"))])
    async def search() -> dict[str, str]:
        return {"ok": "yes"}

    async def main() -> None:
        transport = httpx.ASGITransport(app=app, client=("198.51.100.7", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            assert (await c.get("/search")).status_code == 200
            frozen()
            start = time.monotonic()
            r = await c.get("/search")
            assert r.status_code == 503
            assert time.monotonic() - start < BOUND

    asyncio.run(main())
    store.close()
