"""@redcount.django.limit on function, async and class-based views: every key kind, cost,
methods, scope, exemption, charge by outcome, dynamic limits, stacking and headers."""

from __future__ import annotations

# First: configures Django before anything imports it.
from redcount_django_fixtures import *  # noqa: F403  (the fixtures)

import json
from typing import Any

import pytest

import redcount
import redcount.django
from redcount.django import limit


def codes(client: Any, path: str, n: int, **extra: Any) -> list[int]:
    return [client.get(path, **extra).status_code for _ in range(n)]


async def acodes(client: Any, path: str, n: int, **extra: Any) -> list[int]:
    return [(await client.get(path, **extra)).status_code for _ in range(n)]


def test_function_view(client: Any, configure: Any, store_url: str) -> None:
    configure(URL=store_url)
    assert codes(client, "/sync_view/", 4) == [200, 200, 200, 429]
    r = client.get("/sync_view/")
    assert r["Content-Type"] == "application/problem+json"
    assert json.loads(r.content)["violated-policies"] == ["ok"]
    assert r["RateLimit-Policy"] == '"ok";q=3;w=60'


def test_allowed_responses_carry_headers_without_the_middleware(client: Any, configure: Any, settings: Any) -> None:
    settings.MIDDLEWARE = ["redcount_django_auth.FakeAuthMiddleware"]
    configure()
    r = client.get("/sync_view/")
    assert r.status_code == 200 and r["RateLimit"].startswith('"ok";r=2;t=')
    assert codes(client, "/sync_view/", 3) == [200, 200, 429]


@pytest.mark.asyncio
async def test_async_view(async_client: Any, configure: Any, store_url: str) -> None:
    configure(URL=store_url)
    assert await acodes(async_client, "/async_view/", 4) == [200, 200, 200, 429]
    r = await async_client.get("/async_view/")
    assert int(r["Retry-After"]) >= 1 and r["RateLimit"].startswith('"aok";r=0')


def test_class_based_views(client: Any, configure: Any) -> None:
    configure()
    assert codes(client, "/cbv/", 3) == [200, 200, 429]  # method_decorator(..., name="dispatch")
    assert client.get("/cbv/")["RateLimit-Policy"] == '"CBV.dispatch";q=2;w=60'
    # the decorator on the class itself limits dispatch, keyed by user here
    assert codes(client, "/cbv2/", 3, HTTP_X_TEST_USER="1") == [200, 200, 429]
    assert client.get("/cbv2/", HTTP_X_TEST_USER="2").status_code == 200


@pytest.mark.asyncio
async def test_async_class_based_view(async_client: Any, configure: Any) -> None:
    configure()
    assert await acodes(async_client, "/acbv/", 3) == [200, 200, 429]


def test_key_user(client: Any, configure: Any) -> None:
    configure()
    assert codes(client, "/user_view/", 3, HTTP_X_TEST_USER="1") == [200, 200, 429]
    assert client.get("/user_view/", HTTP_X_TEST_USER="2").status_code == 200
    # anonymous requests are counted by address
    assert codes(client, "/user_view/", 3, REMOTE_ADDR="192.0.2.1") == [200, 200, 429]
    assert client.get("/user_view/", REMOTE_ADDR="192.0.2.2").status_code == 200


@pytest.mark.asyncio
async def test_key_user_in_an_async_view_uses_auser(async_client: Any, configure: Any) -> None:
    configure()
    h1, h2 = {"X-Test-User": "1"}, {"X-Test-User": "2"}
    assert await acodes(async_client, "/auser_view/", 3, headers=h1) == [200, 200, 429]
    assert (await async_client.get("/auser_view/", headers=h2)).status_code == 200


def test_key_ip_through_trusted_proxies(client: Any, configure: Any) -> None:
    configure(TRUSTED_PROXIES=1)
    assert codes(client, "/sync_view/", 3, HTTP_X_FORWARDED_FOR="198.51.100.1") == [200, 200, 200]
    assert client.get("/sync_view/", HTTP_X_FORWARDED_FOR="198.51.100.2").status_code == 200
    assert client.get("/sync_view/", HTTP_X_FORWARDED_FOR="198.51.100.1").status_code == 429


def test_key_header(client: Any, configure: Any) -> None:
    configure()
    assert codes(client, "/header_view/", 3, HTTP_X_API_KEY="a") == [200, 200, 429]
    assert client.get("/header_view/", HTTP_X_API_KEY="b").status_code == 200
    # without the header: the client address
    assert codes(client, "/header_view/", 3) == [200, 200, 429]


@pytest.mark.parametrize("path", ["/callable_view/", "/dotted_view/"])
def test_key_callable_and_dotted_path(client: Any, configure: Any, path: str) -> None:
    configure()
    assert codes(client, path, 3, HTTP_X_TENANT="t1") == [200, 200, 429]
    assert client.get(path, HTTP_X_TENANT="t2").status_code == 200


def test_key_web_request_key(client: Any, configure: Any) -> None:
    configure()
    view = limit("1/minute", key=redcount.web.api_key("X-Api-Key"))(lambda request: __import__("django").http.HttpResponse("k"))
    from django.test import RequestFactory

    rf = RequestFactory()
    assert view(rf.get("/", HTTP_X_API_KEY="s3cret")).status_code == 200
    assert view(rf.get("/", HTTP_X_API_KEY="s3cret")).status_code == 429
    assert view(rf.get("/", HTTP_X_API_KEY="other")).status_code == 200


