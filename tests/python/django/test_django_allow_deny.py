"""ALLOW, DENY and REFUSAL_CACHE in the REDCOUNT setting (middleware, sync and async)."""

from __future__ import annotations

# First: configures Django before anything imports it.
from redcount_django_fixtures import *  # noqa: F403  (the fixtures)

from typing import Any

import pytest

import redcount.django


def test_lists_from_settings(client: Any, configure: Any, store_url: str) -> None:
    configure(URL=store_url, DEFAULT_LIMITS="1/minute", ALLOW="10.0.0.0/8", DENY=["192.0.2.66", "2001:db8::/32"])
    assert [client.get("/plain/", REMOTE_ADDR="10.2.3.4").status_code for _ in range(3)] == [200, 200, 200]
    denied = client.get("/plain/", REMOTE_ADDR="192.0.2.66")
    assert denied.status_code == 429 and denied["Retry-After"] == "86400"
    assert client.get("/plain/", REMOTE_ADDR="192.0.2.1").status_code == 200
    assert client.get("/plain/", REMOTE_ADDR="192.0.2.1").status_code == 429


def test_refusal_cache_from_settings(client: Any, configure: Any, store_url: str) -> None:
    configure(URL=store_url, DEFAULT_LIMITS="1/minute", REFUSAL_CACHE=10)
    assert [client.get("/plain/", REMOTE_ADDR="192.0.2.1").status_code for _ in range(4)] == [200, 429, 429, 429]
    from redcount.django.conf import get_state

    assert get_state().settings.screen.cache.hits == 2  # type: ignore[union-attr]


@pytest.mark.parametrize(("name", "value"), [("ALLOW", ["10.0.0.0/33"]), ("DENY", 5), ("REFUSAL_CACHE", -1)])
def test_bad_settings_are_named(configure: Any, name: str, value: Any) -> None:
    from redcount.django.conf import build_state

    configure(**{name: value})
    with pytest.raises(redcount.django.ConfigurationError, match=name):
        build_state()


@pytest.mark.asyncio
async def test_async_middleware_lists_and_cache(async_client: Any, configure: Any) -> None:
    configure(DEFAULT_LIMITS="1/minute", DENY=["127.0.0.0/8"])  # the test client's address
    r = await async_client.get("/aplain/")
    assert r.status_code == 429 and r["Retry-After"] == "86400"
    configure(DEFAULT_LIMITS="1/minute", ALLOW=["127.0.0.1"])
    assert [(await async_client.get("/aplain/")).status_code for _ in range(3)] == [200, 200, 200]
    configure(DEFAULT_LIMITS="1/minute", REFUSAL_CACHE=5)
    assert [(await async_client.get("/aplain/")).status_code for _ in range(3)] == [200, 429, 429]


def test_penalty_from_settings(client: Any, configure: Any, store_url: str) -> None:
    configure(URL=store_url, DEFAULT_LIMITS="1/minute", PENALTY={"after": 2, "within": 60, "block": 900})
    codes = [client.get("/plain/", REMOTE_ADDR="192.0.2.5") for _ in range(4)]
    assert [r.status_code for r in codes] == [200, 429, 429, 429]
    assert codes[2]["Retry-After"] == "900"
    from redcount.django.conf import build_state

    configure(PENALTY={"after": 2, "blocks": 1})
    with pytest.raises(redcount.django.ConfigurationError, match="PENALTY"):
        build_state()
