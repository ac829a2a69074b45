"""End to end: the Django project of ``e2e_project/`` under gunicorn (WSGI, 2 threaded
workers) and uvicorn (ASGI, 2 workers) against a real redis-server, hit by concurrent clients.

Across both workers exactly the limit is admitted, whether the middleware, the decorator or
the django-ratelimit drop-in decides, on sync views (gunicorn) and async views (uvicorn: the
middleware awaits ``redcount.aio``); refusals carry the IETF headers and Retry-After; a
spoofed X-Forwarded-For changes nothing unless the peer is a trusted proxy; a killed or
frozen Redis under ``FAIL="open"`` lets requests through, none slower than the budget plus
50 ms.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator

import httpx
import pytest
from redcount.tools.servers import RedisServer
from django_e2e import KINDS, WORKERS, burst, ready, start, statuses
from helpers import AppServer

pytestmark = [pytest.mark.redis_only, pytest.mark.slow]

LIMIT = 25
REQUESTS = 100
CLIENTS = 24
VIEWS = {"gunicorn": ("/mw/sync", "/deco/sync", "/dropin/sync"), "uvicorn": ("/mw/async", "/deco/async", "/dropin/async")}


@pytest.fixture(scope="module")
def servers(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[tuple[str, bool], AppServer]]:
    """The project under both servers, ``(kind, trusted)``: trusted, the loopback peer (the
    test) is a trusted proxy. Limits are counted by the exact sliding log (a burst admits
    exactly the limit wherever the window boundaries fall)."""
    logs = tmp_path_factory.mktemp("django-e2e")
    started: dict[tuple[str, bool], AppServer] = {}
    with contextlib.ExitStack() as stop:  # every server started is stopped, also when a later one fails
        for kind in KINDS:
            for trusted in (False, True):
                srv = start(kind, logs, redis_server.url, STRATEGY="sliding-window", LIMIT=f"{LIMIT}/minute",
                            TRUSTED_PROXIES="127.0.0.1/32" if trusted else "")
                stop.callback(srv.stop)
                started[kind, trusted] = srv
        ready(list(started.values()))
        yield started


@pytest.fixture
def fresh(redis_server: RedisServer) -> None:
    """Every limit of the test starts from zero."""
    redis_server.command("FLUSHALL")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("which", [0, 1, 2], ids=["middleware", "decorator", "django-ratelimit-dropin"])
def test_exactly_the_limit_is_admitted_across_workers_with_headers(
    servers: dict[tuple[str, bool], AppServer], fresh: None, kind: str, which: int
) -> None:
    server = servers[kind, False]
    view = VIEWS[kind][which]
    responses = burst(server.url + view, REQUESTS, CLIENTS)
    admitted = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 429]
    assert len(admitted) == LIMIT, statuses(responses)
    assert len(refused) == REQUESTS - LIMIT, statuses(responses)
    assert len({r.headers["X-Worker"] for r in responses}) == WORKERS, "one worker served every request"
    # Every admitted response saw a different count: as if one process had decided them all.
    assert sorted(int(r.headers["X-RateLimit-Remaining"]) for r in admitted) == list(range(LIMIT))
    name = responses[0].headers["RateLimit-Policy"].split(";")[0].strip('"')
    for r in admitted:
        assert r.headers["RateLimit-Policy"] == f'"{name}";q={LIMIT};w=60'
        assert r.headers["RateLimit"].startswith(f'"{name}";r=')
        assert "retry-after" not in r.headers
    for r in refused:
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["status"] == 429
        assert r.headers["RateLimit-Policy"] == f'"{name}";q={LIMIT};w=60'
        assert r.headers["RateLimit"].startswith(f'"{name}";r=0;t=')
        t = int(r.headers["RateLimit"].rsplit("t=", 1)[1])
        retry = int(r.headers["Retry-After"])
        assert 1 <= retry <= 60 and retry >= t
        assert r.headers["X-RateLimit-Remaining"] == "0" and r.headers["X-RateLimit-Limit"] == str(LIMIT)
        for header in ("ratelimit", "ratelimit-policy", "retry-after"):
            assert len(r.headers.get_list(header)) == 1


def spoofed(i: int) -> dict[str, str]:
    """A new made-up client address on every request, as a limiter-dodging client sends."""
    return {"X-Forwarded-For": f"203.0.{i // 250}.{i % 250 + 1}"}


@pytest.mark.parametrize("kind", KINDS)
def test_spoofed_forwarded_for_is_ignored_from_an_untrusted_peer(
    servers: dict[tuple[str, bool], AppServer], fresh: None, kind: str
) -> None:
    responses = burst(servers[kind, False].url + VIEWS[kind][0], REQUESTS, CLIENTS, headers=spoofed)
    assert statuses(responses) == {200: LIMIT, 429: REQUESTS - LIMIT}


@pytest.mark.parametrize("kind", KINDS)
def test_forwarded_for_counts_from_a_trusted_proxy(
    servers: dict[tuple[str, bool], AppServer], fresh: None, kind: str
) -> None:
    url = servers[kind, True].url + VIEWS[kind][0]
    # Each forwarded client is its own client: none of them reaches the limit.
    assert statuses(burst(url, REQUESTS, CLIENTS, headers=spoofed)) == {200: REQUESTS}
    # One forwarded client, however many connections, is one client.
    one = burst(url, LIMIT + 10, CLIENTS, headers=lambda i: {"X-Forwarded-For": "198.51.100.7"})
    assert statuses(one) == {200: LIMIT, 429: 10}


BUDGET = 0.1
BOUND = BUDGET + 0.05


HOWS = ("killed", "frozen")


@pytest.fixture(scope="module")
def failing(redis_session_factory: Callable[..., RedisServer], tmp_path_factory: pytest.TempPathFactory,
            ) -> Iterator[dict[tuple[str, str], tuple[AppServer, RedisServer]]]:
    """``(kind, how)``: the project with ``FAIL="open"`` and a 100 ms budget on a Redis of its
    own, which the test kills or freezes (SIGSTOP: connections stay open, nothing answers)."""
    logs = tmp_path_factory.mktemp("django-e2e-down")
    started: dict[tuple[str, str], tuple[AppServer, RedisServer]] = {}
    try:
        for kind in KINDS:
            for how in HOWS:
                redis = redis_session_factory()
                started[kind, how] = (start(kind, logs, redis.url, LIMIT=f"{LIMIT}/minute", FAIL="open",
                                            BUDGET=str(BUDGET)), redis)
        ready([srv for srv, _ in started.values()])
        yield started
    finally:
        for srv, redis in started.values():
            if redis.proc is not None and redis.proc.poll() is None:
                os.kill(redis.proc.pid, signal.SIGCONT)
            srv.stop()


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("kind", KINDS)
def test_redis_down_fail_open_within_the_budget(
    failing: dict[tuple[str, str], tuple[AppServer, RedisServer]], kind: str, how: str
) -> None:
    server, redis = failing[kind, how]
    assert redis.proc is not None
    view = server.url + VIEWS[kind][0]
    with httpx.Client(timeout=10, headers={"Connection": "close"}) as c:
        workers = set()
        for _ in range(50):  # until each worker has connected to Redis and decided
            r = c.get(view)
            assert r.status_code == 200 and "RateLimit" in r.headers, r.headers
            workers.add(r.headers["X-Worker"])
            if len(workers) == WORKERS:
                break
        assert len(workers) == WORKERS
        if how == "killed":
            os.kill(redis.proc.pid, signal.SIGKILL)
            redis.proc.wait()
        else:
            os.kill(redis.proc.pid, signal.SIGSTOP)
        took = []
        for _ in range(20):  # one after another: each time is the request's own
            t0 = time.perf_counter()
            r = c.get(view)
            took.append(time.perf_counter() - t0)
            assert r.status_code == 200, r.text
    assert max(took) < BOUND, [round(t * 1000, 1) for t in took]
