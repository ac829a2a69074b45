"""One rate limit shared by every Celery worker of every host.

Celery's own ``rate_limit`` is enforced by each worker process on its own, so ten workers run
ten times the limit. A [`LimitedTask`][redcount.celery.LimitedTask] decides every start on the shared store instead:

```python
app.conf.redcount_url = "redis://cache:6379/0"

@app.task(base=redcount.celery.LimitedTask, limit="100/minute")
def send_email(to: str) -> None: ...

@redcount.celery.limited("10/second", app=app, limit_key=lambda args, kwargs: kwargs["tenant"])
def sync_tenant(*, tenant: str) -> None: ...
```

A start the limit refuses is not run and not lost: the task is sent again with
``countdown=retry_after`` (plus a jitter), the same id, arguments and options, and the worker
goes on with other work. The first refusal's time travels in a message header, so that after
``max_wait`` seconds of refusals the task fails with [`MaxWaitExceeded`][redcount.celery.MaxWaitExceeded]. These
re-schedules leave the task's own ``retries`` (and so its ``max_retries``) untouched.

Celery ships no type hints, so the Celery objects here are typed ``Any``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar, Union

import celery  # type: ignore[import-untyped]  # celery has no type hints
from celery import signals
from celery.exceptions import Retry  # type: ignore[import-untyped]

from . import _enforcement
from ._core import Lease, LimitSet
from ._job_limits import jittered, shared_limiter, store_for
from .errors import ConnectionError as StoreConnectionError
from .errors import InvalidInputError, RedcountError, WaitTimeout
from .limiter import (
    Limiter,
    OnUnavailable,
    Strategy,
    check_on_unavailable,
    return_leases_at_exit,
    strategies,
    unavailable_decision,
)
from .store import Store

__all__ = ["DEFAULT_MAX_WAIT", "FIRST_REFUSED_HEADER", "LEASE_MARGIN", "Deferred", "LimitedTask", "MaxWaitExceeded", "limited"]

log = logging.getLogger(__name__)

DEFAULT_MAX_WAIT = 3600.0
"""Seconds of refusals after which a task fails with [`MaxWaitExceeded`][redcount.celery.MaxWaitExceeded]."""
LEASE_MARGIN = 5.0
"""Seconds a default lease outlives the task's hard time limit."""
FIRST_REFUSED_HEADER = "redcount_first_refused"
"""The message header holding the epoch time of a task's first refusal."""

_UNAVAILABLE = "the store could not decide (on_unavailable='deny')"

KeyFunction = Callable[[tuple[Any, ...], dict[str, Any]], Union[str, bytes]]
F = TypeVar("F", bound=Callable[..., Any])


class Deferred(RedcountError):
    """Why a [`LimitedTask`][redcount.celery.LimitedTask] was re-scheduled: the reason of the ``Retry`` it raises
    (what Celery logs, stores as the RETRY state's result and passes to ``on_retry``).

    ``key``: the limit's key; ``retry_after``: the countdown it was sent again with. Not an
    error of the task: it runs later with the same id and arguments."""

    def __init__(self, message: str, key: str | bytes = "", retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.key = key
        self.retry_after = retry_after


class MaxWaitExceeded(WaitTimeout):
    """A [`LimitedTask`][redcount.celery.LimitedTask] was refused for longer than its ``max_wait``: it fails with this
    error and is not run. A [`WaitTimeout`][redcount.errors.WaitTimeout] (so a
    [`RedcountError`][redcount.errors.RedcountError]); ``key``, ``limit``, ``waited`` (seconds since the first
    refusal), ``retry_after`` (the limiter's last estimate) and ``max_wait`` as there.

    Its only required argument is the message, so Celery's result backends can rebuild it
    on the caller's side (``AsyncResult.get()`` raises it with the same message)."""

    def __init__(
        self,
        message: str,
        key: str | bytes = "",
        limit: int = 0,
        *,
        waited: float = 0.0,
        retry_after: float | None = None,
        max_wait: float = 0.0,
    ) -> None:
        super().__init__(message, key, limit, waited=waited, retry_after=retry_after, max_wait=max_wait)


def _return_leases(**_: Any) -> None:
    # A prefork pool process ends with os._exit (billiard), without atexit: its leased
    # units (Limiter.hit(..., lease=N) in its tasks) go back when Celery announces its end,
    # on a warm shutdown and on max_tasks_per_child recycling alike; a solo or threads pool
    # ends with the worker. Connected when this module is imported, before the pool forks.
    return_leases_at_exit()


signals.worker_process_shutdown.connect(_return_leases, weak=False, dispatch_uid="redcount.leases.process")
signals.worker_shutdown.connect(_return_leases, weak=False, dispatch_uid="redcount.leases.worker")


def _check_options(cls: type[LimitedTask]) -> None:
    name = getattr(cls, "name", None) or cls.__name__
    where = f"task {name}"
    limit = cls.limit
    if limit is not None:
        if not isinstance(limit, (str, LimitSet)):
            raise TypeError(f"{where}: limit must be a limit string like '100/minute' or a LimitSet, got {limit!r}")
        if isinstance(limit, str):
            LimitSet(limit)  # a bad string fails here, naming its bad part
    if cls.strategy not in strategies() or cls.strategy == "concurrency":
        allowed = ", ".join(repr(s) for s in strategies() if s != "concurrency")
        raise InvalidInputError(f"{where}: strategy must be one of {allowed}, got {cls.strategy!r}")
    mw = cls.max_wait
    if mw is not None and (isinstance(mw, bool) or not isinstance(mw, (int, float)) or not math.isfinite(mw) or mw < 0):
        raise InvalidInputError(f"{where}: max_wait must be finite and >= 0 seconds, or None (no limit), got {mw!r}")
    n = cls.concurrency
    if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
        raise InvalidInputError(f"{where}: concurrency must be an int >= 1 or None, got {n!r}")
    for opt in ("lease_timeout", "concurrency_retry"):
        v = getattr(cls, opt)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0):
            raise InvalidInputError(f"{where}: {opt} must be a number of seconds > 0, got {v!r}")
    check_on_unavailable(cls.on_unavailable)
    key = cls.__dict__.get("limit_key")
    if key is not None and not isinstance(key, staticmethod):
        if not callable(key):
            raise TypeError(f"{where}: limit_key must be a callable (args, kwargs) -> str, got {key!r}")
        # A function stored on the class would become a method; the key function is not one.
        cls.limit_key = staticmethod(key)


