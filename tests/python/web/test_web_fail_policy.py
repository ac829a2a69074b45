"""Authentication failures under the web integrations' failure policy, and the optional
start-up check, on Flask and FastAPI against a real redis-server that requires a password.

A wrong (or rotated) password makes every call fail the same way; for a rate limiter that is
the store failing, so ``fail="open"`` lets requests through and ``fail="closed"`` answers
503, with one log line when the store starts failing and one when it works again. With
``check_on_start`` the app refuses to start, with the store's own error.
"""

from __future__ import annotations

import asyncio
import logging
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

RIGHT, WRONG = "right-password", "wrong-password"


@pytest.fixture
def locked(redis_factory: Callable[..., RedisServer]) -> RedisServer:
    """A redis-server that requires the password RIGHT."""
    return redis_factory(extra_args=["--requirepass", RIGHT], password=RIGHT)


def url(server: RedisServer, password: str) -> str:
    return f"redis://:{password}@127.0.0.1:{server.port}/0"


def store_error(server: RedisServer, password: str) -> redcount.AuthenticationError:
    """What the store itself says about this password."""
    s = redcount.connect(url(server, password))
    try:
        with pytest.raises(redcount.AuthenticationError) as e:
            s.ping()
        return e.value
    finally:
        s.close()


def switch_lines(caplog: pytest.LogCaptureFixture) -> tuple[list[str], list[str]]:
    failed = [r.getMessage() for r in caplog.records if r.name == "redcount.web" and "store failed" in r.getMessage()]
    back = [r.getMessage() for r in caplog.records if r.name == "redcount.web" and "store is back" in r.getMessage()]
    return failed, back


# -- Flask ----------------------------------------------------------------------------------


def flask_app(server: RedisServer, password: str, **config: Any) -> Flask:
    app = Flask(__name__)
    app.config["REDCOUNT_URL"] = url(server, password)
    app.config["REDCOUNT_APPLICATION"] = "1000/minute"
    app.config.update(config)
    rl = redcount.flask.RateLimiter(app)

    @app.get("/limited")
    @rl.limit("100/minute")
    def limited() -> str:
        return "ok"

    return app


