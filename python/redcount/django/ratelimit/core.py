"""``is_ratelimited`` and ``get_usage``: django-ratelimit's functions, deciding on redcount.

Every call is one atomic limiter call ([`redcount.Limiter.hit`][redcount.limiter.Limiter.hit] when ``increment``,
else [`test`][redcount.limiter.Limiter.test]) under ``REDCOUNT``'s failure policy and budget. The
``a``-prefixed twins await [`redcount.aio`][redcount.aio] for async views.
"""

from __future__ import annotations

import functools
import hashlib
import math
import re
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from ...web.engine import Verdict, decide, decide_async
from ...web.spec import Check, LimitSpec
from .._http import View, attach
from ..conf import State, get_state

__all__ = ["ALL", "UNSAFE", "aget_usage", "ais_ratelimited", "get_usage", "is_ratelimited"]

ALL = (None,)
"""Every HTTP method (``method=ALL``, the default)."""

UNSAFE = ["DELETE", "PATCH", "POST", "PUT"]
"""The methods that change state (``method=UNSAFE``)."""

_PERIODS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_RATE = re.compile(r"([\d]+)/([\d]*)([smhd])?")


def split_rate(rate: Any) -> tuple[int, int]:
    """``"5/m"``, ``"100/5m"``, ``"10/s"`` (``"10/"`` is per second) or ``(count, seconds)``."""
    if isinstance(rate, tuple):
        count, seconds = rate
        return int(count), int(seconds)
    found = _RATE.match(rate) if isinstance(rate, str) else None
    if found is None:
        raise ImproperlyConfigured(f"Ratelimit rate must look like '5/m' or '100/5m', got {rate!r}")
    count, multi, period = found.groups()
    seconds = _PERIODS[(period or "s").lower()] * (int(multi) if multi else 1)
    return int(count), seconds


def group_of(fn: Any) -> str:
    """The group a view is counted under when none is given: its module and qualified name
    (and its class, for a bound method), as django-ratelimit names it."""
    if isinstance(fn, functools.partial):
        fn = fn.func
    if getattr(fn, "__name__", None) == "bound_func" and getattr(fn, "__closure__", None):
        fn = fn.__closure__[0].cell_contents
    parts = []
    if hasattr(fn, "__module__"):
        parts.append(fn.__module__)
    if hasattr(fn, "__self__"):
        parts.append(fn.__self__.__class__.__name__)
    parts.append(fn.__qualname__)
    return ".".join(parts)


def method_matches(request: Any, method: Any) -> bool:
    """Whether ``method`` (``ALL``, a name or a list of names) covers this request."""
    if method == ALL:
        return True
    if not isinstance(method, (list, tuple)):
        method = [method]
    return str(request.method) in [m.upper() for m in method]


def _methods_part(method: Any) -> str:
    if method == ALL:
        return ""
    if isinstance(method, (list, tuple)):
        return "".join(sorted(m.upper() for m in method))
    return str(method).upper()


def _header(request: Any, name: str) -> str:
    return str(request.META.get("HTTP_" + name.replace("-", "_").upper(), ""))


def check_key(key: Any) -> None:
    """Refuse a key django-ratelimit would refuse on the first request, now."""
    if not key:
        raise ImproperlyConfigured("Ratelimit key must be specified")
    if callable(key) or key in ("ip", "user", "user_or_ip"):
        return
    if isinstance(key, str) and ":" in key:
        if key.split(":", 1)[0] not in ("get", "post", "header"):
            raise ImproperlyConfigured(f"Unknown ratelimit key: {key}")
        return
    if isinstance(key, str) and "." in key:
        return
    raise ImproperlyConfigured(f"Could not understand ratelimit key: {key}")


