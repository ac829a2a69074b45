"""Rate limiting for Flask: decorators, app-wide and blueprint limits, IETF headers.

```python
from flask import Flask
import redcount, redcount.flask

app = Flask(__name__)
app.config["REDCOUNT_URL"] = "redis://cache:6379/0"
rl = redcount.flask.RateLimiter(app, default="100/minute")

@app.get("/search")
@rl.limit("10/minute;100/day")
def search(): ...

@app.get("/export")
@rl.limit(lambda req: "1000/hour" if req.headers.get("X-Plan") == "pro" else "10/hour",
          key=redcount.web.api_key("X-API-Key"))
def export(): ...
```

A refused request raises [`RateLimitExceeded`][redcount.flask.RateLimitExceeded] (a werkzeug ``TooManyRequests``) with a
JSON problem body and the rate-limit headers; register an error handler for 429 (or for
this class) to shape it. Headers also reach responses of routes that raise: they are added
in an ``after_request`` hook, which Flask runs for error responses too.

Sync by design: each decision is one [`redcount.Limiter.hit`][redcount.limiter.Limiter.hit] on the worker thread (the
GIL is released while it waits on Redis).

A latency budget, ``REDCOUNT_BUDGET`` (default 0.1 s), bounds each wait for Redis: the store
built from ``REDCOUNT_URL`` gets it as its ``budget`` (with the circuit breaker). A check
whose reply does not come within it, and the request's checks after it, are decided by
``fail`` without the store (the response says so in ``RateLimit-Undecided``), so a frozen or
unreachable Redis costs a request about 100 ms, not ``command_timeout``. Only waiting for
Redis spends it: a reply that arrived while the worker was not scheduled is used, and the
app's own work between two checks costs none of it.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, Union

try:
    import flask
    from flask import Blueprint, Flask, request
    from werkzeug.exceptions import InternalServerError, ServiceUnavailable, TooManyRequests
except ImportError as exc:
    raise ImportError(f"redcount.flask needs Flask ({exc.name} is missing): pip install 'redcount[flask]'") from exc

from . import store as _store
from .errors import InvalidInputError
from .limiter import Limiter
from .policies import Entry, config_list, config_penalty, config_size
from .web import problem
from .web.engine import DEFAULT_BUDGET, FailMode, MetricsSink, Verdict, check_budget, check_store, decide
from .web.headers import HeaderSets, render
from .web.settings import Settings, TrustedArg
from .web.outcome import Deduct, deduct_predicate, merge_charged, split_checks
from .web.spec import (
    Check,
    KeyFunc,
    KeyFunctionError,
    LimitSpec,
    client_prefix,
    config_lease,
    remote_address,
    resolve_all,
)

__all__ = ["RateLimitExceeded", "RateLimiter", "StoreUnavailableError"]

log = logging.getLogger("redcount.flask")

F = TypeVar("F", bound=Union[Callable[..., Any], Blueprint])
LimitArg = Union[str, Callable[..., str]]
CostArg = Union[int, Callable[..., int]]

_UNSET: Any = object()
_VERDICT = "redcount.verdict"  # the request's verdict, in its WSGI environ
_DEDUCT = "redcount.deduct"  # the request's checks charged by outcome (deduct_when), in its WSGI environ


class RateLimitExceeded(TooManyRequests):
    """The 429 raised for a refused request: ``verdict`` says which limit refused and when
    to retry; the response carries a JSON problem body (``application/problem+json``) and
    the rate-limit headers. Customise it with ``@app.errorhandler(429)``."""

    def __init__(self, verdict: Verdict, headers: list[tuple[str, str]]) -> None:
        self.verdict = verdict
        self.body = problem.too_many_requests(verdict)
        self.rate_limit_headers = headers
        super().__init__(description=str(self.body["detail"]))

    def get_body(self, environ: Any = None, scope: Any = None) -> str:
        return json.dumps(self.body)

    def get_headers(self, environ: Any = None, scope: Any = None) -> list[tuple[str, str]]:
        return [("Content-Type", problem.CONTENT_TYPE), *self.rate_limit_headers]


class StoreUnavailableError(ServiceUnavailable):
    """The 503 raised when the store is down and the policy is ``fail="closed"``."""

    def get_body(self, environ: Any = None, scope: Any = None) -> str:
        return json.dumps(problem.store_unavailable())

    def get_headers(self, environ: Any = None, scope: Any = None) -> list[tuple[str, str]]:
        return [("Content-Type", problem.CONTENT_TYPE), ("Retry-After", "1")]


class _View:
    """A Flask request as the shared layer sees it."""

    __slots__ = ("_client", "_identity", "native")

    def __init__(self, req: flask.Request, settings: Settings) -> None:
        self.native = req
        self._identity = settings.identity
        self._client: str | None = None

    @property
    def method(self) -> str:
        return str(self.native.method)

    @property
    def endpoint(self) -> str:
        return self.native.endpoint or self.native.path

    @property
    def client(self) -> str:
        if self._client is None:
            header = self._identity.header
            values = self.native.headers.getlist(header) if header else []
            self._client = self._identity.resolve(self.native.remote_addr, values)
        return self._client

    def header(self, name: str) -> str | None:
        return self.native.headers.get(name)


_SPEC_CACHE = 10_000  # endpoints whose limits are cached per app
_Plan = tuple[list[LimitSpec], Union[list[tuple[LimitSpec, str]], None]]


class _AppState:
    """What [`RateLimiter.init_app`][redcount.flask.RateLimiter.init_app] settled for one app (read-only afterwards)."""

    def __init__(
        self, limiter: Limiter, settings: Settings, default: list[LimitSpec], application: list[LimitSpec], enabled: bool
    ) -> None:
        self.limiter = limiter
        self.settings = settings
        self.default = default
        self.application = application
        self.enabled = enabled
        # The embedded store answers inline: no deadline to watch.
        self.budget = None if limiter.store.is_memory else settings.budget
        # Per endpoint: the specs that apply and, when only the client varies between their
        # checks, each spec's key prefix (see redcount.web.spec.client_prefix).
        self.specs: dict[tuple[int, str | None], _Plan] = {}

    def plan(self, specs: list[LimitSpec], endpoint: str | None) -> _Plan:
        if self.settings.key is not remote_address:
            return specs, None
        fast = []
        for spec in specs:
            prefix = client_prefix(spec, endpoint)
            if prefix is None:
                return specs, None
            fast.append((spec, prefix))
        return specs, fast


def _config_bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return value.strip().lower() in ("1", "true", "yes", "on")
    raise InvalidInputError(f"{name} must be a boolean, got {value!r}")


def _config_budget(value: Any) -> float | None:
    """REDCOUNT_BUDGET: seconds as a number or a numeric string (environment-style config);
    unset or empty: [`DEFAULT_BUDGET`][redcount.web.engine.DEFAULT_BUDGET]; 0: no budget."""
    if value is None or value == "":
        return DEFAULT_BUDGET
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise InvalidInputError(f"REDCOUNT_BUDGET must be a number of seconds, got {value!r}") from None
    return check_budget(value, "REDCOUNT_BUDGET (budget=)")


class _Hooks:
    """The request hooks of one app, bound to what ``init_app`` settled for it, so a request
    looks up neither the app nor its state (each of ``flask.current_app``, ``request`` and
    ``g`` is a context lookup per use)."""

    __slots__ = ("app", "rl", "state")

    def __init__(self, rl: RateLimiter, app: Flask, state: _AppState) -> None:
        self.rl = rl
        self.app = app
        self.state = state

    def before(self) -> None:
        state = self.state
        if not state.enabled:
            return
        req: flask.Request = request._get_current_object()  # type: ignore[attr-defined]
        # Limits are declared at import time, so what applies to an endpoint is settled once
        # and served from the app's cache afterwards. A declaration made later anyway bumps
        # the generation, so no stale entry is read. (Flask derives request.blueprints from
        # the endpoint's name, so the endpoint alone keys the cache.)
        where = (self.rl._generation, req.endpoint)
        planned = state.specs.get(where)
        if planned is None:
            # Keyed per-route specs name the endpoint as _View.endpoint does.
            planned = state.plan(self.rl._specs_uncached(self.app, state, req), req.endpoint)
            if len(state.specs) >= _SPEC_CACHE:
                state.specs.clear()
            state.specs[where] = planned
        specs, fast = planned
        if not specs:
            return
        s = state.settings
        view = _View(req, s)
        if fast is not None:
            client = view.client
            checks = [
                Check(spec, spec.static, prefix + client, spec.cost, spec.static_policies)  # type: ignore[arg-type]
                for spec, prefix in fast
            ]
        else:
            try:
                checks = resolve_all(specs, view, s.key)
            except (KeyFunctionError, InvalidInputError) as e:
                raise InternalServerError(description=str(e) if self.app.debug else None) from e
        deducts = self.rl._deduct
        later: list[Check] = []
        if deducts:
            checks, later = split_checks(checks, deducts)
        if later:
            # Charged by outcome: tested now (nothing charged), charged in after().
            verdict = decide(state.limiter, later, s.policy, s.metrics, shadow_all=s.shadow, budget=state.budget,
                             charge=False, screen=s.screen)
            if verdict.allowed and checks:
                verdict.merge(decide(state.limiter, checks, s.policy, s.metrics, shadow_all=s.shadow,
                                     budget=state.budget, after=verdict, screen=s.screen))
            req.environ[_DEDUCT] = later
        else:
            verdict = decide(
                state.limiter, checks, s.policy, s.metrics, shadow_all=s.shadow, budget=state.budget, screen=s.screen
            )
        req.environ[_VERDICT] = verdict
        if verdict.unavailable:
            raise StoreUnavailableError()
        if not verdict.allowed:
            raise RateLimitExceeded(verdict, render(verdict, s.headers))

    def after(self, response: flask.Response) -> flask.Response:
        verdict: Verdict | None = request.environ.get(_VERDICT)
        later: list[Check] | None = request.environ.get(_DEDUCT)
        if later and verdict is not None and verdict.allowed:
            self._charge_by_outcome(verdict, later, response)
        if verdict is not None:
            for name, value in render(verdict, self.state.settings.headers):
                response.headers[name] = value  # set, not add: never a duplicate field
        return response

    def _charge_by_outcome(self, verdict: Verdict, later: list[Check], response: flask.Response) -> None:
        req = request._get_current_object()  # type: ignore[attr-defined]
        deducts = self.rl._deduct
        due = [c for c in later if deducts[id(c.spec)].matches(req, response)]
        if due:
            s = self.state.settings
            charged = decide(self.state.limiter, due, s.policy, s.metrics, shadow_all=s.shadow,
                             budget=self.state.budget, screen=s.screen)
            merge_charged(verdict, charged)


class RateLimiter:
    """The Flask extension: ``RateLimiter(app)`` or ``RateLimiter()`` + ``init_app(app)``.

    Arguments (each also read from ``app.config`` when not given here; an argument wins):

    - ``limiter`` (``REDCOUNT_URL``, ``REDCOUNT_STRATEGY``, ``REDCOUNT_PREFIX``): a
      [`redcount.Limiter`][redcount.limiter.Limiter]; by default one over ``redcount.connect(REDCOUNT_URL)``
      (``memory://`` when unset) with the fixed-window strategy; ``REDCOUNT_BUDGET``,
      ``REDCOUNT_BREAKER`` and ``REDCOUNT_FALLBACK`` are that store's ``budget``, ``breaker``
      and ``fallback`` (see [`redcount.connect`][redcount.store.connect]).
    - ``budget`` (``REDCOUNT_BUDGET``, default 0.1): seconds a check may wait for the store;
      a check that waited it out, and the request's checks after it, are decided by
      ``fail`` without the store (marked ``RateLimit-Undecided``). 0 turns it off. It is also the ``budget`` of the store built from ``REDCOUNT_URL``,
      which bounds each call; give a ``limiter=`` of your own a store with a ``budget``
      (``redcount.connect(url, budget=0.1)``), as a sync call cannot be cut short.
    - ``check_on_start`` (``REDCOUNT_CHECK_ON_START``, default False): ping the store in
      ``init_app``, so that a wrong password or an unreachable Redis fails the app's start
      with the store's own error instead of failing each request under ``fail``.
    - ``default`` (``REDCOUNT_DEFAULT``): limits for every route without a limit of its own,
      counted per route. ``application`` (``REDCOUNT_APPLICATION``): limits on every request
      of the app together, counted once across routes.
    - ``lease`` (``REDCOUNT_LEASE``): a leased limit for ``default`` and ``application``
      (each worker takes up to this many units at a time and decides from them locally,
      ``Limiter.hit(..., lease=N)``; not with ``"concurrency"``; see
      docs/leased-limits.md). Default None: not leased.
    - ``key``: the default key function (the client address: see ``trusted_proxies``).
    - ``headers`` (``REDCOUNT_HEADERS``): header sets, ``"ietf"``, ``"legacy"``,
      ``"retry-after"``, ``"all"`` or ``"none"`` (default ``"ietf,retry-after"``).
    - ``trusted_proxies`` (``REDCOUNT_TRUSTED_PROXIES``): None (default: trust no forwarding
      header), a proxy count, or CIDRs; ``ipv6_prefix`` (``REDCOUNT_IPV6_PREFIX``): group
      IPv6 clients by this prefix (64 for /64).
    - ``fail`` (``REDCOUNT_FAIL``): ``"open"`` (default: let requests through while the
      store is down) or ``"closed"`` (503): the limiter's ``on_unavailable="allow"``/``"deny"``.
      How fast a dead store is noticed is the store's: ``redcount.connect(url, budget=0.05,
      fallback="memory://")``. A shadow limit never refuses. Store failures include a
      refused password ([`AuthenticationError`][redcount.errors.AuthenticationError]); each switch between the
      store failing and working is logged once (ERROR, then WARNING), not per request.
    - ``shadow`` (``REDCOUNT_SHADOW``): count and report, never refuse.
    - ``allow``, ``deny`` (``REDCOUNT_ALLOW``, ``REDCOUNT_DENY``: a list, or one string of
      comma-separated entries): keys, addresses and CIDRs decided before any round trip,
      matched against each check's identity (the client address by default); an allowed
      check is not counted, a denied one refuses (``Retry-After`` one day).
      ``refusal_cache`` (``REDCOUNT_REFUSAL_CACHE``, default 0: off): how many refused keys
      are answered locally until their ``Retry-After``. ``REDCOUNT_PENALTY``: a
      [`redcount.Penalty`][redcount.policies.Penalty] (or a dict of its arguments) for the limiter built from
      ``REDCOUNT_URL``. See docs/penalties.md.
    - ``metrics``: a [`redcount.web.metrics.PrometheusMetrics`][redcount.web.metrics.PrometheusMetrics].
    - ``enabled`` (``REDCOUNT_ENABLED``): False turns every check off (tests).

    Bad configuration raises [`InvalidInputError`][redcount.errors.InvalidInputError] in ``init_app``; a bad
    limit in a decorator raises at import, naming the route. Decorate at import time; after
    that the extension is read-only and thread-safe.
    """

    def __init__(
        self,
        app: Flask | None = None,
        *,
        limiter: Limiter | None = None,
        default: LimitArg | None = None,
        application: LimitArg | None = None,
        key: KeyFunc | None = None,
        headers: HeaderSets | str | Iterable[str] | None = _UNSET,
        trusted_proxies: TrustedArg = _UNSET,
        ipv6_prefix: int = _UNSET,
        fail: FailMode = _UNSET,
        shadow: bool = _UNSET,
        metrics: MetricsSink | None = None,
        enabled: bool = _UNSET,
        budget: float | None = _UNSET,
        check_on_start: bool = _UNSET,
        allow: Iterable[Entry] | None = None,
        deny: Iterable[Entry] | None = None,
        refusal_cache: int = _UNSET,
        lease: int | None = _UNSET,
    ) -> None:
        self._args: dict[str, Any] = {
            "lease": lease,
            "allow": allow,
            "deny": deny,
            "refusal_cache": refusal_cache,
            "limiter": limiter,
            "default": default,
            "application": application,
            "key": key,
            "headers": headers,
            "trusted_proxies": trusted_proxies,
            "ipv6_prefix": ipv6_prefix,
            "fail": fail,
            "shadow": shadow,
            "metrics": metrics,
            "enabled": enabled,
            "budget": budget,
            "check_on_start": check_on_start,
        }
        self._routes: dict[Callable[..., Any], list[LimitSpec]] = {}
        # Limits charged by outcome: id(spec) -> its deduct_when (specs live as long as this).
        self._deduct: dict[int, Deduct] = {}
        self._blueprints: dict[str, list[LimitSpec]] = {}
        self._exempt_views: set[Callable[..., Any]] = set()
        self._exempt_blueprints: set[str] = set()
        self._generation = 0  # bumped by every declaration: keys the apps' caches of what applies
        if app is not None:
            self.init_app(app)

    # -- set-up --------------------------------------------------------------------------

    def init_app(self, app: Flask) -> None:
        """Read the configuration, validate it and install the request hooks."""
        cfg = app.config
        a = self._args

        def pick(arg: str, name: str, fallback: Any) -> Any:
            value = a[arg]
            if value is _UNSET or value is None:
                value = cfg.get(name, fallback)
            return fallback if value is _UNSET else value

        budget = a["budget"]
        budget = _config_budget(cfg.get("REDCOUNT_BUDGET")) if budget is _UNSET else check_budget(budget, "budget")
        limiter: Limiter | None = a["limiter"]
        if limiter is None:
            store = _store.connect(
                cfg.get("REDCOUNT_URL") or "memory://",
                budget=budget,
                breaker=_config_bool(cfg.get("REDCOUNT_BREAKER", True), "REDCOUNT_BREAKER"),
                fallback=cfg.get("REDCOUNT_FALLBACK") or None,
            )
            limiter = Limiter(
                store, cfg.get("REDCOUNT_STRATEGY", "fixed-window"), prefix=cfg.get("REDCOUNT_PREFIX", "redcount:web"),
                penalty=config_penalty(cfg.get("REDCOUNT_PENALTY"), "REDCOUNT_PENALTY"),
            )
        elif cfg.get("REDCOUNT_PENALTY") is not None:
            raise InvalidInputError(
                "REDCOUNT_PENALTY applies to the limiter built from REDCOUNT_URL; build yours with penalty= instead"
            )
        elif not isinstance(limiter, Limiter):
            raise InvalidInputError(f"limiter must be a redcount.Limiter, got {type(limiter).__name__}")
        elif budget is not None and not limiter.store.is_memory and getattr(limiter.store, "budget", None) is None:
            log.warning(
                "redcount.flask: the limiter's store (%s) has no budget: a frozen Redis holds each check for up "
                "to its command_timeout; open it with redcount.connect(url, budget=%g)", limiter.store.url, budget,
            )
        if _config_bool(pick("check_on_start", "REDCOUNT_CHECK_ON_START", False), "REDCOUNT_CHECK_ON_START"):
            check_store(limiter.store)
        shadow = _config_bool(pick("shadow", "REDCOUNT_SHADOW", False), "REDCOUNT_SHADOW")
        enabled = _config_bool(pick("enabled", "REDCOUNT_ENABLED", True), "REDCOUNT_ENABLED")
        ipv6 = pick("ipv6_prefix", "REDCOUNT_IPV6_PREFIX", 128)
        if isinstance(ipv6, str) and ipv6.strip().isdigit():
            ipv6 = int(ipv6)
        settings = Settings.build(
            key=a["key"],
            headers=pick("headers", "REDCOUNT_HEADERS", None),
            trusted_proxies=pick("trusted_proxies", "REDCOUNT_TRUSTED_PROXIES", None),
            ipv6_prefix=ipv6,
            fail=pick("fail", "REDCOUNT_FAIL", "open"),
            shadow=shadow,
            metrics=a["metrics"],
            where="redcount.flask.RateLimiter",
            budget=budget,
            allow=config_list(pick("allow", "REDCOUNT_ALLOW", None), "REDCOUNT_ALLOW (allow=)"),
            deny=config_list(pick("deny", "REDCOUNT_DENY", None), "REDCOUNT_DENY (deny=)"),
            refusal_cache=config_size(pick("refusal_cache", "REDCOUNT_REFUSAL_CACHE", 0), "REDCOUNT_REFUSAL_CACHE"),
        )
        if settings.metrics is not None and hasattr(settings.metrics, "watch_store"):
            settings.metrics.watch_store(limiter.store)
        default = pick("default", "REDCOUNT_DEFAULT", None)
        application = pick("application", "REDCOUNT_APPLICATION", None)
        lease = config_lease(pick("lease", "REDCOUNT_LEASE", None), limiter.strategy, "REDCOUNT_LEASE (lease=)")
        state = _AppState(
            limiter,
            settings,
            [LimitSpec.build(default, name="default", per_route=True, where="REDCOUNT_DEFAULT (default=)",
                             lease=lease)]
            if default
            else [],
            [LimitSpec.build(application, name="application", where="REDCOUNT_APPLICATION (application=)",
                             lease=lease)]
            if application
            else [],
            enabled,
        )
        app.extensions["redcount"] = state
        hooks = _Hooks(self, app, state)
        app.before_request(hooks.before)
        if settings.headers.any:  # with no header set there is nothing to add to responses
            app.after_request(hooks.after)

    # -- decorators ----------------------------------------------------------------------

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
    ) -> Callable[[F], F]:
        """Limit a view function or a blueprint (all its routes, counted per route).

        ``limit``: ``"10/minute"``, ``"5/second;100/day"`` or a callable of the request
        returning one (per-plan limits). ``key`` and ``cost``: a value or a callable of the
        request; ``methods``: the HTTP methods it applies to; ``exempt_when``: a callable (of
        nothing or of the request) returning True to skip; ``per_method``: separate counts
        per method; ``name``: the policy name in the headers (default: the view's name);
        ``shadow``: count and report, never refuse. Decorators stack: every limit holds.

        ``deduct_when``: charge by outcome, a callable of the response (or of the request
        and the response) returning True for a request that counts, e.g. ``lambda r:
        r.status_code >= 400`` to count failed logins only. The limit is tested before the
        view (a request over it is refused) and charged after it when the response matches.
        Concurrent requests of one key are all tested against the same count, so up to N - 1
        more than the limit may run with N in flight (see docs/refunds.md).

        ``lease``: a leased limit for a hot key (see docs/leased-limits.md).
        """
        deduct = deduct_predicate(deduct_when, f"limit {limit!r}" if isinstance(limit, str) else "limit")

        def decorate(obj: F) -> F:
            if isinstance(obj, Blueprint):
                where = f"blueprint {obj.name!r}"
                spec = LimitSpec.build(
                    limit, name=name or obj.name, scope=f"bp:{obj.name}", key=key, cost=cost, methods=methods,
                    exempt_when=exempt_when, per_method=per_method, per_route=True, shadow=shadow, where=where,
                    lease=lease,
                )
                self._blueprints.setdefault(obj.name, []).append(spec)
                if deduct is not None:
                    self._deduct[id(spec)] = deduct
                self._generation += 1
                return obj
            if not callable(obj):
                raise InvalidInputError(f"RateLimiter.limit decorates a view function or a Blueprint, got {obj!r}")
            qual = f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
            where = f"route {getattr(obj, '__name__', qual)!r}"
            existing = self._routes.setdefault(obj, [])
            base = name or getattr(obj, "__name__", "route")
            spec = LimitSpec.build(
                limit, name=base if not existing else f"{base}-{len(existing) + 1}",
                scope=f"{qual}#{len(existing)}" if existing else qual, key=key, cost=cost, methods=methods,
                exempt_when=exempt_when, per_method=per_method, shadow=shadow, where=where, lease=lease,
            )
            existing.append(spec)
            if deduct is not None:
                self._deduct[id(spec)] = deduct
            self._generation += 1
            return obj

        return decorate

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
        lease: int | None = None,
    ) -> Callable[[F], F]:
        """A limit that a group of routes share: one count for all the views it decorates,
        named ``scope`` (also the policy name in the headers). Call it once and apply the
        result to each view: ``shared = rl.shared_limit("100/hour", "reports")``.
        ``deduct_when`` as in [`limit`][redcount.flask.RateLimiter.limit]."""
        if not isinstance(scope, str) or not scope:
            raise InvalidInputError(f"shared_limit needs a scope name, got {scope!r}")
        spec = LimitSpec.build(
            limit, name=scope, scope=f"shared:{scope}", key=key, cost=cost, methods=methods,
            exempt_when=exempt_when, per_method=per_method, shadow=shadow, where=f"shared limit {scope!r}",
            lease=lease,
        )
        deduct = deduct_predicate(deduct_when, f"shared limit {scope!r}")
        if deduct is not None:
            self._deduct[id(spec)] = deduct

        def decorate(obj: F) -> F:
            if isinstance(obj, Blueprint):
                self._blueprints.setdefault(obj.name, []).append(spec)
                self._generation += 1
            else:
                self._routes.setdefault(obj, []).append(spec)
                self._generation += 1
            return obj

        return decorate

    def exempt(self, obj: F) -> F:
        """Exempt a view function or a blueprint from every limit, app-wide ones included."""
        if isinstance(obj, Blueprint):
            self._exempt_blueprints.add(obj.name)
            self._generation += 1
        else:
            self._exempt_views.add(obj)
            self._generation += 1
        return obj

    # -- what applies to a request ---------------------------------------------------------

    def _specs_uncached(self, app: Flask, state: _AppState, req: flask.Request) -> list[LimitSpec]:
        endpoint = req.endpoint
        view = app.view_functions.get(endpoint) if endpoint else None
        if view is not None and view in self._exempt_views:
            return []
        bps = req.blueprints
        if any(bp in self._exempt_blueprints for bp in bps):
            return []
        route: list[LimitSpec] = list(self._routes.get(view, ())) if view is not None else []
        for bp in bps:
            route.extend(self._blueprints.get(bp, ()))
        if not route and view is not None:
            route = state.default
        return state.application + route

    def verdict(self) -> Verdict | None:
        """The current request's [`Verdict`][redcount.web.engine.Verdict] (None before any check)."""
        found: Verdict | None = request.environ.get(_VERDICT) if flask.has_request_context() else None
        return found
