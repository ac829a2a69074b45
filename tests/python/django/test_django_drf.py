"""redcount.django.drf: DRF's throttles, atomic. Same scopes, rates and idents as DRF's own;
wait() from the limiter; headers; exact counts under concurrency; the failure policy."""

from __future__ import annotations

# First: configures Django before anything imports it.
from redcount_django_fixtures import *  # noqa: F403  (the fixtures)

import threading
from typing import Any

import pytest
from rest_framework import throttling as drf_throttling
from rest_framework.request import Request
from rest_framework.test import APIRequestFactory
from rest_framework.views import APIView

import redcount.django.drf as rdrf


def codes(client: Any, path: str, n: int, **extra: Any) -> list[int]:
    return [client.get(path, **extra).status_code for _ in range(n)]


def drf_request(**extra: Any) -> Request:
    return Request(APIRequestFactory().get("/", **extra))


def test_twins_subclass_drfs_own_classes() -> None:
    assert issubclass(rdrf.AnonRateThrottle, drf_throttling.AnonRateThrottle)
    assert issubclass(rdrf.UserRateThrottle, drf_throttling.UserRateThrottle)
    assert issubclass(rdrf.ScopedRateThrottle, drf_throttling.ScopedRateThrottle)
    assert rdrf.AnonRateThrottle().rate == "3/minute"  # from DEFAULT_THROTTLE_RATES
    assert rdrf.UserRateThrottle().num_requests == 5


def test_anon_throttle(client: Any, configure: Any, store_url: str) -> None:
    configure(URL=store_url)
    assert codes(client, "/api/anon/", 4) == [200, 200, 200, 429]
    assert codes(client, "/api/anon/", 4, HTTP_X_TEST_USER="1") == [200] * 4  # users are not anonymous
    assert codes(client, "/api/anon/", 1, REMOTE_ADDR="192.0.2.7") == [200]


def test_user_throttle(client: Any, configure: Any, store_url: str) -> None:
    configure(URL=store_url)
    assert codes(client, "/api/user/", 6, HTTP_X_TEST_USER="1") == [200] * 5 + [429]
    assert codes(client, "/api/user/", 1, HTTP_X_TEST_USER="2") == [200]
    assert codes(client, "/api/user/", 6) == [200] * 5 + [429]  # anonymous: by address


def test_scoped_throttle_shares_a_scope_across_views(client: Any, configure: Any) -> None:
    configure()
    assert [client.get(p).status_code for p in ("/api/scoped/", "/api/scoped2/", "/api/scoped/")] == [200, 200, 429]
    assert codes(client, "/api/unscoped/", 5) == [200] * 5  # no throttle_scope: not throttled


def test_every_throttle_is_consulted(client: Any, configure: Any) -> None:
    configure()
    assert codes(client, "/api/both/", 4) == [200, 200, 200, 429]  # anon (3) binds for the anonymous
    assert codes(client, "/api/both/", 6, HTTP_X_TEST_USER="4") == [200] * 5 + [429]


def test_wait_and_retry_after(client: Any, configure: Any) -> None:
    configure()
    view = APIView()
    t = rdrf.AnonRateThrottle()
    for _ in range(3):
        assert t.allow_request(drf_request(), view)
        assert t.wait() is None
    assert not t.allow_request(drf_request(), view)
    wait = t.wait()
    assert wait is not None and 0 < wait <= 60
    codes(client, "/api/anon/", 3)
    r = client.get("/api/anon/")
    assert r.status_code == 429 and 1 <= int(r["Retry-After"]) <= 60


def test_headers_with_the_middleware(client: Any, configure: Any) -> None:
    configure()
    r = client.get("/api/scoped/")
    assert r["RateLimit-Policy"] == '"burst";q=2;w=60' and r["RateLimit"].startswith('"burst";r=1;')
    client.get("/api/scoped/")
    refused = client.get("/api/scoped/")
    assert refused["RateLimit"].startswith('"burst";r=0;') and "Retry-After" in refused


def test_same_decisions_as_drfs_own_throttle_in_sequence(configure: Any) -> None:
    configure()
    view = APIView()
    ours = [rdrf.AnonRateThrottle().allow_request(drf_request(REMOTE_ADDR="192.0.2.50"), view) for _ in range(5)]
    theirs = [drf_throttling.AnonRateThrottle().allow_request(drf_request(REMOTE_ADDR="192.0.2.50"), view) for _ in range(5)]
    assert ours == theirs == [True, True, True, False, False]


class TwoPerMinute(rdrf.SimpleRateThrottle):
    scope = "custom"
    rate = "2/min"

    def get_cache_key(self, request: Any, view: Any) -> str:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


def test_a_subclass_with_its_own_rate_and_key(configure: Any) -> None:
    configure()
    view = APIView()
    assert [TwoPerMinute().allow_request(drf_request(), view) for _ in range(3)] == [True, True, False]


