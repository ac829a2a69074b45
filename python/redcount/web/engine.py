"""Deciding one request: run its checks against a :class:`~redcount.Limiter` (sync) or a
:class:`redcount.aio.Limiter` (async) under a failure policy, and report to the metrics.

::

    policy = FailurePolicy("open")
    verdict = decide(limiter, checks, policy)              # sync frameworks (Flask)
    verdict = await decide_async(alimiter, checks, policy) # asyncio (FastAPI, Starlette)
    if not verdict.allowed: ...                            # 429, or 503 when closed and down

Checks run in order and stop at the first refusal, so a request refused by one limit is not
charged against the limits after it (it has been charged against those before it: each
limit has its own key, so they cannot be decided in one round trip). Within one check, a
multi-limit string (``"5/second;100/hour"``) is all-or-nothing, as in the core.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from .._core import Decision
from ..errors import ConnectionError as StoreConnectionError
from ..errors import InvalidInputError
from ..limiter import UNAVAILABLE_RETRY_AFTER, OnUnavailable
from .spec import Check, Policy

if TYPE_CHECKING:
    from .. import aio
    from ..limiter import Limiter

__all__ = ["FailurePolicy", "MetricsSink", "Outcome", "StoreUnavailable", "Verdict", "decide", "decide_async"]

log = logging.getLogger("redcount.web")

FailMode = Literal["open", "closed"]


class StoreUnavailable(Exception):
    """The store could not decide and the failure policy is ``"closed"``: refuse (503)."""


class MetricsSink(Protocol):
    """What the engine reports to (see :class:`redcount.web.metrics.PrometheusMetrics`)."""

    def decision(self, check: Check, decision: Decision, shadow: bool, seconds: float) -> None: ...
    def store_error(self, check: Check, policy: str) -> None:
        """The store failed on ``check``; ``policy`` is ``"open"`` or ``"closed"``."""


class FailurePolicy:
    """What a store failure means for a request: ``"open"`` lets it through without
    rate-limit headers, ``"closed"`` refuses it with 503.

    Built on the core's policy (:class:`redcount.Limiter`'s ``on_unavailable``): ``"open"`` is
    ``on_unavailable="allow"``, ``"closed"`` is ``"deny"``. A store failure
    (:class:`redcount.ConnectionError`: :class:`redcount.Unavailable` from a store with a
    ``budget`` or an open circuit breaker, timeouts, a closed store) becomes the decision that
    policy makes, and a decision made without the store (``Decision.unavailable``, also from
    a limiter built with its own ``on_unavailable``, which then wins) is served as such: an
    allowing one lets the request through without headers, a denying one is a 503. The
    budget and the breaker themselves live in the store (``redcount.connect(url,
    budget=0.05, fallback="memory://")``), shared by every limiter on it. The transitions
    (store down, store back) are logged once each, not per request. Thread-safe.
    """

    def __init__(self, mode: FailMode = "open") -> None:
        if mode not in ("open", "closed"):
            raise InvalidInputError(f"fail must be 'open' or 'closed', got {mode!r}")
        self.mode: FailMode = mode
        self.on_unavailable: OnUnavailable = "allow" if mode == "open" else "deny"
        self._down = False
        self._lock = threading.Lock()

    @property
    def store_down(self) -> bool:
        """True between a store failure and the next success."""
        return self._down

    def _failed(self, error: BaseException | str) -> None:
        with self._lock:
            first, self._down = not self._down, True
        if first:
            log.error("redcount: the rate-limit store failed (%s); failing %s until it is back", error, self.mode)

    def _ok(self) -> None:
        if self._down:
            with self._lock:
                was, self._down = self._down, False
            if was:
                log.warning("redcount: the rate-limit store is back; limits are enforced again")

    def _without_store(self) -> Decision:
        return Decision._without_store(self.on_unavailable == "allow", UNAVAILABLE_RETRY_AFTER)

    def _settle(self, d: Decision, error: BaseException | None = None) -> Decision | None:
        if not d.unavailable:
            self._ok()
            return d
        self._failed(error if error is not None else "decided without the store by the limiter's on_unavailable")
        if d.allowed:
            return None
        raise StoreUnavailable(str(error) if error is not None else "the rate-limit store is unavailable") from error

    def run(self, call: Callable[[], Decision]) -> Decision | None:
        """The decision, or None when the store failed and the policy is open; raises
        :class:`StoreUnavailable` when it failed and the policy is closed."""
        try:
            d = call()
        except StoreConnectionError as e:
            return self._settle(self._without_store(), e)
        return self._settle(d)

    async def arun(self, call: Callable[[], Awaitable[Decision]]) -> Decision | None:
        """The async twin of :meth:`run`."""
        try:
            d = await call()
        except StoreConnectionError as e:
            return self._settle(self._without_store(), e)
        return self._settle(d)


@dataclass(slots=True)
class Outcome:
    """One decided check: the decision and the policy (of the check's limits) that bound it.
    Made per request (slotted: one is built on every decision)."""

    check: Check
    decision: Decision
    policy: Policy
    shadow: bool


@dataclass(slots=True)
class Verdict:
    """Everything decided for one request. ``planned`` are all the checks that applied (their
    policies are all advertised); ``outcomes`` those the store decided. Made per request and
    used by that request only (not thread-safe, and need not be)."""

    planned: list[Check]
    shadow_all: bool = False
    outcomes: list[Outcome] = field(default_factory=list)
    allowed: bool = True
    unavailable: bool = False

    def is_shadow(self, check: Check) -> bool:
        return self.shadow_all or check.spec.shadow

    @property
    def refusal(self) -> Outcome | None:
        """The outcome that refused the request, if one did."""
        for o in self.outcomes:
            if not o.decision.allowed and not o.shadow:
                return o
        return None

    def merge(self, other: Verdict) -> None:
        """Add another verdict's checks for the same request (a route limit after the
        app-wide one), so the headers speak for both."""
        self.planned.extend(other.planned)
        self.outcomes.extend(other.outcomes)
        self.allowed = self.allowed and other.allowed
        self.unavailable = self.unavailable or other.unavailable


def binding_policy(check: Check, d: Decision) -> Policy:
    """Which of a check's limits the decision speaks for: the core reports the binding
    limit's amount (a bucket's capacity); among limits with that amount, the shortest window
    that still covers ``reset_after``."""
    if len(check.policies) == 1:
        return check.policies[0]
    items = check.limits.limits
    matches = [i for i, lim in enumerate(items) if d.limit in (lim.amount, lim.burst)]
    if not matches:
        return check.policies[0]
    covering = [i for i in matches if items[i].window + 1e-3 >= d.reset_after]
    pick = min(covering, key=lambda i: items[i].window) if covering else max(matches, key=lambda i: items[i].window)
    return check.policies[pick]


def _settle(
    verdict: Verdict,
    check: Check,
    d: Decision,
    error: BaseException | None,
    policy: FailurePolicy,
    metrics: MetricsSink | None,
    started: float,
) -> bool:
    """Add one check's decision (or failure) to the verdict under the failure policy; False
    when the request is refused (and checking should stop). Shared by :func:`decide` and
    :func:`decide_async`, and kept free of per-call closures: it runs for every request."""
    shadow = verdict.shadow_all or check.spec.shadow
    if d.unavailable:
        try:
            settled = policy._settle(d, error)
        except StoreUnavailable:
            if shadow:  # a shadow check counts and reports; it never blocks
                if metrics is not None:
                    metrics.store_error(check, "open")
                return True
            if metrics is not None:
                metrics.store_error(check, "closed")
            verdict.allowed, verdict.unavailable = False, True
            return False
        if settled is None:
            if metrics is not None:
                metrics.store_error(check, "open")
            return True
    elif policy._down:
        policy._ok()
    if metrics is not None:
        metrics.decision(check, d, shadow, time.perf_counter() - started)
    policies = check.policies
    bound = policies[0] if len(policies) == 1 else binding_policy(check, d)
    verdict.outcomes.append(Outcome(check, d, bound, shadow))
    if d.allowed:
        return True
    if shadow:
        log.info("redcount shadow: would refuse %s on %s (retry after %.3f s)", check.key, check.spec.where, d.retry_after)
        return True
    verdict.allowed = False
    return False


def decide(
    limiter: Limiter,
    checks: Sequence[Check],
    policy: FailurePolicy,
    metrics: MetricsSink | None = None,
    *,
    shadow_all: bool = False,
) -> Verdict:
    """Decide ``checks`` in order with a sync limiter (blocks the calling thread)."""
    verdict = Verdict(list(checks), shadow_all)
    hit = limiter.hit
    for c in checks:
        started = time.perf_counter() if metrics is not None else 0.0
        error: BaseException | None = None
        try:
            d = hit(c.limits, c.key, c.cost)
        except StoreConnectionError as e:
            d, error = policy._without_store(), e
        if not _settle(verdict, c, d, error, policy, metrics, started):
            break
    return verdict


async def decide_async(
    limiter: aio.Limiter,
    checks: Sequence[Check],
    policy: FailurePolicy,
    metrics: MetricsSink | None = None,
    *,
    shadow_all: bool = False,
) -> Verdict:
    """Decide ``checks`` in order with an async limiter: the event loop never waits on the
    store (see :mod:`redcount.aio`)."""
    verdict = Verdict(list(checks), shadow_all)
    hit = limiter.hit
    for c in checks:
        started = time.perf_counter() if metrics is not None else 0.0
        error: BaseException | None = None
        try:
            d = await hit(c.limits, c.key, c.cost)
        except StoreConnectionError as e:
            d, error = policy._without_store(), e
        if not _settle(verdict, c, d, error, policy, metrics, started):
            break
    return verdict
