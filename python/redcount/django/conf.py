"""The ``REDCOUNT`` setting: read, validated and turned into the objects every request uses.

```python
# settings.py
REDCOUNT = {
    "URL": "redis://cache:6379/0",           # default "memory://" (this process only)
    "DEFAULT_LIMITS": ["1000/hour"],         # every request, counted once across the site
    "PATHS": {"/api/login": "5/minute",      # exact path
              "/api/": "100/minute",         # a prefix (ends with "/"): the longest match wins
              "/health/": None},             # None: no limit at all there, defaults included
    "FAIL": "open",                          # or "closed" (503 while the store is down)
    "BUDGET": 0.1,                           # seconds all of a request's checks may take
}
```

    # settings.py
    REDCOUNT = {
        "URL": "redis://cache:6379/0",           # default "memory://" (this process only)
        "DEFAULT_LIMITS": ["1000/hour"],         # every request, counted once across the site
        "PATHS": {"/api/login": "5/minute",      # exact path
                  "/api/": "100/minute",         # a prefix (ends with "/"): the longest match wins
                  "/health/": None},             # None: no limit at all there, defaults included
        "FAIL": "open",                          # or "closed" (503 while the store is down)
        "BUDGET": 0.1,                           # seconds a check may wait for Redis
    }

Every name is checked when the app starts ([`RedcountConfig`][redcount.django.apps.RedcountConfig]'s
``ready()``, or the first construction of the middleware when the app is not installed), and
a bad value raises [`ConfigurationError`][redcount.django.conf.ConfigurationError], which names the setting
(``REDCOUNT["FAIL"]: ...``). It is both Django's ``ImproperlyConfigured`` and redcount's
[`InvalidInputError`][redcount.errors.InvalidInputError], so either ``except`` catches it. Unknown names are
refused too, so a typo does not silently do nothing.

The settings mean what the Flask and FastAPI integrations' settings mean, with the same
defaults (see [`redcount.flask.RateLimiter`][redcount.flask.RateLimiter]).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.utils.module_loading import import_string

from .. import aio
from .. import store as _store
from ..errors import InvalidInputError
from ..limiter import Limiter
from ..policies import AccessLists, config_list, config_penalty, config_size
from ..web.engine import DEFAULT_BUDGET, check_budget, check_store
from ..web.settings import Settings
from ..web.spec import KeyFunc, LimitSpec, config_lease
from .keys import as_key

__all__ = ["DEFAULTS", "ConfigurationError", "State", "get_state", "reset_state"]

SETTING = "REDCOUNT"

DEFAULTS: dict[str, Any] = {
    "URL": None,
    "STRATEGY": "fixed-window",
    "PREFIX": "redcount:web",
    "DEFAULT_LIMITS": None,
    "PATHS": None,
    "KEY": None,
    "HEADERS": None,
    "TRUSTED_PROXIES": None,
    "IPV6_PREFIX": 128,
    "FAIL": "open",
    "BUDGET": DEFAULT_BUDGET,
    "BREAKER": True,
    "FALLBACK": None,
    "ENABLED": True,
    "SHADOW": False,
    "CHECK_ON_START": False,
    "METRICS": None,
    "VIEW": None,
    "RATELIMIT_COMPAT_403": False,
    "ALLOW": None,
    "DENY": None,
    "REFUSAL_CACHE": 0,
    "PENALTY": None,
    "LEASE": None,
}
"""Every name ``REDCOUNT`` may hold, with its default (the same as the Flask integration's):

- ``URL``: the store, as for [`redcount.connect`][redcount.store.connect] (default ``"memory://"``: counts kept in
  this process only, so each worker process counts apart).
- ``STRATEGY``: the limiter's strategy (default ``"fixed-window"``); ``PREFIX``: its key
  prefix (default ``"redcount:web"``).
- ``DEFAULT_LIMITS``: a limit string or a list of them, applied by the middleware to every
  request, counted once across the site per client.
- ``PATHS``: ``{path: limit}``; a path ending with ``/`` is a prefix, others match exactly, and
  the longest match applies (counted per entry and client). A limit of None exempts those
  paths from every middleware limit, ``DEFAULT_LIMITS`` included.
- ``KEY``: the default key: ``"ip"`` (default: the client address, see
  ``TRUSTED_PROXIES``), ``"user"``, ``"user_or_ip"``, ``"header:<name>"``, a callable of the
  request returning a str, or its dotted path.
- ``HEADERS``: ``"ietf"``, ``"legacy"``, ``"retry-after"``, ``"all"`` or ``"none"``, as a
  comma-separated string or a list (default ``"ietf,retry-after"``).
- ``TRUSTED_PROXIES``: None (default: trust no forwarding header), a proxy count, or CIDRs;
  ``IPV6_PREFIX``: group IPv6 clients by this prefix length (default 128).
- ``FAIL``: ``"open"`` (default: let requests through while the store is down) or
  ``"closed"`` (answer 503).
- ``BUDGET``: seconds a check may wait for Redis (default 0.1; 0 or None: none); a check
  that waited it out, and the request's checks after it, are decided by ``FAIL`` without
  the store (the response carries ``RateLimit-Undecided``). Only waiting spends it: the
  app's own work between the middleware's check and a view's costs none of it. Also the
  ``budget`` of the store built from ``URL``. ``BREAKER`` (default True)
  and ``FALLBACK`` (default None) are that store's ``breaker`` and ``fallback``.
- ``ENABLED``: False turns every limit off (middleware, decorators, throttles).
- ``SHADOW``: count and report, never refuse. ``CHECK_ON_START``: ping the store at start-up.
- ``METRICS``: a [`redcount.web.metrics.PrometheusMetrics`][redcount.web.metrics.PrometheusMetrics] (or its dotted path).
- ``VIEW``: a view (or its dotted path) answering refused requests: called as
  ``view(request, exception)`` with a [`RateLimitExceeded`][redcount.django.RateLimitExceeded]; the
  rate-limit headers are added to what it returns. Default: a 429
  ``application/problem+json`` response.
- ``RATELIMIT_COMPAT_403``: the [`redcount.django.ratelimit`][redcount.django.ratelimit] drop-in raises
  [`Ratelimited`][redcount.django.ratelimit.exceptions.Ratelimited] (403, as django-ratelimit does) instead of
  answering 429.
- ``ALLOW``, ``DENY``: keys, addresses and CIDRs (a list, or one comma-separated string)
  decided before any round trip, matched against each check's identity (the client address
  by default): an allowed check is not counted, a denied one refuses (``Retry-After`` one
  day). ``REFUSAL_CACHE`` (default 0: off): how many refused keys are answered locally until
  their ``Retry-After``. ``PENALTY``: a [`redcount.Penalty`][redcount.policies.Penalty] (or a dict of its
  arguments) for the limiter. See docs/penalties.md.
