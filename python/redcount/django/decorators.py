"""``@redcount.django.limit(...)``: a limit on one view (function, async or class-based).

```python
from redcount.django import limit

@limit("10/minute")                                  # per client address
def search(request): ...

@limit("5/minute", key="user", methods=["POST"])
async def comment(request): ...                      # decided on redcount.aio

@limit("5/15 minutes", scope="login", deduct_when=lambda response: response.status_code == 401)
def login(request): ...                              # only failed logins count

@method_decorator(limit("100/hour", key="user"), name="dispatch")
class Export(View): ...                              # or @limit(...) on the class itself
```

A refused request gets a 429 problem+json response (or ``REDCOUNT["VIEW"]``'s) with the
``RateLimit``/``RateLimit-Policy`` and ``Retry-After`` headers; allowed responses carry the
headers too. Decorators stack; every limit holds.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, Union

from asgiref.sync import iscoroutinefunction

from ..errors import InvalidInputError
from ..web.engine import Verdict, decide, decide_async
from ..web.spec import Check, KeyFunc, LimitSpec
from ._http import View, apply_headers, attach, load_user, refuse, refuse_sync
from .conf import ConfigurationError, State, get_state
from .keys import as_key

__all__ = ["limit"]

V = TypeVar("V", bound=Callable[..., Any])
LimitArg = Union[str, Callable[..., str]]
CostArg = Union[int, Callable[..., int]]


_claimed: dict[str, int] = {}  # limits declared per view, so that each counts apart
_lock = threading.Lock()


def _view_name(view: Any) -> tuple[str, str]:
    """The policy name (the function's name, or ``Class.method``) and the per-view scope."""
    bound = getattr(view.func, "__self__", None) if isinstance(view, functools.partial) else None
    if bound is not None:
        # method_decorator hands over the method bound to the view instance: name it after
        # the instance's class, not the class defining the method (View.dispatch for all).
        cls = type(bound)
        qual = f"{cls.__qualname__}.{getattr(view, '__name__', 'dispatch')}"
        module = cls.__module__
    else:
        qual = str(getattr(view, "__qualname__", getattr(view, "__name__", "view")))
        module = str(getattr(view, "__module__", "?"))
    short = qual.split(".<locals>.")[-1]
    return short, f"{module}.{qual}"


def _predicate(fn: Callable[..., bool] | None, where: str) -> tuple[Callable[..., bool] | None, int]:
    if fn is None:
        return None, 0
    if not callable(fn):
        raise ConfigurationError(f"deduct_when on {where} must be callable(response) or callable(request, response)")
    try:
        params = [
            p for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
        arity = 2 if len(params) >= 2 else 1
    except (TypeError, ValueError):
        arity = 1
    return fn, arity


def limit(
    limit: LimitArg,
    *,
    key: str | KeyFunc | None = None,
    cost: CostArg = 1,
    methods: Iterable[str] | None = None,
    scope: str | None = None,
    exempt_when: Callable[..., bool] | None = None,
    deduct_when: Callable[..., bool] | None = None,
    per_method: bool = False,
    name: str | None = None,
    shadow: bool = False,
    lease: int | None = None,
) -> Callable[[V], V]:
    """Limit a view: a function view, an async view, or a class-based view (decorate the
    class, or use ``method_decorator(limit(...), name="dispatch")``).

    - ``limit``: ``"10/minute"``, ``"5/second;100/day"``, or a callable of the request
      returning one (per-plan limits).
    - ``key``: who is counted: ``"ip"`` (default: ``REDCOUNT["KEY"]``, else the client
      address through ``TRUSTED_PROXIES``), ``"user"``, ``"user_or_ip"``,
      ``"header:<name>"``, a [`redcount.web.RequestKey`][redcount.web.spec.RequestKey], a callable of the request
      returning a str, or its dotted path (see [`redcount.django.keys`][redcount.django.keys]).
    - ``cost``: what one request costs, an int or a callable of the request.
    - ``methods``: the HTTP methods it applies to (default: all); ``per_method``: count each
      method apart.
    - ``scope``: a name shared by every view limited with the same scope: one count for all
      of them (default: each view counts alone).
    - ``exempt_when``: a callable (of nothing, or of the request) returning True to skip.
    - ``deduct_when``: charge by outcome: the limit is tested before the view (a request
      over it is refused) and charged after it only when ``deduct_when(response)`` (or
      ``deduct_when(request, response)``) is true, e.g. only failed logins count. Testing
      and charging are two round trips, so concurrent requests may overshoot by the ones in
      flight.
    - ``name``: the policy name in the headers (default: the view's name, or ``scope``).
    - ``shadow``: count and report, never refuse.
    - ``lease``: a leased limit for a hot key: each process takes up to this many units at
      a time and decides from them locally (see docs/leased-limits.md).

    Bad arguments raise [`ConfigurationError`][redcount.django.conf.ConfigurationError] here, at import.
    """
    base_where = f"limit {limit!r}" if isinstance(limit, str) else "limit"
    try:
        keyfn = as_key(key, base_where) if key is not None else None
        LimitSpec.build(limit, name=name, key=keyfn, cost=cost, methods=methods, exempt_when=exempt_when,
                        per_method=per_method, shadow=shadow, where=base_where, lease=lease)
    except InvalidInputError as e:
        if isinstance(e, ConfigurationError):
            raise
        raise ConfigurationError(str(e)) from None
    if scope is not None and (not isinstance(scope, str) or not scope):
        raise ConfigurationError(f"scope on {base_where} must be a non-empty str, got {scope!r}")
    deduct, deduct_arity = _predicate(deduct_when, base_where)
    specs: dict[str, LimitSpec] = {}  # per view (method_decorator decorates on every call)

    def spec_for(view: Any) -> LimitSpec:
        short, qual = _view_name(view)
        found = specs.get(qual)
        if found is None:
            with _lock:
                # A second limit on the same view (stacked, or the function decorated twice)
                # counts apart from the first, as every limit declared holds on its own.
                n = _claimed.get(qual, 0)
                _claimed[qual] = n + 1
            if n:
                short, qual = f"{short}-{n + 1}", f"{qual}#{n}"
            try:
                found = LimitSpec.build(
                    limit, name=name or scope or short, scope=f"shared:{scope}" if scope else qual, key=keyfn,
                    cost=cost, methods=methods, exempt_when=exempt_when, per_method=per_method, shadow=shadow,
                    where=f"view {short!r}", lease=lease,
                )
            except InvalidInputError as e:
                raise ConfigurationError(str(e)) from None
            specs[qual] = found
        return found

    def charged(decided: Verdict, request: Any, response: Any) -> bool:
        if deduct is None or not decided.outcomes:
            return False
        return bool(deduct(request, response) if deduct_arity == 2 else deduct(response))

    def settle(state: State, merged: Verdict, check: Check, after_charge: Verdict) -> None:
        if after_charge.outcomes and after_charge.outcomes[0].decision.allowed:
            merged.outcomes = [o for o in merged.outcomes if o.check is not check] + after_charge.outcomes

    def decorate(view: V) -> V:
        if isinstance(view, type):
            from django.utils.decorators import method_decorator

            return method_decorator(decorate, name="dispatch")(view)  # type: ignore[no-any-return]
        spec = spec_for(view)
        where_charge = deduct is None

        if iscoroutinefunction(view):

            @functools.wraps(view)
            async def async_wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
                state = get_state()
                if not state.enabled:
                    return await view(request, *args, **kwargs)
                s = state.settings
                user = await load_user(request, (spec,), state)
                check = spec.resolve(View(request, state, user), s.key)
                if check is None:
                    return await view(request, *args, **kwargs)
                decided = await decide_async(
                    state.alimiter, [check], s.policy, s.metrics, shadow_all=s.shadow, budget=state.budget,
                    after=getattr(request, "_redcount_verdict", None), charge=where_charge, screen=s.screen,
                )
                merged = attach(request, decided)
                if not decided.allowed:
                    answer = refuse(request, merged, state)
                    return (await answer) if hasattr(answer, "__await__") else answer
                response = await view(request, *args, **kwargs)
                if charged(decided, request, response):
                    settle(state, merged, check, await decide_async(
                        state.alimiter, [check], s.policy, s.metrics, shadow_all=s.shadow, budget=state.budget,
                        screen=s.screen))
                return apply_headers(response, merged, state)

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(view)
        def wrapper(request: Any, *args: Any, **kwargs: Any) -> Any:
            state = get_state()
            if not state.enabled:
                return view(request, *args, **kwargs)
            s = state.settings
            check = spec.resolve(View(request, state), s.key)
            if check is None:
                return view(request, *args, **kwargs)
            decided = decide(
                state.limiter, [check], s.policy, s.metrics, shadow_all=s.shadow, budget=state.budget,
                after=getattr(request, "_redcount_verdict", None), charge=where_charge, screen=s.screen,
            )
            merged = attach(request, decided)
            if not decided.allowed:
                return refuse_sync(request, merged, state)
            response = view(request, *args, **kwargs)
            if charged(decided, request, response):
                settle(state, merged, check, decide(
                    state.limiter, [check], s.policy, s.metrics, shadow_all=s.shadow, budget=state.budget,
                    screen=s.screen))
            return apply_headers(response, merged, state)

        return wrapper  # type: ignore[return-value]

    return decorate
