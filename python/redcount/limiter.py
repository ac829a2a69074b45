"""Rate limiting: [`Limiter`][redcount.limiter.Limiter] and its strategies."""

from __future__ import annotations

import atexit
from collections.abc import Awaitable, Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Literal

from . import _core
from ._core import Decision, Lease, LimitSet, LimitStats, Store
from ._calendar import calendar_arg
from ._wrap import bind_fast_paths
from .errors import ConnectionError as StoreConnectionError
from .errors import InvalidInputError, RateLimitExceeded, StoreClosed
from .policies import Entry, Penalty, access_entries, config_size, unblock_sync
from .reservations import Adjustment, Reservation, new_request_id
from .shaping import Throttle, check_wait_args, queue_name, shaper_of, wait_async, wait_sync

__all__ = [
    "Adjustment",
    "Decision",
    "Lease",
    "LimitSet",
    "LimitStats",
    "Limiter",
    "Reservation",
    "parse_limits",
    "strategies",
]

Item = tuple[str | LimitSet, str | bytes]
"""One part of a decision across several keys: (limit, key), e.g. ("100/minute", "user:42")."""

Strategy = Literal["fixed-window", "sliding-window", "sliding-window-approx", "token-bucket", "gcra", "concurrency"]
Clock = Literal["client", "server", "server-offset"]
OnUnavailable = Literal["raise", "allow", "deny"]

# A denial made without the store suggests this wait: the breaker probes Redis at least
# every half second, so a client retrying after it likely meets a decision again.
UNAVAILABLE_RETRY_AFTER = 1.0


def check_on_unavailable(value: object) -> OnUnavailable:
    """``value`` if it is a valid ``on_unavailable`` policy; else a clear error."""
    if value == "raise" or value == "allow" or value == "deny":
        return value
    raise InvalidInputError(f"on_unavailable must be 'raise', 'allow' or 'deny', got {value!r}")


def unavailable_decision(policy: OnUnavailable, error: BaseException) -> Decision:
    """What ``policy`` decides when the store failed with ``error``: re-raises it for
    ``"raise"`` (and always for [`StoreClosed`][redcount.errors.StoreClosed], a programming error, and
    anything that is not a [`ConnectionError`][redcount.errors.ConnectionError]); else a [`Decision`][redcount.limiter.Decision]
    with ``unavailable=True``, allowed or denied (``retry_after`` 1 s)."""
    if policy == "raise" or not isinstance(error, StoreConnectionError) or isinstance(error, StoreClosed):
        raise error
    return Decision._without_store(policy == "allow", UNAVAILABLE_RETRY_AFTER)


@atexit.register
def return_leases_at_exit() -> int:
    """Give every unit the leases of this process hold back to their stores; later leases
    take only their hit's cost. Runs at interpreter exit (the end of the main module,
    ``sys.exit``, an uncaught ``KeyboardInterrupt`` from SIGINT, and so the graceful shutdown
    and ``max_requests`` recycling of gunicorn and uvicorn workers, which exit through the
    interpreter); [`redcount.celery`][redcount.celery] calls it when a pool process ends, since those end
    with ``os._exit``. Returns how many went back; store errors are swallowed (those units
    expire with their windows). See docs/leased-limits.md."""
    try:
        return _core._return_all_leases(True)
    except Exception:  # noqa: BLE001 - the process is ending whatever the store says
        return 0


def refuse_lease_all(lease: object) -> None:
    """``hit_all(..., lease=N)`` raises [`InvalidInputError`][redcount.errors.InvalidInputError]: a lease is one
    (limit, key)'s units held by this process, decided apart from the store, so a call
    across several keys could not take from some leases and charge the others in one
    all-or-nothing step. Lease the hot key with [`Limiter.hit`][redcount.limiter.Limiter.hit] instead."""
    if lease is not None:
        raise InvalidInputError(
            "hit_all() takes no lease=: the leases of several keys are held apart from the store and "
            "cannot be charged together all or nothing; call hit(limit, key, lease=N) for the hot key"
        )


# Methods that go straight to the core object (see _wrap.py).
_FAST = ("hit", "test", "stats", "reset", "acquire", "release", "in_flight")


def slots_taken(max_in_flight: int, key: str | bytes) -> RateLimitExceeded:
    """What ``lease()`` (sync and async) raises when every slot of ``key`` is taken."""
    return RateLimitExceeded(
        f"all {max_in_flight} concurrency slots of {key!r} are in use; retry later", key, max_in_flight
    )


