"""One rate limit shared by every Dramatiq worker of every host.

Dramatiq's own ``dramatiq.rate_limits`` are building blocks an actor calls from its body;
[`RateLimit`][redcount.dramatiq.RateLimit] is a middleware that decides every start on the store all workers share,
before the actor runs, from actor options:

```python
broker.add_middleware(redcount.dramatiq.RateLimit("redis://cache:6379/0"))

@dramatiq.actor(limit="100/minute")
def send_email(to: str) -> None: ...

@dramatiq.actor(limit="10/second", limit_key=lambda args, kwargs: kwargs["tenant"], max_wait=600)
def sync_tenant(*, tenant: str) -> None: ...
```

A message the limit refuses is not run and not lost: it is enqueued again (same message id,
arguments and options) with ``delay=retry_after`` (plus a jitter), and the current delivery is
skipped (``SkipMessage``). The first refusal's time travels in the message's options, so that
after ``max_wait`` seconds of refusals the message fails with [`MaxWaitExceeded`][redcount.dramatiq.MaxWaitExceeded]. The
actor's own ``retries`` are untouched.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from typing import Any

try:
    import dramatiq
    from dramatiq.middleware import Middleware, MiddlewareError, SkipMessage
except ImportError as exc:
    raise ImportError(
        f"redcount.dramatiq needs Dramatiq ({exc.name} is missing): pip install 'redcount[dramatiq]'"
    ) from exc

from . import _job_limits
from ._job_limits import JobLimit, jittered, job_limit
from .errors import InvalidInputError, WaitTimeout
from .limiter import OnUnavailable, Strategy, check_on_unavailable
from .store import Store

__all__ = [
    "ACTOR_OPTIONS",
    "DEFAULT_MAX_WAIT",
    "FIRST_REFUSED_OPTION",
    "DecisionFailed",
    "InvalidActorOptions",
    "MaxWaitExceeded",
    "RateLimit",
]

log = logging.getLogger(__name__)

DEFAULT_MAX_WAIT: float = _job_limits.DEFAULT_MAX_WAIT
"""Seconds of refusals after which a message fails with [`MaxWaitExceeded`][redcount.dramatiq.MaxWaitExceeded]."""
FIRST_REFUSED_OPTION = "redcount_first_refused"
"""The message option holding the epoch time of a message's first refusal."""
ACTOR_OPTIONS = frozenset({"limit", "limit_key", "limit_strategy", "max_wait", "on_unavailable"})
"""The actor options [`RateLimit`][redcount.dramatiq.RateLimit] adds to the broker."""


class MaxWaitExceeded(WaitTimeout, SkipMessage):
    """A message was refused for longer than its ``max_wait``: it fails (Dramatiq rejects it
    to the dead-letter queue) without running, and with the ``Results`` middleware
    ``message.get_result()`` raises ``ResultFailure`` whose ``orig_exc_type`` is
    ``"MaxWaitExceeded"`` and whose message says why. A [`WaitTimeout`][redcount.errors.WaitTimeout] (so a
    [`RedcountError`][redcount.errors.RedcountError]), and a ``SkipMessage``: what the middleware raises to skip the
    actor. ``key``, ``limit``, ``waited`` (seconds since the first refusal), ``retry_after``
    and ``max_wait`` as there."""

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
        WaitTimeout.__init__(self, message, key, limit, waited=waited, retry_after=retry_after, max_wait=max_wait)
        self.message = message  # what DramatiqError's own __init__ sets

    def __str__(self) -> str:
        return str(self.message)


class InvalidActorOptions(InvalidInputError, MiddlewareError):
    """An actor's ``limit`` options are wrong: raised when the actor is declared, naming the
    actor and the option. An [`InvalidInputError`][redcount.errors.InvalidInputError], and a Dramatiq
    ``MiddlewareError`` (the only kind Dramatiq lets out of a middleware's hook)."""


class DecisionFailed(MiddlewareError):
    """The limit could not be asked before a message ran: the store's error under
    ``on_unavailable="raise"``, or an error of the actor's ``limit_key`` (the cause, as
    ``__cause__``). The delivery fails without running, and Dramatiq's ``Retries``
    middleware handles it as any error of the actor (a Dramatiq ``MiddlewareError``: other
    errors in a middleware's hook are logged and ignored, which would run the actor
    unlimited)."""


