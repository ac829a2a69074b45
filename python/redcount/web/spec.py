"""Limit specifications: what a decorator, a dependency or an app-wide setting asks for,
checked once at start-up and resolved per request.

```python
spec = LimitSpec.build("10/minute", name="search", where="route 'search'")
check = spec.resolve(view)          # -> Check(limits, key, cost, policies) or None
```

A [`LimitSpec`][redcount.web.spec.LimitSpec] holds the limit (a string, or a callable of the request for per-plan
limits), the key function, the cost, the methods it applies to and an exemption. Everything
that can be checked without a request is checked in [`LimitSpec.build`][redcount.web.spec.LimitSpec.build], so a typo in a
limit string fails at import or ``init_app``, naming the route, never per request.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, Union

from .._core import LimitSet
from ..errors import InvalidInputError

__all__ = [
    "Check",
    "KeyFunc",
    "KeyFunctionError",
    "LimitSpec",
    "Policy",
    "RequestKey",
    "RequestView",
    "api_key",
    "by_header",
    "by_route",
    "remote_address",
]

log = logging.getLogger("redcount.web")

_HTTP_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "TRACE", "CONNECT", "WEBSOCKET"})


class RequestView(Protocol):
    """What the shared layer needs from a request, whatever the framework."""

    @property
    def method(self) -> str: ...
    @property
    def endpoint(self) -> str: ...
    @property
    def client(self) -> str:
        """The resolved client address (see [`ClientIdentity`][redcount.web.identity.ClientIdentity])."""
    @property
    def native(self) -> Any:
        """The framework's own request object, passed to user callables."""
    def header(self, name: str) -> str | None: ...


class RequestKey:
    """A key function of the framework-neutral [`RequestView`][redcount.web.spec.RequestView] (the built-in keys);
    a plain callable used as a key gets the framework's own request instead. Immutable, so
    thread-safe."""

    def __init__(self, fn: Callable[[RequestView], str], name: str) -> None:
        self.fn = fn
        self.name = name

    def __call__(self, view: RequestView) -> str:
        return self.fn(view)

    def __repr__(self) -> str:
        return f"<redcount key {self.name}>"


KeyFunc = Union[RequestKey, Callable[[Any], str]]
"""What ``key=`` accepts: a [`RequestKey`][redcount.web.spec.RequestKey], or any callable of the framework's request
returning a str."""

remote_address = RequestKey(lambda v: v.client, "remote_address")
"""The client address: the socket peer, or what trusted proxies forwarded for (the default)."""

by_route = RequestKey(lambda v: v.endpoint, "by_route")
"""One key per route: a limit for the route as a whole, whoever calls it."""


def by_header(name: str, *, fallback: RequestKey | None = remote_address) -> RequestKey:
    """The value of request header ``name`` (for example a tenant id); requests without it
    fall back to ``fallback`` (the client address by default)."""
    if not isinstance(name, str) or not name:
        raise InvalidInputError(f"by_header needs a header name, got {name!r}")

    def key(view: RequestView) -> str:
        value = view.header(name)
        if value:
            return f"{name.lower()}:{value}"
        if fallback is None:
            return f"{name.lower()}:"
        return fallback(view)

    return RequestKey(key, f"by_header({name!r})")


def api_key(header: str = "X-API-Key", *, fallback: RequestKey | None = remote_address) -> RequestKey:
    """Key by API key, read from ``header``. The key is stored as a SHA-256 digest prefix, so
    secrets never appear in Redis key names; requests without one fall back to ``fallback``."""
    if not isinstance(header, str) or not header:
        raise InvalidInputError(f"api_key needs a header name, got {header!r}")

    def key(view: RequestView) -> str:
        value = view.header(header)
        if value:
            return "apikey:" + hashlib.sha256(value.encode("utf-8", "surrogateescape")).hexdigest()[:32]
        if fallback is None:
            return "apikey:"
        return fallback(view)

    return RequestKey(key, f"api_key({header!r})")


class KeyFunctionError(TypeError):
    """A key, limit or cost callable returned a value of the wrong type. A programming error:
    the integrations answer 500 and log it once per callable."""


@dataclass(frozen=True)
class Policy:
    """One quota policy as the headers advertise it: ``"name";q=quota;w=window``."""

    name: str
    quota: int
    window: int


