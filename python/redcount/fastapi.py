"""Rate limiting for FastAPI and Starlette: a pure ASGI middleware and a dependency.

```python
from fastapi import Depends, FastAPI
import redcount, redcount.aio, redcount.fastapi

store = redcount.connect("redis://cache:6379/0")
rl = redcount.fastapi.RateLimiter(redcount.aio.Limiter(store), default="1000/minute")

app = FastAPI()
app.add_middleware(redcount.fastapi.RateLimitMiddleware, ratelimiter=rl)

@app.get("/search", dependencies=[Depends(rl.limit("5/second"))])
def search() -> dict[str, str]:          # sync or async; no request parameter needed
    return {"ok": "yes"}
```

- The middleware (plain ASGI, not ``BaseHTTPMiddleware``) applies ``default`` to every HTTP
  request and WebSocket handshake of the app, counted once across routes, and writes the
  rate-limit headers into every response start, so they arrive whatever the endpoint
  returns and when a dependency or the endpoint raises an ``HTTPException``.
- ``Depends(rl.limit(...))`` limits one route (counted per route) or, with
  [`RateLimiter.shared_limit`][redcount.fastapi.RateLimiter.shared_limit], a group of routes; it refuses with [`RateLimitExceeded`][redcount.fastapi.RateLimitExceeded]
  (an ``HTTPException`` 429 carrying the headers). On a WebSocket route it refuses the
  handshake.
- Every decision is awaited on [`redcount.aio`][redcount.aio]: the event loop never waits on Redis.
- A latency budget, ``budget=0.1`` seconds by default, bounds each wait for Redis: a call
  still waiting when it runs out is decided by ``fail``, and so are the request's checks
  after it (the middleware's, then its route's), so a frozen Redis costs a request about
  100 ms, not the store's ``command_timeout``. Only waiting spends it: a reply that arrived
  while the loop was busy or the process not scheduled is used. A request decided without
  the store carries ``RateLimit-Undecided``.

Only Starlette is imported, so the middleware and the dependency's check also serve plain
Starlette apps (``await rl.enforce(request, spec)``).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Awaitable, Callable, Iterable, MutableMapping, Sequence
from typing import Any, Union

try:
    from starlette.exceptions import HTTPException, WebSocketException
    from starlette.requests import HTTPConnection, Request
    from starlette.responses import Response
except ImportError as exc:
    raise ImportError(
        f"redcount.fastapi needs FastAPI or Starlette ({exc.name} is missing): pip install 'redcount[fastapi]'"
    ) from exc

from . import aio
from .errors import InvalidInputError
from .limiter import Limiter
from .policies import Entry, Penalty, config_penalty
from .store import connect as _connect
from .web import problem
from .web.engine import DEFAULT_BUDGET, FailMode, MetricsSink, Verdict, check_store, decide_async
from .web.headers import HeaderSets, render
from .web.outcome import Deduct, deduct_predicate, merge_charged, split_checks
from .web.settings import Settings, TrustedArg
from .web.spec import Check, KeyFunc, KeyFunctionError, LimitSpec, Policy, config_lease, policies_of, resolve_all

__all__ = ["RateLimitExceeded", "RateLimitMiddleware", "RateLimiter", "SentResponse", "rate_limit_exceeded_handler"]

log = logging.getLogger("redcount.fastapi")

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]
LimitArg = Union[str, Callable[..., str]]
CostArg = Union[int, Callable[..., int]]

_SCOPE_KEY = "redcount.verdict"
# The request's checks charged by outcome (deduct_when), in its ASGI scope; the middleware
# puts the list there, so its presence says the middleware runs.
_DEDUCT_KEY = "redcount.deduct"


class SentResponse:
    """The response as it starts (what ``deduct_when`` predicates get on FastAPI and
    Starlette): ``status_code`` and ``headers`` (a case-insensitive
    ``starlette.datastructures.Headers``), whatever the endpoint returned or raised."""

    __slots__ = ("headers", "status_code")

    def __init__(self, message: Message) -> None:
        from starlette.datastructures import Headers

        self.status_code: int = int(message["status"])
        self.headers = Headers(raw=list(message.get("headers", ())))

    def __repr__(self) -> str:
        return f"SentResponse(status_code={self.status_code})"
# RFC 6455 1008: the endpoint refuses a message (here: a connection) that violates its policy.
_WS_POLICY_VIOLATION = 1008


class RateLimitExceeded(HTTPException):
    """The 429 a route limit raises: ``detail`` says when to retry, ``headers`` are the
    rate-limit headers, ``problem`` the problem-details body (which policy refused, when to
    retry) and ``verdict`` everything decided. The frameworks' default handlers answer with
    ``detail`` (FastAPI as ``{"detail": "..."}``); [`rate_limit_exceeded_handler`][redcount.fastapi.rate_limit_exceeded_handler] answers
    ``application/problem+json``, or register your own handler for this class."""

    def __init__(self, verdict: Verdict, headers: list[tuple[str, str]]) -> None:
        self.problem = problem.too_many_requests(verdict)
        super().__init__(429, detail=str(self.problem["detail"]), headers=dict(headers))
        self.verdict = verdict


async def rate_limit_exceeded_handler(request: Request, exc: Exception) -> Response:
    """An exception handler answering [`RateLimitExceeded`][redcount.fastapi.RateLimitExceeded] with its problem body:
    ``app.add_exception_handler(RateLimitExceeded, rate_limit_exceeded_handler)``."""
    if not isinstance(exc, RateLimitExceeded):
        raise exc
    return Response(json.dumps(exc.problem), 429, headers=exc.headers, media_type=problem.CONTENT_TYPE)


# Endpoint functions' names as per-route keys use them: an app has a fixed set of endpoints,
# so each name is formatted once (the dict is only read, set or cleared whole: atomic under
# the GIL).
_ENDPOINT_NAMES: dict[Any, str] = {}
_ENDPOINT_CACHE = 10_000


class _View:
    """A Starlette connection as the shared layer sees it."""

    __slots__ = ("_client", "_endpoint", "_native", "_settings", "scope")

    def __init__(self, scope: Scope, settings: Settings, native: HTTPConnection | None = None) -> None:
        self.scope = scope
        self._settings = settings
        self._native = native
        self._client: str | None = None
        self._endpoint: str | None = None

    @property
    def method(self) -> str:
        return str(self.scope.get("method", "WEBSOCKET"))

    @property
    def endpoint(self) -> str:
        if self._endpoint is None:
            fn = self.scope.get("endpoint")
            if fn is not None and hasattr(fn, "__qualname__"):
                name = _ENDPOINT_NAMES.get(fn)
                if name is None:
                    name = f"{getattr(fn, '__module__', '?')}.{fn.__qualname__}"
                    if len(_ENDPOINT_NAMES) >= _ENDPOINT_CACHE:
                        _ENDPOINT_NAMES.clear()
                    _ENDPOINT_NAMES[fn] = name
                self._endpoint = name
            else:
                self._endpoint = str(self.scope.get("path", "?"))
        return self._endpoint

    @property
    def native(self) -> HTTPConnection:
        if self._native is None:
            self._native = Request(self.scope) if self.scope["type"] == "http" else HTTPConnection(self.scope)
        return self._native

    @property
    def client(self) -> str:
        if self._client is None:
            identity = self._settings.identity
            peer = self.scope.get("client")
            header = identity.header
            values = self._headers(header) if header else []
            self._client = identity.resolve(peer[0] if peer else None, values)
        return self._client

    def _headers(self, name: str) -> list[str]:
        raw = name.lower().encode("latin-1")
        return [v.decode("latin-1") for k, v in self.scope.get("headers", ()) if k.lower() == raw]

    def header(self, name: str) -> str | None:
        found = self._headers(name)
        return found[0] if found else None


def _encode(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in headers]


class RateLimiter:
    """Limits for a FastAPI or Starlette app, decided on [`redcount.aio`][redcount.aio].

    - ``limiter``: a [`redcount.aio.Limiter`][redcount.aio.Limiter] (or a [`redcount.Limiter`][redcount.limiter.Limiter], used
      through its async twin); default: the embedded ``memory://`` store, fixed window.
    - ``default``: limits the middleware applies to every request and WebSocket handshake,
      counted once for the whole app.
    - ``lease``: a leased ``default`` limit: each worker takes up to this many units at a
      time and decides from them locally (``"fixed-window"`` and ``"sliding-window-approx"`` only; see
      docs/leased-limits.md). Default None: not leased.
    - ``key``: the default key function, a callable of the Starlette request or a
      [`redcount.web.RequestKey`][redcount.web.spec.RequestKey] (default: the client address).
    - ``headers``: ``"ietf"``, ``"legacy"``, ``"retry-after"``, ``"all"`` or ``"none"``, as a
      comma-separated string or a list (default ``"ietf,retry-after"``).
    - ``trusted_proxies``: None (default: trust no forwarding header), a proxy count or
      CIDRs; ``ipv6_prefix``: group IPv6 clients (64 for /64).
    - ``fail``: ``"open"`` (default) or ``"closed"`` (503) while the store is down: the
      limiter's ``on_unavailable="allow"``/``"deny"``; give the store a ``budget`` (and a
      ``fallback``) in ``redcount.connect`` so that a dead Redis is noticed fast. Store
      failures include a refused password ([`AuthenticationError`][redcount.errors.AuthenticationError]); each
      switch between the store failing and working is logged once, not per request.
    - ``budget``: seconds a check may wait for the store (default 0.1; None or 0: no
      budget); a call still waiting then is decided by ``fail``, and so are the request's
      checks after it. With a store whose own ``budget`` is no longer, the store's deadline
      ends the wait (it reads the socket once more first).
    - ``check_on_start``: ping the store here, so that a wrong password or an unreachable
      Redis stops the app from starting with the store's own error (default: the
      ``REDCOUNT_CHECK_ON_START`` environment variable, off when unset).
    - ``shadow``: count and report, never refuse. ``metrics``: a
      [`redcount.web.metrics.PrometheusMetrics`][redcount.web.metrics.PrometheusMetrics].
    - ``allow``, ``deny``: keys, addresses and CIDRs decided before any round trip, matched
      against each check's identity (the client address by default): an allowed check is
      not counted, a denied one refuses (``Retry-After`` one day). ``refusal_cache``: how
      many refused keys are answered locally until their ``Retry-After`` (0: off).
      ``penalty``: a [`redcount.Penalty`][redcount.policies.Penalty] (or a dict of its arguments) for the limiter
      built here when ``limiter`` is not given (with one, build it with ``penalty=``). See
      docs/penalties.md.

    Bad input raises [`InvalidInputError`][redcount.errors.InvalidInputError] here or in [`limit`][redcount.fastapi.RateLimiter.limit], at
    start-up. Read-only after construction; safe from any number of event loops and threads.
    """

    def __init__(
        self,
        limiter: aio.Limiter | Limiter | None = None,
        *,
        default: LimitArg | None = None,
        key: KeyFunc | None = None,
        headers: HeaderSets | str | Iterable[str] | None = None,
        trusted_proxies: TrustedArg = None,
        ipv6_prefix: int = 128,
        fail: FailMode = "open",
        shadow: bool = False,
        metrics: MetricsSink | None = None,
        budget: float | None = DEFAULT_BUDGET,
        check_on_start: bool | None = None,
        allow: Iterable[Entry] | None = None,
        deny: Iterable[Entry] | None = None,
        refusal_cache: int = 0,
        penalty: Penalty | dict[str, Any] | None = None,
        lease: int | None = None,
    ) -> None:
        if limiter is None:
            limiter = aio.Limiter(_connect("memory://"), prefix="redcount:web",
                                  penalty=config_penalty(penalty, "penalty"))
        elif penalty is not None:
            raise InvalidInputError("penalty= applies to the limiter RateLimiter builds when given none; "
                                    "build yours with redcount.Limiter(..., penalty=...) instead")
        if isinstance(limiter, Limiter):
            limiter = aio.Limiter.from_sync(limiter)
        if not isinstance(limiter, aio.Limiter):
            raise InvalidInputError(f"limiter must be a redcount.aio.Limiter or redcount.Limiter, got {type(limiter).__name__}")
        self.limiter = limiter
        self.settings = Settings.build(
            key=key, headers=headers, trusted_proxies=trusted_proxies, ipv6_prefix=ipv6_prefix, fail=fail,
            shadow=shadow, metrics=metrics, where="redcount.fastapi.RateLimiter", budget=budget,
            allow=allow, deny=deny, refusal_cache=refusal_cache,
        )
        # The embedded store answers inline: nothing to time out, so no timer per call.
        self._budget = None if limiter.sync.store.is_memory else self.settings.budget
        # Per-route policy names of limits declared without a name, per (spec, endpoint).
        self._route_policies: dict[tuple[int, Any], list[Policy]] = {}
        # Limits charged by outcome: id(spec) -> its deduct_when (specs live as long as this).
        self._deduct: dict[int, Deduct] = {}
        if check_on_start is None:
            env = os.environ.get("REDCOUNT_CHECK_ON_START", "").strip().lower()
            if env not in ("", "0", "false", "no", "off", "1", "true", "yes", "on"):
                raise InvalidInputError(f"REDCOUNT_CHECK_ON_START must be a boolean, got {env!r}")
            check_on_start = env in ("1", "true", "yes", "on")
        elif not isinstance(check_on_start, bool):
            raise InvalidInputError(f"check_on_start must be True, False or None, got {check_on_start!r}")
        if check_on_start:
            check_store(limiter.sync.store)
        if metrics is not None and hasattr(metrics, "watch_store"):
            metrics.watch_store(limiter.sync.store)
        default_lease = config_lease(lease, limiter.strategy, "RateLimiter(lease=...)")
        self.default: list[LimitSpec] = (
            [LimitSpec.build(default, name="default", where="RateLimiter(default=...)", lease=default_lease)]
            if default
            else []
        )

    # -- declaring limits ----------------------------------------------------------------

    def spec(
        self,
        limit: LimitArg,
        *,
        key: KeyFunc | None = None,
        cost: CostArg = 1,
        methods: Iterable[str] | None = None,
        exempt_when: Callable[..., bool] | None = None,
        per_method: bool = False,
        name: str | None = None,
        shadow: bool = False,
        scope: str | None = None,
        deduct_when: Callable[..., bool] | None = None,
        lease: int | None = None,
    ) -> LimitSpec:
        """A checked [`LimitSpec`][redcount.web.spec.LimitSpec] for [`enforce`][redcount.fastapi.RateLimiter.enforce] (Starlette).
        ``deduct_when`` as in [`limit`][redcount.fastapi.RateLimiter.limit]."""
        where = f"limit {limit!r}" if scope is None else f"shared limit {scope!r}"
        deduct = deduct_predicate(deduct_when, where)
        spec = LimitSpec.build(
            limit, name=name if scope is None else (name or scope), scope=f"shared:{scope}" if scope else "route",
            key=key, cost=cost, methods=methods, exempt_when=exempt_when, per_method=per_method,
            per_route=scope is None, shadow=shadow, where=where, lease=lease,
        )
        if deduct is not None:
            self._deduct[id(spec)] = deduct
        return spec

    def limit(
        self,
        limit: LimitArg,
        *,
        key: KeyFunc | None = None,
        cost: CostArg = 1,
        methods: Iterable[str] | None = None,
        exempt_when: Callable[..., bool] | None = None,
        per_method: bool = False,
        name: str | None = None,
        shadow: bool = False,
        deduct_when: Callable[..., bool] | None = None,
        lease: int | None = None,
    ) -> Callable[[HTTPConnection, Response], Awaitable[None]]:
        """A dependency limiting the route it is attached to, counted per route:
        ``Depends(rl.limit("5/second"))``. ``limit``, ``key``, ``cost`` may be callables of the
        request; ``methods``, ``exempt_when``, ``per_method``, ``shadow`` as in
        [`LimitSpec`][redcount.web.spec.LimitSpec]; ``name`` is the policy name in the headers
        (default: the route's endpoint function's name, ``search``, suffixed by the window
        when the limit string holds several: ``search-1s``, ``search-3600s``).

        ``deduct_when``: charge by outcome, a callable of the response (a
        [`SentResponse`][redcount.fastapi.SentResponse]: ``status_code``, ``headers``) or of the request and the
        response, returning True for a request that counts: ``lambda r: r.status_code >= 400``
        counts failed logins only. The limit is tested before the endpoint (a request over it
        is refused) and charged when the response starts, if it matches; that needs
        [`RateLimitMiddleware`][redcount.fastapi.RateLimitMiddleware] on the app. Concurrent requests of one key are all tested
        against the same count, so up to N - 1 more than the limit may run with N in flight
        (see docs/refunds.md).

        ``lease``: a leased limit for a hot key (see docs/leased-limits.md)."""
        return self._dependency(self.spec(limit, key=key, cost=cost, methods=methods, exempt_when=exempt_when,
                                          per_method=per_method, name=name, shadow=shadow, deduct_when=deduct_when,
                                          lease=lease))

    def all_of(self, *specs: LimitSpec) -> Callable[[HTTPConnection, Response], Awaitable[None]]:
        """A dependency deciding several limits (each from [`spec`][redcount.fastapi.RateLimiter.spec]) together, in one
        round trip and all-or-nothing (a request refused by one is charged against none):

        ```text
        both = rl.all_of(rl.spec("1000/hour", key=org_of, scope="org"), rl.spec("100/minute", key=user_of))
        @app.get("/search", dependencies=[Depends(both)])
        ```

        Several ``Depends(rl.limit(...))`` are decided one after the other instead, one round
        trip each (FastAPI runs dependencies one by one)."""
        if not specs or not all(isinstance(s, LimitSpec) for s in specs):
            raise InvalidInputError("all_of() takes one or more limits made by RateLimiter.spec()")
        return self._dependency(*specs)

    def shared_limit(
        self,
        limit: LimitArg,
        scope: str,
        *,
        key: KeyFunc | None = None,
        cost: CostArg = 1,
        methods: Iterable[str] | None = None,
        exempt_when: Callable[..., bool] | None = None,
        per_method: bool = False,
        shadow: bool = False,
        deduct_when: Callable[..., bool] | None = None,
    ) -> Callable[[HTTPConnection, Response], Awaitable[None]]:
        """A dependency whose count every route using it shares, named ``scope``:
        ``reports = rl.shared_limit("100/hour", "reports")`` then ``Depends(reports)``.
        ``deduct_when`` as in [`limit`][redcount.fastapi.RateLimiter.limit]."""
        if not isinstance(scope, str) or not scope:
            raise InvalidInputError(f"shared_limit needs a scope name, got {scope!r}")
        return self._dependency(self.spec(limit, key=key, cost=cost, methods=methods, exempt_when=exempt_when,
                                          per_method=per_method, shadow=shadow, scope=scope, deduct_when=deduct_when))

    def _dependency(self, *specs: LimitSpec) -> Callable[[HTTPConnection, Response], Awaitable[None]]:
        # Two parameters that FastAPI fills by their annotation alone (no sub-dependency to
        # solve per request); the response is where FastAPI takes a dependency's headers from.
        # The body is enforce()'s, inlined: every coroutine level is paid again each time the
        # request suspends on the store and resumes.

        async def rate_limit(connection: HTTPConnection, response: Response) -> None:
            scope = connection.scope
            s = self.settings
            checks = self._checks(scope, specs, connection)
            if self._deduct:
                verdict = await self._decide_by_outcome(scope, checks)
            else:
                verdict = await decide_async(self.limiter, checks, s.policy, s.metrics, shadow_all=s.shadow,
                                             budget=self._budget, after=scope.get(_SCOPE_KEY), screen=s.screen)
            headers = self._answer(scope, self._merge(scope, verdict))
            if headers:
                raw = response.headers
                for name, value in headers:
                    raw[name] = value

        rate_limit.__qualname__ = rate_limit.__name__ = f"rate_limit[{', '.join(s.where for s in specs)}]"
        # FastAPI resolves the annotations by name in the function's globals (this module).
        rate_limit.__annotations__ = {"connection": HTTPConnection, "response": Response, "return": None}
        return rate_limit

    # -- deciding ------------------------------------------------------------------------

    def _checks(self, scope: Scope, specs: Sequence[LimitSpec], native: HTTPConnection | None) -> list[Check]:
        s = self.settings
        try:
            checks = resolve_all(specs, _View(scope, s, native), s.key)
        except (KeyFunctionError, InvalidInputError) as e:
            debug = bool(getattr(scope.get("app"), "debug", False))
            raise HTTPException(500, detail=str(e) if debug else "Internal Server Error") from e
        for c in checks:
            if c.spec.auto_name and c.spec.per_route:
                self._name_after_route(c, scope.get("endpoint"))
        return checks

    def _name_after_route(self, check: Check, endpoint: Any) -> None:
        """Name the policies of a route limit declared without a name after the route's
        endpoint function, as Flask names them after the view: two routes with the same
        limit then advertise two policies, not one name for two counts. Without a routed
        endpoint (plain Starlette's [`enforce`][redcount.fastapi.RateLimiter.enforce]) the policies keep the limit's name."""
        route = getattr(endpoint, "__name__", None)
        if not isinstance(route, str) or not route.isascii() or not route.isprintable():
            return
        if check.spec.static is None:  # a dynamic limit: its policies are made per request anyway
            check.policies = policies_of(route, check.limits)
            return
        where = (id(check.spec), endpoint)
        named = self._route_policies.get(where)
        if named is None:
            named = policies_of(route, check.limits)
            if len(self._route_policies) >= _ENDPOINT_CACHE:
                self._route_policies.clear()
            self._route_policies[where] = named
        check.policies = named

    async def _decide(self, scope: Scope, specs: Sequence[LimitSpec], native: HTTPConnection | None) -> Verdict:
        s = self.settings
        checks = self._checks(scope, specs, native)
        if self._deduct:
            return self._merge(scope, await self._decide_by_outcome(scope, checks))
        verdict = await decide_async(self.limiter, checks, s.policy, s.metrics, shadow_all=s.shadow,
                                     budget=self._budget, after=scope.get(_SCOPE_KEY), screen=s.screen)
        return self._merge(scope, verdict)

    async def _decide_by_outcome(self, scope: Scope, checks: list[Check]) -> Verdict:
        """Decide ``checks`` when some are charged by outcome: those are tested (nothing
        charged) and, when the request is allowed, left in the scope for the middleware to
        charge once the response starts; the others are charged now."""
        s = self.settings
        now, later = split_checks(checks, self._deduct)
        if not later:
            return await decide_async(self.limiter, now, s.policy, s.metrics, shadow_all=s.shadow,
                                      budget=self._budget, after=scope.get(_SCOPE_KEY), screen=s.screen)
        pending: list[Check] | None = scope.get(_DEDUCT_KEY)
        if pending is None:
            raise HTTPException(500, detail="deduct_when needs redcount.fastapi.RateLimitMiddleware on the app "
                                            "(it charges the limit once the response is known)")
        verdict = await decide_async(self.limiter, later, s.policy, s.metrics, shadow_all=s.shadow,
                                     budget=self._budget, after=scope.get(_SCOPE_KEY), charge=False,
                                     screen=s.screen)
        if verdict.allowed and now:
            verdict.merge(await decide_async(self.limiter, now, s.policy, s.metrics, shadow_all=s.shadow,
                                             budget=self._budget, after=verdict, screen=s.screen))
        if verdict.allowed:
            pending.extend(later)
        return verdict

    async def _charge_by_outcome(self, scope: Scope, pending: list[Check], message: Message) -> None:
        """Charge the checks whose deduct_when matches the response starting in ``message``."""
        response = SentResponse(message)
        request = Request(scope)
        due = [c for c in pending if self._deduct[id(c.spec)].matches(request, response)]
        pending.clear()
        if not due:
            return
        s = self.settings
        charged = await decide_async(self.limiter, due, s.policy, s.metrics, shadow_all=s.shadow, budget=self._budget,
                                     screen=s.screen)
        verdict: Verdict | None = scope.get(_SCOPE_KEY)
        if verdict is not None:
            merge_charged(verdict, charged)

    @staticmethod
    def _merge(scope: Scope, verdict: Verdict) -> Verdict:
        """The request's verdict so far (the middleware's, then each route limit's)."""
        merged: Verdict | None = scope.get(_SCOPE_KEY)
        if merged is None:
            scope[_SCOPE_KEY] = verdict
            return verdict
        merged.merge(verdict)
        return merged

    async def enforce(self, connection: HTTPConnection, *specs: LimitSpec) -> list[tuple[str, str]]:
        """Decide ``specs`` for this request or WebSocket; return the headers to send, or
        raise [`RateLimitExceeded`][redcount.fastapi.RateLimitExceeded] (HTTP), ``WebSocketException`` (a refused
        handshake) or a 503 ``HTTPException`` (store down, ``fail="closed"``)."""
        scope = connection.scope
        return self._answer(scope, await self._decide(scope, specs, connection))

    def _answer(self, scope: Scope, verdict: Verdict) -> list[tuple[str, str]]:
        """The headers for an allowed request; raises the refusal (see [`enforce`][redcount.fastapi.RateLimiter.enforce])."""
        sets = self.settings.headers
        headers = render(verdict, sets) if sets.any else []
        if verdict.allowed:
            return headers
        if verdict.unavailable:
            if scope["type"] == "websocket":
                raise WebSocketException(code=1011, reason="rate limiter unavailable")
            raise HTTPException(503, detail=str(problem.store_unavailable()["detail"]),
                                headers={"Retry-After": "1", **dict(_undecided(verdict))})
        if scope["type"] == "websocket":
            raise WebSocketException(code=_WS_POLICY_VIOLATION, reason="rate limit exceeded")
        raise RateLimitExceeded(verdict, headers)


def _undecided(verdict: Verdict) -> list[tuple[str, str]]:
    """The ``RateLimit-Undecided`` header of a request decided without the store."""
    return [] if verdict.undecided is None else [("RateLimit-Undecided", verdict.undecided)]


class RateLimitMiddleware:
    """Pure ASGI middleware: ``app.add_middleware(RateLimitMiddleware, ratelimiter=rl)``.

    Applies the rate limiter's ``default`` limits to every HTTP request and WebSocket
    handshake, and sets the rate-limit headers (app-wide and route limits together, each
    field once) on every HTTP response start, error responses included. Refused HTTP
    requests get a 429 problem+json response; refused handshakes get a 429 HTTP response
    where the server supports the ASGI ``websocket.http.response`` extension and a close
    (code 1008, which servers send as 403) elsewhere. Lifespan and other scopes pass
    through untouched.

    An unhandled exception's 500 is sent by Starlette's outermost ``ServerErrorMiddleware``,
    outside every user middleware, so that response carries no rate-limit headers; every
    ``HTTPException`` and handled exception does. Holds no per-request state of its own (the
    verdict travels in the ASGI scope), so one instance serves any number of concurrent
    requests."""

    def __init__(self, app: ASGIApp, ratelimiter: RateLimiter) -> None:
        if not isinstance(ratelimiter, RateLimiter):
            raise InvalidInputError(f"ratelimiter must be a redcount.fastapi.RateLimiter, got {ratelimiter!r}")
        self.app = app
        self.rl = ratelimiter

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        rl = self.rl
        scope.pop(_SCOPE_KEY, None)
        if rl._deduct and kind == "http":
            scope[_DEDUCT_KEY] = []
        if rl.default:
            try:
                verdict = await rl._decide(scope, rl.default, None)
            except HTTPException as e:
                await self._refuse(scope, receive, send, e.status_code, {"detail": e.detail}, [])
                return
            if verdict.unavailable:
                await self._refuse(scope, receive, send, 503, problem.store_unavailable(),
                                   [("Retry-After", "1"), *_undecided(verdict)])
                return
            if not verdict.allowed:
                await self._refuse(scope, receive, send, 429, problem.too_many_requests(verdict),
                                   render(verdict, rl.settings.headers))
                return
        if kind == "websocket":
            await self.app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                pending = scope.get(_DEDUCT_KEY)
                if pending:
                    await rl._charge_by_outcome(scope, pending, message)
                verdict = scope.get(_SCOPE_KEY)
                if verdict is not None:
                    extra = _encode(render(verdict, rl.settings.headers))
                    if extra:
                        names = {k for k, _ in extra}
                        message = dict(message)
                        message["headers"] = [
                            (k, v) for k, v in message.get("headers", ()) if bytes(k).lower() not in names
                        ] + extra
            await send(message)

        await self.app(scope, receive, send_with_headers)

    async def _refuse(
        self, scope: Scope, receive: Receive, send: Send, status: int, body: dict[str, Any], headers: list[tuple[str, str]]
    ) -> None:
        payload = json.dumps(body).encode()
        raw = [(b"content-type", problem.CONTENT_TYPE.encode()), (b"content-length", str(len(payload)).encode())]
        raw += _encode(headers)
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": status, "headers": raw})
            await send({"type": "http.response.body", "body": payload})
            return
        await receive()  # the websocket.connect message: the handshake is under way
        if "websocket.http.response" in scope.get("extensions", {}):
            await send({"type": "websocket.http.response.start", "status": status, "headers": raw})
            await send({"type": "websocket.http.response.body", "body": payload})
        else:
            await send({"type": "websocket.close", "code": _WS_POLICY_VIOLATION if status == 429 else 1011})