class RateLimit(Middleware):
    """Decides every start of an actor that has a ``limit`` option on the shared store.

    ``store``: a URL (each worker process connects once, on its first decision) or a
    [`Store`][redcount.store.Store]. ``prefix``: the limiters' key prefix; ``clock``: their clock (``"server"``
    for hosts whose clocks may disagree). ``strategy``, ``max_wait`` and ``on_unavailable``:
    the defaults of the actor options of the same names.

    Actor options (``@dramatiq.actor(limit="10/second", ...)``; the middleware must be on the
    broker before the actors are declared, as for any middleware's options):

    - ``limit``: ``"100/minute"``, ``"5/second;100/hour"`` (all must hold) or a
      [`LimitSet`][redcount.limiter.LimitSet]: starts allowed per window. Actors without it are not limited.
    - ``limit_key``: ``callable(args, kwargs) -> str``: what the limit counts; the default is
      the actor's name. Actors returning the same key under the same limit share one count.
    - ``limit_strategy``: a [`Limiter`][redcount.limiter.Limiter] strategy but ``"concurrency"`` (default
      ``"sliding-window"``, the exact log).
    - ``max_wait``: seconds of refusals, from the first, after which the message fails with
      [`MaxWaitExceeded`][redcount.dramatiq.MaxWaitExceeded] (None: no end; default one hour).
    - ``on_unavailable``: when the store cannot decide: ``"deny"`` (enqueued again in 1 s,
      within ``max_wait``), ``"allow"`` (run, unlimited) or ``"raise"`` (the store's error
      fails this delivery, and Dramatiq's ``Retries`` middleware handles it as any error).

    A bad option fails when the actor is declared ([`InvalidActorOptions`][redcount.dramatiq.InvalidActorOptions]), naming the
    actor and the option."""

    def __init__(
        self,
        store: str | Store,
        *,
        prefix: str = "redcount:dramatiq",
        clock: str = "client",
        strategy: Strategy = "sliding-window",
        max_wait: float | None = DEFAULT_MAX_WAIT,
        on_unavailable: OnUnavailable = "deny",
    ) -> None:
        if not isinstance(store, (str, Store)):
            raise TypeError(f"store must be a URL like 'redis://cache:6379/0' or a redcount.Store, got {store!r}")
        self.store = store
        self.prefix = prefix
        self.clock = clock
        self.strategy = strategy
        self.max_wait = max_wait
        self.on_unavailable = check_on_unavailable(on_unavailable)
        # Checks the defaults as a job would, so that a bad one fails here.
        job_limit("RateLimit", "1/second", strategy=strategy, max_wait=max_wait, prefix=prefix, clock=clock)
        self._limits: dict[str, JobLimit | None] = {}
        self._lock = threading.Lock()

    @property
    def actor_options(self) -> set[str]:
        return set(ACTOR_OPTIONS)

    def _limit_for(self, actor: Any) -> JobLimit | None:
        options = actor.options
        if options.get("limit") is None:
            for opt in ACTOR_OPTIONS - {"limit"}:
                if opt in options:
                    raise InvalidInputError(f"job {actor.actor_name}: {opt}= needs limit= as well")
            return None
        return job_limit(
            actor.actor_name,
            options["limit"],
            limit_key=options.get("limit_key"),
            strategy=options.get("limit_strategy", self.strategy),
            max_wait=options.get("max_wait", self.max_wait),
            on_unavailable=options.get("on_unavailable", self.on_unavailable),
            store=self.store,
            prefix=self.prefix,
            clock=self.clock,
        )

    def before_declare_actor(self, broker: dramatiq.Broker, actor: Any) -> None:
        try:
            limit = self._limit_for(actor)
        except (InvalidInputError, TypeError) as e:  # a bad option fails the declaration
            raise InvalidActorOptions(str(e)) from e
        with self._lock:
            self._limits[actor.actor_name] = limit

    def limit_of(self, broker: dramatiq.Broker, actor_name: str) -> JobLimit | None:
        """The checked limit of an actor (None: not limited)."""
        try:
            return self._limits[actor_name]
        except KeyError:
            limit = self._limit_for(broker.get_actor(actor_name))
            with self._lock:
                self._limits[actor_name] = limit
            return limit

    def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
        jl = self.limit_of(broker, message.actor_name)
        if jl is None:
            return
        try:
            key = jl.key_for(tuple(message.args), dict(message.kwargs))
            verdict = jl.decide(key)
        except Exception as e:
            raise DecisionFailed(
                f"message {jl.name}[{message.message_id}] not run: its limit could not be asked: {e!r}"
            ) from e
        if verdict.allowed:
            return
        now = time.time()
        first = _first_refused(message.options)
        if first is None:
            first = now
        countdown = jittered(verdict.retry_after)
        if jl.past_max_wait(first, now, countdown):
            text = jl.max_wait_message(f"message {jl.name}[{message.message_id}]", key, first, now, verdict)
            log.warning("%s", text)
            message.fail()  # rejected (dead-letter queue); with Results, stored as this error
            raise MaxWaitExceeded(
                text, key, verdict.amount, waited=now - first, retry_after=verdict.retry_after,
                max_wait=float(jl.max_wait or 0),
            )  # fmt: skip
        # The same message (id, arguments, options, retries) on the broker's delay queue.
        broker.enqueue(message.copy(options={FIRST_REFUSED_OPTION: first}), delay=math.ceil(countdown * 1000))
        # Results stores None for a skipped message that did not fail: not for this
        # delivery, whose result the re-enqueued message will give.
        message.options["store_results"] = False
        raise SkipMessage(f"{verdict.why} on key {key!r}; enqueued again in {countdown:.3f} s")


def _first_refused(options: dict[str, Any]) -> float | None:
    value = options.get(FIRST_REFUSED_OPTION)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None