class LimitedTask(celery.Task):  # type: ignore[misc]  # celery.Task is untyped
    """A Celery task base class whose starts are limited across every worker.

    Task options (keyword arguments of ``@app.task(base=LimitedTask, ...)`` or class
    attributes of a subclass):

    - ``limit``: a limit string like ``"100/minute"`` or ``"5/second;100/hour"`` (all must
      hold), or a [`LimitSet`][redcount.limiter.LimitSet]: at most that many starts of the key.
    - ``limit_key``: ``callable(args, kwargs) -> str`` giving the key the limit counts; the
      default is the task's name (one limit for all its calls). Tasks returning the same key
      with the same limit share one count.
    - ``strategy``: a [`Limiter`][redcount.limiter.Limiter] strategy; the default, ``"sliding-window"``
      (the exact log), lets no interval of one window length hold more starts than the limit.
    - ``max_wait``: seconds of refusals (from the first) after which the task fails with
      [`MaxWaitExceeded`][redcount.celery.MaxWaitExceeded] instead of being sent again (default one hour; None: no end).
      It gives up as soon as the next countdown would go past it.
    - ``concurrency``: at most N of the key running at once, on expiring leases of the
      ``"concurrency"`` strategy: taken before the start, released when the task returns or
      raises, and freed by expiry (``lease_timeout``) when a worker dies holding one.
    - ``lease_timeout``: seconds; default the task's hard ``time_limit`` (else the app's
      ``task_time_limit``) plus 5 s, so that a running task never outlives its lease; else 300.
    - ``concurrency_retry``: the countdown (jittered) of a task that found every slot taken
      (default 1 s: leases free at unknown times).
    - ``on_unavailable``: when the store cannot decide (a
      [`ConnectionError`][redcount.errors.ConnectionError]): ``"deny"`` (default: sent again in 1 s, within
      ``max_wait``), ``"allow"`` (run unlimited) or ``"raise"`` (the task fails).

    App settings: ``redcount_url`` (required: the store every worker shares, such as
    ``"redis://cache:6379/0"``; each process connects once) or ``redcount_store`` (a
    [`Store`][redcount.store.Store] you opened, e.g. with TLS options or a ``budget``; it wins), and
    ``redcount_prefix`` (default ``"redcount:celery"``; the in-flight leases live under
    ``<prefix>:running``) and ``redcount_clock`` (the limiters' ``clock``: ``"client"``, the
    default, or ``"server"`` for workers on hosts whose clocks may disagree).

    A refused start is re-sent with ``countdown=retry_after`` (plus up to 10 % + 10 ms of
    jitter), the same id, arguments and options and the same ``retries`` count, so it does
    not count against ``max_retries``; the worker raises Celery's ``Retry`` with a
    [`Deferred`][redcount.celery.Deferred] reason and goes on with other work. Tasks run with ``apply()`` or
    ``task_always_eager`` wait in the caller instead (up to ``max_wait``); calling the task
    like a function (``send_email("a@b")``) runs it at once, unlimited, as Celery does, and so
    does every start while [`redcount.testing.disable_limits`][redcount.testing.disable_limits] is in force."""

    limit: str | LimitSet | None = None
    limit_key: KeyFunction | None = None
    strategy: Strategy = "sliding-window"
    max_wait: float | None = DEFAULT_MAX_WAIT
    concurrency: int | None = None
    lease_timeout: float | None = None
    concurrency_retry: float = 1.0
    on_unavailable: OnUnavailable = "deny"

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        _check_options(cls)

    # -- the store -------------------------------------------------------------------------

    def _settings(self) -> tuple[Store, str, str]:
        conf = self.app.conf
        prefix = str(conf.get("redcount_prefix") or "redcount:celery")
        clock = str(conf.get("redcount_clock") or "client")
        store = conf.get("redcount_store")
        if store is not None:
            if not isinstance(store, Store):
                raise TypeError(f"app.conf.redcount_store must be a redcount.Store, got {type(store).__name__}")
            return store, prefix, clock
        url = conf.get("redcount_url")
        if not url:
            raise InvalidInputError(
                f"task {self.name}: app.conf.redcount_url is not set; set it to the store every worker "
                "shares, e.g. 'redis://cache:6379/0' (memory:// would limit each worker process on its own)"
            )
        return store_for(str(url)), prefix, clock

    @property
    def limiter(self) -> Limiter:
        """The limiter deciding this task's starts (shared by the tasks of this process on
        the same store, strategy and prefix)."""
        store, prefix, clock = self._settings()
        return shared_limiter(store, self.strategy, prefix, clock)

    @property
    def slots(self) -> Limiter:
        """The ``"concurrency"`` limiter holding this task's in-flight leases."""
        store, prefix, clock = self._settings()
        return shared_limiter(store, "concurrency", prefix + ":running", clock)

    def key_for(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str | bytes:
        """The key the limits count for a call with these arguments."""
        fn = self.limit_key
        if fn is None:
            return str(self.name)
        key = fn(tuple(args), dict(kwargs))
        if not isinstance(key, (str, bytes)):
            raise TypeError(f"task {self.name}: limit_key must return str or bytes, got {type(key).__name__}")
        return key

    def _lease_timeout(self) -> float:
        if self.lease_timeout is not None:
            return float(self.lease_timeout)
        hard = self.time_limit or self.app.conf.get("task_time_limit")
        # The lease is taken just before the run starts, and a pool process past its hard
        # time limit is killed a little after it: a margin, so the lease outlives the run.
        return float(hard) + LEASE_MARGIN if hard else 300.0

    # -- running ---------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        request = self.request
        if request.called_directly:
            return super().__call__(*args, **kwargs)
        if self.limit is None and self.concurrency is None:
            raise InvalidInputError(
                f"task {self.name} has base LimitedTask but neither limit= nor concurrency=; give one, "
                "or use the plain Task base"
            )
        if _enforcement.suspended:  # redcount.testing.disable_limits(): run at once, nothing counted
            return self.run(*args, **kwargs)
        key = self.key_for(args, kwargs)
        if request.is_eager:
            lease = self._admit_eagerly(key)
        else:
            lease = self._admit_or_defer(request, key, args, kwargs)
        try:
            # The worker's tracer has pushed this request already; Task.__call__ would push
            # a second one (which older Celery versions build from the arguments alone).
            return self.run(*args, **kwargs)
        finally:
            if lease is not None:
                self._release(lease)

    def _acquire(self, key: str | bytes) -> tuple[Lease | None, bool, str]:
        """(lease, admitted, why not) for the in-flight cap; (None, True, "") with no cap."""
        if self.concurrency is None:
            return None, True, ""
        try:
            lease = self.slots.acquire(self.concurrency, key, lease_timeout=self._lease_timeout())
        except StoreConnectionError as e:
            d = unavailable_decision(self.on_unavailable, e)
            return None, d.allowed, _UNAVAILABLE
        return lease, lease is not None, f"all {self.concurrency} in-flight slots in use"

    def _hit(self, key: str | bytes) -> tuple[bool, float, int, str]:
        """(allowed, retry_after, amount, why not) for the rate limit; (True, 0, 0, "") with none."""
        if self.limit is None:
            return True, 0.0, 0, ""
        try:
            d = self.limiter.hit(self.limit, key)
        except StoreConnectionError as e:
            d = unavailable_decision(self.on_unavailable, e)
        why = _UNAVAILABLE if d.unavailable else f"limit {self._limit_text()} reached"
        return d.allowed, d.retry_after, d.limit, why

    def _release(self, lease: Lease) -> None:
        if lease.released:
            return
        try:
            self.slots.release(lease)
        except RedcountError as e:  # the lease frees itself at its expiry anyway
            log.warning("task %s: could not release in-flight lease %s (%s); it expires by itself", self.name, lease.id, e)

    def _admit_or_defer(
        self, request: Any, key: str | bytes, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Lease | None:
        lease, admitted, why = self._acquire(key)
        if not admitted:
            self._defer(request, key, args, kwargs, self.concurrency_retry, self.concurrency or 0, why)
        allowed, retry_after, amount, why = self._hit(key)
        if not allowed:
            if lease is not None:
                self._release(lease)
            self._defer(request, key, args, kwargs, retry_after, amount, why)
        return lease

    def _limit_text(self) -> str:
        limit = self.limit
        return repr(limit.text if isinstance(limit, LimitSet) else limit)

    def _defer(
        self,
        request: Any,
        key: str | bytes,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        retry_after: float,
        amount: int,
        why: str,
    ) -> NoReturn:
        now = time.time()
        first = _first_refused(request)
        if first is None:
            first = now
        countdown = jittered(retry_after)
        if self.max_wait is not None and now + countdown - first > self.max_wait:
            waited = now - first
            raise MaxWaitExceeded(
                f"task {self.name}[{request.id}] not run: refused for {waited:.3f} s on key {key!r} ({why}; "
                f"next try in {retry_after:.3f} s would pass max_wait={self.max_wait} s)",
                key,
                amount,
                waited=waited,
                retry_after=retry_after,
                max_wait=float(self.max_wait),
            )
        headers = dict(getattr(request, "headers", None) or {})
        headers[FIRST_REFUSED_HEADER] = first
        # The request's own id, arguments, options and retries: a re-send, not a retry.
        sig = self.signature_from_request(request, args, kwargs, countdown=countdown, headers=headers)
        sig.apply_async()
        raise Retry(exc=Deferred(f"{why} on key {key!r}; sent again in {countdown:.3f} s", key, countdown), when=countdown, sig=sig)

    def _admit_eagerly(self, key: str | bytes) -> Lease | None:
        """apply() / task_always_eager: no worker to hand the task back to, so wait here."""
        started = time.monotonic()
        deadline = None if self.max_wait is None else started + self.max_wait
        lease, admitted, why = self._acquire(key)
        while not admitted:
            delay = jittered(self.concurrency_retry)
            if deadline is not None and time.monotonic() + delay > deadline:
                raise MaxWaitExceeded(
                    f"task {self.name} not run: {why} on {key!r} for max_wait={self.max_wait} s",
                    key,
                    self.concurrency or 0,
                    waited=time.monotonic() - started,
                    max_wait=float(self.max_wait or 0),
                )
            time.sleep(delay)
            lease, admitted, why = self._acquire(key)
        if self.limit is None:
            return lease
        while True:
            allowed, retry_after, amount, why = self._hit(key)
            if allowed:
                return lease
            delay = jittered(retry_after)
            if deadline is not None and time.monotonic() + delay > deadline:
                if lease is not None:
                    self._release(lease)
                raise MaxWaitExceeded(
                    f"task {self.name} not run: {why} on {key!r}; it would not be admitted within "
                    f"max_wait={self.max_wait} s",
                    key,
                    amount,
                    waited=time.monotonic() - started,
                    retry_after=retry_after,
                    max_wait=float(self.max_wait or 0),
                )
            time.sleep(delay)


def _first_refused(request: Any) -> float | None:
    # Celery >= 5.4 gathers custom headers in request.headers; older versions set them as
    # attributes of the request.
    headers = getattr(request, "headers", None) or {}
    value = headers.get(FIRST_REFUSED_HEADER, getattr(request, FIRST_REFUSED_HEADER, None))
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def limited(
    limit: str | LimitSet | None = None, *, app: Any = None, base: type[LimitedTask] | None = None, **options: Any
) -> Callable[[Callable[..., Any]], Any]:
    """The decorator form: ``@limited("100/minute", app=app)`` is
    ``@app.task(base=LimitedTask, limit="100/minute")`` (``app=None``: Celery's
    ``shared_task``). ``options``: [`LimitedTask`][redcount.celery.LimitedTask]'s (``limit_key``, ``strategy``,
    ``max_wait``, ``concurrency``, ``lease_timeout``, ``concurrency_retry``,
    ``on_unavailable``) and any Celery task option (``name``, ``bind``, ``max_retries``, ...).
    ``base``: a subclass of [`LimitedTask`][redcount.celery.LimitedTask] to use; the options given here override its
    attributes, the others keep its values."""
    if base is not None and not (isinstance(base, type) and issubclass(base, LimitedTask)):
        raise TypeError(f"base must be a subclass of redcount.celery.LimitedTask, got {base!r}")
    options["base"] = base or LimitedTask
    if limit is not None:
        options["limit"] = limit
    make = celery.shared_task if app is None else app.task

    def decorate(fn: Callable[..., Any]) -> Any:
        return make(**options)(fn)

    return decorate
