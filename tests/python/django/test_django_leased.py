"""@redcount.django.limit(..., lease=N): a leased limit on a Django view."""

from __future__ import annotations

# First: configures Django before anything imports it.
from redcount_django_fixtures import *  # noqa: F403  (the fixtures)

from typing import Any

import pytest
from django.http import HttpResponse
from django.urls import path

import redcount
from redcount.django import ConfigurationError, limit


@limit("6/hour", key=lambda request: "everyone", lease=4)
def hot_view(request: Any) -> HttpResponse:
    return HttpResponse("ok")


urlpatterns = [path("hot/", hot_view)]


@pytest.mark.usefixtures("away_from_hour_boundary")
def test_leased_view_admits_exactly_the_limit(client: Any, configure: Any, settings: Any, store_url: str) -> None:
    settings.ROOT_URLCONF = __name__
    configure(URL=store_url)
    assert [client.get("/hot/").status_code for _ in range(8)] == [200] * 6 + [429] * 2


def test_bad_lease() -> None:
    with pytest.raises(ConfigurationError, match="lease"):
        limit("6/hour", lease=0)
    with pytest.raises(redcount.InvalidInputError, match="lease"):
        limit("6/hour", lease=-2)


@pytest.mark.usefixtures("away_from_hour_boundary")
def test_leased_middleware_limits_from_settings(client: Any, configure: Any, store_url: str) -> None:
    configure(URL=store_url, DEFAULT_LIMITS="6/hour", LEASE=4)
    assert [client.get("/plain/").status_code for _ in range(8)] == [200] * 6 + [429] * 2
    from redcount.django.conf import get_state

    assert get_state().default[0].lease == 4
    assert get_state().limiter.leased_units == 0


@pytest.mark.parametrize("value", [0, "x", 2.5])
def test_bad_lease_setting_is_named(configure: Any, value: Any) -> None:
    from redcount.django.conf import build_state

    configure(DEFAULT_LIMITS="6/hour", LEASE=value)
    with pytest.raises(ConfigurationError, match="LEASE"):
        build_state()


def test_lease_setting_needs_a_strategy_that_leases(configure: Any) -> None:
    from redcount.django.conf import build_state

    configure(DEFAULT_LIMITS="6/hour", STRATEGY="concurrency", LEASE=4)
    with pytest.raises(ConfigurationError, match="fixed-window"):
        build_state()


@pytest.mark.parametrize("strategy", ["token-bucket", "gcra"])
def test_the_buckets_lease_too(configure: Any, strategy: str) -> None:
    from redcount.django.conf import build_state

    configure(DEFAULT_LIMITS="6/hour", STRATEGY=strategy, LEASE=4)
    build_state()  # accepted at start-up