- ``LEASE``: leased middleware limits (``DEFAULT_LIMITS`` and ``PATHS``): each process takes
  up to this many units at a time and decides from them locally (``STRATEGY``
  any strategy but ``"concurrency"``; see docs/leased-limits.md). Default None:
  not leased.
"""


class ConfigurationError(ImproperlyConfigured, InvalidInputError):  # type: ignore[misc]
    """A bad ``REDCOUNT`` setting or decorator argument, raised at start-up or at import.
    Both Django's ``ImproperlyConfigured`` and [`redcount.InvalidInputError`][redcount.errors.InvalidInputError]."""


def _bool(value: Any, name: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("1", "true", "yes", "on", "0", "false", "no", "off"):
        return value.strip().lower() in ("1", "true", "yes", "on")
    raise ConfigurationError(f'{SETTING}["{name}"] must be True or False, got {value!r}')


def _limits(value: Any, name: str) -> list[str]:
    """A limit string or a list of them."""
    if value is None or value == "" or value == []:
        return []
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(v, str) and v for v in items):
        raise ConfigurationError(f'{SETTING}["{name}"] must be a limit string like "100/minute" or a list of them, got {value!r}')
    return list(items)


def _spec(limit: str, *, name: str, scope: str, setting: str, lease: int | None = None) -> LimitSpec:
    try:
        return LimitSpec.build(limit, name=name, scope=scope, where=f'{SETTING}["{setting}"]', lease=lease)
    except InvalidInputError as e:
        raise ConfigurationError(str(e)) from None


