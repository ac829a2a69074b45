"""Runs the Django examples of the documentation (docs/django.md, docs/drf.md,
docs/switching-from-django-ratelimit.md) inside the docs test process.

An example is written as a project's files are (``REDCOUNT = {...}``, ``MIDDLEWARE = [...]``,
views, ``urlpatterns``); its hidden check calls::

    with site(globals()) as client:
        assert client.get("/search").status_code == 200

:func:`site` configures Django once per process (unless the run already did, as
tests/python/django/conftest.py does), then applies the example's upper-case settings with
``override_settings`` and serves its ``urlpatterns`` as the URLconf, for the ``with`` block.
There is no database: ``AuthenticationMiddleware`` in an example's ``MIDDLEWARE`` is replaced by
one taking the user's id from an ``X-User`` header (test plumbing, never shown in the docs).
"""

from __future__ import annotations

import contextlib
import sys
import types
import uuid
from collections.abc import Iterator
from typing import Any

import django
from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.conf import settings

AUTH = "django.contrib.auth.middleware.AuthenticationMiddleware"
SETTINGS = ("REDCOUNT", "MIDDLEWARE", "REST_FRAMEWORK", "CACHES", "RATELIMIT_ENABLE", "RATELIMIT_EXCEPTION_CLASS")


_APIVIEW = {
    "renderer_classes": "DEFAULT_RENDERER_CLASSES", "parser_classes": "DEFAULT_PARSER_CLASSES",
    "authentication_classes": "DEFAULT_AUTHENTICATION_CLASSES", "throttle_classes": "DEFAULT_THROTTLE_CLASSES",
    "permission_classes": "DEFAULT_PERMISSION_CLASSES",
}


def configure() -> None:
    if not settings.configured:
        settings.configure(
            SECRET_KEY="docs-examples-only", DEBUG=False, ALLOWED_HOSTS=["*"], USE_TZ=True, DATABASES={},
            INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "rest_framework", "redcount.django"],
            MIDDLEWARE=[], ROOT_URLCONF=None, LOGGING_CONFIG=None,
        )
        django.setup()


def _user(request: Any) -> Any:
    from django.contrib.auth.models import AnonymousUser, User

    uid = request.headers.get("X-User")
    return User(pk=int(uid), username=f"user{uid}") if uid else AnonymousUser()


class HeaderUser:
    """``request.user`` (and ``request.auser()``) from the ``X-User`` header."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: Any) -> Any:
        request.user = _user(request)

        async def auser() -> Any:
            return request.user

        request.auser = auser
        return self.get_response(request)


@contextlib.contextmanager
def site(namespace: dict[str, Any]) -> Iterator[Any]:
    """The example's settings and URLconf in force; yields a ``django.test.Client``."""
    configure()
    from django.test import Client, override_settings
    from django.urls import clear_url_caches
    from rest_framework import throttling

    urls = types.ModuleType(f"docs_urls_{uuid.uuid4().hex[:8]}")
    urls.urlpatterns = namespace.get("urlpatterns", [])  # type: ignore[attr-defined]
    sys.modules[urls.__name__] = urls
    overrides = {name: namespace[name] for name in SETTINGS if name in namespace}
    overrides["MIDDLEWARE"] = [f"{__name__}.HeaderUser" if m == AUTH else m for m in overrides.get("MIDDLEWARE", [])]
    overrides["ROOT_URLCONF"] = urls.__name__
    from rest_framework.views import APIView

    # DRF copies some settings into class attributes when it is imported: an app's settings
    # are there before, an example's only now.
    saved = {name: getattr(APIView, name) for name in _APIVIEW}
    rates = throttling.SimpleRateThrottle.THROTTLE_RATES
    try:
        with override_settings(**overrides):
            clear_url_caches()
            from rest_framework.settings import api_settings

            throttling.SimpleRateThrottle.THROTTLE_RATES = api_settings.DEFAULT_THROTTLE_RATES
            for name, setting in _APIVIEW.items():
                setattr(APIView, name, getattr(api_settings, setting))
            yield Client()
    finally:
        throttling.SimpleRateThrottle.THROTTLE_RATES = rates
        for name, value in saved.items():
            setattr(APIView, name, value)
        clear_url_caches()
        del sys.modules[urls.__name__]
