"""Sharded idempotent counters and strong quotas.

```python
likes = redcount.ShardedCounter(store, "likes:post:987", shards=16)
likes.incr(request_id="req-20260223-13001")   # True; a retry with the same id -> False
likes.value()                                 # all shards summed, one round trip
likes.read(max_staleness=0.25)                # Reading(value=..., staleness_ms=...)

credits = redcount.Quota(store, "merchant:1001:credits", floor=0)
credits.set(10_000)
if credits.take(25, request_id="order-77"):   # refused (nothing changes) below the floor
    ...
```
"""

from __future__ import annotations

import atexit
import weakref
from collections.abc import Iterable, Sequence
from types import TracebackType
from typing import Literal, Union

from . import _core
from ._core import BufferedStats, QuotaResult, Reading, RetryStats, ShardGeneration, ShardLayout, Store
from ._retry import CLOSE_TIMEOUT, QUEUE_CAPACITY, RETRY_BACKOFF, RETRY_BACKOFF_MAX
from ._calendar import calendar_arg, calendar_unit
from ._wrap import bind_fast_paths
from .errors import InvalidInputError
from .skew import Skew, skew_of

__all__ = [
    "BufferedCounter",
    "BufferedStats",
    "Quota",
    "QuotaResult",
    "Reading",
    "ShardGeneration",
    "ShardLayout",
    "ShardedCounter",
]

Increment = Union[tuple[str, int], tuple[str, int, Union[str, bytes, None]]]
"""One item of [`ShardedCounter.incr_many`][redcount.sharded.ShardedCounter.incr_many]: ``(name, amount)`` or ``(name, amount, request_id)``."""

_QUEUED: weakref.WeakSet[ShardedCounter] = weakref.WeakSet()
_BUFFERED: weakref.WeakSet[BufferedCounter] = weakref.WeakSet()

_FAST_SHARDED = (
    "incr",
    "decr",
    "incr_many",
    "value",
    "shard_values",
    "values",
    "read",
    "shard_of",
    "key_of",
    "flush",
    "close",
    "stats",
)


