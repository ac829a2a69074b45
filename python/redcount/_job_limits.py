"""What the Celery, RQ and Dramatiq integrations share: the per-process store and limiter
caches and the jitter of a re-schedule; and, for RQ and Dramatiq, one job limit's options,
checked once, and the decision a worker asks of it before a job starts.

A `JobLimit` is pure policy: it knows its limit, key function, strategy, ``max_wait``,
``on_unavailable`` and store, and answers "may this call start now, and if not, when to ask
again and whether ``max_wait`` is spent". How a refused job goes back to its queue (RQ's
scheduler, Dramatiq's delay queue) is the integration's business.
"""

from __future__ import annotations

import math
import os
import random
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Union

from ._core import LimitSet
from .errors import ConnectionError as StoreConnectionError
from .errors import InvalidInputError
from .limiter import Limiter, OnUnavailable, Strategy, check_on_unavailable, strategies, unavailable_decision
from .store import Store, connect

KeyFunction = Callable[[tuple[Any, ...], dict[str, Any]], Union[str, bytes]]

DEFAULT_MAX_WAIT = 3600.0
UNAVAILABLE = "the store could not decide (on_unavailable='deny')"

# One store per URL and one limiter per (store, strategy, prefix, clock) in each process. The
# store is fork-safe (a forked child opens its own connection on its first call).
_lock = threading.Lock()
_stores: dict[str, Store] = {}
# keyed by id(store); the value holds the store, so the id cannot be reused while cached
_limiters: dict[tuple[int, str, str, str], tuple[Store, Limiter]] = {}


def _new_lock_after_fork() -> None:
    global _lock
    _lock = threading.Lock()  # another thread may have held it at the fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_after_fork)


def store_for(store: str | Store) -> Store:
    """``store`` itself, or this process's one connection to the URL ``store``."""
    if isinstance(store, Store):
        return store
    got = _stores.get(store)
    if got is None:
        with _lock:
            got = _stores.get(store)
            if got is None:
                got = _stores[store] = connect(store)
    return got


def shared_limiter(store: Store, strategy: str, prefix: str, clock: str) -> Limiter:
    key = (id(store), strategy, prefix, clock)
    got = _limiters.get(key)
    if got is None:
        with _lock:
            got = _limiters.get(key)
            if got is None:
                limiter = Limiter(store, strategy, prefix=prefix, clock=clock)  # type: ignore[arg-type]
                got = _limiters[key] = (store, limiter)
    return got[1]


def jittered(delay: float) -> float:
    """``delay`` plus up to 10 % + 10 ms: the refused jobs of one burst all learn the same
    ``retry_after``, and should not all come back in the same instant."""
    base = max(delay, 0.001)
    return base + 0.001 + random.uniform(0.0, 0.1 * base + 0.01)


@dataclass(frozen=True)
class Verdict:
    """One decision: ``allowed``; else ``retry_after`` seconds, the limit ``amount`` that
    refused and ``why`` (for messages)."""

    allowed: bool
    retry_after: float
    amount: int
    why: str


