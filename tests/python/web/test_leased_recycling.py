"""Leased limits in web workers that are recycled under load, against a real redis-server:
gunicorn (2 sync workers, each replaced after a few requests by ``max_requests``) and
uvicorn (2 workers, each ending after a few requests by ``limit_max_requests`` and started
again by its supervisor). Every worker that ends gives its unused units back (it exits
through the interpreter, whose atexit returns them), so over the window exactly the limit is
admitted: nothing lost to recycled workers, nothing over."""

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
from helpers import AppServer, wait_for_fresh_window, wait_until

pytestmark = [pytest.mark.redis_only, pytest.mark.slow]

LIMIT = 120  # per day: the window never ends during the test (see wait_for_fresh_window)
LEASE = 10
MAX_REQUESTS = 15  # per worker, then it is replaced
CLIENTS = 8
BUDGET = 10 * LIMIT  # requests sent at most before giving up on reaching the limit

APP = """
    import os
    import redcount

    store = redcount.connect(os.environ["REDCOUNT_URL"])
    limiter = redcount.Limiter(store, prefix=os.environ["REDCOUNT_PREFIX"])
    LIMIT = os.environ["LIMIT"]
    LEASE = int(os.environ["LEASE"])

    def decide() -> tuple[str, int]:
        d = limiter.hit(LIMIT, "api:global", lease=LEASE)
        return str(os.getpid()), 200 if d else 429
"""

FLASK_APP = APP + """
    from flask import Flask

    app = Flask(__name__)

    @app.get("/health")
    def health():
        return str(os.getpid())

    @app.get("/hit")
    def hit():
        return decide()
"""

FASTAPI_APP = APP + """
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse

    app = FastAPI()

    @app.get("/health", response_class=PlainTextResponse)
    def health():
        return str(os.getpid())

    @app.get("/hit", response_class=PlainTextResponse)
    def hit():
        pid, status = decide()
        return PlainTextResponse(pid, status_code=status)
"""


def start(kind: str, tmp_path: Path, redis: RedisServer, prefix: str) -> AppServer:
    port = free_port()
    (tmp_path / "leased_app.py").write_text(textwrap.dedent(FLASK_APP if kind == "gunicorn" else FASTAPI_APP))
    env = dict(os.environ)
    env.update(
        REDCOUNT_URL=redis.url, REDCOUNT_PREFIX=prefix, LIMIT=f"{LIMIT}/day", LEASE=str(LEASE),
        PYTHONDONTWRITEBYTECODE="1",
    )  # fmt: skip
    if kind == "gunicorn":
        argv = [sys.executable, "-m", "gunicorn", "--workers", "2", "--bind", f"127.0.0.1:{port}",
                "--max-requests", str(MAX_REQUESTS), "--max-requests-jitter", "0",
                "--chdir", str(tmp_path), "--log-level", "warning", "leased_app:app"]  # fmt: skip
    else:
        argv = [sys.executable, "-m", "uvicorn", "leased_app:app", "--workers", "2", "--host", "127.0.0.1",
                "--port", str(port), "--app-dir", str(tmp_path), "--log-level", "warning",
                "--limit-max-requests", str(MAX_REQUESTS)]  # fmt: skip
    return AppServer(argv, env, tmp_path, port)


@pytest.fixture(params=["gunicorn", "uvicorn"])
def kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


def test_recycled_workers_lose_no_leased_units(kind: str, tmp_path: Path, redis_server: RedisServer) -> None:
    store = redcount.connect(redis_server.url)
    prefix = f"recycle:{uuid.uuid4().hex[:8]}"
    wait_for_fresh_window(store, 86400, 600)  # the burst takes well under 10 minutes
    server = start(kind, tmp_path, redis_server, prefix)
    statuses: list[int] = []
    pids: set[str] = set()
    try:
        server.wait_ready(2)
        # A connection per request, so the server spreads them over its workers.
        with httpx.Client(timeout=30, headers={"Connection": "close"}) as client:

            def hit(_: int) -> int:
                # A worker that is ending may close a connection unanswered: ask again (a
                # request that got no answer decided nothing the test counts).
                for _attempt in range(50):
                    try:
                        r = client.get(server.url + "/hit")
                    except httpx.TransportError:
                        continue
                    pids.add(r.text)
                    return r.status_code
                raise AssertionError("no answer in 50 attempts")

            def new_worker() -> bool:
                try:
                    pid = client.get(server.url + "/health").text
                except httpx.TransportError:
                    return False
                return pid not in pids

            with ThreadPoolExecutor(CLIENTS) as pool:
                while statuses.count(200) < LIMIT and len(statuses) < BUDGET:
                    statuses += pool.map(hit, range(4 * CLIENTS))
                    # A worker was replaced since (gunicorn does it every few requests; uvicorn
                    # looks at its count every 0.1 s), so each batch meets a recycled one.
                    wait_until(new_worker, 60, "a recycled worker")
                admitted = statuses.count(200)
                # Over the limit: nobody admits any more, whichever worker answers.
                after = list(pool.map(hit, range(4 * CLIENTS)))
    finally:
        server.stop()
    assert set(statuses + after) <= {200, 429}
    assert len(pids) > 4, f"workers were not recycled: {pids}"
    assert admitted == LIMIT, f"{admitted} admitted of {LIMIT} in {len(statuses)} requests"
    assert after.count(200) == 0
    lim = redcount.Limiter(store, prefix=prefix)
    assert lim.stats(f"{LIMIT}/day", "api:global")[0].count == LIMIT
    store.close()
