"""Per-plan limits from a callable (a plan change takes effect at the next request, with the
usage kept) and a request's limits decided together (one round trip, all-or-nothing), in
Flask and FastAPI, on memory:// and a real Redis server."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import redcount
import redcount.aio
import redcount.flask
from fastapi import Depends, FastAPI, Request
from flask import Flask
from flask import request as flask_request
from helpers import all_keys
from redcount.fastapi import RateLimiter, RateLimitMiddleware

PLANS = {"free": "3/hour", "pro": "6/hour"}

pytestmark = pytest.mark.usefixtures("away_from_hour_boundary")


def test_flask_per_plan_callable_keeps_the_usage(store: redcount.Store) -> None:
    plan = {"user": "free"}
    app = Flask(__name__)
    rl = redcount.flask.RateLimiter(app, limiter=redcount.Limiter(store), headers="all")

    @app.get("/api")
    @rl.limit(lambda: PLANS[plan["user"]], key=lambda: flask_request.headers["X-User"], name="plan")
    def api() -> str:
        return "ok"

    c = app.test_client()
    got = [c.get("/api", headers={"X-User": "u1"}).status_code for _ in range(4)]
    assert got == [200, 200, 200, 429]
    plan["user"] = "pro"  # upgraded mid-window: the 3 used stay used, 3 more are allowed
    r = c.get("/api", headers={"X-User": "u1"})
    assert r.status_code == 200 and r.headers["RateLimit"].startswith('"plan";r=2;')
    got = [c.get("/api", headers={"X-User": "u1"}).status_code for _ in range(3)]
    assert got == [200, 200, 429]
    plan["user"] = "free"  # downgraded: over the smaller limit at once
    assert c.get("/api", headers={"X-User": "u1"}).status_code == 429
    assert len(all_keys(store, "redcount:lim:*")) == 1  # one key whatever the plan


def test_fastapi_per_plan_callable_keeps_the_usage(store: redcount.Store) -> None:
    plan = {"user": "free"}
    rl = RateLimiter(redcount.aio.Limiter(store), headers="all")
    app = FastAPI()
    app.add_middleware(RateLimitMiddleware, ratelimiter=rl)

    def limit_of(request: Request) -> str:
        return PLANS[plan["user"]]

    def user_of(request: Request) -> str:
        return request.headers["x-user"]

    @app.get("/api", dependencies=[Depends(rl.limit(limit_of, key=user_of, name="plan"))])
    async def api() -> str:
        return "ok"

    async def scenario(c: httpx.AsyncClient) -> None:
        h = {"x-user": "u1"}
        assert [(await c.get("/api", headers=h)).status_code for _ in range(4)] == [200, 200, 200, 429]
        plan["user"] = "pro"
        r = await c.get("/api", headers=h)
        assert r.status_code == 200 and r.headers["ratelimit"].startswith('"plan";r=2;')
        assert [(await c.get("/api", headers=h)).status_code for _ in range(3)] == [200, 200, 429]
        plan["user"] = "free"
        assert (await c.get("/api", headers=h)).status_code == 429

    run(app, scenario)
    assert len(all_keys(store, "redcount:lim:*")) == 1


def run(app: Any, scenario: Any) -> None:
    async def main() -> None:
        transport = httpx.ASGITransport(app=app, client=("198.51.100.7", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            await scenario(client)

    asyncio.run(main())


class CountingLimiter(redcount.Limiter):
    """Counts the limiter calls a request makes (each is one round trip)."""

    calls = 0

    def hit(self, *a: Any, **kw: Any) -> redcount.Decision:
        CountingLimiter.calls += 1
        return super().hit(*a, **kw)

    def hit_all(self, *a: Any, **kw: Any) -> redcount.Decision:
        CountingLimiter.calls += 1
        return super().hit_all(*a, **kw)


def test_flask_three_limits_one_round_trip_all_or_nothing(store: redcount.Store) -> None:
    app = Flask(__name__)
    rl = redcount.flask.RateLimiter(app, limiter=CountingLimiter(store), application="100/hour", headers="all")

    @app.get("/search")
    @rl.limit("2/hour", key=lambda: flask_request.headers["X-User"], name="user")
    @rl.limit("50/hour", name="ip")
    def search() -> str:
        return "ok"

    c = app.test_client()
    CountingLimiter.calls = 0
    assert [c.get("/search", headers={"X-User": "a"}).status_code for _ in range(3)] == [200, 200, 429]
    assert CountingLimiter.calls == 3  # one call per request for its three limits
    r = c.get("/search", headers={"X-User": "b"})
    assert r.status_code == 200
    assert r.headers["RateLimit"].startswith('"user') and ";r=1;" in r.headers["RateLimit"]
    # The refusal charged none of the three: the application and the per-address limits have
    # 3 each (a's 2 and b's 1), user a 2, user b 1.
    used = [int(store.execute("GET", k)) for k in all_keys(store, "redcount:lim:fw:*")]
    assert sorted(used) == [1, 2, 3, 3]

