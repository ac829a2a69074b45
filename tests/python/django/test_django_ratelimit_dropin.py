"""redcount.django.ratelimit keeps django-ratelimit's documented behaviours: the keys, the
rates (strings, tuples, callables, dotted paths), group, method (ALL, UNSAFE),
request.limited, block, is_ratelimited/get_usage, Ratelimited (403) in compat mode."""

from __future__ import annotations

# First: configures Django before anything imports it.
from redcount_django_fixtures import *  # noqa: F403  (the fixtures)

import json
import time
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import HttpResponse
from django.test import RequestFactory

import redcount.django.ratelimit as rl
from redcount.django.ratelimit import ALL, UNSAFE, Ratelimited, get_usage, is_ratelimited, ratelimit


def limited(client: Any, path: str, n: int, method: str = "get", **extra: Any) -> list[Any]:
    out = []
    for _ in range(n):
        r = getattr(client, method)(path, **extra)
        out.append(json.loads(r.content)["limited"] if r.status_code == 200 else r.status_code)
    return out


def test_switching_is_one_import() -> None:
    import django_ratelimit
    import django_ratelimit.core
    import django_ratelimit.decorators
    import django_ratelimit.exceptions

    import redcount.django.ratelimit.core
    import redcount.django.ratelimit.decorators
    import redcount.django.ratelimit.exceptions

    assert rl.ALL == django_ratelimit.ALL and rl.UNSAFE == django_ratelimit.UNSAFE
    assert redcount.django.ratelimit.decorators.ratelimit is ratelimit
    assert redcount.django.ratelimit.core.is_ratelimited is is_ratelimited
    assert redcount.django.ratelimit.exceptions.Ratelimited is Ratelimited
    assert issubclass(Ratelimited, PermissionDenied)
    assert ratelimit.ALL == ALL and ratelimit.UNSAFE == UNSAFE  # type: ignore[attr-defined]
    import inspect

    for ours, theirs in [
        (ratelimit, django_ratelimit.decorators.ratelimit),
        (is_ratelimited, django_ratelimit.core.is_ratelimited),
        (get_usage, django_ratelimit.core.get_usage),
    ]:
        assert list(inspect.signature(ours).parameters) == list(inspect.signature(theirs).parameters)


def _clear_of_a_minute_boundary() -> None:
    # The views' limits are per minute, on the real clock: a short sequence that straddled a
    # minute would count in two windows. Waits for a time, not for readiness.
    left = 60 - time.time() % 60
    if left < 5:
        time.sleep(left + 0.01)


def test_block_answers_429_with_headers(client: Any, configure: Any, store_url: str) -> None:
    configure(URL=store_url)
    _clear_of_a_minute_boundary()
    assert [client.get("/rl_ip/").status_code for _ in range(3)] == [200, 200, 429]
    r = client.get("/rl_ip/")
    assert r["Content-Type"] == "application/problem+json" and int(r["Retry-After"]) >= 1
    assert r["RateLimit-Policy"].endswith(";q=2;w=60")


def test_compat_403_raises_ratelimited(client: Any, configure: Any) -> None:
    configure(RATELIMIT_COMPAT_403=True)
    _clear_of_a_minute_boundary()
    assert [client.get("/rl_ip/").status_code for _ in range(3)] == [200, 200, 403]
    rf = RequestFactory()
    view = ratelimit(key="ip", rate="1/m")(lambda request: HttpResponse("x"))
    view(rf.get("/"))
    with pytest.raises(Ratelimited):
        view(rf.get("/"))


def test_compat_403_honours_ratelimit_exception_class(configure: Any, settings: Any) -> None:
    configure(RATELIMIT_COMPAT_403=True)
    settings.RATELIMIT_EXCEPTION_CLASS = "django.core.exceptions.SuspiciousOperation"
    from django.core.exceptions import SuspiciousOperation

    view = ratelimit(key="ip", rate="1/m")(lambda request: HttpResponse("x"))
    view(RequestFactory().get("/"))
    with pytest.raises(SuspiciousOperation):
        view(RequestFactory().get("/"))


def test_request_limited_without_blocking(client: Any, configure: Any, store_url: str) -> None:
    configure(URL=store_url)
    assert limited(client, "/rl_ip_noblock/", 4) == [False, False, True, True]


def test_limited_is_sticky_across_stacked_decorators(client: Any, configure: Any) -> None:
    # the outer decorator (1/m) limits; the inner (100/m) does not, and keeps limited True
    assert limited(client, "/rl_stacked/", 2, HTTP_X_API_KEY="k") == [False, True]