class ShardedCounter:
    """One logical counter striped over ``shards`` keys, with request-id deduplication.

    A write is one atomic script: it records ``request_id`` (kept ``idempotency_ttl``
    seconds), and only if the id is new adds ``amount`` to one shard and appends the delta to
    that shard's delta log (a Redis stream, which a [`Flusher`][redcount.sql.flusher.Flusher] trims once its
    entries are in SQL, and ``log_maxlen`` guards). A write
    with a request id goes to a shard chosen by a stable hash of the id, so a retry meets the
    id it recorded; a write without one goes to a random shard. Reads sum all shards in one
    round trip; [`read`][redcount.sharded.ShardedCounter.read] serves hot readers from a cache.

    Eventually consistent in the useful sense: every applied write is in the value at once,
    but a reader may see a cached value ([`read`][redcount.sharded.ShardedCounter.read]) up to ``max_staleness`` old. For
    refusals that must be exact (stock, credits), use [`Quota`][redcount.sharded.Quota].

    Args:
        store: from [`redcount.connect`][redcount.store.connect].
        name: the counter's name (no ``{`` or ``}``).
        shards: 1..4096 (default 16): the counter's first generation of shards. Keep it fixed
            for a counter's life and change the shard count with [`reshard`][redcount.sharded.ShardedCounter.reshard], which every
            instance (in every process) follows through the counter's layout key.
        idempotency_ttl: seconds a request id is remembered (default one day).
        route: ``"request-id"`` (default) or ``"random"`` (every write to a random shard;
            request ids are then refused).
        on_error: ``"raise"`` (default) or ``"queue"``: a write *with a request id* that
            fails transiently, or ambiguously (sent, no reply), goes to a bounded retry
            queue and is applied exactly once; ``incr`` then returns True. Writes without an
            id always raise (retrying them could count twice).
        log_maxlen: the delta logs' memory guard: entries kept per shard's log (approximately,
            ``MAXLEN ~``; default 1,000,000). A flusher trims each log to the entries it has
            not applied yet, so the guard only bites when no flusher runs for a long time
            (about ``log_maxlen`` / the shard's write rate); entries it trims before a
            flusher applied them are lost to the SQL snapshots, and the flusher counts them
            (``FlusherStats.trimmed``, the ``redcount_flusher_trimmed_entries_total``
            metric) and reconcile reports the drift. At about 100 bytes an entry, the
            default costs up to about 100 MB per shard in Redis while no flusher runs.

    Thread-safe; share one instance (its read cache is per instance).
    """

    _core: _core.ShardedCounter
    exit_timeout: float

    def __init__(
        self,
        store: Store,
        name: str,
        *,
        shards: int = 16,
        idempotency_ttl: float = 86400,
        route: Literal["request-id", "random"] = "request-id",
        prefix: str = "redcount",
        log_maxlen: int = 1_000_000,
        on_error: Literal["raise", "queue"] = "raise",
        queue_capacity: int = QUEUE_CAPACITY,
        retry_backoff: float = RETRY_BACKOFF,
        retry_backoff_max: float = RETRY_BACKOFF_MAX,
    ) -> None:
        core = _core.ShardedCounter(
            store,
            name,
            shards,
            idempotency_ttl,
            route,
            prefix,
            log_maxlen,
            on_error,
            queue_capacity,
            retry_backoff,
            retry_backoff_max,
        )
        self._core = core
        bind_fast_paths(self, ShardedCounter, core, _FAST_SHARDED)
        self.exit_timeout = CLOSE_TIMEOUT
        if on_error == "queue":
            _QUEUED.add(self)

    def incr(self, amount: int = 1, *, request_id: str | bytes | None = None) -> bool:
        """Add ``amount`` (non-zero; negative subtracts). True when applied; False when
        ``request_id`` was already applied to this counter within ``idempotency_ttl``."""
        return self._core.incr(amount, request_id=request_id)

    def decr(self, amount: int = 1, *, request_id: str | bytes | None = None) -> bool:
        """``incr(-amount)``."""
        return self._core.decr(amount, request_id=request_id)

    def adjust(self, delta: int, reason: str, *, request_id: str | bytes | None = None) -> bool:
        """An audited correction: adds ``delta`` (a non-zero int) through the delta log like
        [`incr`][redcount.sharded.ShardedCounter.incr], and its log entry carries ``reason`` (1..255 bytes), so the flusher also
        records it in the SQL adjustments table. With ``request_id``, a repeat is not applied
        twice (False). Bad input raises InvalidInputError and writes nothing."""
        check_adjust(delta, reason)
        return self._core.adjust(delta, reason, request_id=request_id)

    def incr_many(self, items: Iterable[Increment]) -> list[bool]:
        """Write many counters (this prefix and TTL; each follows its own shard layout) in one
        round trip, one script call per shard group: ``[(name, amount[, request_id]), ...]``
        -> applied flags in input order. Every item is validated before anything is sent."""
        return self._core.incr_many(items)

    def value(self) -> int:
        """All shards of every generation summed, in one round trip (plus one when a
        reshard changed the layout since this object last looked)."""
        return self._core.value()

    def shard_values(self) -> list[int]:
        """Each shard's value, in shard index order over all generations."""
        return self._core.shard_values()

    def values(self, names: Sequence[str]) -> dict[str, int]:
        """``{name: value}`` of counters with this prefix (each with its own layout), in one
        round trip."""
        return self._core.values(list(names))

    def read(self, max_staleness: float = 0.25) -> Reading:
        """The value from this object's cache when it is at most ``max_staleness`` seconds
        old, else a fresh [`value`][redcount.sharded.ShardedCounter.value] that refreshes the cache; ``staleness_ms`` says how
        old the value may be. One refresh at a time: meanwhile others get the cached value
        with its true staleness."""
        return self._core.read(max_staleness)

    def reshard(self, new_shards: int) -> ShardLayout:
        """Move this counter's writes to a new generation of ``new_shards`` shards while
        writers in other threads and processes keep writing: no increment is lost or counted
        twice, and reads sum every generation throughout (see docs/sharded.md, "Resharding").

        The shards so far are frozen (still summed, no longer written once writers have
        re-read the layout, at most a second later) and the new ones take the next free
        shard indices. Returns the new layout. ``new_shards`` must be an int in 1..4096, not
        the current count, and all generations together at most 4096 shards
        (InvalidInputError, nothing written). A reshard that raced another one fails with
        RedcountError and changes nothing."""
        return self._core.reshard(new_shards)

    def layout(self) -> ShardLayout:
        """The shard generations as the store holds them now (one round trip)."""
        return self._core.layout()

    @property
    def cached_layout(self) -> ShardLayout:
        """The layout this object last saw, without I/O."""
        return self._core.cached_layout

    @property
    def layout_key(self) -> str:
        """The layout key ``{<prefix>:<name>}:layout``: a string holding the shard
        generations (absent until the first reshard; no TTL)."""
        return self._core.layout_key

    def skew(self, window: float = 60.0, target_per_shard: float | None = None) -> Skew:
        """How unevenly the writes of the last ``window`` seconds spread over the current
        generation's shards: [`redcount.skew.skew_of`][redcount.skew.skew_of] over per-shard write rates
        (log entries per second), with ``recommended_shards`` for ``target_per_shard``
        writes per second per shard.

        The rates come from the shards' delta logs (entries newer than now - ``window``), read
        after the layout in one round trip for all shards. A log keeps about ``log_maxlen``
        entries, and a running [`Flusher`][redcount.sql.flusher.Flusher] trims the entries it applied unless
        it keeps them (its ``retain`` seconds), so a shard that wrote more than that within
        ``window`` is under-counted: keep ``window`` below ``log_maxlen`` / the hottest shard's
        rate, and below a flusher's ``retain``. Frozen generations are left
        out: they take no new writes, and counting them would report skew that resharding
        already removed."""
        window_ms, min_id = skew_window(window, self.store)
        gen = self.layout().current
        logs = self.store.execute_many([("XRANGE", self.key_of(i, "log"), min_id, "+") for i in gen.shards])
        return skew_of_logs(logs, window_ms, target_per_shard)

    def shard_of(self, request_id: str | bytes) -> int:
        """The shard a write with this request id goes to (in the current generation as
        this object last saw it)."""
        return self._core.shard_of(request_id)

    def key_of(self, shard: int, suffix: str = "") -> str:
        """Shard ``shard``'s value key ``{<prefix>:<name>:<shard>}``; with suffix ``"log"``
        its delta log, ``"rid:<id>"`` a request id's key."""
        return self._core.key_of(shard, suffix)

    def flush(self, timeout: float | None = None) -> int:
        """Retry everything queued now and wait up to ``timeout`` seconds; returns how many
        writes are still pending."""
        return self._core.flush(timeout)

    def close(self, timeout: float | None = CLOSE_TIMEOUT) -> int:
        """Flush within ``timeout`` seconds, then stop the retry thread; returns how many
        writes could not be delivered (counted in ``stats().failed``)."""
        return self._core.close(timeout)

    def stats(self) -> RetryStats:
        """A snapshot of the retry queue's counters."""
        return self._core.stats()

    @property
    def pending(self) -> int:
        return self._core.pending

    @property
    def name(self) -> str:
        return self._core.name

    @property
    def prefix(self) -> str:
        return self._core.prefix

    @property
    def shards(self) -> int:
        """The current generation's shard count, as this object last saw it."""
        return self._core.shards

    @property
    def idempotency_ttl(self) -> float:
        return self._core.idempotency_ttl

    @property
    def route(self) -> str:
        return self._core.route

    @property
    def on_error(self) -> str:
        return self._core.on_error

    @property
    def store(self) -> Store:
        return self._core.store

    def __enter__(self) -> ShardedCounter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(self.exit_timeout)

    def __repr__(self) -> str:
        return (
            f"ShardedCounter(name={self.name!r}, shards={self.shards}, route={self.route!r}, "
            f"on_error={self.on_error!r}, store={self.store.url!r})"
        )