def _object(value: Any, name: str) -> Any:
    if isinstance(value, str):
        try:
            return import_string(value)
        except ImportError as e:
            raise ConfigurationError(f'{SETTING}["{name}"]: cannot import {value!r}: {e}') from None
    return value


_PATH_CACHE = 10_000


@dataclass
class State:
    """What the ``REDCOUNT`` setting settled: the limiters (sync, and its asyncio twin on the
    same core), the shared web settings and the middleware's limits. Built once per process
    (and again when a test changes the setting); read-only afterwards, so thread-safe."""

    limiter: Limiter
    alimiter: aio.Limiter
    settings: Settings
    default: list[LimitSpec]
    paths: list[tuple[str, list[LimitSpec] | None]]
    enabled: bool
    budget: float | None
    view: Callable[..., Any] | None
    compat_403: bool
    prefix: str
    _by_path: dict[str, list[LimitSpec]] = field(default_factory=dict)
    # connect() with the URL's arguments and another clock: the store of limiter_on_clock().
    reopen: Callable[[_store.ManualClock], _store.Store] | None = None
    _strategies: dict[str, Limiter] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _on_clock: tuple[_store.Store, _store.ManualClock] | None = None
    _clocked: dict[str, Limiter] = field(default_factory=dict)
    clock_lock: threading.Lock = field(default_factory=threading.Lock)

    def specs_for(self, path: str) -> list[LimitSpec]:
        """The middleware's limits for a request to ``path``: ``DEFAULT_LIMITS`` and the
        longest ``PATHS`` entry that matches (nothing when that entry is None)."""
        found = self._by_path.get(path)
        if found is not None:
            return found
        specs: list[LimitSpec] = list(self.default)
        for pattern, limits in self.paths:  # longest first
            if path == pattern or (pattern.endswith("/") and path.startswith(pattern)):
                specs = [] if limits is None else specs + limits
                break
        if len(self._by_path) >= _PATH_CACHE:
            self._by_path.clear()
        self._by_path[path] = specs
        return specs

    def limiter_for(self, strategy: str) -> Limiter:
        """A limiter on the same store with another strategy (the DRF throttles use the
        sliding log, as DRF's own throttles do), under its own key prefix."""
        if strategy == self.limiter.strategy:
            return self.limiter
        found = self._strategies.get(strategy)
        if found is None:
            with self._lock:
                found = self._strategies.get(strategy)
                if found is None:
                    found = Limiter(self.limiter.store, strategy, prefix=f"{self.prefix}:{strategy}")  # type: ignore[arg-type]
                    self._strategies[strategy] = found
        return found

    def limiter_on_clock(self, strategy: str) -> tuple[Limiter, _store.ManualClock]:
        """A limiter like [`limiter_for`][redcount.django.conf.State.limiter_for]'s (same strategy and key prefix) on a second
        store opened from ``URL`` whose clock is the returned [`ManualClock`][redcount.store.ManualClock]:
        the DRF throttles whose ``timer`` is overridden decide on it, setting the clock to
        the timer's time under `clock_lock`. On Redis it holds the same keys; on
        ``memory://`` it is a keyspace of its own (the store is private to its process)."""
        with self._lock:
            if self._on_clock is None:
                if self.reopen is None:
                    raise RuntimeError("this State was built without reopen; use build_state()")
                clock = _store.ManualClock()
                self._on_clock = (self.reopen(clock), clock)
            store, clock = self._on_clock
            found = self._clocked.get(strategy)
            if found is None:
                prefix = self.prefix if strategy == self.limiter.strategy else f"{self.prefix}:{strategy}"
                found = Limiter(store, strategy, prefix=prefix)  # type: ignore[arg-type]
                self._clocked[strategy] = found
            return found, clock


def read_settings() -> dict[str, Any]:
    """``settings.REDCOUNT`` over [`DEFAULTS`][redcount.django.conf.DEFAULTS], unknown names refused."""
    raw = getattr(django_settings, SETTING, None)
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigurationError(f"{SETTING} must be a dict, got {type(raw).__name__}")
    unknown = sorted(str(k) for k in raw if k not in DEFAULTS)
    if unknown:
        raise ConfigurationError(f'{SETTING}["{unknown[0]}"] is not a redcount setting; known: {", ".join(DEFAULTS)}')
    return {**DEFAULTS, **raw}


