"""Allow and deny lists and the refusal cache in the Flask and FastAPI integrations, on
both stores: decided before any round trip, with the usual refusal answer."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import redcount
import redcount.aio
import redcount.fastapi
import redcount.flask
from fastapi import Depends, FastAPI
from flask import Flask

pytestmark = pytest.mark.usefixtures("away_from_minute_boundary")


@pytest.fixture
def away_from_minute_boundary() -> None:
    from helpers import wait_for_fresh_window

    wait_for_fresh_window(redcount.connect(), 60, 10)


def flask_app(store: redcount.Store, config: dict[str, Any], **kw: Any) -> Flask:
    app = Flask(__name__)
    app.config.update(config)
    rl = redcount.flask.RateLimiter(app, limiter=redcount.Limiter(store), headers="all", **kw)

    @app.get("/")
    @rl.limit("1/minute")
    def index() -> str:
        return "ok"

    return app


def get(app: Flask, ip: str) -> Any:
    return app.test_client().get("/", environ_base={"REMOTE_ADDR": ip})


@pytest.mark.parametrize("how", ["config", "arguments"])
def test_flask_lists(store: redcount.Store, how: str) -> None:
    allow, deny = "10.0.0.0/8, 2001:db8::/32", ["203.0.113.0/24"]
    if how == "config":
        app = flask_app(store, {"REDCOUNT_ALLOW": allow, "REDCOUNT_DENY": deny})
    else:
        app = flask_app(store, {}, allow=allow.split(", "), deny=deny)
    for _ in range(3):
        r = get(app, "10.1.2.3")
        assert r.status_code == 200 and "RateLimit" not in r.headers  # not checked, not counted
        assert get(app, "2001:db8::7").status_code == 200
    no = get(app, "203.0.113.9")
    assert no.status_code == 429 and no.headers["Retry-After"] == "86400"
    assert no.headers["Content-Type"] == "application/problem+json"
    assert get(app, "192.0.2.1").status_code == 200 and get(app, "192.0.2.1").status_code == 429
    keys = store.execute("KEYS", "redcount:lim:*")
    assert keys and all(b"192.0.2.1" in k for k in keys)  # only the unlisted client was counted


def test_flask_bad_entries_fail_at_start_up(store: redcount.Store) -> None:
    with pytest.raises(redcount.InvalidInputError, match="10.0.0.1/8"):
        flask_app(store, {"REDCOUNT_DENY": "10.0.0.1/8"})
    with pytest.raises(redcount.InvalidInputError, match="REDCOUNT_REFUSAL_CACHE"):
        flask_app(store, {"REDCOUNT_REFUSAL_CACHE": "many"})


def test_flask_refusal_cache(store: redcount.Store) -> None:
    app = flask_app(store, {"REDCOUNT_REFUSAL_CACHE": "100"})
    assert get(app, "192.0.2.1").status_code == 200
    first = get(app, "192.0.2.1")
    assert first.status_code == 429
    cache = app.extensions["redcount"].settings.screen.cache
    assert cache.hits == 0
    for _ in range(5):
        r = get(app, "192.0.2.1")
        assert r.status_code == 429 and int(r.headers["Retry-After"]) <= int(first.headers["Retry-After"])
    assert cache.hits == 5
    assert get(app, "192.0.2.2").status_code == 200


def run(app: Any, peer: str, n: int) -> list[httpx.Response]:
    async def main() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app, client=(peer, 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return [await client.get("/") for _ in range(n)]

    return asyncio.run(main())


def test_fastapi_lists_and_cache(store: redcount.Store) -> None:
    rl = redcount.fastapi.RateLimiter(
        redcount.aio.Limiter(store), headers="all", allow=["10.0.0.0/8"], deny=["user:banned", "203.0.113.9"],
        refusal_cache=50,
    )
    app = FastAPI()

    @app.get("/", dependencies=[Depends(rl.limit("1/minute"))])
    async def index() -> str:
        return "ok"

    assert [r.status_code for r in run(app, "10.0.0.5", 3)] == [200, 200, 200]
    denied = run(app, "203.0.113.9", 1)[0]
    assert denied.status_code == 429 and denied.headers["Retry-After"] == "86400"
    assert [r.status_code for r in run(app, "192.0.2.1", 4)] == [200, 429, 429, 429]
    assert rl.settings.screen.cache.hits == 2  # type: ignore[union-attr]
    with pytest.raises(redcount.InvalidInputError, match="allow"):
        redcount.fastapi.RateLimiter(redcount.aio.Limiter(store), allow=["10.0.0.0/33"])


def test_a_penalty_through_the_integrations(store: redcount.Store) -> None:
    """A limiter built with a penalty blocks a client in Flask and FastAPI alike."""
    limiter = redcount.Limiter(store, penalty=redcount.Penalty(after=2, within=60, block=600))
    app = Flask(__name__)
    rl = redcount.flask.RateLimiter(app, limiter=limiter, headers="all")

    @app.get("/")
    @rl.limit("1/minute")
    def index() -> str:
        return "ok"

    codes = [get(app, "192.0.2.9") for _ in range(4)]
    assert [r.status_code for r in codes] == [200, 429, 429, 429]
    assert codes[2].headers["Retry-After"] == "600"  # the 2nd refusal started the block
    assert 590 <= int(codes[3].headers["Retry-After"]) <= 600

    frl = redcount.fastapi.RateLimiter(redcount.aio.Limiter.from_sync(limiter), headers="all")
    fapp = FastAPI()

    @fapp.get("/", dependencies=[Depends(frl.limit("1/minute", key=lambda r: "fastapi-client"))])
    async def findex() -> str:
        return "ok"

    rs = run(fapp, "192.0.2.10", 4)
    assert [r.status_code for r in rs] == [200, 429, 429, 429] and rs[2].headers["Retry-After"] == "600"


def test_flask_penalty_setting(store: redcount.Store) -> None:
    app = Flask(__name__)
    app.config.update(REDCOUNT_PENALTY={"after": 1, "within": 60, "block": 300}, REDCOUNT_HEADERS="all")
    rl = redcount.flask.RateLimiter(app)

    @app.get("/")
    @rl.limit("1/minute")
    def index() -> str:
        return "ok"

    assert get(app, "192.0.2.3").status_code == 200
    assert get(app, "192.0.2.3").headers["Retry-After"] == "300"
    assert app.extensions["redcount"].limiter.penalty == redcount.Penalty(after=1, within=60, block=300)
    bad = Flask(__name__)
    bad.config.update(REDCOUNT_PENALTY={"after": 0})
    with pytest.raises(redcount.InvalidInputError, match="REDCOUNT_PENALTY"):
        redcount.flask.RateLimiter(bad)
    mixed = Flask(__name__)
    mixed.config.update(REDCOUNT_PENALTY=redcount.Penalty())
    with pytest.raises(redcount.InvalidInputError, match="penalty="):
        redcount.flask.RateLimiter(mixed, limiter=redcount.Limiter(store))


def test_fastapi_penalty_setting(store: redcount.Store) -> None:
    rl = redcount.fastapi.RateLimiter(headers="all", penalty={"after": 1, "within": 60, "block": 300})
    assert rl.limiter.sync.penalty == redcount.Penalty(after=1, within=60, block=300)
    app = FastAPI()

    @app.get("/", dependencies=[Depends(rl.limit("1/minute"))])
    async def index() -> str:
        return "ok"

    rs = run(app, "192.0.2.4", 3)
    assert [r.status_code for r in rs] == [200, 429, 429] and rs[1].headers["Retry-After"] == "300"
    with pytest.raises(redcount.InvalidInputError, match="penalty"):
        redcount.fastapi.RateLimiter(penalty={"after": 0})
    with pytest.raises(redcount.InvalidInputError, match="penalty="):
        redcount.fastapi.RateLimiter(redcount.aio.Limiter(store), penalty=redcount.Penalty())
