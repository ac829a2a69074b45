"""Django REST framework throttles on redcount: atomic twins of DRF's own.

```python
REST_FRAMEWORK = {
    "DEFAULT_THROTTLE_CLASSES": ["redcount.django.drf.AnonRateThrottle",
                                 "redcount.django.drf.UserRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"anon": "100/day", "user": "1000/day", "uploads": "20/hour"},
}
```

Each class subclasses its DRF namesake, so scopes, rates (``DEFAULT_THROTTLE_RATES``,
``rate``/``scope`` attributes, ``"5/min"`` strings) and the cache keys that say who is
counted (``get_cache_key``, ``get_ident`` with ``NUM_PROXIES``) are DRF's. What differs is
the counting: DRF reads the request history from the cache, decides, and writes it back,
so concurrent requests read the same history and all pass; here each request is one atomic
limiter call (the exact sliding log, DRF's own algorithm) on the ``REDCOUNT`` store, so no
window of the throttle's length ever admits more than its rate. `wait` is the
limiter's ``retry_after``. With [`RateLimitMiddleware`][redcount.django.middleware.RateLimitMiddleware] installed,
responses carry the ``RateLimit``/``RateLimit-Policy`` headers too (``Retry-After`` on a 429
is DRF's). When the store is down, ``REDCOUNT["FAIL"]`` decides: ``"open"`` lets requests
through, ``"closed"`` answers 503.

A throttle whose ``timer`` is overridden (``def timer(self)`` in a subclass, or a test's
``cls.timer = lambda self: t``) decides on that timer's time, as DRF's own does: its
decisions go to a limiter on a second connection to the store whose clock is set to the
timer's reading (on ``memory://`` a keyspace of its own), so a test moves time by moving the
timer.
"""

from __future__ import annotations

from typing import Any

try:
    from rest_framework import throttling as _drf
    from rest_framework.exceptions import APIException
except ImportError as exc:  # pragma: no cover - exercised without DRF installed
    raise ImportError(
        f"redcount.django.drf needs Django REST framework ({exc.name} is missing): pip install 'redcount[django-drf]'"
    ) from exc

from ..web.engine import decide
from ..web.spec import Check, LimitSpec
from ._http import attach
from .conf import get_state

# DRF's default clock, read when this module is imported: a throttle whose timer is another
# callable (a subclass's ``def timer(self)``, a test's ``cls.timer = lambda self: t``)
# decides on that timer's time. Compared with the function DRF's class holds, not with
# ``time.time`` now, so that a test patching ``time.time`` does not count as an override.
_SYSTEM_TIMER = _drf.SimpleRateThrottle.timer

__all__ = ["AnonRateThrottle", "ScopedRateThrottle", "SimpleRateThrottle", "StoreUnavailable", "UserRateThrottle"]


class StoreUnavailable(APIException):  # type: ignore[misc]
    """503: the store cannot decide and ``REDCOUNT["FAIL"]`` is ``"closed"``."""

    status_code = 503
    default_detail = "The rate limiter cannot decide right now; retry shortly."
    default_code = "rate_limiter_unavailable"


_SPECS: dict[tuple[str, int, int], LimitSpec] = {}


def _spec(scope: str, num: int, duration: int) -> LimitSpec:
    found = _SPECS.get((scope, num, duration))
    if found is None:
        name = scope if scope.isascii() and scope.isprintable() and scope else None
        found = LimitSpec.build(f"{num}/{duration} seconds", name=name, scope=f"drf:{scope}", where=f"throttle {scope!r}")
        _SPECS[(scope, num, duration)] = found
    return found


class SimpleRateThrottle(_drf.SimpleRateThrottle):  # type: ignore[misc]
    """DRF's ``SimpleRateThrottle`` deciding with one atomic limiter call. Subclass it as
    DRF's (``scope``, ``rate``, ``get_cache_key``); ``strategy`` picks the limiter's strategy
    (default ``"sliding-window"``, the exact log DRF keeps)."""

    strategy = "sliding-window"

    def allow_request(self, request: Any, view: Any) -> bool:
        """One atomic hit for this request: True when the throttle's rate allows it."""
        if self.rate is None:
            return True
        self.key = self.get_cache_key(request, view)
        if self.key is None:
            return True
        return self._decide(request)

    def _decide(self, request: Any) -> bool:
        self._wait: float | None = None
        state = get_state()
        if not state.enabled:
            return True
        scope = str(getattr(self, "scope", None) or type(self).__name__)
        spec = _spec(scope, int(self.num_requests), int(self.duration))
        assert spec.static is not None
        check = Check(spec, spec.static, f"drf|{self.key}", 1, spec.static_policies)
        s = state.settings
        django_request = getattr(request, "_request", request)
        after = getattr(django_request, "_redcount_verdict", None)
        timer = self.timer
        if timer is _SYSTEM_TIMER:
            verdict = decide(state.limiter_for(self.strategy), [check], s.policy, s.metrics, shadow_all=s.shadow,
                             budget=state.budget, after=after, screen=s.screen)
        else:
            # An overridden timer is this throttle's clock, as in DRF: the decision runs on a
            # limiter whose client clock is set to the timer's time. One clock for every such
            # throttle of the process, hence the lock around setting it and deciding.
            limiter, clock = state.limiter_on_clock(self.strategy)
            with state.clock_lock:
                self.now = now = float(timer())
                clock.set(now)
                verdict = decide(limiter, [check], s.policy, s.metrics, shadow_all=s.shadow,
                                 budget=state.budget, after=after, screen=s.screen)
        attach(django_request, verdict)
        if verdict.unavailable:
            raise StoreUnavailable()
        if verdict.allowed:
            return True
        refusal = verdict.refusal
        self._wait = refusal.decision.retry_after if refusal is not None else float(self.duration)
        return False

    def wait(self) -> float | None:
        """Seconds until this client may try again: the limiter's ``retry_after`` for the
        request just refused (None after an allowed one)."""
        return getattr(self, "_wait", None)


class AnonRateThrottle(SimpleRateThrottle, _drf.AnonRateThrottle):  # type: ignore[misc]
    """DRF's ``AnonRateThrottle`` (scope ``"anon"``: unauthenticated requests, by client
    address), atomic."""


class UserRateThrottle(SimpleRateThrottle, _drf.UserRateThrottle):  # type: ignore[misc]
    """DRF's ``UserRateThrottle`` (scope ``"user"``: by user id, or by client address for
    anonymous requests), atomic."""


class ScopedRateThrottle(SimpleRateThrottle, _drf.ScopedRateThrottle):  # type: ignore[misc]
    """DRF's ``ScopedRateThrottle`` (the view's ``throttle_scope`` names the rate; views
    with the same scope share a count), atomic."""

    def allow_request(self, request: Any, view: Any) -> bool:
        """As DRF's: no ``throttle_scope`` on the view means no throttling."""
        self.scope = getattr(view, self.scope_attr, None)
        if not self.scope:
            return True
        self.rate = self.get_rate()
        self.num_requests, self.duration = self.parse_rate(self.rate)
        return super().allow_request(request, view)