def test_cost(client: Any, configure: Any) -> None:
    configure()
    assert codes(client, "/cost_view/", 3) == [200, 200, 429]  # 2 + 2 of 5, then 2 more is over
    assert client.get("/cost_callable_view/", {"n": "4"}).status_code == 200
    assert client.get("/cost_callable_view/", {"n": "2"}).status_code == 429
    assert client.get("/cost_callable_view/", {"n": "1"}).status_code == 200


def test_methods_and_per_method(client: Any, configure: Any) -> None:
    configure()
    assert codes(client, "/post_only_view/", 3) == [200, 200, 200]
    assert client.post("/post_only_view/").status_code == 200
    assert client.post("/post_only_view/").status_code == 429
    assert client.get("/per_method_view/").status_code == 200
    assert client.post("/per_method_view/").status_code == 200  # its own count
    assert client.get("/per_method_view/").status_code == 429


def test_scope_shares_one_count(client: Any, configure: Any) -> None:
    configure()
    assert [client.get(p).status_code for p in ("/shared_a/", "/shared_b/", "/shared_a/", "/shared_b/")] == [200, 200, 200, 429]
    assert client.get("/shared_a/")["RateLimit-Policy"] == '"reports";q=3;w=60'


def test_exempt_when(client: Any, configure: Any) -> None:
    configure()
    assert codes(client, "/exempt_view/", 3, HTTP_X_INTERNAL="yes") == [200, 200, 200]
    assert codes(client, "/exempt_view/", 2) == [200, 429]


def test_deduct_when_charges_only_failed_logins(client: Any, configure: Any, store_url: str) -> None:
    configure(URL=store_url)
    for _ in range(5):  # successful logins are never charged
        assert client.get("/login/", {"pw": "right"}).status_code == 200
    assert client.get("/login/", {"pw": "wrong"}).status_code == 401
    r = client.get("/login/", {"pw": "wrong"})
    assert r.status_code == 401 and r["RateLimit"].startswith('"login_view";r=0')
    refused = client.get("/login/", {"pw": "right"})  # two failures: even the right password waits
    assert refused.status_code == 429 and int(refused["Retry-After"]) >= 1


@pytest.mark.asyncio
async def test_deduct_when_async_with_request_and_response(async_client: Any, configure: Any) -> None:
    configure()
    assert (await async_client.get("/alogin/", {"pw": "right"})).status_code == 200
    assert await acodes(async_client, "/alogin/", 3, data={"pw": "wrong"}) == [401, 401, 429]


def test_dynamic_limit(client: Any, configure: Any) -> None:
    configure()
    assert codes(client, "/plan_view/", 3) == [200, 200, 429]
    assert codes(client, "/plan_view/", 4, HTTP_X_PLAN="pro", REMOTE_ADDR="192.0.2.9") == [200] * 4
    assert client.get("/plan_view/", HTTP_X_PLAN="pro", REMOTE_ADDR="192.0.2.9")["RateLimit-Policy"].endswith(';q=5;w=60')


def test_stacked_limits_all_hold_and_headers_list_both(client: Any, configure: Any) -> None:
    configure()
    r = client.get("/stacked_view/")
    assert r["RateLimit-Policy"] == '"burst";q=5;w=60, "hourly";q=10;w=3600'
    assert codes(client, "/stacked_view/", 5) == [200, 200, 200, 200, 429]


def test_shadow_never_refuses(client: Any, configure: Any) -> None:
    configure()
    assert codes(client, "/shadow_view/", 3) == [200, 200, 200]


def test_middleware_and_decorator_headers_together(client: Any, configure: Any) -> None:
    configure(DEFAULT_LIMITS="100/minute")
    r = client.get("/sync_view/")
    assert r["RateLimit-Policy"] == '"default";q=100;w=60, "ok";q=3;w=60'
    assert r["RateLimit"].startswith('"ok";r=2')  # the binding one: fewest left


def test_store_down_fail_open_and_closed(client: Any, configure: Any, redis_factory: Any) -> None:
    server = redis_factory()
    configure(URL=server.url, FAIL="open", BUDGET=0.2)
    assert client.get("/sync_view/").status_code == 200
    server.kill()
    assert codes(client, "/sync_view/", 5) == [200] * 5
    configure(URL=server.url, FAIL="closed", BUDGET=0.2)
    assert client.get("/sync_view/").status_code == 503


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"limit": "ten/minute"}, "limit"),
        ({"limit": "1/minute", "cost": 0}, "cost"),
        ({"limit": "1/minute", "methods": ["FETCH"]}, "methods"),
        ({"limit": "1/minute", "key": "nobody"}, "key"),
        ({"limit": "1/minute", "key": "no.such.module"}, "cannot import"),
        ({"limit": "1/minute", "deduct_when": 5}, "deduct_when"),
        ({"limit": "1/minute", "scope": ""}, "scope"),
    ],
)
def test_bad_arguments_fail_at_import(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(redcount.django.ConfigurationError, match=message) as info:
        limit(**kwargs)
    assert isinstance(info.value, redcount.InvalidInputError)