@dataclass(slots=True)
class Check:
    """One limit to decide for one request: the parsed limits, the storage key, the cost.
    Made per request and never shared between requests (slotted: one is built for every limit
    of every request)."""

    spec: LimitSpec = field(repr=False)
    limits: LimitSet = field(repr=False)
    key: str
    cost: int
    policies: list[Policy]


def _arity(fn: Callable[..., Any], what: str, where: str) -> int:
    """How many positional arguments a user callable takes (0 or 1), checked at start-up."""
    if not callable(fn):
        raise InvalidInputError(f"{what} on {where} must be callable, got {type(fn).__name__}")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return 1
    required = [
        p
        for p in sig.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
    ]
    if len(required) > 1:
        raise InvalidInputError(f"{what} on {where} must take the request or nothing, but needs {len(required)} arguments")
    if required or any(p.kind == p.VAR_POSITIONAL for p in sig.parameters.values()):
        return 1
    return 0


def as_key(fn: KeyFunc, where: str) -> KeyFunc:
    """A key function as the integrations call it: a [`RequestKey`][redcount.web.spec.RequestKey] as is; a callable
    of the request as is; a callable of nothing (Flask-Limiter's style, reading
    ``flask.request``) wrapped to ignore the request. Checked at start-up."""
    if isinstance(fn, RequestKey):
        return fn
    if _arity(fn, "key", where):
        return fn
    nullary: Callable[[], str] = fn  # type: ignore[assignment]
    wrapped: Callable[[Any], str] = lambda _request: nullary()  # noqa: E731
    wrapped.__name__ = getattr(fn, "__name__", "key")
    return wrapped


def _parse(text: str, where: str) -> LimitSet:
    try:
        return LimitSet(text)
    except (InvalidInputError, ValueError) as e:
        # The parser's message quotes the limit string already: add only where it was, and
        # nothing when ``where`` names the limit by that same string.
        if where == f"limit {text!r}":
            raise InvalidInputError(str(e)) from None
        raise InvalidInputError(f"bad limit on {where}: {e}") from None


# The functions whose error was logged, by id; each is kept alive here, so that its id is
# never reused by a later function whose first error would then go unlogged.
_logged: dict[int, object] = {}


def _once(fn: object, message: str) -> None:
    if id(fn) not in _logged:
        _logged[id(fn)] = fn
        log.error("%s", message)


def policies_of(name: str | None, limits: LimitSet) -> list[Policy]:
    """The header policies of one spec: its name alone for a single limit; suffixed by the
    window (``name-60s``) when a spec holds several; named after the limit itself
    (``10-per-60s``) when the spec has no name."""
    out: list[Policy] = []
    items = limits.limits
    for i, lim in enumerate(items):
        window = max(1, math.ceil(lim.window))
        if name is None:
            pname = f"{lim.amount}-per-{window}s"
        else:
            pname = name if len(items) == 1 else f"{name}-{window}s"
        if any(p.name == pname for p in out):
            pname = f"{pname}-{i}"
        out.append(Policy(pname, lim.amount, window))
    return out


# The strategies whose limits lease (docs/leased-limits.md says why the others do not).
LEASING_STRATEGIES = ("fixed-window", "sliding-window", "sliding-window-approx", "token-bucket", "gcra")


def config_lease(value: object, strategy: str, where: str) -> int | None:
    """The lease of limits from configuration (an app-wide or default limit): None, or an
    int >= 1, also as a string of digits (an environment variable or a config file). Only
    the rate strategies' limiters lease (not ``"concurrency"``: docs/leased-limits.md says
    why); others raise [`InvalidInputError`][redcount.errors.InvalidInputError] at start-up rather than on
    the first request."""
    if value is None or value == "":
        return None
    if isinstance(value, str) and value.strip().isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InvalidInputError(f"{where} must be an int >= 1 (units per lease) or None, got {value!r}")
    if strategy not in LEASING_STRATEGIES:
        raise InvalidInputError(
            f"{where}: leased limits need a rate strategy ('fixed-window', 'sliding-window', "
            f"'sliding-window-approx', 'token-bucket' or 'gcra'), this "
            f"limiter's is {strategy!r} (see docs/leased-limits.md)"
        )
    return value


def _check_name(name: str, where: str) -> str:
    if not isinstance(name, str) or not name or not all(0x20 <= ord(c) < 0x7F for c in name):
        raise InvalidInputError(f"limit name on {where} must be printable ASCII (it goes into headers), got {name!r}")
    return name


