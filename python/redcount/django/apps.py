"""The Django app: add ``"redcount.django"`` to ``INSTALLED_APPS`` to have the ``REDCOUNT``
setting validated when Django starts (``manage.py check``, the first request of a server
process), not on the first limited request."""

from __future__ import annotations

from django.apps import AppConfig

__all__ = ["RedcountConfig"]


class RedcountConfig(AppConfig):  # type: ignore[misc]
    """Validates ``settings.REDCOUNT`` in ``ready()``; a bad value raises
    [`ConfigurationError`][redcount.django.conf.ConfigurationError] naming the setting."""

    name = "redcount.django"
    label = "redcount"
    verbose_name = "redcount rate limiting"
    default = True

    def ready(self) -> None:
        """Build the state from ``settings.REDCOUNT`` now, so that a bad setting stops the
        start (a process forked later builds its own)."""
        from .conf import get_state

        get_state()
