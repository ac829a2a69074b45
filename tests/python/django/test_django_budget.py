"""``REDCOUNT["BUDGET"]`` bounds each wait for Redis, not the request: the app's own work
between the middleware's check and a view's (other middleware, URL resolution, a worker
that was not scheduled) spends none of it, so both are decided by Redis. A request decided
without the store says so in ``RateLimit-Undecided``."""

from __future__ import annotations

# First: configures Django before anything imports it.
from redcount_django_fixtures import *  # noqa: F403  (the fixtures)

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.http import HttpResponse
from django.test import RequestFactory

import redcount.django
from redcount.django import RateLimitMiddleware

pytestmark = pytest.mark.redis_only

BUDGET = 0.05


@redcount.django.limit("3/minute", name="route")
def limited(request: Any) -> HttpResponse:
    return HttpResponse("ok")


def slow_then_limited(request: Any) -> HttpResponse:
    time.sleep(4 * BUDGET)  # the app's own work between the middleware's check and the view's
    return limited(request)


def test_app_work_between_the_middleware_and_the_view_spends_no_budget(configure: Any, redis_url: str) -> None:
    configure(URL=redis_url, DEFAULT_LIMITS="100/minute", BUDGET=BUDGET, HEADERS="all", STRATEGY="sliding-window")
    middleware = RateLimitMiddleware(slow_then_limited)
    responses = [middleware(RequestFactory().get("/plain/")) for _ in range(5)]
    assert [r.status_code for r in responses] == [200, 200, 200, 429, 429]
    assert all(not r.has_header("RateLimit-Undecided") for r in responses)
    assert [r["X-RateLimit-Remaining"] for r in responses[:3]] == ["2", "1", "0"]


def test_undecided_request_is_marked(configure: Any, redis_factory: Callable[..., Any]) -> None:
    server = redis_factory()
    configure(URL=server.url, DEFAULT_LIMITS="100/minute", BUDGET=BUDGET)
    middleware = RateLimitMiddleware(limited)
    assert not middleware(RequestFactory().get("/plain/")).has_header("RateLimit-Undecided")
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        r = middleware(RequestFactory().get("/plain/"))
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    assert r.status_code == 200 and r["RateLimit-Undecided"] == "timeout"  # FAIL open, the default
    assert not r.has_header("RateLimit")
