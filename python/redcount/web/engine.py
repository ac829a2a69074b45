"""Deciding one request: run its checks against a [`Limiter`][redcount.limiter.Limiter] (sync) or a
[`redcount.aio.Limiter`][redcount.aio.Limiter] (async) under a failure policy, and report to the metrics.

```python
policy = FailurePolicy("open")
verdict = decide(limiter, checks, policy)              # sync frameworks (Flask)
verdict = await decide_async(alimiter, checks, policy) # asyncio (FastAPI, Starlette)
if not verdict.allowed: ...                            # 429, or 503 when closed and down
```

A request's checks are decided together, in one round trip and all-or-nothing
([`redcount.Limiter.hit_all`][redcount.limiter.Limiter.hit_all]): a request refused by one limit is charged against none
of them. Checks that cannot go together are decided one by one, in order, stopping at the
first refusal (a request refused by one is then charged against those before it): shadow
checks (they count and report, never refuse, so they never join an all-or-nothing
decision), checks of different costs, two checks of one key with the same window, the
concurrency strategy, and everything when [`BATCH_CHECKS`][redcount.web.engine.BATCH_CHECKS] is False. Within one check,
a multi-limit string (``"5/second;100/hour"``) is all-or-nothing, as in the core.

A request's checks share one latency budget ([`DEFAULT_BUDGET`][redcount.web.engine.DEFAULT_BUDGET], 100 ms, unless the
integration is given another): once it is spent, or once the store has failed for this
request, the checks left are decided by the failure policy without asking the store, so a
frozen or unreachable Redis costs a request at most about one budget, never a store's
``command_timeout`` per check. The async engine cancels a call still waiting when the budget
runs out; a sync call cannot be interrupted, so there the store's own ``budget`` bounds a
single call (the integrations give the store they build the same budget).
"""

from __future__ import annotations

import asyncio
import logging
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from .._core import Decision
from ..errors import AuthenticationError, InvalidInputError, Unavailable
from ..errors import ConnectionError as StoreConnectionError
from ..limiter import UNAVAILABLE_RETRY_AFTER, OnUnavailable
from ..policies import Screen, denied_decision
from .spec import Check, Policy

if TYPE_CHECKING:
    from .. import aio
    from .._core import Store
    from ..limiter import Limiter

__all__ = [
    "BATCH_CHECKS",
    "DEFAULT_BUDGET",
    "FailurePolicy",
    "MetricsSink",
    "Outcome",
    "StoreUnavailable",
    "Verdict",
    "check_budget",
    "check_store",
    "decide",
    "decide_async",
]

log = logging.getLogger("redcount.web")

FailMode = Literal["open", "closed"]

DEFAULT_BUDGET = 0.1
"""Seconds all the checks of one request may take together, unless configured otherwise."""

BATCH_CHECKS = True
"""Decide a request's checks together, in one round trip (see the module's docstring).
False decides them one by one, one round trip each (``redcount bench web`` measures both)."""

# What the failure policy covers: the store could not be reached or answered too late
# (ConnectionError and its TimeoutError, Unavailable, StoreClosed), or refused us our
# credentials (a wrong or rotated password: every call would fail the same way, so it is a
# store failure, not a bug in the request).
STORE_FAILURES = (StoreConnectionError, AuthenticationError)