def test_exact_count_under_concurrency(configure: Any, redis_url: str) -> None:
    configure(URL=redis_url)
    view = APIView()
    threads, admitted = 16, []
    barrier = threading.Barrier(threads)
    lock = threading.Lock()

    class Five(rdrf.SimpleRateThrottle):
        scope = "five"
        rate = "5/min"

        def get_cache_key(self, request: Any, view: Any) -> str:
            return "five"

    def worker() -> None:
        barrier.wait()
        for _ in range(4):
            ok = Five().allow_request(drf_request(), view)
            with lock:
                admitted.append(ok)

    ts = [threading.Thread(target=worker) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert admitted.count(True) == 5 and len(admitted) == threads * 4


def test_store_down(client: Any, configure: Any, redis_factory: Any) -> None:
    server = redis_factory()
    configure(URL=server.url, FAIL="open", BUDGET=0.2)
    assert client.get("/api/scoped/").status_code == 200
    server.kill()
    assert codes(client, "/api/scoped/", 4) == [200] * 4
    configure(URL=server.url, FAIL="closed", BUDGET=0.2)
    assert codes(client, "/api/scoped/", 1) == [503]


def test_disabled(client: Any, configure: Any) -> None:
    configure(ENABLED=False)
    assert codes(client, "/api/scoped/", 4) == [200] * 4


@pytest.mark.parametrize("strategy", ["sliding-window", "fixed-window"])
def test_strategy_attribute(configure: Any, strategy: str) -> None:
    configure()

    class Throttle(TwoPerMinute):
        pass

    Throttle.strategy = strategy
    view = APIView()
    assert [Throttle().allow_request(drf_request(REMOTE_ADDR="192.0.2.60"), view) for _ in range(3)] == [True, True, False]


def test_view_decorators_on_an_api_view(client: Any, configure: Any) -> None:
    configure()
    assert codes(client, "/api/decorated/", 3, HTTP_X_TEST_USER="1") == [200, 200, 429]
    r = client.get("/api/decorated/", HTTP_X_TEST_USER="2")
    assert r.status_code == 200 and r["RateLimit"].startswith('"DecoratedAPI.get";r=1;')
    assert client.post("/api/decorated/").status_code == 200
    refused = client.post("/api/decorated/")
    assert refused.status_code == 429 and "Retry-After" in refused


class TimedThreePerMinute(rdrf.SimpleRateThrottle):
    """A throttle on a clock of its own, as DRF's tests and users' tests move time."""

    scope = "timed"
    rate = "3/min"
    NOW = 1000.0

    def get_cache_key(self, request: Any, view: Any) -> str:
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}

    def timer(self) -> float:
        return self.NOW


def test_an_overridden_timer_is_the_throttles_clock(configure: Any, store_url: str) -> None:
    configure(URL=store_url)
    view = APIView()
    t = TimedThreePerMinute()
    assert [t.allow_request(drf_request(), view) for _ in range(4)] == [True, True, True, False]
    assert t.wait() == 60
    TimedThreePerMinute.NOW += 30  # on the timer's clock only: the wall clock has not moved
    assert not t.allow_request(drf_request(), view)
    assert t.wait() == 30
    TimedThreePerMinute.NOW += 30  # a whole window after the three hits: admitted again
    assert [t.allow_request(drf_request(), view) for _ in range(4)] == [True, True, True, False]


class Timed3PerSecond(rdrf.UserRateThrottle):
    rate = "3/sec"
    scope = "timed-seconds"


class Timed6PerMinute(rdrf.UserRateThrottle):
    rate = "6/min"
    scope = "timed-minutes"


class DoublyThrottled(APIView):
    throttle_classes = (Timed3PerSecond, Timed6PerMinute)

    def get(self, request: Any) -> Any:
        from rest_framework.response import Response

        return Response("ok")


def test_timer_set_on_the_class_as_drfs_own_tests_do(configure: Any, store_url: str) -> None:
    """DRF's test of two throttles on one view, moving ``cls.timer`` as it does."""
    configure(URL=store_url)

    def at(value: float) -> None:
        for cls in DoublyThrottled.throttle_classes:
            cls.timer = lambda self: value  # type: ignore[method-assign,misc]

    try:
        request = APIRequestFactory().get("/")
        view = DoublyThrottled.as_view()
        at(0)
        responses = [view(request) for _ in range(4)]
        assert [r.status_code for r in responses] == [200, 200, 200, 429]
        assert int(responses[-1]["Retry-After"]) == 1
        at(1)  # the 3/sec window has passed; the 6/min one holds 4 hits
        responses = [view(request) for _ in range(3)]
        assert [r.status_code for r in responses] == [200, 200, 429]
        assert int(responses[-1]["Retry-After"]) == 59
        at(2)
        r = view(request)
        assert r.status_code == 429 and int(r["Retry-After"]) == 58
    finally:
        for cls in DoublyThrottled.throttle_classes:
            if "timer" in vars(cls):
                delattr(cls, "timer")
