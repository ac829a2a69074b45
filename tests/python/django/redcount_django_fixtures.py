"""Configures Django for the tests in this folder only (settings from
``redcount_django_settings``), unless the run already configured it, and holds their
fixtures: each test module star-imports this one. It is not a conftest.py, because the
other folders' tests import ``conftest`` by name and must keep getting tests/python's; a
run that does not collect this folder does not configure Django at all. The Redis fixtures
come from tests/python/conftest.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import django
import pytest
from django.conf import settings

if not settings.configured:
    import redcount_django_settings as _test_settings

    settings.configure(**{k: getattr(_test_settings, k) for k in dir(_test_settings) if k.isupper()})
    django.setup()

import redcount  # noqa: E402
import redcount.django  # noqa: E402


__all__ = ["configure", "fresh_state", "redis_url", "store_url"]


@pytest.fixture(autouse=True)
def fresh_state() -> Iterator[None]:
    """Each test builds its own limiter from the settings it sets."""
    redcount.django.reset_state()
    yield
    redcount.django.reset_state()


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis_only)])
def store_url(request: pytest.FixtureRequest) -> str:
    """The same test on the embedded store and on the session's redis-server (flushed)."""
    if request.param == "memory":
        return "memory://"
    server = request.getfixturevalue("redis_server")
    s = redcount.connect(server.url)
    s.execute("FLUSHALL")
    s.close()
    return str(server.url)


@pytest.fixture
def redis_url(redis_server: Any) -> str:
    """The session's redis-server, flushed."""
    s = redcount.connect(redis_server.url)
    s.execute("FLUSHALL")
    s.close()
    return str(redis_server.url)


@pytest.fixture
def configure(settings: Any) -> Callable[..., None]:
    """``configure(URL=..., DEFAULT_LIMITS=...)``: sets ``settings.REDCOUNT`` for this test."""

    def set_(**values: Any) -> None:
        settings.REDCOUNT = values

    return set_