def key_value(key: Any, group: str, request: Any, view: View) -> str:
    """The value a request is counted under for ``key``."""
    if callable(key):
        return str(key(group, request))
    if key == "ip":
        return view.client
    if key == "user":
        return str(getattr(view.user, "pk", None))
    if key == "user_or_ip":
        u = view.user
        return str(u.pk) if u is not None and u.is_authenticated else view.client
    if ":" in key:
        accessor, name = key.split(":", 1)
        if accessor == "get":
            return str(request.GET.get(name, ""))
        if accessor == "post":
            return str(request.POST.get(name, ""))
        if accessor == "header":
            return _header(request, name)
        raise ImproperlyConfigured(f"Unknown ratelimit key: {key}")
    if "." in key:
        return str(import_string(key)(group, request))
    raise ImproperlyConfigured(f"Could not understand ratelimit key: {key}")


_SPECS: dict[tuple[str, int, int], LimitSpec] = {}
_SPEC_CACHE = 10_000


def _spec(group: str, count: int, seconds: int) -> LimitSpec:
    found = _SPECS.get((group, count, seconds))
    if found is None:
        name = group if group.isascii() and group.isprintable() and group else None
        found = LimitSpec.build(f"{count}/{seconds} seconds", name=name, scope=group, where=f"ratelimit group {group!r}")
        if len(_SPECS) >= _SPEC_CACHE:
            _SPECS.clear()
        _SPECS[(group, count, seconds)] = found
    return found


class _Plan:
    """One call's check, or None when nothing is limited; ``zero`` for a rate of 0 (every
    request is over it: django-ratelimit's way of shutting a client out)."""

    __slots__ = ("check", "zero")

    def __init__(self, check: Check | None, zero: int = 0) -> None:
        self.check = check
        self.zero = zero


def _zero(plan: _Plan, request: Any, increment: bool) -> tuple[dict[str, Any], Verdict]:
    refused = Verdict([], allowed=False)
    attach(request, refused)
    return {"count": 1 if increment else 0, "limit": 0, "should_limit": True, "time_left": plan.zero}, refused


def _plan(request: Any, group: Any, fn: Any, key: Any, rate: Any, method: Any, state: State, user: Any) -> _Plan:
    if group is None and fn is None:
        raise ImproperlyConfigured("get_usage must be called with either `group` or `fn` arguments")
    if not state.enabled or not getattr(settings, "RATELIMIT_ENABLE", True):
        return _Plan(None)
    if not method_matches(request, method):
        return _Plan(None)
    if group is None:
        group = group_of(fn)
    if callable(rate):
        rate = rate(group, request)
    elif isinstance(rate, str) and "." in rate:
        rate = import_string(rate)(group, request)
    if rate is None:
        return _Plan(None)
    count, seconds = split_rate(rate)
    if seconds <= 0:
        raise ImproperlyConfigured("Ratelimit period must be greater than 0")
    check_key(key)
    if count == 0:
        return _Plan(None, seconds)
    view = View(request, state, user) if user is not None else View(request, state)
    value = key_value(key, group, request, view)
    spec = _spec(group, count, seconds)
    assert spec.static is not None
    digest = hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:32]
    storage_key = f"rl|{group}|{count}/{seconds}|{_methods_part(method)}|{digest}"
    return _Plan(Check(spec, spec.static, storage_key, 1, spec.static_policies))


def _usage(verdict: Verdict, increment: bool) -> dict[str, Any] | None:
    if verdict.unavailable:  # the store is down and FAIL is "closed"
        return {"count": 0, "limit": 0, "should_limit": True, "time_left": -1}
    if not verdict.outcomes:  # the store is down and FAIL is "open"
        return None
    d = verdict.outcomes[0].decision
    over = not d.allowed and not verdict.outcomes[0].shadow
    count = d.limit - d.remaining + (1 if increment and not d.allowed else 0)
    return {
        "count": count,
        "limit": d.limit,
        "should_limit": over,
        "time_left": math.ceil(d.retry_after if not d.allowed else d.reset_after),
    }