def parse_limits(text: str) -> LimitSet:
    """Parse a limit string such as ``"10/minute"``, ``"10 per minute"``, ``"100/5 minutes"``,
    ``"5/second;100/hour"`` (all must hold) or, for the bucket strategies,
    ``"10/second burst 50"``. Raises ``ValueError`` ([`InvalidInputError`][redcount.errors.InvalidInputError])
    naming the bad part."""
    return LimitSet(text)


def strategies() -> list[str]:
    """The strategy names [`Limiter`][redcount.limiter.Limiter] accepts."""
    return _core.limiter_strategies()


class Limiter:
    """Decides whether a key may do something, under one or more rate limits.

    ``limit`` arguments are strings like ``"10/minute"`` or ``"5/second;100/hour"`` (parsed
    once and cached) or a [`LimitSet`][redcount.limiter.LimitSet]. Several limits are decided in one round trip and
    all-or-nothing: a hit is charged against every limit or, when any limit refuses it,
    against none, so a denied hit stores nothing.

    Methods (implemented in C++): ``hit(limit, key, cost=1) -> Decision`` charges ``cost`` if
    every limit allows it; ``test(limit, key, cost=1)`` decides without charging;
    ``stats(limit, key) -> list[LimitStats]``; ``reset(limit, key)``; and for the
    concurrency strategy ``acquire(max_in_flight, key, *, lease_timeout=60.0) -> Lease | None``,
    ``release(lease) -> bool``, ``in_flight(key)`` and the [`lease`][redcount.limiter.Limiter.lease] context manager.
    [`refund`][redcount.limiter.Limiter.refund], [`reserve`][redcount.limiter.Limiter.reserve] and [`settle`][redcount.limiter.Limiter.settle] charge by what a request really cost
    (docs/refunds.md).

    Strategies (``strategy=``):

    - ``"fixed-window"``: clock-aligned windows; a burst straddling a boundary can get up to
      twice the limit through within one window length. O(1) per key.
    - ``"sliding-window"``: an exact sliding log; never more than the limit in any window
      length. A refused hit stores nothing, so a key holds at most ``amount`` entries however
      hard it is hammered. ``cost=n`` adds ``n`` entries. Amounts up to 1,000,000.
    - ``"sliding-window-approx"``: the weighted estimate of ``sub_buckets`` + 1 fixed
      sub-buckets (1 = the classic two-bucket estimate). O(k) per key; see docs/limiting.md for its
      documented error.
    - ``"token-bucket"``: a bucket of ``capacity`` tokens (the limit's ``burst``, by default its
      amount) refilled continuously at the limit's rate; ``"10/second burst 50"``.
    - ``"gcra"``: the generic cell rate algorithm, one timestamp per key; same parameters and
      decisions as the token bucket.
    - ``"concurrency"``: at most N in flight per key: [`acquire`][redcount.limiter.Limiter.acquire], [`release`][redcount.limiter.Limiter.release],
      [`lease`][redcount.limiter.Limiter.lease]. ``hit("N/period", key)`` takes a slot that frees itself after the period.

    ``clock``: ``"client"`` (default; this process's clock), ``"server"`` (Redis ``TIME``
    inside the scripts, immune to skew between app servers; falls back to
    ``"server-offset"`` where the server refuses ``TIME`` in scripts) or ``"server-offset"``
    (the client clock corrected by an offset measured with ``TIME`` every 10 s). The
    fixed-window strategy names its keys after the time, so it always uses the offset form
    for server time. [`clock`][redcount.limiter.Limiter.clock] tells which is in force.

    ``on_unavailable``: what [`hit`][redcount.limiter.Limiter.hit] and [`test`][redcount.limiter.Limiter.test] decide when the store cannot
    (a [`ConnectionError`][redcount.errors.ConnectionError]: [`Unavailable`][redcount.errors.Unavailable] from a store opened
    with a ``budget`` or while its circuit breaker is open, a timeout, a refused connection;
    never [`StoreClosed`][redcount.errors.StoreClosed], an error reply or bad input): ``"raise"`` (default)
    raises it; ``"allow"`` returns an allowing [`Decision`][redcount.limiter.Decision], ``"deny"`` a denying one
    (``retry_after`` 1 s), both with ``unavailable=True`` and ``limit == remaining == 0``. The
    other methods always raise.

    ``calendar``: an IANA time zone (``"Europe/Berlin"``, ``"UTC"``): the fixed-window
    strategy's windows are then calendar periods in that zone, so ``"10000/month"`` resets at
    local midnight on the first of the month (or on ``anchor_day``, 1..31: a billing period;
    in months shorter than ``anchor_day`` days it starts on their last day), ``"100/day"`` at
    local midnight (days of 23 or 25 hours on DST changes), ``"/week"`` on Mondays and
    ``"/year"`` on January 1. Each limit must be days, weeks, months or years; several
    (``"10/2 days"``, ``"1000/3 months"``, up to a century) are counted from a fixed epoch
    in the zone (1970-01-01, Monday 1969-12-29, January 1970, 1970), so ``"/3 months"``
    are the quarters. See docs/fixed-windows.md.

    ``allow`` and ``deny``: keys, IP addresses and CIDRs (IPv4 and IPv6) decided without the
    store: an allow-listed key is admitted (``remaining == limit``, nothing charged), a
    deny-listed key refused (``retry_after`` one day, [`redcount.policies.DENIED_RETRY_AFTER`][redcount.policies.DENIED_RETRY_AFTER]).
    A key that is an address (or ``"ip:<address>"``) matches the CIDRs; the most specific
    entry wins, deny on a tie. ``refusal_cache``: up to that many keys whose refusal by the
    store is repeated locally until its ``retry_after`` (0, the default: off); see
    docs/penalties.md. ``penalty``: a [`Penalty`][redcount.policies.Penalty] (escalating blocks of keys
    refused too often; the block check goes inside each decision's own script call, so a
    call still costs one round trip, and a refusal one more, the penalty's count). Without
    any of these, calls go straight to the core.
    ``lease_ttl``: seconds (default 10) a lease taken by ``hit(..., lease=N)`` may hold units
    before the unused ones go back to the store. See docs/leased-limits.md.

    [`redcount.aio.Limiter`][redcount.aio.Limiter] is the asyncio twin; it can share this limiter's core
    (``redcount.aio.Limiter.from_sync(limiter)``).

    Thread-safe.
    """

    _core: _core.LimiterCore

    def __init__(
        self,
        store: Store,
        strategy: Strategy = "fixed-window",
        *,
        prefix: str = "redcount:lim",
        clock: Clock = "client",
        sub_buckets: int = 1,
        on_unavailable: OnUnavailable = "raise",
        calendar: str | None = None,
        anchor_day: int = 1,
        allow: Iterable[Entry] | None = None,
        deny: Iterable[Entry] | None = None,
        refusal_cache: int = 0,
        penalty: Penalty | None = None,
        lease_ttl: float = 10.0,
    ) -> None:
        self.on_unavailable: OnUnavailable = check_on_unavailable(on_unavailable)
        if penalty is not None and not isinstance(penalty, Penalty):
            raise InvalidInputError(f"penalty must be a redcount.Penalty, got {penalty!r}")
        allowed, denied = access_entries(allow, "allow"), access_entries(deny, "deny")
        cache_size = config_size(refusal_cache, "refusal_cache")
        cal = calendar_arg(calendar, anchor_day)
        core = _core.LimiterCore(store, strategy, prefix, clock, sub_buckets, cal)
        core.lease_ttl = lease_ttl
        self._core = core
        # Lists, the refusal cache, the penalty and on_unavailable run in the core, in front
        # of every decision (sync and asyncio alike): the core's methods are the limiter's.
        core._set_guard(allowed, denied, cache_size, penalty, on_unavailable)
        bind_fast_paths(self, Limiter, core, _FAST)
        self.penalty = penalty
        self.store = store
        self.strategy = strategy
        self.prefix = prefix
        self.sub_buckets = sub_buckets
        self.calendar = calendar
        self.anchor_day = anchor_day

    # The methods below document the calls; on an instance, bind_fast_paths has replaced
    # them by the core's own bound methods (same arguments, results and errors).

    def hit(
        self,
        limit: str | LimitSet,
        key: str | bytes,
        cost: int = 1,
        *,
        lease: int | None = None,
        tag: str | None = None,
        penalty: Penalty | Literal[False] | None = None,
    ) -> Decision:
        """Charge ``cost`` against ``key`` if every limit allows it; return the [`Decision`][redcount.limiter.Decision].

        ``limit`` is a string like ``"10/minute"`` or ``"5/second;100/hour"`` (parsed once and
        cached) or a [`LimitSet`][redcount.limiter.LimitSet].

        ``tag``: decide on ``key``'s state under that hash tag, the state
        ``hit_all(..., tag=tag)`` charges (so that a cluster keeps keys sharing a tag in one
        slot). A key's state under a tag is separate from its untagged state: pass the same
        ``tag`` to [`test`][redcount.limiter.Limiter.test], [`stats`][redcount.limiter.Limiter.stats], [`reset`][redcount.limiter.Limiter.reset], [`refund`][redcount.limiter.Limiter.refund],
        [`reserve`][redcount.limiter.Limiter.reserve] and [`settle`][redcount.limiter.Limiter.settle] to act on it. Not with ``lease``.

        ``lease=N`` (every rate strategy; not ``"concurrency"``): a leased limit for a hot key. The process takes up
        to N units at a time from the store (at most half of what the window or bucket has
        left, at least ``cost``), charged there at once, and admits from them locally, with no
        round trip, until they are used up or the window (the approximate sliding window's
        current sub-bucket, the exact log's lease: a tenth of the window) ends; a bucket's lease
        loses units as fast as the bucket refills. Never admits past the limit
        across processes; units other processes hold unused are refused meanwhile
        (under-admission). Unused units go back after ``lease_ttl`` seconds (default 10; at
        this process's next leased call, or within about a second from a background thread),
        on [`return_leases`][redcount.limiter.Limiter.return_leases], when the store is closed and when the process ends
        (interpreter exit, SIGINT, a SIGTERM nothing else handles, gunicorn, uvicorn and
        Celery workers; a SIGKILL loses at most what the process held). Decisions made
        locally report ``remaining`` as the process knows it; refusals of an exhausted key
        cost one round trip each at most (none with ``refusal_cache``). See
        docs/leased-limits.md.

        ``penalty``: this call's [`Penalty`][redcount.policies.Penalty] instead of the limiter's (None, the
        default: the limiter's; ``False``: none for this call). Its state is the key's, under
        the limiter's prefix, whichever penalty counts it. Anything else raises ``TypeError``.
        See docs/penalties.md."""
        return self._core.hit(limit, key, cost, lease=lease, tag=tag, penalty=penalty)

    def return_leases(self) -> int:
        """Give every unit this process holds in leases (``hit(..., lease=N)``) and has not
        admitted back to the store, now; returns how many went back. Closing the store does
        the same."""
        return self._core.return_leases()

    @property
    def leased_units(self) -> int:
        """Units this process holds in leases and has not admitted yet."""
        return self._core.leased_units

    @property
    def lease_ttl(self) -> float:
        """Seconds a lease may hold units before they go back to the store."""
        return self._core.lease_ttl

    def test(
        self,
        limit: str | LimitSet,
        key: str | bytes,
        cost: int = 1,
        *,
        lease: int | None = None,
        tag: str | None = None,
    ) -> Decision:
        """What [`hit`][redcount.limiter.Limiter.hit] would decide now, without charging anything.

        ``lease=N``: answered from this process's lease of ``key`` (the one ``hit(...,
        lease=N)`` takes) when it holds ``cost`` units now, with no round trip; else by the
        store, as without ``lease=``. A test never takes a lease. ``tag``: as in [`hit`][redcount.limiter.Limiter.hit]."""
        return self._core.test(limit, key, cost, lease=lease, tag=tag)

    def _unavailable(self, error: BaseException) -> Decision:
        """What a call decides when the store failed: this limiter's ``on_unavailable``."""
        return unavailable_decision(self.on_unavailable, error)

    def hit_all(
        self,
        items: Iterable[Item],
        cost: int = 1,
        *,
        tag: str | None = None,
        penalty: Penalty | Literal[False] | None = None,
        lease: int | None = None,
    ) -> Decision:
        """One decision across several keys: charge ``cost`` against every ``(limit, key)``
        of ``items`` if all of their limits allow it, else against none:

        ```python
        d = limiter.hit_all([("1000/hour", "org:acme"), ("100/minute", "user:42")])
        if not d:
            limit, key = d.refused_by          # e.g. ("100/minute", "user:42")
            wait = d.retry_after               # the longest wait of the refusing limits
        ```

        One round trip. Keys in one slot (always on a single Redis server and on memory://;
        on a cluster, keys under one ``tag``) are decided by one script call, atomically. On
        a cluster, keys in different slots are decided by one script call per slot in one
        pipelined batch: when any refuses, what the others charged is given back (a second
        round trip, only then). That never admits past any limit, but a concurrent caller
        may be refused by units given back a moment later (see docs/limiting.md).
        ``tag`` puts every key under that hash tag, so that a cluster keeps them in one slot;
        a key's state under a tag is separate from its untagged state, so use one tag per
        key consistently. One limit per window per key (the amount is not part of the
        key). Every strategy but ``"concurrency"``. Bad input raises
        [`InvalidInputError`][redcount.errors.InvalidInputError] before anything is stored. ``penalty``: this
        call's penalty, as in [`hit`][redcount.limiter.Limiter.hit].

        ``lease=`` is refused ([`InvalidInputError`][redcount.errors.InvalidInputError]): the leases of several
        keys are units held apart from the store, so one call could not take from some of them
        and charge the other keys all or nothing. Lease a hot key with [`hit`][redcount.limiter.Limiter.hit]."""
        refuse_lease_all(lease)
        return self._core.hit_all(items, cost, tag=tag, penalty=penalty)

    def test_all(self, items: Iterable[Item], cost: int = 1, *, tag: str | None = None) -> Decision:
        """What [`hit_all`][redcount.limiter.Limiter.hit_all] would decide now, without charging anything."""
        return self._core.test_all(items, cost, tag=tag)

    def stats(self, limit: str | LimitSet, key: str | bytes, *, tag: str | None = None) -> list[LimitStats]:
        """The count, remaining hits and reset time of ``key`` under each limit (its state
        under ``tag``, as [`hit`][redcount.limiter.Limiter.hit] with that ``tag`` charges it, when given)."""
        return self._core.stats(limit, key, tag=tag)

    def reset(self, limit: str | LimitSet, key: str | bytes, *, tag: str | None = None) -> None:
        """Forget ``key``'s state under these limits (its state under ``tag`` when given; the
        untagged state and other tags' are left alone)."""
        self._core.reset(limit, key, tag=tag)

    def unblock(self, key: str | bytes) -> int:
        """Clear every limit and penalty state of ``key`` under this limiter's prefix at once
        (one DEL of every such key; found with SCAN, or KEYS on ``memory://``), and its
        entry in the refusal cache; returns how many storage keys were deleted. For an admin
        action, not a request path: the scan walks the keyspace. Not on a cluster."""
        return unblock_sync(self.store, self.prefix, self._core, key)

    def acquire(self, max_in_flight: int, key: str | bytes, *, lease_timeout: float = 60.0) -> Lease | None:
        """Take one of ``key``'s ``max_in_flight`` slots, or return None when all are taken
        (``strategy="concurrency"``). The lease frees itself after ``lease_timeout`` seconds if
        never released."""
        return self._core.acquire(max_in_flight, key, lease_timeout=lease_timeout)

    def release(self, lease: Lease) -> bool:
        """Give the slot back: True when the lease was still held, False when it had already
        expired. Releasing the same lease twice raises [`InvalidInputError`][redcount.errors.InvalidInputError]."""
        return self._core.release(lease)

    def in_flight(self, key: str | bytes) -> int:
        """Leases of ``key`` held now (``strategy="concurrency"``)."""
        return self._core.in_flight(key)

    def refund(
        self,
        limit: str | LimitSet,
        key: str | bytes,
        cost: int = 1,
        *,
        request_id: str | bytes | None = None,
        tag: str | None = None,
        decision: Decision | None = None,
    ) -> Adjustment:
        """Give back up to ``cost`` units charged to ``key`` under every limit (e.g. a request
        that turned out not to count). Returns an [`Adjustment`][redcount.limiter.Adjustment]: ``status``
        ``"applied"`` with ``units`` given back (fewer when less was charged), and
        ``decision``, the key's state afterwards.

        ``decision``: the allowed [`hit`][redcount.limiter.Limiter.hit]'s [`Decision`][redcount.limiter.Decision], which says where
        the units were charged ([`charged_at`][redcount.limiter.Decision.charged_at]). Only the state that
        still holds that charge is credited, so a refund never admits past a limit: the
        charged window while it is the current one (nothing once it has ended), the hit's own
        sliding-log entries still in the window, and for the token bucket and GCRA only what
        has not refilled since the hit. Without ``decision`` the refund credits the current
        window (the newest entries, the buckets' full cost): right for a hit of the current
        window, too generous for an earlier one.

        With ``request_id`` it is done once: a refund under an id already applied changes
        nothing and says ``"duplicate"`` (retries are safe); the id's marker is written with
        the refund, atomically, and kept at least as long as the longest window. What each
        strategy gives back: see docs/refunds.md. Not for ``strategy="concurrency"``
        ([`release`][redcount.limiter.Limiter.release] gives a lease back). ``tag``: give back to the key's state under
        that hash tag (what ``hit(..., tag=tag)`` or ``hit_all(..., tag=tag)`` charged); the
        id's marker is kept under the same tag."""
        self._forget(key, tag)
        return self._core.refund(limit, key, cost, request_id=request_id, tag=tag, decision=decision)

    def reserve(
        self,
        limit: str | LimitSet,
        key: str | bytes,
        cost: int,
        *,
        request_id: str | bytes | None = None,
        deadline: float = 60.0,
        tag: str | None = None,
    ) -> Reservation:
        """Charge the estimate ``cost`` if every limit allows it (as [`hit`][redcount.limiter.Limiter.hit] would) and
        record the reservation under ``request_id`` (a fresh one when None) for ``deadline``
        seconds, in the same script. Returns a [`Reservation`][redcount.reservations.Reservation], truthy when
        charged; its ``settle(actual)`` (or [`settle`][redcount.limiter.Limiter.settle] from any process) charges or gives
        back the difference, once. The record keeps where the estimate was charged, so a
        settlement gives back only to that state (see [`settle`][redcount.limiter.Limiter.settle]). A reservation not
        settled by its deadline settles at the estimate: nothing more happens, and a later
        settle reports ``"expired"``. A second reserve under the same id charges nothing
        (``duplicate``). A refused reservation charges and records nothing. ``tag``: reserve
        on the key's state under that hash tag (the reservation's record goes under it too);
        the reservation's ``settle`` keeps to it, and [`settle`][redcount.limiter.Limiter.settle] from elsewhere must pass
        the same ``tag``."""
        rid = new_request_id() if request_id is None else request_id
        adjustment = self._core.reserve(limit, key, cost, request_id=rid, deadline=deadline, tag=tag)
        return Reservation(self, limit, key, rid, adjustment, tag)

    def settle(
        self,
        limit: str | LimitSet,
        key: str | bytes,
        *,
        request_id: str | bytes,
        actual: int,
        tag: str | None = None,
    ) -> Adjustment:
        """Settle the reservation ``request_id`` at ``actual`` units (>= 0): gives back
        ``estimate - actual``, or charges ``actual - estimate`` whatever the limits say (the
        units were used). What is given back goes only where the reservation charged: the
        window it was made in while that is still the current one (nothing once it has
        ended), its own sliding-log entries still in the window, and for the token bucket
        and GCRA at most what has not refilled since the reservation; ``units`` says how
        much was given back (the fewest over the limits). Once: ``status`` is ``"applied"``
        the first time, ``"duplicate"`` after; ``"expired"`` when there is no such reservation
        (past its deadline, where it settled at the estimate, refused, or never made): nothing
        changes then. ``tag``: the one the reservation was made under (a reservation under
        another tag, or none, is not found: ``"expired"``)."""
        self._forget(key, tag)
        return self._core.settle(limit, key, request_id=request_id, actual=actual, tag=tag)

    def _forget(self, key: str | bytes, tag: str | None = None) -> None:
        """Drops ``key``'s state (under ``tag``) from the refusal cache (if any): units given
        back may admit it."""
        self._core._forget(key, tag)

    @property
    def clock(self) -> str:
        """The time source in force: ``"client"``, ``"server"`` or ``"server-offset"``."""
        return self._core.clock

    @contextmanager
    def lease(self, max_in_flight: int, key: str | bytes, *, lease_timeout: float = 60.0) -> Iterator[Lease]:
        """``with limiter.lease(5, "user:1") as lease: ...``: holds a slot for the block.

        Raises [`RateLimitExceeded`][redcount.errors.RateLimitExceeded] when all slots are taken; releases the
        slot when the block ends, even by an exception."""
        got = self.acquire(max_in_flight, key, lease_timeout=lease_timeout)
        if got is None:
            raise slots_taken(max_in_flight, key)
        try:
            yield got
        finally:
            if not got.released:
                self.release(got)

    def __repr__(self) -> str:
        extra = "" if self.on_unavailable == "raise" else f", on_unavailable={self.on_unavailable!r}"
        return f"Limiter(strategy={self.strategy!r}, clock={self.clock!r}, store={self.store.url!r}{extra})"

    def wait(
        self, limit: str | LimitSet, key: str | bytes, cost: int = 1, *, max_wait: float | None = None
    ) -> Decision:
        """Wait until ``cost`` is allowed under ``limit`` for ``key``, charge it and return
        the admitting [`Decision`][redcount.limiter.Decision] (shaping instead of refusing).

        Waiters of this process queue per (limit, key) in order of arrival and only the
        first talks to the store: one [`hit`][redcount.limiter.Limiter.hit]; when refused, it sleeps the reported
        ``retry_after`` plus a few ms of jitter and calls once more. So admission follows
        arrival order within the process; across processes it is best-effort (see
        docs/shaping.md).

        ``max_wait``: seconds, finite and >= 0, or None (the default) to wait as long as it
        takes. When the hit cannot be admitted in time this raises
        [`WaitTimeout`][redcount.errors.WaitTimeout] (a [`RateLimitExceeded`][redcount.errors.RateLimitExceeded]) with
        ``waited`` and ``retry_after``, having charged nothing; it gives up as soon as the
        limiter's ``retry_after`` goes past the deadline. ``max_wait=0`` tries once.

        A ``cost`` the limit can never admit (above its amount, or a bucket's capacity)
        raises [`InvalidInputError`][redcount.errors.InvalidInputError] at once. ``KeyboardInterrupt`` while
        waiting leaves the queue and charges nothing. Store errors propagate (the waiter
        leaves the queue; the next one carries on). Works with every strategy: each reports
        when a refused hit would be allowed (for ``"concurrency"``, ``hit("N/period")``
        slots; leases taken with [`acquire`][redcount.limiter.Limiter.acquire] are not waited for). Thread-safe."""
        return wait_sync(shaper_of(self), self.hit, self.strategy, limit, key, cost, max_wait)

    def waiting(self, limit: str | LimitSet, key: str | bytes) -> int:
        """How many waiters of this process (threads, and coroutines of any
        [`redcount.aio.Limiter`][redcount.aio.Limiter] view of this limiter) are queued in [`wait`][redcount.limiter.Limiter.wait] for
        ``limit`` and ``key``, the one talking to the store included. No store call."""
        return shaper_of(self).waiting(queue_name(limit, key))

    def throttle(
        self, limit: str | LimitSet, key: str | bytes, cost: int = 1, *, max_wait: float | None = None
    ) -> Throttle:
        """A decorator for calls to a rate-limited API: each call first waits its turn
        ([`wait`][redcount.limiter.Limiter.wait]), then runs:

        ```python
        @limiter.throttle("10/second", key="github", max_wait=30)
        def get_repo(name: str) -> dict[str, object]: ...

        @limiter.throttle("10/second", key="github", max_wait=30)
        async def get_user(name: str) -> dict[str, object]: ...   # waits without blocking the loop
        ```

        Coroutine functions wait through [`redcount.aio.Limiter`][redcount.aio.Limiter] (sharing this
        limiter's core and queues); plain functions block their thread. Signatures, return
        values and exceptions are kept; [`WaitTimeout`][redcount.errors.WaitTimeout] is raised instead of
        the call when ``max_wait`` runs out. The arguments are checked here, when decorating."""
        check_wait_args(limit, key, cost, self.strategy, max_wait)

        hits: list[Callable[[str | LimitSet, str | bytes, int], Awaitable[Decision]]] = []

        def wait_on_loop() -> Awaitable[Decision]:
            if not hits:  # the first coroutine call: an awaitable hit on this limiter's core
                # (what redcount.aio.Limiter.wait does; that module builds on this one, so the
                # loop machinery is taken from the runtime under both)
                from ._aio_runtime import awaitable_method

                hit = awaitable_method(self._core, "hit", self.store)
                policy = self.on_unavailable

                async def hit_async(limit: str | LimitSet, key: str | bytes, cost: int) -> Decision:
                    try:
                        return await hit(limit, key, cost)  # type: ignore[no-any-return]
                    except StoreConnectionError as e:
                        return unavailable_decision(policy, e)

                hits.append(hit_async)
            return wait_async(shaper_of(self), hits[0], self.strategy, limit, key, cost, max_wait)

        return Throttle(lambda: self.wait(limit, key, cost, max_wait=max_wait), wait_on_loop)