def layout_text(layout: ShardLayout) -> str:
    """``layout`` as its layout key holds it ('' for a counter never resharded): what
    restore writes back. The format is the core's: ``<version>|<first>,<count>,<retired_ms>;...``."""
    if layout.version == 1:
        return ""
    gens = ";".join(f"{g.first},{g.count},{g.retired_ms}" for g in layout.generations)
    return f"{layout.version}|{gens}"


def skew_window(window: object, store: Store) -> tuple[int, str]:
    """``skew(window)``'s checked window in ms and the first stream id inside it (by the
    store's clock). Shared by [`ShardedCounter.skew`][redcount.sharded.ShardedCounter.skew] and its asyncio twin."""
    if isinstance(window, bool) or not isinstance(window, (int, float)) or not 0 < window <= 86400 * 7:
        raise InvalidInputError(f"window must be a number of seconds in (0, 604800], got {window!r}")
    window_ms = max(1, round(window * 1000))
    since = int(store.now() * 1000) - window_ms
    return window_ms, f"{max(since, 0) + 1}-0"


def skew_of_logs(logs: Sequence[object], window_ms: int, target_per_shard: float | None) -> Skew:
    """The [`Skew`][redcount.skew.Skew] of the shards' write rates, from their delta-log
    entries of the last ``window_ms`` (one XRANGE reply per shard)."""
    rates = [len(entries) * 1000.0 / window_ms if isinstance(entries, list) else 0.0 for entries in logs]
    return skew_of(rates, target_per_shard=target_per_shard)