@dataclass(frozen=True)
class JobLimit:
    """The checked options of one limited job (see `job_limit`)."""

    name: str
    limit: str | LimitSet
    limit_key: KeyFunction | None
    strategy: Strategy
    max_wait: float | None
    on_unavailable: OnUnavailable
    store: str | Store | None
    prefix: str
    clock: str

    def key_for(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | bytes:
        """The key the limit counts for a call with these arguments (the job's name by default)."""
        if self.limit_key is None:
            return self.name
        key = self.limit_key(tuple(args), dict(kwargs))
        if not isinstance(key, (str, bytes)):
            raise TypeError(f"job {self.name}: limit_key must return str or bytes, got {type(key).__name__}")
        return key

    def limiter(self, default_store: str | Store | None = None) -> Limiter:
        """The limiter deciding this job's starts, on its own store or else ``default_store``."""
        store = self.store if self.store is not None else default_store
        if store is None:
            raise InvalidInputError(
                f"job {self.name}: no store to decide on; give store= to the job's limit or to the worker "
                "(the store every worker shares, e.g. 'redis://cache:6379/0')"
            )
        return shared_limiter(store_for(store), self.strategy, self.prefix, self.clock)

    def limit_text(self) -> str:
        limit = self.limit
        return repr(limit.text if isinstance(limit, LimitSet) else limit)

    def decide(self, key: str | bytes, default_store: str | Store | None = None) -> Verdict:
        """Charge one start of ``key``, or say when to ask again. A store that cannot decide
        follows ``on_unavailable`` (``"raise"``: the store's error propagates)."""
        limiter = self.limiter(default_store)
        try:
            d = limiter.hit(self.limit, key)
        except StoreConnectionError as e:
            d = unavailable_decision(self.on_unavailable, e)
        why = UNAVAILABLE if d.unavailable else f"limit {self.limit_text()} reached"
        return Verdict(d.allowed, d.retry_after, d.limit, why)

    def past_max_wait(self, first: float, now: float, countdown: float) -> bool:
        """True when a job first refused at ``first`` would, sent again ``countdown`` seconds
        after ``now``, come back after ``max_wait``."""
        return self.max_wait is not None and now + countdown - first > self.max_wait

    def max_wait_message(self, what: str, key: str | bytes, first: float, now: float, verdict: Verdict) -> str:
        return (
            f"{what} not run: refused for {now - first:.3f} s on key {key!r} ({verdict.why}; next try in "
            f"{verdict.retry_after:.3f} s would pass max_wait={self.max_wait} s)"
        )


def _number(where: str, name: str, value: object) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0
    ):
        raise InvalidInputError(f"{where}: {name} must be finite and >= 0 seconds, or None (no limit), got {value!r}")


def job_limit(
    name: str,
    limit: object,
    *,
    limit_key: object = None,
    strategy: object = "sliding-window",
    max_wait: object = DEFAULT_MAX_WAIT,
    on_unavailable: object = "deny",
    store: object = None,
    prefix: object = "redcount:jobs",
    clock: object = "client",
) -> JobLimit:
    """Check a job's options and return them as a `JobLimit`; a bad one fails here,
    naming the job and the option."""
    where = f"job {name}"
    if not isinstance(limit, (str, LimitSet)):
        raise TypeError(f"{where}: limit must be a limit string like '100/minute' or a LimitSet, got {limit!r}")
    if isinstance(limit, str):
        LimitSet(limit)  # a bad string fails here, naming its bad part
    if strategy not in strategies() or strategy == "concurrency":
        allowed = ", ".join(repr(s) for s in strategies() if s != "concurrency")
        raise InvalidInputError(f"{where}: strategy must be one of {allowed}, got {strategy!r}")
    _number(where, "max_wait", max_wait)
    if limit_key is not None and not callable(limit_key):
        raise TypeError(f"{where}: limit_key must be a callable (args, kwargs) -> str, got {limit_key!r}")
    if store is not None and not isinstance(store, (str, Store)):
        raise TypeError(f"{where}: store must be a URL like 'redis://cache:6379/0' or a redcount.Store, got {store!r}")
    if not isinstance(prefix, str) or not prefix:
        raise InvalidInputError(f"{where}: prefix must be a non-empty string, got {prefix!r}")
    if clock not in ("client", "server"):
        raise InvalidInputError(f"{where}: clock must be 'client' or 'server', got {clock!r}")
    return JobLimit(
        name=name,
        limit=limit,
        limit_key=limit_key,  # checked callable above
        strategy=strategy,  # type: ignore[arg-type]  # checked above
        max_wait=None if max_wait is None else float(max_wait),  # type: ignore[arg-type]
        on_unavailable=check_on_unavailable(on_unavailable),
        store=store,
        prefix=prefix,
        clock=clock,
    )