@dataclass
class LimitSpec:
    """A limit as declared: see [`build`][redcount.web.spec.LimitSpec.build]. Immutable after build, so thread-safe."""

    limit: str | Callable[..., str]
    name: str
    scope: str
    key: KeyFunc | None = None
    cost: int | Callable[..., int] = 1
    methods: frozenset[str] | None = None
    exempt_when: Callable[..., bool] | None = None
    per_method: bool = False
    per_route: bool = False
    shadow: bool = False
    where: str = "?"
    auto_name: bool = False
    static: LimitSet | None = None
    static_policies: list[Policy] = field(default_factory=list)
    _limit_arity: int = 1
    _cost_arity: int = 1
    _exempt_arity: int = 0
    _prefix: str | None = None  # the key up to the client's part, when no request part precedes it
    lease: int | None = None  # a leased limit: units a process takes at a time (Limiter.hit(lease=))

    @classmethod
    def build(
        cls,
        limit: str | Callable[..., str],
        *,
        name: str | None,
        scope: str | None = None,
        key: KeyFunc | None = None,
        cost: int | Callable[..., int] = 1,
        methods: Iterable[str] | None = None,
        exempt_when: Callable[..., bool] | None = None,
        per_method: bool = False,
        per_route: bool = False,
        shadow: bool = False,
        where: str,
        lease: int | None = None,
    ) -> LimitSpec:
        """Check everything that can be checked without a request, raising
        [`InvalidInputError`][redcount.errors.InvalidInputError] that names ``where`` (the route).

        ``limit``: ``"10/minute"``, ``"5/second;100/hour"`` or a callable of the request
        returning such a string. ``key``: a [`RequestKey`][redcount.web.spec.RequestKey], a callable of the request
        returning a str, or None for the integration's default. ``cost``: an int >= 1 or a
        callable of the request. ``methods``: the HTTP methods it applies to (default all).
        ``exempt_when``: a callable (of nothing, or of the request) returning True to skip.
        ``name``: the policy name in the headers and the metrics label; None names each
        policy after its limit (``10-per-60s``). ``per_method``: separate counts per HTTP method. ``per_route``: separate counts per
        endpoint (default limits). ``shadow``: count and report, never refuse.
        ``lease``: a leased limit for a hot key (``Limiter.hit(..., lease=N)``: each process
        takes up to N units at a time and decides locally; fixed-window and
        sliding-window-approx limiters only); such a limit is decided on its own, not in one
        call with the request's other limits."""
        if name is not None:
            name = _check_name(name, where)
        label = name if name is not None else (limit if isinstance(limit, str) else "dynamic")
        spec = cls(limit=limit, name=label, scope=scope or label, where=where, per_method=bool(per_method),
                   per_route=bool(per_route), shadow=bool(shadow), auto_name=name is None)
        if isinstance(limit, str):
            spec.static = _parse(limit, where)
            spec.static_policies = policies_of(name, spec.static)
        elif callable(limit):
            spec._limit_arity = _arity(limit, "limit", where)
        else:
            raise InvalidInputError(f"limit on {where} must be a string like '10/minute' or a callable, got {limit!r}")
        spec.key = as_key(key, where) if key is not None else None
        if isinstance(cost, bool) or not (isinstance(cost, int) or callable(cost)):
            raise InvalidInputError(f"cost on {where} must be an int >= 1 or a callable, got {cost!r}")
        if isinstance(cost, int):
            if cost < 1:
                raise InvalidInputError(f"cost on {where} must be >= 1, got {cost}")
            if spec.static is not None and cost > min(lim.burst or lim.amount for lim in spec.static.limits):
                raise InvalidInputError(f"cost {cost} on {where} is more than the limit {limit!r} ever allows")
        else:
            spec._cost_arity = _arity(cost, "cost", where)
        spec.cost = int(cost) if isinstance(cost, int) else cost  # a plain int: resolve() tests its class
        if methods is not None:
            if isinstance(methods, str):
                methods = [methods]
            ms = frozenset(m.upper() for m in methods if isinstance(m, str))
            bad = sorted(m for m in ms if m not in _HTTP_METHODS)
            if bad or not ms or any(not isinstance(m, str) for m in methods):
                raise InvalidInputError(f"methods on {where} must be HTTP method names, got {sorted(methods)!r}")
            spec.methods = ms
        if exempt_when is not None:
            spec._exempt_arity = _arity(exempt_when, "exempt_when", where)
            spec.exempt_when = exempt_when
        if lease is not None:
            if isinstance(lease, bool) or not isinstance(lease, int) or lease < 1:
                raise InvalidInputError(
                    f"lease on {where} must be an int >= 1 (units per lease) or None, got {lease!r}"
                )
            spec.lease = lease
        if not spec.per_route and not spec.per_method:
            spec._prefix = spec.scope + "|"
        return spec

    def _call(self, fn: Callable[..., Any], arity: int, native: Any) -> Any:
        return fn(native) if arity else fn()

    def resolve(self, view: RequestView, default_key: KeyFunc) -> Check | None:
        """The check for this request, or None when the spec does not apply to it.

        A callable returning the wrong type raises [`KeyFunctionError`][redcount.web.spec.KeyFunctionError] (logged once
        per callable); a dynamic limit string that does not parse raises
        [`InvalidInputError`][redcount.errors.InvalidInputError] (logged once per callable)."""
        if self.methods is not None and view.method.upper() not in self.methods:
            return None
        if self.exempt_when is not None and self._call(self.exempt_when, self._exempt_arity, view.native):
            return None
        if self.static is not None:
            limits, policies = self.static, self.static_policies
        else:
            fn = self.limit
            assert callable(fn)
            text = self._call(fn, self._limit_arity, view.native)
            if isinstance(text, LimitSet):
                limits = text
            elif isinstance(text, str):
                try:
                    limits = LimitSet(text)
                except (InvalidInputError, ValueError) as e:
                    msg = f"the limit callable on {self.where} returned a bad limit: {e}"
                    _once(fn, msg)
                    raise InvalidInputError(msg) from None
            else:
                msg = f"the limit callable on {self.where} must return a str like '10/minute', got {type(text).__name__}"
                _once(fn, msg)
                raise KeyFunctionError(msg)
            policies = policies_of(None if self.auto_name else self.name, limits)
        keyfn = self.key if self.key is not None else default_key
        if keyfn is remote_address:  # the default: no call through the RequestKey
            ident = view.client
        elif isinstance(keyfn, RequestKey):
            ident = keyfn(view)
        else:
            ident = keyfn(view.native)
        if not isinstance(ident, str):
            msg = f"the key function {getattr(keyfn, '__name__', keyfn)!r} on {self.where} must return a str, got {type(ident).__name__}"
            _once(keyfn, msg)
            raise KeyFunctionError(msg)
        cost: Any = self.cost
        if cost.__class__ is not int:  # build() made a fixed cost a plain int; else a callable
            cost = self._call(cost, self._cost_arity, view.native)
            if not isinstance(cost, int) or isinstance(cost, bool) or cost < 1:
                msg = f"the cost callable on {self.where} must return an int >= 1, got {cost!r}"
                _once(self.cost, msg)
                raise KeyFunctionError(msg)
        if self._prefix is not None:
            return Check(self, limits, self._prefix + ident, cost, policies)
        parts = [self.scope]
        if self.per_route:
            parts.append(view.endpoint)
        if self.per_method:
            parts.append(view.method.upper())
        parts.append(ident)
        return Check(self, limits, "|".join(parts), cost, policies)


def client_prefix(spec: LimitSpec, endpoint: str | None) -> str | None:
    """When only the client's address varies between the checks this spec makes for
    requests to ``endpoint`` (a fixed limit, cost and scope; every method; no exemption; the
    integration's default key, which must be [`remote_address`][redcount.web.spec.remote_address]), the key up to the
    client's part: ``Check(spec, spec.static, prefix + client, spec.cost, spec.static_policies)``
    is then what [`LimitSpec.resolve`][redcount.web.spec.LimitSpec.resolve] would build. None otherwise."""
    if (
        spec.static is None
        or spec.methods is not None
        or spec.exempt_when is not None
        or spec.key is not None
        or spec.per_method
        or spec.cost.__class__ is not int
    ):
        return None
    if not spec.per_route:
        return spec.scope + "|"
    return None if endpoint is None else f"{spec.scope}|{endpoint}|"


def resolve_all(specs: Sequence[LimitSpec], view: RequestView, default_key: KeyFunc) -> list[Check]:
    """Every spec that applies to this request, in order."""
    out = []
    for spec in specs:
        c = spec.resolve(view, default_key)
        if c is not None:
            out.append(c)
    return out
