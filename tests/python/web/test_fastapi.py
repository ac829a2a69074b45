"""redcount.fastapi against real FastAPI apps: in-process through httpx's ASGI transport on
both stores, and under a real uvicorn server for WebSockets."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import httpx
import pytest
import redcount
import redcount.aio
import redcount.fastapi
from conftest import free_port
from fastapi import Depends, FastAPI, HTTPException, WebSocket
from pydantic import BaseModel
from redcount.fastapi import RateLimiter, RateLimitMiddleware
from redcount.web import TrustedProxies

pytestmark = pytest.mark.usefixtures("away_from_minute_boundary")


@pytest.fixture
def away_from_minute_boundary() -> None:
    """Fixed windows of a minute on the real clock: start a test with 10 s to spare."""
    from helpers import wait_for_fresh_window

    wait_for_fresh_window(redcount.connect(), 60, 10)


def run(app: Any, scenario: Callable[[httpx.AsyncClient], Awaitable[None]], peer: str = "198.51.100.7") -> None:
    async def main() -> None:
        transport = httpx.ASGITransport(app=app, client=(peer, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            await scenario(client)

    asyncio.run(main())


def make(store: redcount.Store, *, middleware: bool = True, **kw: Any) -> tuple[FastAPI, RateLimiter]:
    kw.setdefault("headers", "all")
    rl = RateLimiter(redcount.aio.Limiter(store), **kw)
    app = FastAPI()
    if middleware:
        app.add_middleware(RateLimitMiddleware, ratelimiter=rl)
    return app, rl


class Item(BaseModel):
    name: str


def test_dependency_on_sync_and_async_endpoints_without_a_request_parameter(store: redcount.Store) -> None:
    app, rl = make(store)

    @app.get("/sync", dependencies=[Depends(rl.limit("2/minute"))])
    def sync_endpoint() -> dict[str, str]:
        return {"kind": "sync"}

    @app.get("/async", dependencies=[Depends(rl.limit("2/minute", name="async-route"))])
    async def async_endpoint() -> Item:
        return Item(name="model")

    async def scenario(c: httpx.AsyncClient) -> None:
        for path in ("/sync", "/async"):
            got = [(await c.get(path)).status_code for _ in range(3)]
            assert got == [200, 200, 429], path
        r = await c.get("/sync")
        assert r.status_code == 429
        assert r.headers["ratelimit-policy"] == '"sync_endpoint";q=2;w=60'
        assert r.headers["ratelimit"].startswith('"sync_endpoint";r=0;')
        assert int(r.headers["retry-after"]) >= 1
        assert r.json()["detail"].startswith("rate limit exceeded; retry in ")
        r = await c.get("/async")
        assert r.headers["ratelimit-policy"] == '"async-route";q=2;w=60'

    run(app, scenario)


def test_headers_without_the_middleware_for_dict_and_model_returns(store: redcount.Store) -> None:
    app, rl = make(store, middleware=False)

    @app.get("/d", dependencies=[Depends(rl.limit("5/minute"))])
    def d() -> dict[str, int]:
        return {"a": 1}

    async def scenario(c: httpx.AsyncClient) -> None:
        r = await c.get("/d")
        assert r.json() == {"a": 1}
        assert r.headers["ratelimit"].startswith('"d";r=4;')
        assert r.headers.get_list("ratelimit") == [r.headers["ratelimit"]]

    run(app, scenario)


def test_middleware_default_and_route_limit_headers_never_duplicated(store: redcount.Store) -> None:
    app, rl = make(store, default="4/minute")

    @app.get("/r", dependencies=[Depends(rl.limit("10/minute", name="route"))])
    async def r_() -> dict[str, str]:
        return {"ok": "y"}

    @app.get("/plain")
    async def plain() -> dict[str, str]:
        return {"ok": "y"}

    async def scenario(c: httpx.AsyncClient) -> None:
        r = await c.get("/r")
        assert r.headers["ratelimit-policy"] == '"default";q=4;w=60, "route";q=10;w=60'
        assert r.headers["ratelimit"].startswith('"default";r=3;')  # fewest left binds
        for name in ("ratelimit", "ratelimit-policy", "x-ratelimit-limit", "x-ratelimit-remaining"):
            assert len(r.headers.get_list(name)) == 1, name
        assert (await c.get("/plain")).headers["ratelimit"].startswith('"default";r=2;')
        await c.get("/plain")
        await c.get("/plain")
        r = await c.get("/r")  # refused by the middleware before routing
        assert r.status_code == 429 and r.headers["content-type"] == "application/problem+json"
        assert r.json()["violated-policies"] == ["default"]
        assert r.headers["ratelimit-policy"] == '"default";q=4;w=60'
        assert int(r.headers["retry-after"]) >= 1

    run(app, scenario)


def test_headers_reach_the_response_when_a_later_dependency_or_the_route_raises(store: redcount.Store) -> None:
    app, rl = make(store)

    def auth() -> None:
        raise HTTPException(401, "who are you")

    @app.get("/dep", dependencies=[Depends(rl.limit("5/minute")), Depends(auth)])
    def dep() -> dict[str, str]:
        return {}

    @app.get("/route", dependencies=[Depends(rl.limit("5/minute"))])
    async def route() -> dict[str, str]:
        raise HTTPException(404, "no such thing")

    async def scenario(c: httpx.AsyncClient) -> None:
        r = await c.get("/dep")
        assert r.status_code == 401 and r.headers["ratelimit"].startswith('"dep";r=4;')
        r = await c.get("/route")
        assert r.status_code == 404 and r.headers["ratelimit"].startswith('"route";r=4;')
        assert len(r.headers.get_list("ratelimit")) == 1

    run(app, scenario)


def test_shared_limit_key_cost_and_dynamic_limit(store: redcount.Store) -> None:
    app, rl = make(store, middleware=False)
    reports = rl.shared_limit("3/minute", "reports")

    @app.get("/r1", dependencies=[Depends(reports)])
    def r1() -> dict[str, str]:
        return {}

    @app.get("/r2", dependencies=[Depends(reports)])
    def r2() -> dict[str, str]:
        return {}

    plan = rl.limit(
        lambda req: "3/minute" if req.headers.get("x-plan") == "pro" else "1/minute",
        key=lambda req: "user:" + req.headers.get("x-user", "anon"),
        cost=lambda req: int(req.query_params.get("n", "1")),
    )

    @app.get("/plan", dependencies=[Depends(plan)])
    def plan_route() -> dict[str, str]:
        return {}

    async def scenario(c: httpx.AsyncClient) -> None:
        got = [(await c.get(p)).status_code for p in ("/r1", "/r2", "/r1", "/r2")]
        assert got == [200, 200, 200, 429]
        pro = {"x-plan": "pro", "x-user": "alice"}
        assert (await c.get("/plan?n=2", headers=pro)).status_code == 200
        assert (await c.get("/plan?n=2", headers=pro)).status_code == 429
        assert (await c.get("/plan", headers=pro)).status_code == 200
        bob = {"x-user": "bob"}
        assert [(await c.get("/plan", headers=bob)).status_code for _ in range(2)] == [200, 429]

    run(app, scenario)


def test_spoofed_forwarded_for_changes_nothing_and_trusted_proxies_count(store: redcount.Store) -> None:
    app, rl = make(store, middleware=False)

    @app.get("/s", dependencies=[Depends(rl.limit("1/minute"))])
    def s() -> dict[str, str]:
        return {}

    async def spoof(c: httpx.AsyncClient) -> None:
        got = [(await c.get("/s", headers={"x-forwarded-for": f"10.9.9.{i}"})).status_code for i in range(3)]
        assert got == [200, 429, 429]

    run(app, spoof)

    app2, rl2 = make(store, middleware=False, trusted_proxies=TrustedProxies(cidrs=["10.0.0.0/8"]), ipv6_prefix=64)

    @app2.get("/t", dependencies=[Depends(rl2.limit("1/minute"))])
    def t() -> dict[str, str]:
        return {}

    async def proxied(c: httpx.AsyncClient) -> None:
        assert (await c.get("/t", headers={"x-forwarded-for": "2001:db8::1"})).status_code == 200
        assert (await c.get("/t", headers={"x-forwarded-for": "2001:db8::2"})).status_code == 429  # same /64
        assert (await c.get("/t", headers={"x-forwarded-for": "203.0.113.5"})).status_code == 200

    run(app2, proxied, peer="10.0.0.1")


def test_key_function_returning_non_string_is_a_clear_500_logged_once(
    store: redcount.Store, caplog: pytest.LogCaptureFixture
) -> None:
    app, rl = make(store, middleware=False, key=lambda req: 7)
    app.debug = True

    @app.get("/k", dependencies=[Depends(rl.limit("5/minute"))])
    def k() -> dict[str, str]:
        return {}

    async def scenario(c: httpx.AsyncClient) -> None:
        with caplog.at_level(logging.ERROR, logger="redcount.web"):
            for _ in range(3):
                r = await c.get("/k")
                assert r.status_code == 500 and "must return a str, got int" in r.text
        assert caplog.text.count("must return a str") == 1

    run(app, scenario)


def test_bad_input_at_start_up() -> None:
    rl = RateLimiter()
    with pytest.raises(redcount.InvalidInputError, match="^invalid rate limit '5/fortnight'"):
        rl.limit("5/fortnight")
    with pytest.raises(redcount.InvalidInputError, match="bad limit on RateLimiter\\(default=...\\): invalid rate limit 'x'"):
        RateLimiter(default="x")
    with pytest.raises(redcount.InvalidInputError, match="malformed trusted proxy CIDR"):
        RateLimiter(trusted_proxies=["10.0.0.0/8", "10.0.0.0/99"])
    with pytest.raises(redcount.InvalidInputError, match="unknown header set 'x-rate'"):
        RateLimiter(headers="x-rate")
    with pytest.raises(redcount.InvalidInputError, match="fail must be"):
        RateLimiter(fail="sideways")  # type: ignore[arg-type]
    with pytest.raises(redcount.InvalidInputError, match="limiter must be"):
        RateLimiter("redis://x")  # type: ignore[arg-type]
    with pytest.raises(redcount.InvalidInputError, match="shared_limit needs a scope"):
        rl.shared_limit("1/minute", "")


def test_a_sync_limiter_is_accepted_and_shares_counts(store: redcount.Store) -> None:
    sync = redcount.Limiter(store, prefix="redcount:web")
    rl = RateLimiter(sync)
    app = FastAPI()

    @app.get("/x", dependencies=[Depends(rl.limit("2/minute"))])
    def x() -> dict[str, str]:
        return {}

    run(app, lambda c: _expect(c, "/x", [200, 200, 429]))


async def _expect(c: httpx.AsyncClient, path: str, codes: list[int]) -> None:
    assert [(await c.get(path)).status_code for _ in codes] == codes


def test_shadow_mode(store: redcount.Store) -> None:
    app, rl = make(store, shadow=True, default="1/minute")

    @app.get("/x", dependencies=[Depends(rl.limit("1/minute"))])
    def x() -> dict[str, str]:
        return {}

    async def scenario(c: httpx.AsyncClient) -> None:
        for _ in range(3):
            r = await c.get("/x")
            assert r.status_code == 200 and "ratelimit" not in r.headers

    run(app, scenario)


@pytest.mark.redis_only
def test_the_event_loop_never_waits_on_redis(redis_factory: Any) -> None:
    """While redis-server is frozen (SIGSTOP), a request waits but the loop keeps running; the
    request is decided by Redis once it thaws (its headers prove it was not failed open)."""
    server = redis_factory()
    store = redcount.connect(server.url, command_timeout=30)
    app, rl = make(store, budget=None)  # no request budget: the request waits for Redis to thaw

    @app.get("/sync", dependencies=[Depends(rl.limit("5/minute"))])
    def sync_endpoint() -> dict[str, str]:
        return {}

    @app.get("/async", dependencies=[Depends(rl.limit("5/minute"))])
    async def async_endpoint() -> dict[str, str]:
        return {}

    async def scenario(c: httpx.AsyncClient) -> None:
        assert (await c.get("/async")).status_code == 200  # connected, scripts loaded
        for path, left in (("/sync", 4), ("/async", 3)):
            ticks = 0
            stop = False

            async def ticker() -> None:
                nonlocal ticks
                while not stop:
                    ticks += 1
                    await asyncio.sleep(0.001)

            t = asyncio.create_task(ticker())
            os.kill(server.proc.pid, signal.SIGSTOP)
            try:
                req = asyncio.create_task(c.get(path))
                start = ticks
                while ticks < start + 20:  # the loop turns while the request waits
                    await asyncio.sleep(0.001)
                assert not req.done()
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            r = await req
            stop = True
            await t
            assert r.status_code == 200 and r.headers["ratelimit"].startswith(f'"{path[1:]}_endpoint";r={left};'), path

    run(app, scenario)
    store.close()


@pytest.mark.redis_only
def test_fail_open_and_closed_when_redis_dies(redis_factory: Any) -> None:
    server = redis_factory()
    for fail in ("open", "closed"):
        store = redcount.connect(server.url, connect_timeout=0.5, command_timeout=0.5)
        app, rl = make(store, fail=fail, default="100/minute")

        @app.get("/f", dependencies=[Depends(rl.limit("100/minute"))])
        def f() -> dict[str, str]:
            return {}

        async def scenario(c: httpx.AsyncClient) -> None:
            assert (await c.get("/f")).status_code == 200
            server.kill()
            r = await c.get("/f")
            if fail == "open":
                assert r.status_code == 200 and "ratelimit" not in r.headers
            else:
                assert r.status_code == 503 and r.headers["retry-after"] == "1"
                # The middleware's default limit refused first, with its problem body.
                assert r.json()["status"] == 503

        run(app, scenario)
        server.restart()
        store.close()


# -- WebSockets under a real uvicorn ----------------------------------------------------------


class ThreadedUvicorn:
    """A uvicorn server on a free loopback port, in a thread of this process."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        self.port = free_port()
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    ws="websockets-sansio", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> ThreadedUvicorn:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def ws_app(store: redcount.Store) -> Iterator[tuple[FastAPI, RateLimiter]]:
    yield make(store)


