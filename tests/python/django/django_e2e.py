"""The Django project of the end-to-end tests (``e2e_project/``) served by real servers:
gunicorn (WSGI, 2 workers, threaded) and uvicorn (ASGI, 2 workers), on free loopback ports,
configured through ``E2E_*`` environment variables (see ``e2e_project/settings.py``).

Shared by the ``test_e2e_*.py`` modules of this folder; the server process itself is
:class:`helpers.AppServer`, the one the Flask and FastAPI end-to-end tests use.
"""

from __future__ import annotations

import os
import statistics
import sys
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from helpers import AppServer
from redcount.tools.servers import free_port

HERE = Path(__file__).resolve().parent
WORKERS = 2
THREADS = 8  # gunicorn threads per worker: 16 requests in flight at once across the two workers
KINDS = ("gunicorn", "uvicorn")


def start(kind: str, log_dir: Path, redis_url: str, cache_url: str | None = None, **settings: str) -> AppServer:
    """Start the project under ``kind`` (not yet ready: call ``wait_ready(WORKERS)``).
    ``settings`` are the ``E2E_*`` variables without the prefix (``FAIL="open"``)."""
    port = free_port()
    env = dict(os.environ)
    env.update(
        E2E_REDIS_URL=redis_url, E2E_CACHE_URL=cache_url or redis_url.rsplit("/", 1)[0] + "/1",
        E2E_PREFIX=f"e2e:{uuid.uuid4().hex[:8]}", PYTHONDONTWRITEBYTECODE="1",
        DJANGO_SETTINGS_MODULE="e2e_project.settings",
    )
    env.update({f"E2E_{k}": v for k, v in settings.items()})
    if kind == "gunicorn":
        argv = [sys.executable, "-m", "gunicorn", "--workers", str(WORKERS), "--worker-class", "gthread",
                "--threads", str(THREADS), "--bind", f"127.0.0.1:{port}", "--chdir", str(HERE),
                "--log-level", "warning", "e2e_project.wsgi:application"]
    else:
        argv = [sys.executable, "-m", "uvicorn", "e2e_project.asgi:application", "--workers", str(WORKERS),
                "--host", "127.0.0.1", "--port", str(port), "--app-dir", str(HERE), "--lifespan", "off",
                # uvicorn itself would otherwise believe X-Forwarded-For from 127.0.0.1 (its
                # default --forwarded-allow-ips) and hand Django the forwarded address: here
                # the peer is the socket's, and redcount's TRUSTED_PROXIES decides.
                "--no-proxy-headers", "--log-level", "warning", "--no-access-log"]
    log = log_dir / f"{kind}-{port}.log"
    return AppServer(argv, env, HERE, port, log=log)


def ready(servers: Sequence[AppServer]) -> None:
    """Wait until every worker of every server answers (the servers boot side by side)."""
    for srv in servers:
        srv.wait_ready(WORKERS)


def burst(url: str, n: int, clients: int, headers: Callable[[int], dict[str, str]] | None = None) -> list[httpx.Response]:
    """``n`` GETs of ``url`` from ``clients`` threads, a connection per request (so the server
    spreads them over its workers)."""
    with httpx.Client(timeout=30, headers={"Connection": "close"}) as client:

        def hit(i: int) -> httpx.Response:
            return client.get(url, headers=headers(i) if headers else None)

        with ThreadPoolExecutor(clients) as pool:
            return list(pool.map(hit, range(n)))


def statuses(responses: Sequence[httpx.Response]) -> dict[int, int]:
    out: dict[int, int] = {}
    for r in responses:
        out[r.status_code] = out.get(r.status_code, 0) + 1
    return out


def p99(values: Sequence[float]) -> float:
    return statistics.quantiles(values, n=100)[98] if len(values) >= 2 else (values[0] if values else 0.0)

