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