def test_websocket_refused_at_the_handshake(ws_app: tuple[FastAPI, RateLimiter]) -> None:
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    app, rl = ws_app

    @app.websocket("/ws", dependencies=[Depends(rl.limit("2/minute"))])
    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text("hello")
        await websocket.close()

    with ThreadedUvicorn(app) as srv:
        url = f"ws://127.0.0.1:{srv.port}/ws"
        for _ in range(2):
            with connect(url) as conn:
                assert conn.recv() == "hello"
        with pytest.raises(InvalidStatus) as e:
            with connect(url):
                pass
        # Closed before accept (code 1008): uvicorn answers the handshake with 403.
        assert e.value.response.status_code == 403


def test_websocket_default_limit_in_the_middleware(store: redcount.Store) -> None:
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    app, rl = make(store, default="1/minute")

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        await websocket.send_text("hi")
        await websocket.close()

    with ThreadedUvicorn(app) as srv:
        url = f"ws://127.0.0.1:{srv.port}/ws"
        with connect(url) as conn:
            assert conn.recv() == "hi"
        with pytest.raises(InvalidStatus) as e:
            with connect(url):
                pass
        # uvicorn supports the websocket.http.response extension: a real 429 with headers.
        resp = e.value.response
        assert resp.status_code == 429
        assert int(resp.headers["Retry-After"]) >= 1
        assert resp.headers["RateLimit"].startswith('"default";r=0;')
        assert json.loads(resp.body)["violated-policies"] == ["default"]


