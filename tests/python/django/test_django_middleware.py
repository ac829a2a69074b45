"""redcount.django.RateLimitMiddleware: default and per-path limits, headers, the refusal
answer, trusted proxies, the failure policy with a dead or frozen Redis, sync and async."""

from __future__ import annotations

# First: configures Django before anything imports it.
from redcount_django_fixtures import *  # noqa: F403  (the fixtures)

import asyncio
import json
import os
import signal
import time
from typing import Any

import pytest
from django.http import HttpResponse

import redcount.django


def statuses(client: Any, path: str, n: int, **extra: Any) -> list[int]:
    return [client.get(path, **extra).status_code for _ in range(n)]


def test_default_limits_count_once_across_the_site(client: Any, configure: Any, store_url: str) -> None:
    configure(URL=store_url, DEFAULT_LIMITS="3/minute")
    assert [client.get(p).status_code for p in ("/plain/", "/health/", "/plain/", "/sync_view/")] == [200, 200, 200, 429]


def test_refusal_is_problem_json_with_ietf_headers(client: Any, configure: Any, store_url: str) -> None:
    configure(URL=store_url, DEFAULT_LIMITS="2/minute")
    first = client.get("/plain/")
    assert first.status_code == 200
    assert first["RateLimit-Policy"] == '"default";q=2;w=60'
    assert first["RateLimit"].startswith('"default";r=1;t=')
    assert "Retry-After" not in first
    client.get("/plain/")
    refused = client.get("/plain/")
    assert refused.status_code == 429
    assert refused["Content-Type"] == "application/problem+json"
    body = json.loads(refused.content)
    assert body["status"] == 429 and body["violated-policies"] == ["default"]
    assert int(refused["Retry-After"]) >= 1
    assert refused["RateLimit"].startswith('"default";r=0;t=')


def test_several_default_limits_each_hold(client: Any, configure: Any) -> None:
    configure(DEFAULT_LIMITS=["5/minute", "2/hour"])
    assert statuses(client, "/plain/", 3) == [200, 200, 429]
    assert client.get("/plain/")["RateLimit-Policy"] == '"default";q=5;w=60, "default-2";q=2;w=3600'


def test_per_path_limits_longest_prefix_and_exemption(client: Any, configure: Any) -> None:
    configure(DEFAULT_LIMITS="100/minute", PATHS={"/health/": None, "/sync_view/": "1/minute", "/rl_": "50/minute"})
    assert statuses(client, "/health/deep/", 5) == [200] * 5  # a prefix with None: no limit at all
    assert "RateLimit" not in client.get("/health/")
    # /sync_view/ has a path limit (and the view's own 3/minute)
    assert statuses(client, "/sync_view/", 2) == [200, 429]
    # "/rl_" does not end with "/": it matches that exact path only, not /rl_ip/
    r = client.get("/rl_tuple/")
    assert '"/rl_"' not in r["RateLimit-Policy"]


def test_path_limit_counts_per_entry(client: Any, configure: Any) -> None:
    configure(PATHS={"/api/": "2/minute"})
    assert [client.get(p).status_code for p in ("/api/anon/", "/api/user/", "/api/scoped/")] == [200, 200, 429]
    assert client.get("/plain/").status_code == 200


@pytest.mark.parametrize(
    ("headers", "present", "absent"),
    [
        ("legacy", ["X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"], ["RateLimit", "Retry-After"]),
        ("all", ["RateLimit", "X-RateLimit-Limit", "Retry-After"], []),
        ("none", [], ["RateLimit", "RateLimit-Policy", "X-RateLimit-Limit", "Retry-After"]),
        (["ietf"], ["RateLimit", "RateLimit-Policy"], ["Retry-After"]),
    ],
)
def test_header_sets(client: Any, configure: Any, headers: Any, present: list[str], absent: list[str]) -> None:
    configure(DEFAULT_LIMITS="1/minute", HEADERS=headers)
    client.get("/plain/")
    refused = client.get("/plain/")
    assert refused.status_code == 429
    for name in present:
        assert name in refused, name
    for name in absent:
        assert name not in refused, name


def too_many(request: Any, exception: redcount.django.RateLimitExceeded) -> HttpResponse:
    return HttpResponse(f"slow down: {exception.problem['retry_after']}", status=429, content_type="text/plain")


def test_refusal_view_of_the_users_choice(client: Any, configure: Any) -> None:
    configure(DEFAULT_LIMITS="1/minute", VIEW="test_django_middleware.too_many")
    client.get("/plain/")
    r = client.get("/plain/")
    assert r.status_code == 429 and r.content.startswith(b"slow down: ")
    assert r["Content-Type"] == "text/plain" and "RateLimit" in r and "Retry-After" in r