def check_adjust(delta: object, reason: object) -> None:
    """Raise [`InvalidInputError`][redcount.errors.InvalidInputError] unless ``adjust(delta, reason)`` is valid
    (checked before anything is sent, by the sync and the async counter alike)."""
    if type(delta) is not int or delta == 0:
        raise InvalidInputError(f"adjust: delta must be a non-zero int, got {delta!r}")
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidInputError(f"adjust: reason must be a non-empty string, got {reason!r}")
    if len(reason.encode()) > 255:
        raise InvalidInputError("adjust: reason must be at most 255 bytes (UTF-8)")


_FAST_QUOTA = ("take", "give", "set", "value", "storage_key")


class Quota:
    """A strong counter for quotas and inventory: one key, every call atomic and
    linearizable on its Redis master, never below ``floor`` (nor above ``ceiling``).

    ``take(n)`` is refused, changing nothing, when it would cross the floor; ``give(n)``
    when it would cross the ceiling. The result is a [`QuotaResult`][redcount.sharded.QuotaResult], true when applied.
    With ``request_id``, a repeat of an applied call changes nothing and reports
    ``applied=True, duplicate=True``; a refused call does not use up its id.

    ``soft``: a threshold that is reported (``result.soft_exceeded`` when the value is below
    it) and never refuses. ``durable=N``: every write is followed by ``WAIT N
    durable_timeout``, and ``result.replicas`` / ``result.durable_ok`` say whether N replicas
    acknowledged it within ``durable_timeout``; fewer is a result (``durable_ok=False``, the
    write applied on the master), not an exception. That narrows, and does not close, the
    window in which a failover loses a write (Redis replication stays asynchronous: WAIT
    reports, it does not roll back). The write and its WAIT go on connections kept for them,
    never on the ones the store's other callers share, and the call's deadline is
    ``command_timeout + durable_timeout``. On ``memory://`` there are no replicas:
    ``replicas`` is 0, and ``durable_ok`` False for every call that changed the value.

    ``reset``: a scheduled reset. With ``reset="month"`` (or ``"day"``, ``"week"``,
    ``"year"``), every calendar period of ``calendar`` (an IANA time zone, default
    ``"UTC"``; months start on ``anchor_day``, 1..31, clamped to the last day of shorter
    months) has a key of its own: the value starts at ``reset_to`` when the period begins,
    and the key expires at the period's end plus ``grace`` seconds. ``request_id`` repeats
    are recognised within a period. See docs/fixed-windows.md.

    Thread-safe.
    """

    _core: _core.Quota

    def __init__(
        self,
        store: Store,
        name: str,
        *,
        floor: int = 0,
        ceiling: int | None = None,
        soft: int | None = None,
        idempotency_ttl: float = 86400,
        durable: int = 0,
        durable_timeout: float = 0.5,
        prefix: str = "redcount",
        reset: Literal["day", "week", "month", "year"] | None = None,
        reset_to: int = 0,
        calendar: str | None = None,
        anchor_day: int = 1,
        grace: float = 1.0,
    ) -> None:
        if reset is None:
            if calendar is not None or reset_to != 0:
                raise InvalidInputError(
                    "calendar= and reset_to= need reset= ('day', 'week', 'month' or 'year'): "
                    "when the quota resets"
                )
            cal = calendar_arg(None, anchor_day)
            unit = ""
        else:
            cal = calendar_arg("UTC" if calendar is None else calendar, anchor_day)
            unit = calendar_unit(reset, "reset")
        core = _core.Quota(
            store, name, floor, ceiling, soft, idempotency_ttl, durable, durable_timeout, prefix,
            cal, unit, reset_to, grace,
        )
        self._core = core
        bind_fast_paths(self, Quota, core, _FAST_QUOTA)

    def take(self, n: int = 1, *, request_id: str | bytes | None = None) -> QuotaResult:
        """Take ``n`` (>= 1) unless the value would go below the floor."""
        return self._core.take(n, request_id=request_id)

    def give(self, n: int = 1, *, request_id: str | bytes | None = None) -> QuotaResult:
        """Give ``n`` (>= 1) back unless the value would go above the ceiling."""
        return self._core.give(n, request_id=request_id)

    def set(self, value: int) -> QuotaResult:
        """Set the value (``floor <= value <= ceiling``)."""
        return self._core.set(value)

    def value(self) -> int:
        """The current value (0 before the first write; with a ``reset``, ``reset_to`` before the
        period's first write)."""
        return self._core.value()

    def storage_key(self) -> str:
        """The key ``<prefix>:quota:{<name>}`` (with a ``reset``, followed by the current period's
        length and start in ms: ``...:<length>:<start>``)."""
        return self._core.storage_key()

    def current_period(self) -> tuple[float, float] | None:
        """``(start, end)`` of the current period in seconds since the epoch; None without a ``reset``."""
        return self._core.current_period()

    @property
    def reset_to(self) -> int:
        return self._core.reset_to

    @property
    def name(self) -> str:
        return self._core.name

    @property
    def floor(self) -> int:
        return self._core.floor

    @property
    def ceiling(self) -> int | None:
        return self._core.ceiling

    @property
    def soft(self) -> int | None:
        return self._core.soft

    @property
    def durable(self) -> int:
        return self._core.durable

    @property
    def store(self) -> Store:
        return self._core.store

    def __repr__(self) -> str:
        return f"Quota(name={self.name!r}, floor={self.floor}, ceiling={self.ceiling}, store={self.store.url!r})"