def test_plain_starlette_app(store: redcount.Store) -> None:
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    rl = RateLimiter(redcount.aio.Limiter(store), default="100/minute")
    spec = rl.spec("2/minute", name="hello")

    async def hello(request: Request) -> JSONResponse:
        await rl.enforce(request, spec)
        return JSONResponse({"hello": "world"})

    app = Starlette(routes=[Route("/", hello)], middleware=[Middleware(RateLimitMiddleware, ratelimiter=rl)])

    async def scenario(c: httpx.AsyncClient) -> None:
        r = await c.get("/")
        assert r.status_code == 200
        assert r.headers["ratelimit-policy"] == '"default";q=100;w=60, "hello";q=2;w=60'
        assert r.headers["ratelimit"].startswith('"hello";r=1;')
        await c.get("/")
        r = await c.get("/")
        assert r.status_code == 429 and r.headers["ratelimit"].startswith('"hello";r=0;')
        assert int(r.headers["retry-after"]) >= 1

    run(app, scenario)


def test_problem_json_handler(store: redcount.Store) -> None:
    from redcount.fastapi import RateLimitExceeded, rate_limit_exceeded_handler

    app, rl = make(store, middleware=False)
    app.add_exception_handler(RateLimitExceeded, rate_limit_exceeded_handler)

    @app.get("/p", dependencies=[Depends(rl.limit("1/minute", name="p"))])
    def p() -> dict[str, str]:
        return {}

    async def scenario(c: httpx.AsyncClient) -> None:
        await c.get("/p")
        r = await c.get("/p")
        assert r.status_code == 429 and r.headers["content-type"] == "application/problem+json"
        assert r.json()["violated-policies"] == ["p"] and r.json()["retry_after"] >= 1
        assert r.headers["ratelimit"].startswith('"p";r=0;') and int(r.headers["retry-after"]) >= 1

    run(app, scenario)