def test_spoofed_forwarded_for_is_ignored_unless_the_proxy_is_trusted(client: Any, configure: Any) -> None:
    configure(DEFAULT_LIMITS="1/minute")
    # no trusted proxy: every request from 10.0.0.1 is one client, whatever it claims
    assert client.get("/plain/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="1.1.1.1").status_code == 200
    assert client.get("/plain/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="2.2.2.2").status_code == 429
    configure(DEFAULT_LIMITS="1/minute", TRUSTED_PROXIES=["10.0.0.0/8"])
    assert client.get("/plain/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="1.1.1.1").status_code == 200
    assert client.get("/plain/", REMOTE_ADDR="10.0.0.1", HTTP_X_FORWARDED_FOR="2.2.2.2").status_code == 200
    assert client.get("/plain/", REMOTE_ADDR="10.0.0.2", HTTP_X_FORWARDED_FOR="1.1.1.1").status_code == 429
    # a peer outside the trusted networks is not believed
    assert client.get("/plain/", REMOTE_ADDR="192.0.2.5", HTTP_X_FORWARDED_FOR="3.3.3.3").status_code == 200
    assert client.get("/plain/", REMOTE_ADDR="192.0.2.5", HTTP_X_FORWARDED_FOR="4.4.4.4").status_code == 429


def test_default_key_from_settings(client: Any, configure: Any) -> None:
    configure(DEFAULT_LIMITS="1/minute", KEY="user")
    assert client.get("/plain/", HTTP_X_TEST_USER="1").status_code == 200
    assert client.get("/plain/", HTTP_X_TEST_USER="2").status_code == 200
    assert client.get("/plain/", HTTP_X_TEST_USER="1").status_code == 429


def test_enabled_false_and_shadow_never_refuse(client: Any, configure: Any) -> None:
    configure(DEFAULT_LIMITS="1/minute", ENABLED=False)
    assert statuses(client, "/plain/", 3) == [200, 200, 200]
    assert "RateLimit" not in client.get("/plain/")
    configure(DEFAULT_LIMITS="1/minute", SHADOW=True)
    assert statuses(client, "/plain/", 3) == [200, 200, 200]


def test_exempt_views_skip_the_middleware_limits_only(client: Any, configure: Any) -> None:
    configure(DEFAULT_LIMITS="2/minute", PATHS={"/api/": "2/minute"})
    # Function and class-based views marked exempt: no middleware limit, no headers from it.
    for path in ("/exempt/", "/exemptcbv/"):
        responses = [client.get(path) for _ in range(4)]
        assert [r.status_code for r in responses] == [200] * 4
        assert all("RateLimit" not in r for r in responses)
    # The exempt requests were not counted: the default limit still has both hits.
    assert statuses(client, "/plain/", 3) == [200, 200, 429]
    # A view's own limit still holds on an exempt view, and a DRF throttle on an exempt APIView.
    assert statuses(client, "/exempt_limited/", 3) == [200, 200, 429]
    assert statuses(client, "/api/exempt/", 4) == [200, 200, 200, 429]  # the anon throttle: 3/minute
    # An unknown URL is not exempt: the middleware decides (and refuses) before Django's 404.
    assert client.get("/no-such-page/").status_code == 429


def test_exempt_refuses_what_is_not_a_view() -> None:
    with pytest.raises(TypeError, match="decorates a view"):
        redcount.django.exempt("health")  # type: ignore[type-var]


@pytest.mark.asyncio
async def test_async_middleware_skips_exempt_views(async_client: Any, configure: Any) -> None:
    configure(DEFAULT_LIMITS="1/minute")
    codes = [(await async_client.get("/aexempt/")).status_code for _ in range(3)]
    assert codes == [200, 200, 200]
    assert [(await async_client.get("/aplain/")).status_code for _ in range(2)] == [200, 429]


@pytest.mark.asyncio
async def test_async_middleware_counts_and_refuses(async_client: Any, configure: Any, store_url: str) -> None:
    configure(URL=store_url, DEFAULT_LIMITS="2/minute")
    codes = [(await async_client.get("/aplain/")).status_code for _ in range(3)]
    assert codes == [200, 200, 429]
    r = await async_client.get("/aplain/")
    assert r["Content-Type"] == "application/problem+json" and int(r["Retry-After"]) >= 1


@pytest.mark.asyncio
async def test_async_middleware_loads_the_user_without_blocking_calls(async_client: Any, configure: Any) -> None:
    # request.user refuses to load on the event loop (as a session lookup would): the
    # middleware must use await request.auser()
    configure(DEFAULT_LIMITS="1/minute", KEY="user")
    assert (await async_client.get("/aplain/", headers={"X-Test-User": "7"})).status_code == 200
    assert (await async_client.get("/aplain/", headers={"X-Test-User": "8"})).status_code == 200
    assert (await async_client.get("/aplain/", headers={"X-Test-User": "7"})).status_code == 429


# -- a store that is down or frozen -----------------------------------------------------------


def test_fail_open_lets_requests_through_without_headers(client: Any, configure: Any, redis_factory: Any) -> None:
    server = redis_factory()
    configure(URL=server.url, DEFAULT_LIMITS="1/minute", FAIL="open", BUDGET=0.2)
    assert client.get("/plain/").status_code == 200
    server.kill()
    for _ in range(3):
        r = client.get("/plain/")
        assert r.status_code == 200 and "RateLimit" not in r


def test_fail_closed_answers_503(client: Any, configure: Any, redis_factory: Any) -> None:
    server = redis_factory()
    configure(URL=server.url, DEFAULT_LIMITS="5/minute", FAIL="closed", BUDGET=0.2)
    assert client.get("/plain/").status_code == 200
    server.kill()
    r = client.get("/plain/")
    assert r.status_code == 503
    assert r["Retry-After"] == "1" and r["Content-Type"] == "application/problem+json"
    assert json.loads(r.content)["status"] == 503


@pytest.mark.asyncio
async def test_async_fail_closed_and_open(async_client: Any, configure: Any, redis_factory: Any) -> None:
    server = redis_factory()
    configure(URL=server.url, DEFAULT_LIMITS="5/minute", FAIL="closed", BUDGET=0.2)
    assert (await async_client.get("/aplain/")).status_code == 200
    server.kill()
    assert (await async_client.get("/aplain/")).status_code == 503
    configure(URL=server.url, DEFAULT_LIMITS="5/minute", FAIL="open", BUDGET=0.2)
    assert (await async_client.get("/aplain/")).status_code == 200


@pytest.mark.asyncio
async def test_async_middleware_never_blocks_the_loop_on_a_frozen_redis(
    async_client: Any, configure: Any, redis_factory: Any, stopped: list[Any]
) -> None:
    server = redis_factory()
    configure(URL=server.url, DEFAULT_LIMITS="5/minute", FAIL="open", BUDGET=0.3)
    assert (await async_client.get("/aplain/")).status_code == 200
    os.kill(server.proc.pid, signal.SIGSTOP)
    stopped.append(server)
    ticks = 0
    done = False

    async def ticker() -> None:
        nonlocal ticks
        while not done:
            await asyncio.sleep(0.01)
            ticks += 1

    task = asyncio.create_task(ticker())
    started = time.monotonic()
    r = await async_client.get("/aplain/")
    waited = time.monotonic() - started
    done = True
    await task
    assert r.status_code == 200 and "RateLimit" not in r
    # the loop kept running while the request waited on the frozen store for its budget
    assert waited >= 0.2 and ticks >= 5


def test_metrics(client: Any, configure: Any) -> None:
    from prometheus_client import CollectorRegistry

    from redcount.web.metrics import PrometheusMetrics

    reg = CollectorRegistry()
    configure(DEFAULT_LIMITS="1/minute", METRICS=PrometheusMetrics(reg))
    assert statuses(client, "/plain/", 2) == [200, 429]
    assert reg.get_sample_value("redcount_decisions_total", {"limit": "default", "result": "allowed"}) == 1
    assert reg.get_sample_value("redcount_decisions_total", {"limit": "default", "result": "denied"}) == 1


async def atoo_many(request: Any, exception: redcount.django.RateLimitExceeded) -> HttpResponse:
    return HttpResponse("async slow down", status=429)


def test_an_async_refusal_view_under_wsgi(client: Any, configure: Any) -> None:
    configure(DEFAULT_LIMITS="1/minute", VIEW=atoo_many)
    client.get("/plain/")
    r = client.get("/plain/")
    assert r.status_code == 429 and r.content == b"async slow down" and "Retry-After" in r


@pytest.mark.asyncio
async def test_refusal_views_under_asgi(async_client: Any, configure: Any) -> None:
    configure(DEFAULT_LIMITS="1/minute", VIEW=atoo_many)
    await async_client.get("/aplain/")
    r = await async_client.get("/aplain/")
    assert r.status_code == 429 and r.content == b"async slow down" and "RateLimit" in r
    configure(DEFAULT_LIMITS="1/minute", VIEW=too_many)
    await async_client.get("/aplain/")
    r = await async_client.get("/aplain/")
    assert r.status_code == 429 and r.content.startswith(b"slow down")


def test_fallback_store_keeps_limiting_while_redis_is_down(client: Any, configure: Any, redis_factory: Any) -> None:
    server = redis_factory()
    configure(URL=server.url, DEFAULT_LIMITS="2/minute", BUDGET=0.05, FALLBACK="memory://")
    assert client.get("/plain/").status_code == 200
    server.kill()
    # the embedded fallback decides (counting from zero) instead of letting everything through
    got = statuses(client, "/plain/", 4)
    assert got.count(429) >= 1 and got[0] == 200