@pytest.mark.parametrize(
    ("path", "same", "other"),
    [
        ("/rl_user/", {"HTTP_X_TEST_USER": "1"}, {"HTTP_X_TEST_USER": "2"}),
        ("/rl_user_or_ip/", {"HTTP_X_TEST_USER": "1"}, {"HTTP_X_TEST_USER": "2"}),
        ("/rl_user_or_ip/", {"REMOTE_ADDR": "192.0.2.1"}, {"REMOTE_ADDR": "192.0.2.2"}),
        ("/rl_header/", {"HTTP_X_API_KEY": "a"}, {"HTTP_X_API_KEY": "b"}),
        ("/rl_callable/", {"HTTP_X_TENANT": "a"}, {"HTTP_X_TENANT": "b"}),
        ("/rl_dotted/", {"HTTP_X_TENANT": "a"}, {"HTTP_X_TENANT": "b"}),
    ],
)
def test_keys(client: Any, configure: Any, path: str, same: dict[str, str], other: dict[str, str]) -> None:
    configure()
    assert limited(client, path, 3, **same) == [False, False, True]
    assert limited(client, path, 1, **other) == [False]


def test_user_key_counts_all_anonymous_users_together(client: Any) -> None:
    # django-ratelimit's "user" is str(request.user.pk): None for every anonymous user
    assert limited(client, "/rl_user/", 2, REMOTE_ADDR="192.0.2.1") == [False, False]
    assert limited(client, "/rl_user/", 1, REMOTE_ADDR="192.0.2.2") == [True]


def test_get_and_post_keys(client: Any) -> None:
    assert limited(client, "/rl_get/?q=a", 3) == [False, False, True]
    assert limited(client, "/rl_get/?q=b", 1) == [False]
    assert limited(client, "/rl_post/", 3, method="post", data={"q": "a"}) == [False, False, True]
    assert limited(client, "/rl_post/", 1, method="post", data={"q": "b"}) == [False]


def test_ip_key_through_trusted_proxies(client: Any, configure: Any) -> None:
    configure(TRUSTED_PROXIES=1)
    assert limited(client, "/rl_ip_noblock/", 3, HTTP_X_FORWARDED_FOR="198.51.100.1") == [False, False, True]
    assert limited(client, "/rl_ip_noblock/", 1, HTTP_X_FORWARDED_FOR="198.51.100.2") == [False]


def test_rates(client: Any) -> None:
    assert limited(client, "/rl_tuple/", 3) == [False, False, True]
    assert limited(client, "/rl_multi/", 3) == [False, False, True]
    r = client.get("/rl_multi/")
    assert r["RateLimit-Policy"].endswith(";q=2;w=300")  # "2/5m": two per five minutes
    # a rate callable (group, request); None means no limit
    assert limited(client, "/rl_rate_callable/", 3) == [False, False, True]
    assert limited(client, "/rl_rate_callable/", 3, HTTP_X_PLAN="unlimited") == [False, False, False]
    # a dotted path to the rate callable
    assert limited(client, "/rl_dotted/", 4, HTTP_X_PLAN="unlimited", HTTP_X_TENANT="z") == [False] * 4


def test_method(client: Any) -> None:
    # method="POST": GETs are neither limited nor counted
    assert limited(client, "/rl_post_method/", 3) == [False, False, False]
    assert limited(client, "/rl_post_method/", 2, method="post") == [False, True]
    assert limited(client, "/rl_unsafe/", 2) == [False, False]
    assert limited(client, "/rl_unsafe/", 1, method="put") == [False]
    assert limited(client, "/rl_unsafe/", 1, method="delete") == [True]
    assert limited(client, "/rl_all/", 1, method="patch") == [False]
    assert limited(client, "/rl_all/", 1, method="options") == [True]


def test_group_shares_the_count(client: Any) -> None:
    assert limited(client, "/rl_group_a/", 1) + limited(client, "/rl_group_b/", 2) == [False, False, True]


def test_class_based_view_with_method_decorator(client: Any) -> None:
    assert client.post("/rlview/").status_code == 200
    assert client.post("/rlview/").status_code == 429
    assert client.get("/rlview/").status_code == 200


@pytest.mark.asyncio
async def test_async_views(async_client: Any, configure: Any, store_url: str) -> None:
    configure(URL=store_url)
    assert [(await async_client.get("/rl_async/")).status_code for _ in range(3)] == [200, 200, 429]
    h = {"X-Test-User": "3"}
    got = [json.loads((await async_client.get("/rl_async_user/", headers=h)).content)["limited"] for _ in range(3)]
    assert got == [False, False, True]


