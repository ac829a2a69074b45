"""``ratelimit``: django-ratelimit's decorator, deciding on redcount."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from asgiref.sync import iscoroutinefunction
from django.conf import settings
from django.utils.module_loading import import_string

from ...web.engine import Verdict
from .._http import apply_headers, refuse, refuse_sync, verdict
from ..conf import get_state
from .core import ALL, UNSAFE, ausage_and_verdict, check_key, usage_and_verdict
from .exceptions import Ratelimited

__all__ = ["ratelimit"]

F = TypeVar("F", bound=Callable[..., Any])


def _blocked(request: Any, decided: Verdict | None, *, sync: bool) -> Any:
    state = get_state()
    if state.compat_403 or decided is None:
        cls = getattr(settings, "RATELIMIT_EXCEPTION_CLASS", Ratelimited)
        raise (import_string(cls) if isinstance(cls, str) else cls)()
    return (refuse_sync if sync else refuse)(request, verdict(request) or decided, state)


def ratelimit(group: Any = None, key: Any = None, rate: Any = None, method: Any = ALL, block: bool = True) -> Callable[[F], F]:
    """django-ratelimit's decorator, for sync and async views (class-based views through
    ``method_decorator``).

    ``group``: the name counts are shared under (default: the view's module and name);
    ``key``: ``"ip"``, ``"user"``, ``"user_or_ip"``, ``"header:<name>"``, ``"get:<name>"``,
    ``"post:<name>"``, a callable ``(group, request)`` or its dotted path; ``rate``:
    ``"5/m"``, ``"100/5m"``, ``(count, seconds)``, None (no limit), or a callable
    ``(group, request)`` (or its dotted path) returning one; ``method``: [`ALL`][redcount.django.ratelimit.core.ALL]
    (default), [`UNSAFE`][redcount.django.ratelimit.core.UNSAFE], a method name or a list of them; ``block``: refuse limited
    requests (429 with the rate-limit headers, or [`Ratelimited`][redcount.django.ratelimit.exceptions.Ratelimited] with
    ``REDCOUNT["RATELIMIT_COMPAT_403"]``). Sets ``request.limited`` (True when this or an
    earlier decorator found the request over its limit).
    """
    if rate is not None:
        check_key(key)

    def decorator(fn: F) -> F:
        if iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def _awrapped(request: Any, *args: Any, **kw: Any) -> Any:
                old_limited = getattr(request, "limited", False)
                usage, decided = await ausage_and_verdict(request, group, fn, key, rate, method, True)
                limited = bool(usage is not None and usage["should_limit"])
                request.limited = limited or old_limited
                if limited and block:
                    answer = _blocked(request, decided, sync=False)
                    return (await answer) if hasattr(answer, "__await__") else answer
                response = await fn(request, *args, **kw)
                return apply_headers(response, verdict(request), get_state()) if decided is not None else response

            return _awrapped  # type: ignore[return-value]

        @functools.wraps(fn)
        def _wrapped(request: Any, *args: Any, **kw: Any) -> Any:
            old_limited = getattr(request, "limited", False)
            usage, decided = usage_and_verdict(request, group, fn, key, rate, method, True)
            limited = bool(usage is not None and usage["should_limit"])
            request.limited = limited or old_limited
            if limited and block:
                return _blocked(request, decided, sync=True)
            response = fn(request, *args, **kw)
            return apply_headers(response, verdict(request), get_state()) if decided is not None else response

        return _wrapped  # type: ignore[return-value]

    return decorator


ratelimit.ALL = ALL  # type: ignore[attr-defined]
ratelimit.UNSAFE = UNSAFE  # type: ignore[attr-defined]
