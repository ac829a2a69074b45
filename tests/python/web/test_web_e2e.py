"""End to end: real servers with 4 worker processes each (gunicorn for Flask, uvicorn for
FastAPI), started on free loopback ports against a real redis-server, hit by concurrent
clients. Across all workers exactly the limit is admitted in the window; every other
request gets a 429 with correct headers."""

from __future__ import annotations

import os
import sys
import textwrap
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import redcount
from conftest import RedisServer, free_port
from helpers import AppServer, wait_for_fresh_window

pytestmark = [pytest.mark.redis_only, pytest.mark.slow]

LIMIT = 25
REQUESTS = 120
CLIENTS = 24

FLASK_APP = """
    import os
    import redcount, redcount.flask
    from flask import Flask

    app = Flask(__name__)
    app.config.update(
        REDCOUNT_URL=os.environ["REDCOUNT_URL"], REDCOUNT_PREFIX=os.environ["REDCOUNT_PREFIX"],
        REDCOUNT_STRATEGY=os.environ["REDCOUNT_STRATEGY"], REDCOUNT_HEADERS="all",
        REDCOUNT_BUDGET=os.environ["BUDGET"],
    )
    rl = redcount.flask.RateLimiter(app)

    @app.get("/health")
    @rl.exempt
    def health():
        return str(os.getpid())

    @app.get("/limited")
    @rl.limit(os.environ["LIMIT"], name="limited")
    def limited():
        return str(os.getpid())
"""

FASTAPI_APP = """
    import os
    import redcount, redcount.aio
    from fastapi import Depends, FastAPI
    from fastapi.responses import PlainTextResponse
    from redcount.fastapi import RateLimiter, RateLimitMiddleware

    store = redcount.connect(os.environ["REDCOUNT_URL"])
    limiter = redcount.aio.Limiter(store, os.environ["REDCOUNT_STRATEGY"], prefix=os.environ["REDCOUNT_PREFIX"])
    rl = RateLimiter(limiter, headers="all", budget=float(os.environ["BUDGET"]))
    app = FastAPI()
    app.add_middleware(RateLimitMiddleware, ratelimiter=rl)

    @app.get("/health", response_class=PlainTextResponse)
    def health():
        return str(os.getpid())

    @app.get("/limited", response_class=PlainTextResponse,
             dependencies=[Depends(rl.limit(os.environ["LIMIT"], name="limited"))])
    async def limited():
        return str(os.getpid())
"""


def start(kind: str, tmp_path: Path, redis: RedisServer, strategy: str) -> AppServer:
    port = free_port()
    source = FLASK_APP if kind == "flask" else FASTAPI_APP
    (tmp_path / f"{kind}_app.py").write_text(textwrap.dedent(source))
    env = dict(os.environ)
    env.update(
        REDCOUNT_URL=redis.url, REDCOUNT_PREFIX=f"e2e:{uuid.uuid4().hex[:8]}", REDCOUNT_STRATEGY=strategy,
        LIMIT=f"{LIMIT}/minute", PYTHONDONTWRITEBYTECODE="1",
        # Exact counts need every check decided by Redis. The default request budget (0.1 s)
        # lets a request through undecided when the burst on a shared 2-core machine keeps a
        # fresh worker's first calls waiting longer than that; this test is about counting.
        BUDGET="5",
    )
    if kind == "flask":
        argv = [sys.executable, "-m", "gunicorn", "--workers", "4", "--bind", f"127.0.0.1:{port}",
                "--chdir", str(tmp_path), "--log-level", "warning", "flask_app:app"]
    else:
        argv = [sys.executable, "-m", "uvicorn", "fastapi_app:app", "--workers", "4", "--host", "127.0.0.1",
                "--port", str(port), "--app-dir", str(tmp_path), "--log-level", "warning"]
    return AppServer(argv, env, tmp_path, port)


@pytest.fixture(params=[("flask", "fixed-window"), ("fastapi", "sliding-window")], ids=["gunicorn-flask", "uvicorn-fastapi"])
def server(request: pytest.FixtureRequest, tmp_path: Path, redis_server: RedisServer) -> Iterator[AppServer]:
    kind, strategy = request.param
    srv = start(kind, tmp_path, redis_server, strategy)
    try:
        srv.wait_ready(4)
        yield srv
    finally:
        srv.stop()


def test_exactly_the_limit_is_admitted_across_four_workers(server: AppServer) -> None:
    wait_for_fresh_window(redcount.connect(), 60, 30)  # the burst takes a few seconds at most
    # A connection per request, so the server spreads them over its workers.
    with httpx.Client(timeout=30, headers={"Connection": "close"}) as client:

        def hit(_: int) -> httpx.Response:
            return client.get(server.url + "/limited")

        with ThreadPoolExecutor(CLIENTS) as pool:
            responses = list(pool.map(hit, range(REQUESTS)))

    admitted = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 429]
    assert len(admitted) == LIMIT, [r.status_code for r in responses]
    assert len(refused) == REQUESTS - LIMIT
    assert len({r.text for r in admitted}) >= 2, "one worker served every admitted request"
    # Every admitted response saw a different count: the remaining values are exactly
    # LIMIT-1 .. 0, once each, as if one process had decided them all.
    assert sorted(int(r.headers["X-RateLimit-Remaining"]) for r in admitted) == list(range(LIMIT))
    for r in admitted:
        assert r.headers["RateLimit-Policy"] == f'"limited";q={LIMIT};w=60'
        assert "retry-after" not in r.headers
    for r in refused:
        assert r.headers["content-type"].startswith("application/")
        assert r.headers["RateLimit-Policy"] == f'"limited";q={LIMIT};w=60'
        assert r.headers["RateLimit"].startswith('"limited";r=0;t=')
        t = int(r.headers["RateLimit"].rsplit("t=", 1)[1])
        retry = int(r.headers["Retry-After"])
        assert 1 <= retry <= 60 and retry >= t
        assert r.headers["X-RateLimit-Remaining"] == "0" and r.headers["X-RateLimit-Limit"] == str(LIMIT)
        for name in ("ratelimit", "ratelimit-policy", "retry-after"):
            assert len(r.headers.get_list(name)) == 1
