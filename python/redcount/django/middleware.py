"""``RateLimitMiddleware``: the site's default and per-path limits, and the rate-limit
headers on every response.

```python
MIDDLEWARE = [
    ...,
    "django.contrib.auth.middleware.AuthenticationMiddleware",   # before it, for key="user"
    "redcount.django.RateLimitMiddleware",
    ...,
]
```

Sync and async capable: under WSGI it decides with [`redcount.Limiter`][redcount.limiter.Limiter] on the worker
thread (the GIL is released while it waits on Redis); under ASGI Django calls its async
form, which awaits [`redcount.aio`][redcount.aio], so the event loop never waits on the store.
"""

from __future__ import annotations

from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.urls import Resolver404, resolve

from ..web.engine import decide, decide_async
from ..web.spec import resolve_all
from ._http import View, apply_headers, attach, load_user, refuse, refuse_sync, verdict
from .conf import get_state

__all__ = ["RateLimitMiddleware", "exempt"]

V = TypeVar("V")

# How many views are marked exempt: while none is, the middleware never resolves a URL.
_exempt_marked = 0
_MARK = "redcount_exempt"


def exempt(view: V) -> V:
    """Exempts a view from [`RateLimitMiddleware`][redcount.django.middleware.RateLimitMiddleware]'s limits (``DEFAULT_LIMITS`` and
    ``PATHS``); the view's own [`limit`][redcount.django.decorators.limit] decorators and throttles
    still apply. Decorates a function or async view, or a class-based view's class
    (Django's ``View`` or DRF's ``APIView``: every URL routed to its ``as_view()``):

    ```python
    @redcount.django.exempt
    def health(request): ...

    @redcount.django.exempt
    class Status(View): ...
    ```

    Once a view is marked, the middleware resolves each request's URL (Django's
    ``resolve``, which Django does again to call the view) to find out whether its view is
    exempt; a site with no exempt view pays nothing. ``PATHS`` with ``None`` exempts by path
    instead, without resolving."""
    global _exempt_marked
    if not callable(view):
        raise TypeError(f"redcount.django.exempt decorates a view (a function or a class), got {view!r}")
    setattr(view, _MARK, True)
    _exempt_marked += 1
    return view


def is_exempt(request: Any) -> bool:
    """Whether ``request``'s URL routes to a view marked with [`exempt`][redcount.django.middleware.exempt]."""
    if not _exempt_marked:
        return False
    try:
        match = resolve(request.path_info, getattr(request, "urlconf", None))
    except Resolver404:
        return False
    func = match.func
    return bool(getattr(func, _MARK, False) or getattr(getattr(func, "view_class", None), _MARK, False))


class RateLimitMiddleware:
    """Applies ``REDCOUNT["DEFAULT_LIMITS"]`` and ``REDCOUNT["PATHS"]`` to every request
    before it reaches a view (except views marked with [`exempt`][redcount.django.middleware.exempt]), refusing with 429 (or ``REDCOUNT["VIEW"]``'s answer; 503 when
    the store is down and ``FAIL`` is ``"closed"``), and sets the rate-limit headers of
    everything decided for the request (its own limits, the decorators' and the DRF
    throttles') on the response. Validates the settings when constructed (start-up).
    Holds no per-request state, so one instance serves concurrent requests."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response
        get_state()  # validate the settings now, at start-up
        self._async = iscoroutinefunction(get_response)
        if self._async:
            markcoroutinefunction(self)

    def __call__(self, request: Any) -> Any:
        if self._async:
            return self.__acall__(request)
        state = get_state()
        if state.enabled:
            specs = state.specs_for(request.path_info)
            if specs and not is_exempt(request):
                s = state.settings
                checks = resolve_all(specs, View(request, state), s.key)
                decided = decide(
                    state.limiter, checks, s.policy, s.metrics, shadow_all=s.shadow, budget=state.budget, screen=s.screen
                )
                merged = attach(request, decided)
                if not decided.allowed:
                    return refuse_sync(request, merged, state)
        response = self.get_response(request)
        return apply_headers(response, verdict(request), state)

    async def __acall__(self, request: Any) -> Any:
        """The async form, used under ASGI: the same as ``__call__``, awaiting [`redcount.aio`][redcount.aio]."""
        state = get_state()
        if state.enabled:
            specs = state.specs_for(request.path_info)
            if specs and not is_exempt(request):
                s = state.settings
                user = await load_user(request, specs, state)
                checks = resolve_all(specs, View(request, state, user), s.key)
                decided = await decide_async(
                    state.alimiter, checks, s.policy, s.metrics, shadow_all=s.shadow, budget=state.budget,
                    screen=s.screen,
                )
                merged = attach(request, decided)
                if not decided.allowed:
                    answer = refuse(request, merged, state)
                    return (await answer) if hasattr(answer, "__await__") else answer
        response = await self.get_response(request)
        return apply_headers(response, verdict(request), state)
