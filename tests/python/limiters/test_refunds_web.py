"""Charging by outcome (``deduct_when=``) in Flask (its test client) and FastAPI (in process
through httpx's ASGI transport, as the FastAPI suite does: Starlette's TestClient warns
about its httpx), on the embedded store and on a real redis-server: a request is tested
before the view and charged after it only when the response matches."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
import redcount
import redcount.aio
import redcount.fastapi
import redcount.flask
from fastapi import Depends, FastAPI, HTTPException, Request
from flask import Flask
from helpers import all_keys

pytestmark = pytest.mark.usefixtures("away_from_minute_boundary")


@pytest.fixture
def away_from_minute_boundary() -> None:
    """Fixed windows of a minute on the real clock: start a test with 10 s to spare."""
    from helpers import wait_for_fresh_window

    wait_for_fresh_window(redcount.connect(), 60, 10)


def failed(response: Any) -> bool:
    return bool(response.status_code == 401)


# ---------------------------------------------------------------------------------- Flask


def flask_app(store: redcount.Store) -> tuple[Flask, redcount.flask.RateLimiter]:
    app = Flask(__name__)
    rl = redcount.flask.RateLimiter(app, limiter=redcount.Limiter(store), headers="all")
    return app, rl


def test_flask_counts_only_failed_logins(store: redcount.Store) -> None:
    app, rl = flask_app(store)

    @app.post("/login")
    @rl.limit("3/minute", deduct_when=failed)
    def login() -> tuple[str, int]:
        from flask import request

        return ("ok", 200) if request.form.get("password") == "right" else ("no", 401)

    c = app.test_client()
    for _ in range(6):  # successes are free
        r = c.post("/login", data={"password": "right"})
        assert r.status_code == 200 and r.headers["X-RateLimit-Remaining"] == "3"
    remaining = []
    for _ in range(3):
        r = c.post("/login", data={"password": "wrong"})
        assert r.status_code == 401
        remaining.append(r.headers["X-RateLimit-Remaining"])
    assert remaining == ["2", "1", "0"]  # the headers tell the count after the charge
    refused = c.post("/login", data={"password": "right"})
    assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
    assert c.post("/login", data={"password": "wrong"}).status_code == 429


def test_flask_predicate_of_request_and_response_beside_a_plain_limit(store: redcount.Store) -> None:
    app, rl = flask_app(store)
    seen: list[tuple[str, int]] = []

    def only_bad_queries(request: Any, response: Any) -> bool:
        seen.append((request.path, response.status_code))
        return bool(response.status_code >= 400)

    @app.get("/search")
    @rl.limit("100/minute", name="all")
    @rl.limit("2/minute", name="bad", deduct_when=only_bad_queries)
    def search() -> tuple[str, int]:
        from flask import request

        return ("ok", 200) if request.args.get("q") else ("missing q", 400)

    c = app.test_client()
    assert [c.get("/search?q=a").status_code for _ in range(3)] == [200, 200, 200]
    assert [c.get("/search").status_code for _ in range(2)] == [400, 400]
    assert c.get("/search?q=a").status_code == 429
    assert seen == [("/search", 200)] * 3 + [("/search", 400)] * 2
    r = c.get("/search?q=a")
    assert r.status_code == 429


def test_flask_shared_limit_by_outcome_and_bad_input(store: redcount.Store) -> None:
    app, rl = flask_app(store)
    shared = rl.shared_limit("2/minute", "errors", deduct_when=lambda r: r.status_code >= 500)

    @app.get("/a")
    @shared
    def a() -> tuple[str, int]:
        return "boom", 503

    @app.get("/b")
    @shared
    def b() -> str:
        return "ok"

    c = app.test_client()
    assert [c.get("/b").status_code for _ in range(4)] == [200] * 4
    assert [c.get("/a").status_code for _ in range(2)] == [503, 503]
    assert c.get("/b").status_code == 429
    with pytest.raises(redcount.InvalidInputError, match="deduct_when"):
        rl.limit("1/minute", deduct_when="status >= 400")  # type: ignore[arg-type]


# -------------------------------------------------------------------------------- FastAPI


def run(app: Any, scenario: Callable[[httpx.AsyncClient], Awaitable[None]]) -> None:
    async def main() -> None:
        transport = httpx.ASGITransport(app=app, client=("198.51.100.7", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            await scenario(client)

    asyncio.run(main())


def fastapi_app(store: redcount.Store, *, middleware: bool = True) -> tuple[FastAPI, redcount.fastapi.RateLimiter]:
    rl = redcount.fastapi.RateLimiter(redcount.aio.Limiter(store), headers="all")
    app = FastAPI()
    if middleware:
        app.add_middleware(redcount.fastapi.RateLimitMiddleware, ratelimiter=rl)
    return app, rl


def test_fastapi_counts_only_failed_logins(store: redcount.Store) -> None:
    app, rl = fastapi_app(store)

    @app.post("/login", dependencies=[Depends(rl.limit("3/minute", deduct_when=failed))])
    async def login(password: str) -> dict[str, str]:
        if password != "right":
            raise HTTPException(401, "no")
        return {"ok": "yes"}

    async def scenario(c: httpx.AsyncClient) -> None:
        for _ in range(6):
            r = await c.post("/login", params={"password": "right"})
            assert r.status_code == 200 and r.headers["X-RateLimit-Remaining"] == "3"
        remaining = []
        for _ in range(3):
            r = await c.post("/login", params={"password": "wrong"})
            assert r.status_code == 401
            remaining.append(r.headers["X-RateLimit-Remaining"])
        assert remaining == ["2", "1", "0"]
        refused = await c.post("/login", params={"password": "right"})
        assert refused.status_code == 429 and int(refused.headers["Retry-After"]) >= 1
        assert (await c.post("/login", params={"password": "wrong"})).status_code == 429

    run(app, scenario)


def test_fastapi_predicate_sees_the_response_start_and_the_request(store: redcount.Store) -> None:
    app, rl = fastapi_app(store)
    seen: list[tuple[str, int, str | None]] = []

    def slow_ones(request: Request, response: redcount.fastapi.SentResponse) -> bool:
        seen.append((request.url.path, response.status_code, response.headers.get("x-slow")))
        return response.headers.get("x-slow") == "1"

    @app.get("/report", dependencies=[Depends(rl.limit("2/minute", deduct_when=slow_ones))])
    def report(slow: bool = False) -> Any:
        from fastapi.responses import JSONResponse

        return JSONResponse({"ok": True}, headers={"X-Slow": "1" if slow else "0"})

    async def scenario(c: httpx.AsyncClient) -> None:
        assert [(await c.get("/report")).status_code for _ in range(3)] == [200] * 3
        assert [(await c.get("/report", params={"slow": "true"})).status_code for _ in range(2)] == [200, 200]
        assert (await c.get("/report")).status_code == 429

    run(app, scenario)
    assert seen == [("/report", 200, "0")] * 3 + [("/report", 200, "1")] * 2


def test_fastapi_deduct_when_needs_the_middleware(store: redcount.Store) -> None:
    app, rl = fastapi_app(store, middleware=False)

    @app.get("/x", dependencies=[Depends(rl.limit("2/minute", deduct_when=failed))])
    def x() -> dict[str, str]:
        return {}

    async def scenario(c: httpx.AsyncClient) -> None:
        r = await c.get("/x")
        assert r.status_code == 500 and "RateLimitMiddleware" in r.json()["detail"]

    run(app, scenario)


def test_flask_concurrent_requests_overshoot_by_at_most_the_ones_in_flight(store: redcount.Store) -> None:
    """The documented bound: N requests of one key in flight together were all tested
    against the same count, so up to N - 1 more than the limit run; the count stays at the
    limit (the charges past it are refused) and the next request is refused."""
    import threading

    app, rl = flask_app(store)
    n = 4
    together = threading.Barrier(n, timeout=30)

    @app.post("/login")
    @rl.limit("1/minute", deduct_when=failed)
    def login() -> tuple[str, int]:
        together.wait()  # every request has passed the test before any is charged
        return "no", 401

    codes: list[int] = []

    def attempt() -> None:
        codes.append(app.test_client().post("/login").status_code)

    threads = [threading.Thread(target=attempt) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert codes == [401] * n  # the limit is 1: n - 1 more ran
    # The count stays at the limit: the charges past it were refused and recorded nothing.
    windows = [k for k in all_keys(store, "*") if b":fw:" in k]
    assert len(windows) == 1 and int(store.execute("GET", windows[0])) == 1
    assert app.test_client().post("/login").status_code == 429