def build_state() -> State:
    """Validate ``settings.REDCOUNT`` and build the [`State`][redcount.django.conf.State]; raises
    [`ConfigurationError`][redcount.django.conf.ConfigurationError] naming the first bad setting."""
    cfg = read_settings()

    def web(name: str, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except InvalidInputError as e:
            if isinstance(e, ConfigurationError):
                raise
            raise ConfigurationError(f'{SETTING}["{name}"]: {e}') from None

    budget_raw = cfg["BUDGET"]
    if isinstance(budget_raw, str):
        try:
            budget_raw = float(budget_raw)
        except ValueError:
            raise ConfigurationError(f'{SETTING}["BUDGET"] must be a number of seconds, got {budget_raw!r}') from None
    budget = web("BUDGET", lambda: check_budget(budget_raw, "the budget"))
    url = cfg["URL"] or "memory://"
    if not isinstance(url, (str, list, tuple)):
        raise ConfigurationError(f'{SETTING}["URL"] must be a store URL like "redis://host:6379/0", got {url!r}')
    strategy = cfg["STRATEGY"]
    prefix = cfg["PREFIX"]
    if not isinstance(prefix, str) or not prefix:
        raise ConfigurationError(f'{SETTING}["PREFIX"] must be a non-empty str, got {prefix!r}')
    fallback = cfg["FALLBACK"] or None
    if fallback is not None and not isinstance(fallback, str):
        raise ConfigurationError(f'{SETTING}["FALLBACK"] must be a store URL such as "memory://", got {fallback!r}')
    breaker = _bool(cfg["BREAKER"], "BREAKER")
    def reopen(clock: _store.ManualClock | None = None) -> _store.Store:
        return _store.connect(url, budget=budget, breaker=breaker, fallback=fallback, clock=clock)

    store = web("URL", reopen)
    try:
        penalty = web("PENALTY", lambda: config_penalty(cfg["PENALTY"], "the penalty"))
        limiter = web("STRATEGY", lambda: Limiter(store, strategy, prefix=prefix, penalty=penalty))
        if _bool(cfg["CHECK_ON_START"], "CHECK_ON_START"):
            check_store(store)
        ipv6 = cfg["IPV6_PREFIX"]
        if isinstance(ipv6, str) and ipv6.strip().isdigit():
            ipv6 = int(ipv6)
        metrics = _object(cfg["METRICS"], "METRICS")
        key: KeyFunc | None = (
            web("KEY", lambda: as_key(cfg["KEY"], "the default key")) if cfg["KEY"] is not None else None
        )
        parts: dict[str, Any] = {
            "HEADERS": lambda: Settings.build(
                key=None, headers=cfg["HEADERS"], trusted_proxies=None, ipv6_prefix=128, fail="open",
                shadow=False, metrics=None, where=SETTING,
            ),
            "TRUSTED_PROXIES": lambda: Settings.build(
                key=None, headers=None, trusted_proxies=cfg["TRUSTED_PROXIES"], ipv6_prefix=128, fail="open",
                shadow=False, metrics=None, where=SETTING,
            ),
            "IPV6_PREFIX": lambda: Settings.build(
                key=None, headers=None, trusted_proxies=None, ipv6_prefix=ipv6, fail="open",
                shadow=False, metrics=None, where=SETTING,
            ),
            "FAIL": lambda: Settings.build(
                key=None, headers=None, trusted_proxies=None, ipv6_prefix=128, fail=cfg["FAIL"],
                shadow=False, metrics=None, where=SETTING,
            ),
            "METRICS": lambda: Settings.build(
                key=None, headers=None, trusted_proxies=None, ipv6_prefix=128, fail="open",
                shadow=False, metrics=metrics, where=SETTING,
            ),
            "ALLOW": lambda: AccessLists(allow=config_list(cfg["ALLOW"], "the allow list")),
            "DENY": lambda: AccessLists(deny=config_list(cfg["DENY"], "the deny list")),
            "REFUSAL_CACHE": lambda: config_size(cfg["REFUSAL_CACHE"], "the refusal cache size"),
        }
        for name, check in parts.items():  # each alone first, so the error names its setting
            web(name, check)
        shadow = _bool(cfg["SHADOW"], "SHADOW")
        settings = Settings.build(
            key=key, headers=cfg["HEADERS"], trusted_proxies=cfg["TRUSTED_PROXIES"], ipv6_prefix=ipv6,
            fail=cfg["FAIL"], shadow=shadow, metrics=metrics, where=SETTING, budget=budget,
            allow=config_list(cfg["ALLOW"], "ALLOW"), deny=config_list(cfg["DENY"], "DENY"),
            refusal_cache=config_size(cfg["REFUSAL_CACHE"], "REFUSAL_CACHE"),
        )
        if metrics is not None and hasattr(metrics, "watch_store"):
            metrics.watch_store(store)
        default_limits = _limits(cfg["DEFAULT_LIMITS"], "DEFAULT_LIMITS")
        lease = web("LEASE", lambda: config_lease(cfg["LEASE"], limiter.strategy, "the lease"))
        default = [
            _spec(text, name="default" if i == 0 else f"default-{i + 1}", scope="default" if i == 0 else f"default-{i + 1}",
                  setting="DEFAULT_LIMITS", lease=lease)
            for i, text in enumerate(default_limits)
        ]
        paths: list[tuple[str, list[LimitSpec] | None]] = []
        raw_paths = cfg["PATHS"] or {}
        if not isinstance(raw_paths, Mapping):
            raise ConfigurationError(f'{SETTING}["PATHS"] must be a dict of path -> limit, got {type(raw_paths).__name__}')
        for pattern, value in raw_paths.items():
            if not isinstance(pattern, str) or not pattern.startswith("/"):
                raise ConfigurationError(f'{SETTING}["PATHS"] keys must be paths starting with "/", got {pattern!r}')
            if value is None:
                paths.append((pattern, None))
                continue
            texts = _limits(value, f"PATHS']['{pattern}")
            paths.append((pattern, [
                _spec(text, name=pattern if len(texts) == 1 else f"{pattern}-{i + 1}", scope=f"path:{pattern}#{i}",
                      setting="PATHS", lease=lease)
                for i, text in enumerate(texts)
            ]))
        paths.sort(key=lambda item: len(item[0]), reverse=True)
        view = _object(cfg["VIEW"], "VIEW")
        if view is not None and not callable(view):
            raise ConfigurationError(f'{SETTING}["VIEW"] must be a view callable(request, exception) or its dotted path, got {view!r}')
        return State(
            limiter=limiter,
            alimiter=aio.Limiter.from_sync(limiter),
            settings=settings,
            default=default,
            paths=paths,
            enabled=_bool(cfg["ENABLED"], "ENABLED"),
            # The embedded store answers inline: no deadline to watch.
            budget=None if store.is_memory else settings.budget,
            view=view,
            compat_403=_bool(cfg["RATELIMIT_COMPAT_403"], "RATELIMIT_COMPAT_403"),
            prefix=prefix,
            reopen=reopen,
        )
    except BaseException:
        store.close()
        raise


_state: State | None = None
_state_lock = threading.Lock()


def get_state() -> State:
    """The process's [`State`][redcount.django.conf.State], built from the settings on first use."""
    state = _state
    if state is None:
        with _state_lock:
            state = _state
            if state is None:
                state = build_state()
                _set(state)
    return state


def _set(state: State | None) -> None:
    global _state
    _state = state


def reset_state() -> None:
    """Forget the built state: the next request reads ``settings.REDCOUNT`` again (done
    automatically when a test changes the setting with ``override_settings``)."""
    with _state_lock:
        _set(None)


def _on_setting_changed(*, setting: str, **_: Any) -> None:
    if setting in (SETTING, "RATELIMIT_ENABLE"):
        reset_state()


setting_changed.connect(_on_setting_changed, dispatch_uid="redcount.django.conf")

# A process forked after the state was built (gunicorn --preload, a multiprocessing worker)
# builds its own on first use: the parent's store and its connections stay the parent's. The
# inherited state is kept referenced, never collected in the child, so that nothing of it
# runs there (its sockets are the parent's).
_inherited: list[State] = []


def _after_fork_in_child() -> None:
    global _state_lock
    if _state is not None:
        _inherited.append(_state)
    _state_lock = threading.Lock()  # another thread may have held it at the fork
    _set(None)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