def test_is_ratelimited_and_get_usage(configure: Any, store_url: str) -> None:
    configure(URL=store_url)
    req = RequestFactory().get("/")
    kw: dict[str, Any] = {"group": "login", "key": "ip", "rate": "2/m"}
    assert get_usage(req, **kw) is not None and get_usage(req, **kw)["count"] == 0  # type: ignore[index]
    assert not is_ratelimited(req, increment=True, **kw)
    usage = get_usage(req, increment=True, **kw)
    assert usage is not None and usage["count"] == 2 and usage["limit"] == 2 and not usage["should_limit"]
    assert 0 < usage["time_left"] <= 60
    assert is_ratelimited(req, increment=False, **kw)  # one more would be refused
    over = get_usage(req, increment=True, **kw)
    assert over is not None and over["should_limit"] and over["count"] == 3
    # a method that does not match, or no rate: None
    assert get_usage(req, method="POST", **kw) is None
    assert get_usage(req, group="login", key="ip", rate=None) is None


def test_disabled(configure: Any, settings: Any) -> None:
    req = RequestFactory().get("/")
    settings.RATELIMIT_ENABLE = False
    assert get_usage(req, group="g", key="ip", rate="1/m", increment=True) is None
    settings.RATELIMIT_ENABLE = True
    configure(ENABLED=False)
    assert get_usage(req, group="g", key="ip", rate="1/m", increment=True) is None


def test_argument_errors(configure: Any) -> None:
    req = RequestFactory().get("/")
    with pytest.raises(ImproperlyConfigured, match="either `group` or `fn`"):
        get_usage(req, key="ip", rate="1/m")
    with pytest.raises(ImproperlyConfigured, match="key must be specified"):
        ratelimit(rate="1/m")
    with pytest.raises(ImproperlyConfigured, match="Unknown ratelimit key"):
        ratelimit(key="cookie:x", rate="1/m")
    with pytest.raises(ImproperlyConfigured, match="Could not understand"):
        ratelimit(key="nothing", rate="1/m")
    with pytest.raises(ImproperlyConfigured, match="greater than 0"):
        get_usage(req, group="g", key="ip", rate=(1, 0))


def test_store_down_follows_redcount_fail(client: Any, configure: Any, redis_factory: Any) -> None:
    server = redis_factory()
    configure(URL=server.url, FAIL="open", BUDGET=0.2)
    assert client.get("/rl_ip/").status_code == 200
    server.kill()
    assert limited(client, "/rl_ip_noblock/", 3) == [False, False, False]
    configure(URL=server.url, FAIL="closed", BUDGET=0.2)
    assert limited(client, "/rl_ip_noblock/", 1) == [True]
    assert client.get("/rl_ip/").status_code == 503
    req = RequestFactory().get("/")
    assert get_usage(req, group="g", key="ip", rate="5/m") == {"count": 0, "limit": 0, "should_limit": True, "time_left": -1}


def ratelimited_view(request: Any, exception: Exception) -> HttpResponse:
    return HttpResponse(f"limited by {type(exception).__name__}", status=403)


def test_ratelimit_middleware_answers_with_ratelimit_view(client: Any, configure: Any, settings: Any) -> None:
    configure(RATELIMIT_COMPAT_403=True)
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "redcount.django.ratelimit.middleware.RatelimitMiddleware"]
    settings.RATELIMIT_VIEW = "test_django_ratelimit_dropin.ratelimited_view"
    client.get("/rl_ip/")
    client.get("/rl_ip/")
    r = client.get("/rl_ip/")
    assert r.status_code == 403 and r.content == b"limited by Ratelimited"


def test_a_rate_of_zero_limits_every_request(configure: Any) -> None:
    rf = RequestFactory()
    usage = get_usage(rf.get("/"), group="banned", key="ip", rate="0/m", increment=True)
    assert usage is not None and usage["should_limit"] and usage["limit"] == 0
    view = ratelimit(key="ip", rate=lambda group, request: "0/s")(lambda request: HttpResponse("x"))
    assert view(rf.get("/")).status_code == 429
    noblock = ratelimit(key="ip", rate="0/h", block=False)(lambda request: HttpResponse(str(request.limited)))
    assert noblock(rf.get("/")).content == b"True"


@pytest.mark.asyncio
async def test_ratelimit_middleware_serves_async_views_without_a_thread_hop(
    async_client: Any, configure: Any, settings: Any
) -> None:
    from redcount.django.ratelimit.middleware import RatelimitMiddleware

    assert RatelimitMiddleware.sync_capable and RatelimitMiddleware.async_capable
    configure(RATELIMIT_COMPAT_403=True)
    settings.MIDDLEWARE = [*settings.MIDDLEWARE, "redcount.django.ratelimit.middleware.RatelimitMiddleware"]
    settings.RATELIMIT_VIEW = "test_django_ratelimit_dropin.ratelimited_view"
    got = [await async_client.get("/rl_async/") for _ in range(3)]
    assert [r.status_code for r in got] == [200, 200, 403] and got[2].content == b"limited by Ratelimited"
