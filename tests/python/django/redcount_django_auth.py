"""Test-only authentication for the redcount.django tests: the user is the id in the
``X-Test-User`` header. No database."""

from __future__ import annotations

from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.contrib.auth.models import AnonymousUser, User
from django.utils.asyncio import async_unsafe
from django.utils.functional import SimpleLazyObject
from rest_framework.authentication import BaseAuthentication


def _user_from(request: Any) -> Any:
    name = request.META.get("HTTP_X_TEST_USER")
    if not name:
        return AnonymousUser()
    return User(pk=int(name), username=f"u{name}")


class FakeAuthMiddleware:
    """Sync and async capable, so under ASGI the whole chain stays async. ``request.user`` from the ``X-Test-User`` header (a user id), as
    AuthenticationMiddleware would load it from the session: lazily, and refusing to run on
    an event loop (like a database query), with ``request.auser()`` for async code."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: Any) -> Any:
        load = async_unsafe(lambda: _user_from(request))
        request.user = SimpleLazyObject(load)

        async def auser() -> Any:
            return _user_from(request)

        request.auser = auser
        return self.get_response(request)


class HeaderAuthentication(BaseAuthentication):
    """DRF authentication from ``X-Test-User``."""

    def authenticate(self, request: Any) -> Any:
        user = _user_from(request._request)
        return None if not user.is_authenticated else (user, None)