def test_flask_wrong_password_fails_open_then_recovers_with_one_log_line_per_switch(
    locked: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    app = flask_app(locked, WRONG)
    c = app.test_client()
    with caplog.at_level(logging.WARNING, logger="redcount.web"):
        for _ in range(5):
            r = c.get("/limited")
            assert r.status_code == 200 and r.get_data() == b"ok"
            assert "RateLimit" not in r.headers  # let through without the store
        failed, back = switch_lines(caplog)
        assert len(failed) == 1 and not back
        assert "AuthenticationError" in failed[0] and "failing open" in failed[0]
        # The password is rotated to the one the app has: limits are enforced again.
        locked.command("CONFIG", "SET", "requirepass", WRONG)
        locked.password = WRONG
        # The store reconnects after a back-off of its own: poll (bounded) until it decides.
        deadline = time.monotonic() + 5
        while "RateLimit" not in (r := c.get("/limited")).headers and time.monotonic() < deadline:
            time.sleep(0.05)
        assert r.status_code == 200 and r.headers["RateLimit"].startswith('"limited";r=')
        failed, back = switch_lines(caplog)
        assert len(failed) == 1 and len(back) == 1
    app.extensions["redcount"].limiter.store.close()


def test_flask_wrong_password_fails_closed_with_503(locked: RedisServer, caplog: pytest.LogCaptureFixture) -> None:
    app = flask_app(locked, WRONG, REDCOUNT_FAIL="closed")
    c = app.test_client()
    with caplog.at_level(logging.WARNING, logger="redcount.web"):
        for _ in range(3):
            r = c.get("/limited")
            assert r.status_code == 503 and r.headers["Retry-After"] == "1"
        failed, _ = switch_lines(caplog)
        assert len(failed) == 1 and "failing closed" in failed[0]
    app.extensions["redcount"].limiter.store.close()


@pytest.mark.parametrize("how", ["config", "argument"])
def test_flask_check_on_start_refuses_to_start_with_the_stores_message(locked: RedisServer, how: str) -> None:
    expected = str(store_error(locked, WRONG))
    app = Flask(__name__)
    app.config["REDCOUNT_URL"] = url(locked, WRONG)
    with pytest.raises(redcount.AuthenticationError) as e:
        if how == "config":
            app.config["REDCOUNT_CHECK_ON_START"] = "true"
            redcount.flask.RateLimiter(app)
        else:
            redcount.flask.RateLimiter(app, check_on_start=True)
    assert str(e.value) == expected
    # Off by default; with the right password the check passes.
    redcount.flask.RateLimiter(Flask(__name__), check_on_start=True, limiter=redcount.Limiter(redcount.connect()))
    good = Flask(__name__)
    good.config.update(REDCOUNT_URL=url(locked, RIGHT), REDCOUNT_CHECK_ON_START=True)
    redcount.flask.RateLimiter(good)
    good.extensions["redcount"].limiter.store.close()


# -- FastAPI --------------------------------------------------------------------------------


def fastapi_app(store: redcount.Store, **kw: Any) -> FastAPI:
    rl = redcount.fastapi.RateLimiter(redcount.aio.Limiter(store), default="1000/minute", **kw)
    app = FastAPI()
    app.add_middleware(redcount.fastapi.RateLimitMiddleware, ratelimiter=rl)

    @app.get("/limited", dependencies=[Depends(rl.limit("100/minute"))])
    async def limited() -> dict[str, str]:
        return {"ok": "yes"}

    return app


def run(app: FastAPI, scenario: Callable[[httpx.AsyncClient], Any]) -> None:
    async def main() -> None:
        transport = httpx.ASGITransport(app=app, client=("198.51.100.7", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            await scenario(client)

    asyncio.run(main())


@pytest.fixture
def wrong_store(locked: RedisServer) -> Iterator[redcount.Store]:
    s = redcount.connect(url(locked, WRONG))
    yield s
    s.close()


def test_fastapi_wrong_password_fails_open_then_recovers_with_one_log_line_per_switch(
    locked: RedisServer, wrong_store: redcount.Store, caplog: pytest.LogCaptureFixture
) -> None:
    app = fastapi_app(wrong_store)

    async def scenario(c: httpx.AsyncClient) -> None:
        for _ in range(5):
            r = await c.get("/limited")
            assert r.status_code == 200 and r.json() == {"ok": "yes"}
            assert "ratelimit" not in r.headers
        failed, back = switch_lines(caplog)
        assert len(failed) == 1 and not back
        assert "AuthenticationError" in failed[0] and "failing open" in failed[0]
        locked.command("CONFIG", "SET", "requirepass", WRONG)
        locked.password = WRONG
        # The store reconnects after a back-off of its own: poll (bounded) until it decides.
        deadline = time.monotonic() + 5
        while "ratelimit" not in (r := await c.get("/limited")).headers and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert r.status_code == 200 and r.headers["ratelimit"].startswith('"limited";r=')
        failed, back = switch_lines(caplog)
        assert len(failed) == 1 and len(back) == 1

    with caplog.at_level(logging.WARNING, logger="redcount.web"):
        run(app, scenario)


def test_fastapi_wrong_password_fails_closed_with_503(
    wrong_store: redcount.Store, caplog: pytest.LogCaptureFixture
) -> None:
    app = fastapi_app(wrong_store, fail="closed")

    async def scenario(c: httpx.AsyncClient) -> None:
        for _ in range(3):
            r = await c.get("/limited")
            assert r.status_code == 503 and r.headers["retry-after"] == "1"
        failed, _ = switch_lines(caplog)
        assert len(failed) == 1 and "failing closed" in failed[0]

    with caplog.at_level(logging.WARNING, logger="redcount.web"):
        run(app, scenario)


def test_fastapi_route_limit_alone_is_under_the_policy(wrong_store: redcount.Store) -> None:
    rl = redcount.fastapi.RateLimiter(redcount.aio.Limiter(wrong_store))
    app = FastAPI()

    @app.get("/limited", dependencies=[Depends(rl.limit("100/minute"))])
    async def limited() -> dict[str, str]:
        return {"ok": "yes"}

    async def scenario(c: httpx.AsyncClient) -> None:
        assert (await c.get("/limited")).status_code == 200

    run(app, scenario)


@pytest.mark.parametrize("how", ["argument", "environment"])
def test_fastapi_check_on_start_refuses_to_start_with_the_stores_message(
    locked: RedisServer, wrong_store: redcount.Store, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    expected = str(store_error(locked, WRONG))
    limiter = redcount.aio.Limiter(wrong_store)
    with pytest.raises(redcount.AuthenticationError) as e:
        if how == "argument":
            redcount.fastapi.RateLimiter(limiter, check_on_start=True)
        else:
            monkeypatch.setenv("REDCOUNT_CHECK_ON_START", "1")
            redcount.fastapi.RateLimiter(limiter)
    assert str(e.value) == expected
    monkeypatch.setenv("REDCOUNT_CHECK_ON_START", "1")
    redcount.fastapi.RateLimiter(limiter, check_on_start=False)  # an argument wins
    monkeypatch.setenv("REDCOUNT_CHECK_ON_START", "maybe")
    with pytest.raises(redcount.InvalidInputError, match="REDCOUNT_CHECK_ON_START"):
        redcount.fastapi.RateLimiter(limiter)
    monkeypatch.delenv("REDCOUNT_CHECK_ON_START")
    redcount.fastapi.RateLimiter(limiter)  # off by default: the start does not touch the store
    good = redcount.connect(url(locked, RIGHT))
    redcount.fastapi.RateLimiter(redcount.aio.Limiter(good), check_on_start=True)
    good.close()
