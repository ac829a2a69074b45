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

The latency budget ([`DEFAULT_BUDGET`][redcount.web.engine.DEFAULT_BUDGET], 100 ms, unless the integration is given
another) bounds each wait for the store, never the request's wall-clock time: a check waits
for Redis at most about one budget, a reply that has arrived is used however long the
process took to get to it (a CPU-starved machine, a stopped worker), and the app's own work
between two checks (the middleware's, then the route's) spends none of it. Once a wait has
run out, or the store has failed for this request, the request's remaining checks are
decided by the failure policy without asking the store, so a frozen or unreachable Redis
costs a request about one budget, never a store's ``command_timeout`` per check.

A sync call is bounded by the store's own ``budget`` (the integrations give the store they
build the same one); the async engine awaits the store's own deadline when the store has a
budget no longer than the request's, else cuts the wait itself after the budget (taking the
reply when it completed meanwhile).

A request decided without the store is *undecided*: `Verdict.undecided` says why
([`UNDECIDED_REASONS`][redcount.web.engine.UNDECIDED_REASONS]), the integrations send it as the ``RateLimit-Undecided`` response
header, and the metrics count it (``redcount_undecided_total``, and
[`redcount.telemetry.snapshot`][redcount.telemetry.snapshot]'s ``undecided_requests``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol

from .._core import Decision
from .. import telemetry
from .. import _enforcement
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
    "UNDECIDED_REASONS",
    "Verdict",
    "check_budget",
    "check_store",
    "decide",
    "decide_async",
]

log = logging.getLogger("redcount.web")

FailMode = Literal["open", "closed"]

DEFAULT_BUDGET = 0.1
"""Seconds one check may wait for the store, unless configured otherwise."""

UNDECIDED_REASONS = ("timeout", "breaker-open", "unavailable")
"""Why a request was decided without the store (`Verdict.undecided`, the
``RateLimit-Undecided`` header): ``timeout``, a request was sent and no reply came within the
budget; ``breaker-open``, the store's circuit breaker was open, so nothing was asked;
``unavailable``, anything else that kept the store from deciding (refused or lost
connection, refused credentials, a closed store, or the limiter's own ``on_unavailable``)."""

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


class _OverBudget(Unavailable):
    """An async call the engine cut short at the budget."""


def _over_budget(budget: float) -> Unavailable:
    return _OverBudget(f"the rate-limit store did not answer within the budget of {budget * 1000:.0f} ms")


def undecided_reason(error: BaseException | None, store: object | None) -> str:
    """Which of [`UNDECIDED_REASONS`][redcount.web.engine.UNDECIDED_REASONS] a decision made without the store gets."""
    if isinstance(error, (TimeoutError, _OverBudget)):
        return "timeout"
    if isinstance(error, Unavailable) and error.maybe_applied:
        return "timeout"  # sent, and no reply in time (the budget's Unavailable keeps that)
    if store is not None and getattr(store, "breaker_open", False):
        return "breaker-open"  # (this call's own timeout may have opened it: checked first)
    return "unavailable"


class StoreUnavailable(Exception):
    """The store could not decide and the failure policy is ``"closed"``: refuse (503)."""


class MetricsSink(Protocol):
    """What the engine reports to (see [`redcount.web.metrics.PrometheusMetrics`][redcount.web.metrics.PrometheusMetrics])."""

    def decision(self, check: Check, decision: Decision, shadow: bool, seconds: float) -> None: ...
    def store_error(self, check: Check, policy: str) -> None:
        """The store failed on ``check``; ``policy`` is ``"open"`` or ``"closed"``."""

    # Optional: ``undecided(reason)``, once per request decided without the store (one of
    # UNDECIDED_REASONS); called when the sink has it.


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
    # The store failed (or a wait ran out of the budget) for this request: later checks of
    # the same request are decided by the failure policy without asking the store again.
    store_failed: bool = False
    # Why some check of this request was decided without the store (one of
    # UNDECIDED_REASONS; the first one), else None. Sent as the RateLimit-Undecided header.
    undecided: str | None = None

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
        if self.undecided is None:
            self.undecided = other.undecided


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
    store: object | None = None,
) -> bool:
    """Add one check's decision (or failure) to the verdict under the failure policy; False
    when the request is refused (and checking should stop). Shared by [`decide`][redcount.web.engine.decide] and
    [`decide_async`][redcount.web.engine.decide_async], and kept free of per-call closures: it runs for every request.
    ``own``: what the metrics record for this check of a joint decision (its own limit and
    remaining), when it differs from ``d``. ``store``: the limiter's store, asked whether
    its breaker is open when the decision was made without it."""
    shadow = verdict.shadow_all or check.spec.shadow
    if d.unavailable:
        verdict.store_failed = True
        if verdict.undecided is None:
            verdict.undecided = undecided_reason(error, store)
            if metrics is not None:
                note = getattr(metrics, "undecided", None)
                if note is not None:
                    note(verdict.undecided)
            telemetry.note_undecided(verdict.undecided)
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
    store: object | None = None,
) -> None:
    """Add a joint decision of ``checks`` to the verdict: a refusal is the refusing check's
    (no other check was charged); an allowed request lists every check, the binding one
    first (the headers speak for it); a decision without the store is settled per check."""
    if d.unavailable:
        for c in checks:
            if not _settle(verdict, c, d, error, policy, metrics, started, None, store):
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