def usage_and_verdict(
    request: Any, group: Any = None, fn: Any = None, key: Any = None, rate: Any = None, method: Any = ALL,
    increment: bool = False, *, user: Any = None,
) -> tuple[dict[str, Any] | None, Verdict | None]:
    """[`get_usage`][redcount.django.ratelimit.core.get_usage] and the verdict it attached to the request (None when nothing was
    decided)."""
    state = get_state()
    plan = _plan(request, group, fn, key, rate, method, state, user)
    if plan.zero:
        return _zero(plan, request, increment)
    if plan.check is None:
        return None, None
    s = state.settings
    decided = decide(state.limiter, [plan.check], s.policy, s.metrics, shadow_all=s.shadow, budget=state.budget,
                     after=getattr(request, "_redcount_verdict", None), charge=increment)
    attach(request, decided)
    return _usage(decided, increment), decided


async def ausage_and_verdict(
    request: Any, group: Any = None, fn: Any = None, key: Any = None, rate: Any = None, method: Any = ALL,
    increment: bool = False,
) -> tuple[dict[str, Any] | None, Verdict | None]:
    """The async twin of [`usage_and_verdict`][redcount.django.ratelimit.core.usage_and_verdict] (loads ``request.user`` with ``auser()``
    for the user keys)."""
    state = get_state()
    user = None
    if key in ("user", "user_or_ip") and hasattr(request, "auser"):
        user = await request.auser()
    plan = _plan(request, group, fn, key, rate, method, state, user)
    if plan.zero:
        return _zero(plan, request, increment)
    if plan.check is None:
        return None, None
    s = state.settings
    decided = await decide_async(state.alimiter, [plan.check], s.policy, s.metrics, shadow_all=s.shadow,
                                 budget=state.budget, after=getattr(request, "_redcount_verdict", None),
                                 charge=increment)
    attach(request, decided)
    return _usage(decided, increment), decided


def get_usage(
    request: Any, group: Any = None, fn: Any = None, key: Any = None, rate: Any = None, method: Any = ALL,
    increment: bool = False,
) -> dict[str, Any] | None:
    """django-ratelimit's ``get_usage``: ``{"count", "limit", "should_limit", "time_left"}``
    for this request under ``rate`` (None when the method does not match, the rate is None,
    limiting is disabled, or the store is down and ``FAIL`` is ``"open"``). ``increment``
    counts this request (when the limit allows it)."""
    return usage_and_verdict(request, group, fn, key, rate, method, increment)[0]


def is_ratelimited(
    request: Any, group: Any = None, fn: Any = None, key: Any = None, rate: Any = None, method: Any = ALL,
    increment: bool = False,
) -> bool:
    """django-ratelimit's ``is_ratelimited``: whether this request is over ``rate``
    (counting it when ``increment``; without, whether one more would be refused)."""
    usage = get_usage(request, group, fn, key, rate, method, increment)
    return bool(usage is not None and usage["should_limit"])


async def aget_usage(
    request: Any, group: Any = None, fn: Any = None, key: Any = None, rate: Any = None, method: Any = ALL,
    increment: bool = False,
) -> dict[str, Any] | None:
    """The async twin of [`get_usage`][redcount.django.ratelimit.core.get_usage], on [`redcount.aio`][redcount.aio]."""
    return (await ausage_and_verdict(request, group, fn, key, rate, method, increment))[0]


async def ais_ratelimited(
    request: Any, group: Any = None, fn: Any = None, key: Any = None, rate: Any = None, method: Any = ALL,
    increment: bool = False,
) -> bool:
    """The async twin of [`is_ratelimited`][redcount.django.ratelimit.core.is_ratelimited], on [`redcount.aio`][redcount.aio]."""
    usage = await aget_usage(request, group, fn, key, rate, method, increment)
    return bool(usage is not None and usage["should_limit"])


is_ratelimited.ALL = ALL  # type: ignore[attr-defined]
is_ratelimited.UNSAFE = UNSAFE  # type: ignore[attr-defined]
get_usage.ALL = ALL  # type: ignore[attr-defined]
get_usage.UNSAFE = UNSAFE  # type: ignore[attr-defined]
