"""Leased limits through the web integrations (``lease=`` on a Flask or FastAPI limit), on
memory:// and a real Redis server."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import redcount
import redcount.aio
import redcount.fastapi
import redcount.flask
from fastapi import Depends, FastAPI
from flask import Flask
from redcount.web import by_route

pytestmark = pytest.mark.usefixtures("away_from_hour_boundary")




def test_flask_leased_route_limit(store: redcount.Store) -> None:
    app = Flask(__name__)
    limiter = redcount.Limiter(store)
    rl = redcount.flask.RateLimiter(app, limiter=limiter, headers="all")

    @app.get("/hot")
    @rl.limit("20/hour", key=by_route, lease=4)
    def hot() -> str:
        return "ok"

    @app.get("/both")
    @rl.limit("20/hour", key=by_route, lease=4)
    @rl.limit("100/hour", key=by_route)
    def both() -> str:
        return "ok"

    c = app.test_client()
    codes = [c.get("/hot").status_code for _ in range(25)]
    assert codes == [200] * 20 + [429] * 5  # every leased unit used, none past the limit
    assert limiter.leased_units == 0
    r = c.get("/hot")
    assert r.status_code == 429 and int(r.headers["Retry-After"]) > 0
    first = c.get("/both")
    assert first.status_code == 200
    assert limiter.leased_units == 3  # the leased limit took 4 units; the other one is plain
    assert [c.get("/both").status_code for _ in range(19)] == [200] * 19


def test_fastapi_leased_route_limit(store: redcount.Store) -> None:
    limiter = redcount.aio.Limiter(store)
    rl = redcount.fastapi.RateLimiter(limiter, headers="all")
    app = FastAPI()

    @app.get("/hot", dependencies=[Depends(rl.limit("20/hour", key=by_route, lease=4))])
    async def hot() -> str:
        return "ok"

    async def main() -> list[int]:
        transport = httpx.ASGITransport(app=app, client=("198.51.100.7", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return [(await client.get("/hot")).status_code for _ in range(25)]

    assert asyncio.run(main()) == [200] * 20 + [429] * 5
    assert limiter.sync.leased_units == 0


def test_bad_lease_setting(memory_store: redcount.Store) -> None:
    app = Flask(__name__)
    rl = redcount.flask.RateLimiter(app, limiter=redcount.Limiter(memory_store))
    for bad in (0, -1, True, "4", 2.5):
        with pytest.raises(redcount.InvalidInputError, match="lease on route"):
            rl.limit("20/hour", lease=bad)(lambda: "ok")  # type: ignore[arg-type]
    fast = redcount.fastapi.RateLimiter(redcount.aio.Limiter(memory_store))
    with pytest.raises(redcount.InvalidInputError, match="lease"):
        fast.limit("20/hour", lease=0)


def test_flask_leased_default_and_application_limits(store: redcount.Store) -> None:
    app = Flask(__name__)
    app.config["REDCOUNT_LEASE"] = "4"  # from a config file or the environment: a string
    limiter = redcount.Limiter(store)
    redcount.flask.RateLimiter(app, limiter=limiter, default="10/hour", application="100/hour")

    @app.get("/a")
    def a() -> str:
        return "ok"

    c = app.test_client()
    assert c.get("/a").status_code == 200
    assert limiter.leased_units == 3 + 3  # the default (per route) and the application limit each took 4
    codes = [c.get("/a").status_code for _ in range(11)]
    assert codes == [200] * 9 + [429] * 2  # the default limit, to the unit


def test_flask_leased_application_limit_spans_routes(store: redcount.Store) -> None:
    app = Flask(__name__)
    limiter = redcount.Limiter(store)
    redcount.flask.RateLimiter(app, limiter=limiter, application="7/hour", lease=2)

    @app.get("/a")
    def a() -> str:
        return "ok"

    @app.get("/b")
    def b() -> str:
        return "ok"

    c = app.test_client()
    codes = [c.get(path).status_code for path in ["/a", "/b"] * 5]
    assert codes.count(200) == 7 and codes[7:] == [429] * 3
    assert limiter.leased_units == 0


def test_flask_lease_setting_is_checked(memory_store: redcount.Store) -> None:
    for bad in (0, "-1", 2.5, True):
        with pytest.raises(redcount.InvalidInputError, match="REDCOUNT_LEASE"):
            redcount.flask.RateLimiter(Flask(__name__), limiter=redcount.Limiter(memory_store), default="1/hour",
                                       lease=bad)  # type: ignore[arg-type]
    with pytest.raises(redcount.InvalidInputError, match="fixed-window"):
        redcount.flask.RateLimiter(Flask(__name__), limiter=redcount.Limiter(memory_store, "concurrency"),
                                   default="1/hour", lease=4)
    app = Flask(__name__)
    approx = redcount.Limiter(memory_store, "sliding-window-approx")
    redcount.flask.RateLimiter(app, limiter=approx, application="3/hour", lease=4)

    @app.get("/")
    def index() -> str:
        return "ok"

    assert [app.test_client().get("/").status_code for _ in range(4)] == [200, 200, 200, 429]


def test_fastapi_leased_default_limit(store: redcount.Store) -> None:
    limiter = redcount.aio.Limiter(store)
    rl = redcount.fastapi.RateLimiter(limiter, default="20/hour", lease=4)
    app = FastAPI()
    app.add_middleware(redcount.fastapi.RateLimitMiddleware, ratelimiter=rl)

    @app.get("/x")
    async def x() -> str:
        return "ok"

    async def main() -> list[int]:
        transport = httpx.ASGITransport(app=app, client=("198.51.100.7", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            codes = [(await client.get("/x")).status_code for _ in range(2)]
            assert limiter.sync.leased_units == 2
            return codes + [(await client.get("/x")).status_code for _ in range(23)]

    assert asyncio.run(main()) == [200] * 20 + [429] * 5
    assert limiter.sync.leased_units == 0
    with pytest.raises(redcount.InvalidInputError, match="fixed-window"):
        redcount.fastapi.RateLimiter(redcount.aio.Limiter(store, "concurrency"), default="1/hour", lease=4)
    with pytest.raises(redcount.InvalidInputError, match="lease"):
        redcount.fastapi.RateLimiter(limiter, default="1/hour", lease=0)