@pytest.mark.redis_only
def test_a_thousand_concurrent_requests_share_one_connection(redis_factory: Any) -> None:
    """limits' async storage runs out of pool connections here; redcount.aio multiplexes
    every request over the store's one socket, and the count stays exact."""
    server = redis_factory()
    redis_store = redcount.connect(server.url)
    # A thousand requests started at once keep the loop busy for longer than the default
    # request budget (100 ms), which would decide the late ones by the failure policy; the
    # point here is the exact count over one connection, so no budget.
    app, rl = make(redis_store, default="10000/minute", budget=None)

    @app.get("/x", dependencies=[Depends(rl.limit("300/minute"))])
    async def x() -> dict[str, str]:
        return {}

    async def scenario(c: httpx.AsyncClient) -> None:
        responses = await asyncio.gather(*(c.get("/x") for _ in range(1000)))
        codes = [r.status_code for r in responses]
        assert codes.count(200) == 300 and codes.count(429) == 700
        admitted = sorted(int(r.headers["x-ratelimit-remaining"]) for r in responses if r.status_code == 200)
        # The binding limit of an admitted request is the route's (fewer left than the default's).
        assert admitted == list(range(300))
        info = redis_store.execute("INFO", "clients")
        clients = [int(line.split(b":")[1]) for line in info.split(b"\r\n") if line.startswith(b"connected_clients:")]
        assert clients == [1]  # this store's one connection: the test's INFO goes over it too

    run(app, scenario)
    redis_store.close()