class BufferedCounter:
    """Local pre-aggregation in front of a [`ShardedCounter`][redcount.sharded.ShardedCounter], for counters hit far more
    often than one round trip per hit allows.

    [`incr`][redcount.sharded.BufferedCounter.incr] adds to an in-process sum (an atomic add in C++: no I/O, no lock); a
    background thread writes the sum every ``flush_every`` seconds or as soon as
    ``max_pending`` units have accumulated, whichever comes first, as one idempotent write
    with its own request id, so a retried flush never counts twice.

    The worst case, stated: while the store is reachable, an increment reaches the store at
    most ``flush_every`` (plus a round trip) after it was made; a crash of this process loses
    at most [`pending`][redcount.sharded.BufferedCounter.pending] units (accumulated, or written without an acknowledgement), which
    [`pending`][redcount.sharded.BufferedCounter.pending] reports at any time. A flush that fails transiently is retried with the
    same id; units given up (a non-transient error, an id that would expire first,
    [`close`][redcount.sharded.BufferedCounter.close] with the store down) are counted in ``stats().failed_units``.

    Flushes on [`close`][redcount.sharded.BufferedCounter.close] and at interpreter exit. After ``os.fork()`` the child starts
    empty, with its own flusher (the parent writes what it had). Thread-safe.
    """

    _core: _core.BufferedCounter
    exit_timeout: float

    def __init__(self, counter: ShardedCounter, *, flush_every: float = 0.05, max_pending: int = 1000) -> None:
        self.counter = counter
        core = _core.BufferedCounter(counter._core, flush_every, max_pending)
        self._core = core
        bind_fast_paths(self, BufferedCounter, core, ("incr", "flush", "close", "stats"))
        self.exit_timeout = CLOSE_TIMEOUT
        _BUFFERED.add(self)

    def incr(self, amount: int = 1) -> None:
        """Add ``amount`` (non-zero, ``|amount| <= 2**40``) to the pending sum; no I/O."""
        self._core.incr(amount)

    def flush(self, timeout: float | None = None) -> int:
        """Write what is pending now and wait up to ``timeout`` seconds for the store's
        acknowledgement; returns the units still pending."""
        return self._core.flush(timeout)

    def close(self, timeout: float | None = CLOSE_TIMEOUT) -> int:
        """Flush within ``timeout`` seconds, then stop; returns the units given up (also
        counted in ``stats().failed_units``). Later [`incr`][redcount.sharded.BufferedCounter.incr] calls raise."""
        return self._core.close(timeout)

    def stats(self) -> BufferedStats:
        return self._core.stats()

    @property
    def pending(self) -> int:
        """Net units not yet acknowledged by the store: what a crash now could lose."""
        return self._core.pending

    @property
    def flush_every(self) -> float:
        return self._core.flush_every

    @property
    def max_pending(self) -> int:
        return self._core.max_pending

    def __enter__(self) -> BufferedCounter:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close(self.exit_timeout)

    def __repr__(self) -> str:
        return (
            f"BufferedCounter({self.counter!r}, flush_every={self.flush_every}, max_pending={self.max_pending})"
        )


@atexit.register
def _drain_retry_queues() -> None:
    """Give queued and buffered writes a last chance at interpreter exit."""
    for buffered in list(_BUFFERED):
        try:
            buffered.close(buffered.exit_timeout)
        except Exception:  # noqa: BLE001 - exit must go on; stats().failed_units records losses
            pass
    for counter in list(_QUEUED):
        try:
            counter.close(counter.exit_timeout)
        except Exception:  # noqa: BLE001 - exit must go on; stats().failed records losses
            pass
