"""django-ratelimit's ``RatelimitMiddleware``: answers [`Ratelimited`][redcount.django.ratelimit.exceptions.Ratelimited] with the view
named by ``settings.RATELIMIT_VIEW`` (only raised with ``REDCOUNT["RATELIMIT_COMPAT_403"]``;
the default 429 answer needs no middleware)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.utils.deprecation import MiddlewareMixin
from django.utils.module_loading import import_string

from .exceptions import Ratelimited

__all__ = ["RatelimitMiddleware"]


class RatelimitMiddleware(MiddlewareMixin):  # type: ignore[misc]
    """``MIDDLEWARE = [..., "redcount.django.ratelimit.middleware.RatelimitMiddleware"]``:
    a [`Ratelimited`][redcount.django.ratelimit.exceptions.Ratelimited] raised by a view becomes ``RATELIMIT_VIEW(request, exception)``.

    Sync and async capable (Django's ``MiddlewareMixin``), so under ASGI it adds no thread
    hop to requests it does not touch."""

    def process_exception(self, request: Any, exception: BaseException) -> Any:
        """``RATELIMIT_VIEW``'s answer to a [`Ratelimited`][redcount.django.ratelimit.exceptions.Ratelimited]; None for anything else."""
        if not isinstance(exception, Ratelimited):
            return None
        view = import_string(settings.RATELIMIT_VIEW)
        return view(request, exception)