def check_budget(value: object, where: str) -> float | None:
    """A request budget in seconds, or None (no budget) for None or 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value or value < 0:
        raise InvalidInputError(f"{where} must be a number of seconds >= 0 (0 or None: no budget), got {value!r}")
    return float(value) if value > 0 else None


def check_store(store: Store) -> None:
    """The integrations' start-up check (``check_on_start``): one PING, so that a wrong or
    rotated password or an unreachable Redis stops the app from starting, with the store's
    own error ([`AuthenticationError`][redcount.errors.AuthenticationError], [`ConnectionError`][redcount.errors.ConnectionError]),
    instead of showing up on the first limited request."""
    try:
        store.ping()
    except STORE_FAILURES as e:
        log.error("redcount: the rate-limit store %s failed the start-up check: %s: %s", store.url, type(e).__name__, e)
        raise


def _over_budget(budget: float) -> Unavailable:
    return Unavailable(f"the rate-limit store did not decide within the request's budget of {budget * 1000:.0f} ms")


class StoreUnavailable(Exception):
    """The store could not decide and the failure policy is ``"closed"``: refuse (503)."""


class MetricsSink(Protocol):
    """What the engine reports to (see [`redcount.web.metrics.PrometheusMetrics`][redcount.web.metrics.PrometheusMetrics])."""

    def decision(self, check: Check, decision: Decision, shadow: bool, seconds: float) -> None: ...
    def store_error(self, check: Check, policy: str) -> None:
        """The store failed on ``check``; ``policy`` is ``"open"`` or ``"closed"``."""


class FailurePolicy:
    """What a store failure means for a request: ``"open"`` lets it through without
    rate-limit headers, ``"closed"`` refuses it with 503.

    Built on the core's policy ([`redcount.Limiter`][redcount.limiter.Limiter]'s ``on_unavailable``): ``"open"`` is
    ``on_unavailable="allow"``, ``"closed"`` is ``"deny"``. A store failure
    ([`redcount.ConnectionError`][redcount.errors.ConnectionError]: [`redcount.Unavailable`][redcount.errors.Unavailable] from a store with a
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
            what = f"{type(error).__name__}: {error}" if isinstance(error, BaseException) else error
            log.error("redcount: the rate-limit store failed (%s); failing %s until it is back", what, self.mode)

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
        [`StoreUnavailable`][redcount.web.engine.StoreUnavailable] when it failed and the policy is closed."""
        try:
            d = call()
        except STORE_FAILURES as e:
            return self._settle(self._without_store(), e)
        return self._settle(d)

    async def arun(self, call: Callable[[], Awaitable[Decision]]) -> Decision | None:
        """The async twin of [`run`][redcount.web.engine.FailurePolicy.run]."""
        try:
            d = await call()
        except STORE_FAILURES as e:
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
    # The request's deadline (time.monotonic()), shared by every decide() of the request;
    # None without a budget.
    deadline: float | None = None
    # The store failed (or the budget ran out) for this request: later checks of the same
    # request are decided by the failure policy without asking the store again.
    store_failed: bool = False

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
        self.store_failed = self.store_failed or other.store_failed


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
    own: Decision | None = None,
) -> bool:
    """Add one check's decision (or failure) to the verdict under the failure policy; False
    when the request is refused (and checking should stop). Shared by [`decide`][redcount.web.engine.decide] and
    [`decide_async`][redcount.web.engine.decide_async], and kept free of per-call closures: it runs for every request.
    ``own``: what the metrics record for this check of a joint decision (its own limit and
    remaining), when it differs from ``d``."""
    shadow = verdict.shadow_all or check.spec.shadow
    if d.unavailable:
        verdict.store_failed = True
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
        metrics.decision(check, d if own is None else own, shadow, time.perf_counter() - started)
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


def _together(limiter: Limiter | aio.Limiter, strategy: str, checks: Sequence[Check], verdict: Verdict) -> bool:
    """Whether ``checks`` can be decided in one all-or-nothing call (see the module's docstring)."""
    if len(checks) < 2 or not BATCH_CHECKS or verdict.shadow_all or verdict.store_failed or strategy == "concurrency":
        return False
    cost = checks[0].cost
    for c in checks:
        if c.spec.shadow or c.cost != cost or c.spec.lease is not None:
            return False
    if len({c.key for c in checks}) == len(checks):
        return True  # (two limits of one check with one window are refused either way)
    seen: set[tuple[str, float]] = set()
    for c in checks:
        for lim in c.limits.limits:
            k = (c.key, lim.window)
            if k in seen:
                return False
            seen.add(k)
    return True


def _binding_check(checks: Sequence[Check], d: Decision) -> int:
    """The index of the check the decision of a joint call speaks for (its ``bound_by``)."""
    bound = d.bound_by
    if bound is not None:
        text, key = bound
        found = [i for i, c in enumerate(checks) if c.key == key]
        if len(found) == 1:
            return found[0]
        for i in found:
            if any(str(lim) == text for lim in checks[i].limits.limits):
                return i
    return 0


def _settle_together(
    verdict: Verdict,
    checks: Sequence[Check],
    d: Decision,
    error: BaseException | None,
    policy: FailurePolicy,
    metrics: MetricsSink | None,
    started: float,
) -> None:
    """Add a joint decision of ``checks`` to the verdict: a refusal is the refusing check's
    (no other check was charged); an allowed request lists every check, the binding one
    first (the headers speak for it); a decision without the store is settled per check."""
    if d.unavailable:
        for c in checks:
            if not _settle(verdict, c, d, error, policy, metrics, started):
                return
        return
    first = _binding_check(checks, d)
    if _settle(verdict, checks[first], d, None, policy, metrics, started):
        # Allowed: one metrics record per check, each with its own limit and remaining (as
        # deciding the checks one by one records them), not the binding check's.
        parts = d.per_key if metrics is not None else None
        for i, c in enumerate(checks):
            if i != first:
                own = None
                if parts is not None and i < len(parts):
                    own = Decision._local(True, parts[i][0], parts[i][1], d.reset_after, 0.0)
                _settle(verdict, c, d, None, policy, metrics, started, own)


def _start(checks: Sequence[Check], shadow_all: bool, budget: float | None, after: Verdict | None) -> Verdict:
    """A verdict for ``checks`` that continues ``after`` (the same request's earlier checks:
    its deadline and whether the store already failed carry over)."""
    verdict = Verdict(list(checks), shadow_all)
    if after is not None:
        verdict.deadline, verdict.store_failed = after.deadline, after.store_failed
    elif budget is not None:
        verdict.deadline = time.monotonic() + budget
    return verdict


def _screen(
    screen: Screen, checks: Sequence[Check], verdict: Verdict, policy: FailurePolicy, metrics: MetricsSink | None
) -> Sequence[Check] | None:
    """The checks still to ask the store about: allow-listed ones are left out (not
    counted); a deny-listed check, or one the refusal cache holds, refuses the request
    (None) before any round trip. The lists match a check's identity (its key's last part:
    the client address by default, or what the key function returned)."""
    access, cache = screen.access, screen.cache
    rest: list[Check] = []
    for c in checks:
        if c.spec.shadow:
            rest.append(c)
            continue
        d = None
        if access is not None:
            listed = access.lookup(c.key.rpartition("|")[2])
            if listed:
                continue
            if listed is False:
                d = denied_decision(c.limits)
        if d is None and cache is not None:
            d = cache.get(c.limits, c.key, c.cost)
        if d is not None:
            _settle(verdict, c, d, None, policy, metrics, time.perf_counter() if metrics is not None else 0.0)
            return None
        rest.append(c)
    return rest


def _remember(screen: Screen, verdict: Verdict) -> None:
    """Put the store's refusal of this request in the refusal cache."""
    if screen.cache is not None and not verdict.allowed:
        o = verdict.refusal
        if o is not None and not o.decision.unavailable:
            screen.cache.put(o.check.limits, o.check.key, o.check.cost, o.decision)


def decide(
    limiter: Limiter,
    checks: Sequence[Check],
    policy: FailurePolicy,
    metrics: MetricsSink | None = None,
    *,
    shadow_all: bool = False,
    budget: float | None = None,
    after: Verdict | None = None,
    charge: bool = True,
    screen: Screen | None = None,
) -> Verdict:
    """Decide ``checks`` in order with a sync limiter (blocks the calling thread).

    ``budget``: seconds all the checks may take together (see the module's docstring); a
    check not started before it is spent is decided by the policy without the store.
    ``after``: the verdict of this request's earlier checks, whose deadline this continues.
    ``charge``: False decides with [`test`][redcount.limiter.Limiter.test] (nothing is charged), for
    limits that charge by outcome once the response is known.
    ``screen``: allow and deny lists and a refusal cache, applied before any round trip.
    """
    verdict = _start(checks, shadow_all, budget, after)
    if screen is not None and not shadow_all:
        screened = _screen(screen, checks, verdict, policy, metrics)
        if screened is None:
            return verdict
        verdict = decide(limiter, screened, policy, metrics, budget=budget, after=after, charge=charge)
        verdict.planned = list(checks)
        _remember(screen, verdict)
        return verdict
    deadline = verdict.deadline
    if _together(limiter, limiter.strategy, checks, verdict) and (deadline is None or time.monotonic() < deadline):
        started = time.perf_counter() if metrics is not None else 0.0
        error: BaseException | None = None
        all_of = limiter.hit_all if charge else limiter.test_all
        try:
            d = all_of([(c.limits, c.key) for c in checks], checks[0].cost)
        except STORE_FAILURES as e:
            d, error = policy._without_store(), e
        _settle_together(verdict, checks, d, error, policy, metrics, started)
        return verdict
    hit = limiter.hit if charge else limiter.test
    for c in checks:
        started = time.perf_counter() if metrics is not None else 0.0
        error = None
        if verdict.store_failed:
            d, error = policy._without_store(), None
        elif deadline is not None and time.monotonic() >= deadline:
            d, error = policy._without_store(), _over_budget(budget or 0.0)
        else:
            try:
                lease = c.spec.lease if charge else None
                if lease is None:
                    d = hit(c.limits, c.key, c.cost)
                else:
                    d = limiter.hit(c.limits, c.key, c.cost, lease=lease)
            except STORE_FAILURES as e:
                d, error = policy._without_store(), e
        if not _settle(verdict, c, d, error, policy, metrics, started):
            break
    return verdict


if sys.version_info >= (3, 11):

    async def _within(call: Awaitable[Decision], seconds: float) -> Decision:
        async with asyncio.timeout(seconds):
            return await call

else:  # pragma: no cover - Python < 3.11

    async def _within(call: Awaitable[Decision], seconds: float) -> Decision:
        return await asyncio.wait_for(call, seconds)


async def decide_async(
    limiter: aio.Limiter,
    checks: Sequence[Check],
    policy: FailurePolicy,
    metrics: MetricsSink | None = None,
    *,
    shadow_all: bool = False,
    budget: float | None = None,
    after: Verdict | None = None,
    charge: bool = True,
    screen: Screen | None = None,
) -> Verdict:
    """Decide ``checks`` in order with an async limiter: the event loop never waits on the
    store (see [`redcount.aio`][redcount.aio]). ``budget``, ``after`` and ``charge`` as in
    [`decide`][redcount.web.engine.decide]; here a call still waiting when the budget runs out is cancelled (its
    reply, if one comes, is discarded) and decided by the policy."""
    verdict = _start(checks, shadow_all, budget, after)
    if screen is not None and not shadow_all:
        screened = _screen(screen, checks, verdict, policy, metrics)
        if screened is None:
            return verdict
        verdict = await decide_async(limiter, screened, policy, metrics, budget=budget, after=after, charge=charge)
        verdict.planned = list(checks)
        _remember(screen, verdict)
        return verdict
    deadline = verdict.deadline
    if _together(limiter, limiter.sync.strategy, checks, verdict):
        started = time.perf_counter() if metrics is not None else 0.0
        error: BaseException | None = None
        all_of = limiter.hit_all if charge else limiter.test_all
        items = [(c.limits, c.key) for c in checks]
        try:
            if deadline is None:
                d = await all_of(items, checks[0].cost)
            else:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise _over_budget(budget or 0.0)
                d = await _within(all_of(items, checks[0].cost), left)
        except STORE_FAILURES as e:
            d, error = policy._without_store(), e
        except asyncio.TimeoutError:  # the budget ran out while the call waited
            d, error = policy._without_store(), _over_budget(budget or 0.0)
        _settle_together(verdict, checks, d, error, policy, metrics, started)
        return verdict
    hit = limiter.hit if charge else limiter.test
    for c in checks:
        started = time.perf_counter() if metrics is not None else 0.0
        error = None
        if verdict.store_failed:
            d = policy._without_store()
        else:
            try:
                lease = c.spec.lease if charge else None
                if deadline is None:
                    if lease is None:
                        d = await hit(c.limits, c.key, c.cost)
                    else:
                        d = await limiter.hit(c.limits, c.key, c.cost, lease=lease)
                else:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise _over_budget(budget or 0.0)
                    if lease is None:
                        d = await _within(hit(c.limits, c.key, c.cost), left)
                    else:
                        d = await _within(limiter.hit(c.limits, c.key, c.cost, lease=lease), left)
            except STORE_FAILURES as e:
                d, error = policy._without_store(), e
            except asyncio.TimeoutError:  # the budget ran out while the call waited
                d, error = policy._without_store(), _over_budget(budget or 0.0)
        if not _settle(verdict, c, d, error, policy, metrics, started):
            break
    return verdict