def _start(checks: Sequence[Check], shadow_all: bool, after: Verdict | None) -> Verdict:
    """A verdict for ``checks`` that continues ``after`` (the same request's earlier checks:
    whether the store already failed for it carries over, and why)."""
    verdict = Verdict(list(checks), shadow_all)
    if after is not None:
        verdict.store_failed, verdict.undecided = after.store_failed, after.undecided
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

    ``budget``: seconds one check may wait for the store (see the module's docstring). A
    sync call cannot be cut short from here: the store's own ``budget`` bounds it, so this
    one only says what the request was promised. ``after``: the verdict of this request's
    earlier checks (once the store failed for it, the checks left skip the store).
    ``charge``: False decides with [`test`][redcount.limiter.Limiter.test] (nothing is charged), for
    limits that charge by outcome once the response is known.
    ``screen``: allow and deny lists and a refusal cache, applied before any round trip.
    """
    metrics = telemetry.web_sink(metrics)  # and OpenTelemetry's, once enabled
    verdict = _start(checks, shadow_all, after)
    if _enforcement.suspended:  # redcount.testing.disable_limits(): admitted, nothing counted
        return verdict
    if screen is not None and not shadow_all:
        screened = _screen(screen, checks, verdict, policy, metrics)
        if screened is None:
            return verdict
        verdict = decide(limiter, screened, policy, metrics, budget=budget, after=after, charge=charge)
        verdict.planned = list(checks)
        _remember(screen, verdict)
        return verdict
    store = limiter.store
    if _together(limiter, limiter.strategy, checks, verdict):
        started = time.perf_counter() if metrics is not None else 0.0
        error: BaseException | None = None
        all_of = limiter.hit_all if charge else limiter.test_all
        try:
            d = all_of([(c.limits, c.key) for c in checks], checks[0].cost)
        except STORE_FAILURES as e:
            d, error = policy._without_store(), e
        _settle_together(verdict, checks, d, error, policy, metrics, started, store)
        return verdict
    hit = limiter.hit if charge else limiter.test
    for c in checks:
        started = time.perf_counter() if metrics is not None else 0.0
        error = None
        if verdict.store_failed:
            d, error = policy._without_store(), None
        else:
            try:
                lease = c.spec.lease if charge else None
                if lease is None:
                    d = hit(c.limits, c.key, c.cost)
                else:
                    d = limiter.hit(c.limits, c.key, c.cost, lease=lease)
            except STORE_FAILURES as e:
                d, error = policy._without_store(), e
        if not _settle(verdict, c, d, error, policy, metrics, started, None, store):
            break
    return verdict


def _store_bounds(store: Store, budget: float | None) -> bool:
    """Whether the store's own deadline already ends a wait within ``budget``: then the
    async engine awaits it (the store reads the socket once more at its deadline, so a reply
    that arrived while the process was not running is used) instead of racing it with a
    timer of its own."""
    own = getattr(store, "budget", None)
    return budget is None or (isinstance(own, float) and own <= budget + 1e-9)


async def _within(call: Awaitable[Decision], seconds: float) -> Decision:
    """``await call``, cut short after ``seconds``; a call that completed meanwhile (its
    reply arrived while the loop was not running) is used, not thrown away."""
    task = asyncio.ensure_future(call)
    try:
        # The budget starts once the call is on its way: one turn of the loop lets the task
        # submit it, so time the loop spent on other work before that is not counted.
        await asyncio.sleep(0)
        await asyncio.wait((task,), timeout=seconds)
        if not task.done():
            # Completions the store has handed to the loop but the loop has not run yet.
            await asyncio.sleep(0)
    except BaseException:
        task.cancel()
        raise
    if not task.done():
        task.cancel()
        raise asyncio.TimeoutError
    return task.result()


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
    [`decide`][redcount.web.engine.decide]; here a call is bounded by the store's own deadline when the store's
    budget is no longer than ``budget``, else cut short after ``budget`` (its reply, if one
    comes later, is discarded) and decided by the policy."""
    metrics = telemetry.web_sink(metrics)  # and OpenTelemetry's, once enabled
    verdict = _start(checks, shadow_all, after)
    if _enforcement.suspended:  # redcount.testing.disable_limits(): admitted, nothing counted
        return verdict
    if screen is not None and not shadow_all:
        screened = _screen(screen, checks, verdict, policy, metrics)
        if screened is None:
            return verdict
        verdict = await decide_async(limiter, screened, policy, metrics, budget=budget, after=after, charge=charge)
        verdict.planned = list(checks)
        _remember(screen, verdict)
        return verdict
    store = limiter.sync.store
    cut = None if _store_bounds(store, budget) else budget
    if _together(limiter, limiter.sync.strategy, checks, verdict):
        started = time.perf_counter() if metrics is not None else 0.0
        error: BaseException | None = None
        all_of = limiter.hit_all if charge else limiter.test_all
        items = [(c.limits, c.key) for c in checks]
        try:
            if cut is None:
                d = await all_of(items, checks[0].cost)
            else:
                d = await _within(all_of(items, checks[0].cost), cut)
        except STORE_FAILURES as e:
            d, error = policy._without_store(), e
        except asyncio.TimeoutError:  # the budget ran out while the call waited
            error = _over_budget(cut or 0.0)
            d = policy._without_store()
        _settle_together(verdict, checks, d, error, policy, metrics, started, store)
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
                call = hit(c.limits, c.key, c.cost) if lease is None else limiter.hit(c.limits, c.key, c.cost, lease=lease)
                d = await call if cut is None else await _within(call, cut)
            except STORE_FAILURES as e:
                d, error = policy._without_store(), e
            except asyncio.TimeoutError:  # the budget ran out while the call waited
                d, error = policy._without_store(), _over_budget(cut or 0.0)
        if not _settle(verdict, c, d, error, policy, metrics, started, None, store):
            break
    return verdict
