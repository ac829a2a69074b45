"""The exception django-ratelimit raises for blocked requests."""

from __future__ import annotations

from django.core.exceptions import PermissionDenied

__all__ = ["Ratelimited"]


class Ratelimited(PermissionDenied):  # type: ignore[misc]
    """Raised for a blocked request when ``REDCOUNT["RATELIMIT_COMPAT_403"]`` is True (Django
    answers ``PermissionDenied`` with 403), as django-ratelimit's ``Ratelimited`` is."""
