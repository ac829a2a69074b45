"""Native asyncio: awaitable stores, counters and limiters.

```python
import redcount, redcount.aio

store = redcount.connect("redis://localhost:6379/0")   # the same store object as for sync code
limiter = redcount.aio.Limiter(store, "sliding-window")
if not await limiter.hit("10/minute", "ip:203.0.113.9"):
    ...  # 429

astore = redcount.aio.AsyncStore(store)
await astore.execute("GET", "k")
```

The classes take the same arguments as their sync twins and have the same methods, as
coroutines, with the same results and errors. A sync and an async object can share one core
(``redcount.aio.Limiter.from_sync(limiter)``; ``alimiter.sync`` is the sync twin), so a
limit is counted once whichever side is called.

How a call completes: the store runs the operation without a thread per call; when it
finishes on the store's I/O thread, it goes to a per-loop completion queue, without the
GIL, and the loop is woken through an eventfd registered once with ``loop.add_reader`` only
when that queue goes from empty to non-empty: one wake-up completes every call finished
since the last one. Loops without ``add_reader`` (Windows' proactor) are woken with one
``loop.call_soon_threadsafe`` per such transition instead. Works on asyncio's loops and on
uvloop. On the memory store a call completes inline: no future, no thread hop.

Cancelling a coroutine that awaits a call (``asyncio.wait_for``, ``task.cancel()``) drops the
request if it was not sent yet and discards its reply if it was; the connection stays in
step and later calls get their own replies.

On Redis the loop never waits on the network: a call is handed to the store's I/O thread
(which may wait, with the GIL released, only when the store's queue of unsent requests is
full: see ``pool_timeout`` in [`redcount.connect`][redcount.store.connect]).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any, Concatenate, Literal, ParamSpec

from . import _core
from ._aio_runtime import OpFuture, engine_method, off_loop
from ._core import Decision, Lease, LimitSet, LimitStats, QuotaResult, Reading, RetryStats, ShardLayout, Store
from ._retry import CLOSE_TIMEOUT
from .counters import FixedWindowCounter as _SyncFixedWindowCounter
from .errors import ConnectionError as _StoreConnectionError
from .errors import InvalidInputError
from .limiter import (
    Item,
    OnUnavailable,
    check_on_unavailable,
    refuse_lease_all,
    slots_taken,
    unavailable_decision,
)
from .limiter import Limiter as _SyncLimiter
from .pn import PNCounter as _SyncPNCounter
from .policies import Penalty, unblock_async
from .reservations import Adjustment, AsyncReservation, new_request_id
from .shaping import Throttle
from .shaping import check_wait_args as _check_wait_args
from .shaping import shaper_of as _shaper_of
from .shaping import wait_async as _wait_async
from .sharded import Increment, check_adjust, skew_of_logs, skew_window
from .sharded import Quota as _SyncQuota
from .sharded import ShardedCounter as _SyncShardedCounter
from .skew import Skew
from .sliding import SlidingWindowCounter as _SyncSlidingWindowCounter
from .store import connect as _connect

if TYPE_CHECKING:
    from ._core import Value

__all__ = [
    "AsyncStore",
    "FixedWindowCounter",
    "Limiter",
    "PNCounter",
    "Quota",
    "ShardedCounter",
    "SlidingWindowCounter",
    "connect",
]

P = ParamSpec("P")


def _unwrap(store: Store | AsyncStore) -> Store:
    return store.store if isinstance(store, AsyncStore) else store


class AsyncStore:
    """An awaitable view of a [`Store`][redcount.store.Store], with the same vocabulary.

    ``await astore.execute("GET", key)``, ``await astore.execute_many([...])``,
    ``await astore.ping()``. The store itself is [`store`][redcount.aio.AsyncStore.store] (close it there, or use
    ``async with``). Thread-safe, like the store.
    """

    def __init__(self, store: Store) -> None:
        if isinstance(store, AsyncStore):
            store = store.store
        self.store = store
        """The [`Store`][redcount.store.Store] this view awaits."""

    async def execute(self, *args: str | bytes | int | float) -> Value:
        """Run one command; bulk strings come back as bytes, status replies as str; an error
        reply raises [`ReplyError`][redcount.errors.ReplyError] (or a subclass)."""
        r = _core.execute_async(self.store, *args)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def execute_many(self, commands: list[tuple[str | bytes | int | float, ...]]) -> list[Value]:
        """Run several commands in one round trip; error replies are returned as str."""
        r = _core.execute_many_async(self.store, commands)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def ping(self) -> bool:
        """Round-trip a PING; raises ConnectionError/AuthenticationError if the store is unusable."""
        r = _core.ping_async(self.store)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    @property
    def url(self) -> str:
        return self.store.url

    @property
    def is_memory(self) -> bool:
        return self.store.is_memory

    def close(self) -> None:
        """Close the store (every view of it)."""
        self.store.close()

    async def __aenter__(self) -> AsyncStore:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"AsyncStore({self.store.url!r})"


def connect(url: str | Sequence[str] | None = None, **options: Any) -> AsyncStore:
    """[`redcount.connect`][redcount.store.connect] for asyncio: the same arguments, an [`AsyncStore`][redcount.aio.AsyncStore]."""
    return AsyncStore(_connect(url, **options))


def _same_arguments(
    sync_cls: Callable[Concatenate[Store, P], object],
) -> Callable[[Callable[..., None]], Callable[Concatenate[Any, Store | AsyncStore, P], None]]:
    """Gives an async twin's ``__init__`` the arguments of its sync class, for type checkers
    and ``help()``: ``store`` (which may also be an [`AsyncStore`][redcount.aio.AsyncStore]), then the sync
    class's own. So every default is declared once, on the sync class."""

    def decorate(init: Callable[..., None]) -> Callable[Concatenate[Any, Store | AsyncStore, P], None]:
        sig = inspect.signature(sync_cls)
        store, *rest = sig.parameters.values()
        me = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        store = store.replace(annotation="Store | AsyncStore")
        setattr(init, "__signature__", sig.replace(parameters=[me, store, *rest]))
        return init

    return decorate


class FixedWindowCounter:
    """The asyncio twin of [`redcount.FixedWindowCounter`][redcount.counters.FixedWindowCounter]: the same arguments and
    behaviour, with [`incr`][redcount.aio.FixedWindowCounter.incr], [`incr_many`][redcount.aio.FixedWindowCounter.incr_many], [`get`][redcount.aio.FixedWindowCounter.get], [`get_many`][redcount.aio.FixedWindowCounter.get_many] and
    [`ttl`][redcount.aio.FixedWindowCounter.ttl] as coroutines.

    ``FixedWindowCounter.from_sync(counter)`` shares an existing sync counter's core (and its
    retry queue); [`sync`][redcount.aio.FixedWindowCounter.sync] is the sync twin either way. Thread-safe.
    """

    sync: _SyncFixedWindowCounter
    """The sync twin, a [`redcount.FixedWindowCounter`][redcount.counters.FixedWindowCounter], whose core this object shares."""

    @_same_arguments(_SyncFixedWindowCounter)
    def __init__(self, store: Store | AsyncStore, *args: Any, **options: Any) -> None:
        self._share(_SyncFixedWindowCounter(_unwrap(store), *args, **options))

    @classmethod
    def from_sync(cls, counter: _SyncFixedWindowCounter) -> FixedWindowCounter:
        """An async view of ``counter``, sharing its core: the same counts and retry queue."""
        self = cls.__new__(cls)
        self._share(counter)
        return self

    def _share(self, sync: _SyncFixedWindowCounter) -> None:
        self.sync = sync
        core, store = sync._core, sync.store
        self._incr = engine_method(core, "incr", store)
        self._incr_many = engine_method(core, "incr_many", store)
        self._get = engine_method(core, "get", store)
        self._get_many = engine_method(core, "get_many", store)
        self._ttl = engine_method(core, "ttl", store)

    async def incr(self, key: str | bytes, amount: int = 1, *, request_id: str | bytes | None = None) -> int:
        """Add ``amount`` to ``key``'s count in the current window; the new count (see
        [`redcount.FixedWindowCounter.incr`][redcount.counters.FixedWindowCounter.incr])."""
        r = self._incr(key, amount, request_id=request_id)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def incr_many(
        self, amounts: dict[str, int] | dict[bytes, int] | dict[str | bytes, int]
    ) -> dict[str | bytes, int]:
        """``{key: amount} -> {key: count}`` in one round trip."""
        r = self._incr_many(amounts)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def get(self, key: str | bytes) -> int:
        """The count of ``key`` in the current window (0 if none)."""
        r = self._get(key)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def get_many(self, keys: list[str] | list[bytes] | list[str | bytes]) -> dict[str | bytes, int]:
        """Counts of many keys in the current window, in one round trip."""
        r = self._get_many(keys)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def ttl(self, key: str | bytes) -> float:
        """Seconds until the current window's key expires; -2.0 if none, -1.0 if no TTL."""
        r = self._ttl(key)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def flush(self, timeout: float | None = None) -> int:
        """[`redcount.FixedWindowCounter.flush`][redcount.counters.FixedWindowCounter.flush], waited for off the loop (it waits for
        the retry thread)."""
        return await off_loop(lambda: self.sync.flush(timeout))

    async def close(self, timeout: float | None = CLOSE_TIMEOUT) -> int:
        """[`redcount.FixedWindowCounter.close`][redcount.counters.FixedWindowCounter.close] (of the shared core), off the loop."""
        return await off_loop(lambda: self.sync.close(timeout))

    def storage_key(self, key: str | bytes) -> str:
        return self.sync.storage_key(key)

    def current_window(self, key: str | bytes) -> tuple[float, float]:
        return self.sync.current_window(key)

    def stats(self) -> RetryStats:
        return self.sync.stats()

    @property
    def pending(self) -> int:
        return self.sync.pending

    @property
    def name(self) -> str:
        return self.sync.name

    @property
    def prefix(self) -> str:
        return self.sync.prefix

    @property
    def window(self) -> float:
        return self.sync.window

    @property
    def grace(self) -> float:
        return self.sync.grace

    @property
    def mode(self) -> str:
        return self.sync.mode

    @property
    def on_error(self) -> str:
        return self.sync.on_error

    @property
    def store(self) -> Store:
        return self.sync.store

    async def __aenter__(self) -> FixedWindowCounter:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close(self.sync.exit_timeout)

    def __repr__(self) -> str:
        return "redcount.aio." + repr(self.sync)


class SlidingWindowCounter:
    """The asyncio twin of [`redcount.SlidingWindowCounter`][redcount.sliding.SlidingWindowCounter]: the same arguments and
    behaviour, with [`add`][redcount.aio.SlidingWindowCounter.add], [`count`][redcount.aio.SlidingWindowCounter.count], [`add_unique`][redcount.aio.SlidingWindowCounter.add_unique], [`count_unique`][redcount.aio.SlidingWindowCounter.count_unique] and
    [`clear`][redcount.aio.SlidingWindowCounter.clear] as coroutines. ``from_sync(counter)`` shares a sync counter's core;
    [`sync`][redcount.aio.SlidingWindowCounter.sync] is the sync twin. Thread-safe.
    """

    sync: _SyncSlidingWindowCounter
    """The sync twin, a [`redcount.SlidingWindowCounter`][redcount.sliding.SlidingWindowCounter], whose core this object shares."""

    @_same_arguments(_SyncSlidingWindowCounter)
    def __init__(self, store: Store | AsyncStore, *args: Any, **options: Any) -> None:
        self._share(_SyncSlidingWindowCounter(_unwrap(store), *args, **options))

    @classmethod
    def from_sync(cls, counter: _SyncSlidingWindowCounter) -> SlidingWindowCounter:
        """An async view of ``counter``, sharing its core."""
        self = cls.__new__(cls)
        self._share(counter)
        return self

    def _share(self, sync: _SyncSlidingWindowCounter) -> None:
        self.sync = sync
        core, store = sync._core, sync.store
        self._add = engine_method(core, "add", store)
        self._count = engine_method(core, "count", store)
        self._add_unique = engine_method(core, "add_unique", store)
        self._count_unique = engine_method(core, "count_unique", store)
        self._clear = engine_method(core, "clear", store)

    async def add(self, key: str | bytes, amount: int = 1) -> int:
        """Record ``amount`` events now; the window's count including them."""
        r = self._add(key, amount)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def count(self, key: str | bytes) -> int:
        """The events of the last ``window`` seconds (read-only)."""
        r = self._count(key)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def add_unique(self, key: str | bytes, item: str | bytes) -> int:
        """Record that ``item`` was seen now; the distinct items of the window."""
        r = self._add_unique(key, item)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def count_unique(self, key: str | bytes) -> int:
        """The distinct items seen in the last ``window`` seconds (read-only)."""
        r = self._count_unique(key)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def clear(self, key: str | bytes) -> None:
        """Forget ``key``'s events and items."""
        r = self._clear(key)
        if r.__class__ is OpFuture:
            await r

    def storage_keys(self, key: str | bytes) -> tuple[str, str, str]:
        return self.sync.storage_keys(key)

    @property
    def name(self) -> str:
        return self.sync.name

    @property
    def prefix(self) -> str:
        return self.sync.prefix

    @property
    def window(self) -> float:
        return self.sync.window

    @property
    def clock(self) -> str:
        return self.sync.clock

    @property
    def store(self) -> Store:
        return self.sync.store

    def __repr__(self) -> str:
        return "redcount.aio." + repr(self.sync)


class Limiter:
    """The asyncio twin of [`redcount.Limiter`][redcount.limiter.Limiter]: the same arguments, strategies and
    decisions, with [`hit`][redcount.aio.Limiter.hit], [`test`][redcount.aio.Limiter.test], [`stats`][redcount.aio.Limiter.stats], [`reset`][redcount.aio.Limiter.reset], [`acquire`][redcount.aio.Limiter.acquire],
    [`release`][redcount.aio.Limiter.release], [`in_flight`][redcount.aio.Limiter.in_flight], [`refund`][redcount.aio.Limiter.refund], [`reserve`][redcount.aio.Limiter.reserve] and [`settle`][redcount.aio.Limiter.settle] as
    coroutines, and [`lease`][redcount.aio.Limiter.lease] as an async context manager.

    ``Limiter.from_sync(limiter)`` shares a sync limiter's core (its parsed-limit cache and
    clock); [`sync`][redcount.aio.Limiter.sync] is the sync twin either way. Thread-safe.
    """

    sync: _SyncLimiter
    """The sync twin, a [`redcount.Limiter`][redcount.limiter.Limiter], whose core this object shares."""

    @_same_arguments(_SyncLimiter)
    def __init__(self, store: Store | AsyncStore, *args: Any, **options: Any) -> None:
        self._share(_SyncLimiter(_unwrap(store), *args, **options))

    @classmethod
    def from_sync(cls, limiter: _SyncLimiter, *, on_unavailable: OnUnavailable | None = None) -> Limiter:
        """An async view of ``limiter``, sharing its core (and its ``on_unavailable``, unless
        given here)."""
        self = cls.__new__(cls)
        self._share(limiter, on_unavailable)
        return self

    def _share(self, sync: _SyncLimiter, on_unavailable: OnUnavailable | None = None) -> None:
        self.sync = sync
        self.on_unavailable: OnUnavailable = (
            sync.on_unavailable if on_unavailable is None else check_on_unavailable(on_unavailable)
        )
        core, store = sync._core, sync.store
        self._hit = engine_method(core, "hit", store)
        self._test = engine_method(core, "test", store)
        self._stats = engine_method(core, "stats", store)
        self._reset = engine_method(core, "reset", store)
        self._acquire = engine_method(core, "acquire", store)
        self._release = engine_method(core, "release", store)
        self._in_flight = engine_method(core, "in_flight", store)
        self._hit_all = engine_method(core, "hit_all", store)
        self._test_all = engine_method(core, "test_all", store)
        self._refund = engine_method(core, "refund", store)
        self._reserve = engine_method(core, "reserve", store)
        self._settle = engine_method(core, "settle", store)

    def _unavailable(self, error: BaseException) -> Decision:
        """What a call decides when the store failed: this limiter's ``on_unavailable``."""
        return unavailable_decision(self.on_unavailable, error)

    async def _leased_guarded(
        self,
        limit: str | LimitSet,
        key: str | bytes,
        cost: int,
        lease: int,
        tag: str | None,
        penalty: object,
        charge: bool,
    ) -> Decision:
        """A leased ``hit`` (``charge``) or ``test`` on a limiter with lists, a refusal cache or
        a penalty: the lease decides in this process, so the core's guard steps go around it
        (the lists and the cache, the block as a PTTL of its own, then a refusal counted by
        the penalty and filed in the cache)."""
        core = self.sync._core
        d: Decision | None = core._decide_locally(limit, key, cost, tag, penalty)
        if d is not None:
            return d
        r = core._block_check_async(limit, key, penalty)
        d = (await r) if r.__class__ is OpFuture else r
        if d is not None:
            return d
        if charge:
            r = self._hit(limit, key, cost, lease=lease, tag=tag, penalty=False)
        else:
            r = self._test(limit, key, cost, lease=lease, tag=tag)
        got: Decision = (await r) if r.__class__ is OpFuture else r
        if got.allowed or got.unavailable:
            return got
        r = core._after_async(limit, key, cost, tag, penalty, got, charge)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def refund(
        self,
        limit: str | LimitSet,
        key: str | bytes,
        cost: int = 1,
        *,
        request_id: str | bytes | None = None,
        tag: str | None = None,
        decision: Decision | None = None,
    ) -> Adjustment:
        """Give back up to ``cost`` units, once per ``request_id``, where ``decision`` (the
        hit's) charged: see [`redcount.Limiter.refund`][redcount.limiter.Limiter.refund]."""
        self.sync._forget(key, tag)
        r = self._refund(limit, key, cost, request_id=request_id, tag=tag, decision=decision)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def reserve(
        self,
        limit: str | LimitSet,
        key: str | bytes,
        cost: int,
        *,
        request_id: str | bytes | None = None,
        deadline: float = 60.0,
        tag: str | None = None,
    ) -> AsyncReservation:
        """Charge an estimate and record the reservation: see [`redcount.Limiter.reserve`][redcount.limiter.Limiter.reserve]."""
        rid = new_request_id() if request_id is None else request_id
        r = self._reserve(limit, key, cost, request_id=rid, deadline=deadline, tag=tag)
        adjustment = (await r) if r.__class__ is OpFuture else r
        return AsyncReservation(self, limit, key, rid, adjustment, tag)

    async def settle(
        self,
        limit: str | LimitSet,
        key: str | bytes,
        *,
        request_id: str | bytes,
        actual: int,
        tag: str | None = None,
    ) -> Adjustment:
        """Settle a reservation at ``actual``, once: see [`redcount.Limiter.settle`][redcount.limiter.Limiter.settle]."""
        self.sync._forget(key, tag)
        r = self._settle(limit, key, request_id=request_id, actual=actual, tag=tag)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def hit(
        self,
        limit: str | LimitSet,
        key: str | bytes,
        cost: int = 1,
        *,
        lease: int | None = None,
        tag: str | None = None,
        penalty: Penalty | Literal[False] | None = None,
    ) -> Decision:
        """Charge ``cost`` against ``key`` if every limit allows it; the [`Decision`][redcount.limiter.Decision]
        (``on_unavailable`` as in [`redcount.Limiter`][redcount.limiter.Limiter]). ``lease=N``: a leased limit, as
        in [`redcount.Limiter.hit`][redcount.limiter.Limiter.hit] (a local admission completes without the loop).
        ``tag``: the key's state under that hash tag, as in [`redcount.Limiter.hit`][redcount.limiter.Limiter.hit].
        ``penalty``: this call's penalty, as in [`redcount.Limiter.hit`][redcount.limiter.Limiter.hit]."""
        try:
            if lease is not None and ((penalty is not None and penalty is not False) or self.sync._core._guarded):
                return await self._leased_guarded(limit, key, cost, lease, tag, penalty, True)
            if lease is None and tag is None and penalty is None:
                r = self._hit(limit, key, cost)
            else:
                r = self._hit(limit, key, cost, lease=lease, tag=tag, penalty=penalty)
            return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]
        except _StoreConnectionError as e:
            return unavailable_decision(self.on_unavailable, e)

    async def test(
        self,
        limit: str | LimitSet,
        key: str | bytes,
        cost: int = 1,
        *,
        lease: int | None = None,
        tag: str | None = None,
    ) -> Decision:
        """What [`hit`][redcount.aio.Limiter.hit] would decide now, without charging anything. ``lease=N``: from this
        process's lease of ``key`` when it holds ``cost`` units (no round trip), else by the
        store; never takes a lease (as [`redcount.Limiter.test`][redcount.limiter.Limiter.test]). ``tag``: as in [`hit`][redcount.aio.Limiter.hit]."""
        try:
            if lease is not None and self.sync._core._guarded:
                return await self._leased_guarded(limit, key, cost, lease, tag, None, False)
            if lease is None and tag is None:
                r = self._test(limit, key, cost)
            else:
                r = self._test(limit, key, cost, lease=lease, tag=tag)
            return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]
        except _StoreConnectionError as e:
            return unavailable_decision(self.on_unavailable, e)

    async def hit_all(
        self,
        items: Iterable[Item],
        cost: int = 1,
        *,
        tag: str | None = None,
        penalty: Penalty | Literal[False] | None = None,
        lease: int | None = None,
    ) -> Decision:
        """One decision across several ``(limit, key)`` pairs, all or nothing, in one round
        trip: see [`redcount.Limiter.hit_all`][redcount.limiter.Limiter.hit_all] (``penalty`` as there; ``lease=`` refused
        as there)."""
        refuse_lease_all(lease)
        try:
            r = self._hit_all(items, cost, tag=tag, penalty=penalty)
            return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]
        except _StoreConnectionError as e:
            return unavailable_decision(self.on_unavailable, e)

    async def test_all(self, items: Iterable[Item], cost: int = 1, *, tag: str | None = None) -> Decision:
        """What [`hit_all`][redcount.aio.Limiter.hit_all] would decide now, without charging anything."""
        try:
            r = self._test_all(items, cost, tag=tag)
            return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]
        except _StoreConnectionError as e:
            return unavailable_decision(self.on_unavailable, e)

    async def stats(self, limit: str | LimitSet, key: str | bytes, *, tag: str | None = None) -> list[LimitStats]:
        """The count, remaining hits and reset time of ``key`` under each limit (under
        ``tag``: see [`redcount.Limiter.stats`][redcount.limiter.Limiter.stats])."""
        r = self._stats(limit, key, tag=tag)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def reset(self, limit: str | LimitSet, key: str | bytes, *, tag: str | None = None) -> None:
        """Forget ``key``'s state under these limits (under ``tag`` when given)."""
        r = self._reset(limit, key, tag=tag)
        if r.__class__ is OpFuture:
            await r

    async def acquire(self, max_in_flight: int, key: str | bytes, *, lease_timeout: float = 60.0) -> Lease | None:
        """Take one of ``key``'s ``max_in_flight`` slots, or None when all are taken."""
        r = self._acquire(max_in_flight, key, lease_timeout=lease_timeout)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def release(self, lease: Lease) -> bool:
        """Give the slot back: True when the lease was still held."""
        r = self._release(lease)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def in_flight(self, key: str | bytes) -> int:
        """Leases of ``key`` held now."""
        r = self._in_flight(key)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def unblock(self, key: str | bytes) -> int:
        """See [`redcount.Limiter.unblock`][redcount.limiter.Limiter.unblock]."""
        sync = self.sync
        return await unblock_async(sync.store, sync.prefix, sync._core, key)

    @asynccontextmanager
    async def lease(self, max_in_flight: int, key: str | bytes, *, lease_timeout: float = 60.0) -> AsyncIterator[Lease]:
        """``async with limiter.lease(5, "user:1") as lease: ...``: holds a slot for the block.

        Raises [`RateLimitExceeded`][redcount.errors.RateLimitExceeded] when all slots are taken; releases the
        slot when the block ends, even by an exception or a cancellation."""
        got = await self.acquire(max_in_flight, key, lease_timeout=lease_timeout)
        if got is None:
            raise slots_taken(max_in_flight, key)
        try:
            yield got
        finally:
            if not got.released:
                await self.release(got)

    @property
    def clock(self) -> str:
        return self.sync.clock

    @property
    def strategy(self) -> str:
        return self.sync.strategy

    @property
    def prefix(self) -> str:
        return self.sync.prefix

    @property
    def sub_buckets(self) -> int:
        return self.sync.sub_buckets

    @property
    def store(self) -> Store:
        return self.sync.store

    def __repr__(self) -> str:
        return "redcount.aio." + repr(self.sync)

    async def wait(
        self, limit: str | LimitSet, key: str | bytes, cost: int = 1, *, max_wait: float | None = None
    ) -> Decision:
        """See [`redcount.Limiter.wait`][redcount.limiter.Limiter.wait]: the same arguments, result and errors
        ([`WaitTimeout`][redcount.errors.WaitTimeout] when ``max_wait`` runs out), waiting without
        blocking the loop. Coroutines queue per (event loop, limit, key) in the order they
        call ``wait``. A cancelled waiter leaves the queue and charges nothing (a call to
        the store already in flight is left to finish; an admission it made goes to the
        next waiter of the same cost)."""
        shaper = _shaper_of(self.sync)
        return await _wait_async(shaper, self.hit, self.sync.strategy, limit, key, cost, max_wait)

    def waiting(self, limit: str | LimitSet, key: str | bytes) -> int:
        """See [`redcount.Limiter.waiting`][redcount.limiter.Limiter.waiting] (no store call, so not a coroutine)."""
        return self.sync.waiting(limit, key)

    def throttle(
        self, limit: str | LimitSet, key: str | bytes, cost: int = 1, *, max_wait: float | None = None
    ) -> Throttle:
        """See [`redcount.Limiter.throttle`][redcount.limiter.Limiter.throttle]: the same decorator (coroutine functions
        wait on the loop, plain functions block their thread)."""
        _check_wait_args(limit, key, cost, self.sync.strategy, max_wait)
        return Throttle(
            lambda: self.sync.wait(limit, key, cost, max_wait=max_wait),
            lambda: self.wait(limit, key, cost, max_wait=max_wait),
        )


class ShardedCounter:
    """The asyncio twin of [`redcount.ShardedCounter`][redcount.sharded.ShardedCounter]: the same arguments and
    behaviour, with [`incr`][redcount.aio.ShardedCounter.incr], [`decr`][redcount.aio.ShardedCounter.decr], [`incr_many`][redcount.aio.ShardedCounter.incr_many], [`value`][redcount.aio.ShardedCounter.value],
    [`shard_values`][redcount.aio.ShardedCounter.shard_values], [`values`][redcount.aio.ShardedCounter.values] and [`read`][redcount.aio.ShardedCounter.read] as coroutines.
    ``from_sync(counter)`` shares a sync counter's core (its read cache and retry queue);
    [`sync`][redcount.aio.ShardedCounter.sync] is the sync twin. Thread-safe.
    """

    sync: _SyncShardedCounter
    """The sync twin, a [`redcount.ShardedCounter`][redcount.sharded.ShardedCounter], whose core this object shares."""

    @_same_arguments(_SyncShardedCounter)
    def __init__(self, store: Store | AsyncStore, *args: Any, **options: Any) -> None:
        self._share(_SyncShardedCounter(_unwrap(store), *args, **options))

    @classmethod
    def from_sync(cls, counter: _SyncShardedCounter) -> ShardedCounter:
        """An async view of ``counter``, sharing its core."""
        self = cls.__new__(cls)
        self._share(counter)
        return self

    def _share(self, sync: _SyncShardedCounter) -> None:
        self.sync = sync
        core, store = sync._core, sync.store
        self._incr = engine_method(core, "incr", store)
        self._decr = engine_method(core, "decr", store)
        self._incr_many = engine_method(core, "incr_many", store)
        self._adjust = engine_method(core, "adjust", store)
        self._value = engine_method(core, "value", store)
        self._shard_values = engine_method(core, "shard_values", store)
        self._values = engine_method(core, "values", store)
        self._read = engine_method(core, "read", store)
        self._reshard = engine_method(core, "reshard", store)
        self._layout = engine_method(core, "layout", store)

    async def incr(self, amount: int = 1, *, request_id: str | bytes | None = None) -> bool:
        """See [`redcount.ShardedCounter.incr`][redcount.sharded.ShardedCounter.incr]."""
        r = self._incr(amount, request_id=request_id)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def decr(self, amount: int = 1, *, request_id: str | bytes | None = None) -> bool:
        """``incr(-amount)``."""
        r = self._decr(amount, request_id=request_id)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def adjust(self, delta: int, reason: str, *, request_id: str | bytes | None = None) -> bool:
        """See [`redcount.ShardedCounter.adjust`][redcount.sharded.ShardedCounter.adjust]."""
        check_adjust(delta, reason)
        r = self._adjust(delta, reason, request_id=request_id)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def incr_many(self, items: list[Increment]) -> list[bool]:
        """See [`redcount.ShardedCounter.incr_many`][redcount.sharded.ShardedCounter.incr_many]."""
        r = self._incr_many(items)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def value(self) -> int:
        """All shards summed, in one round trip."""
        r = self._value()
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def shard_values(self) -> list[int]:
        """Each shard's value, in shard order."""
        r = self._shard_values()
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def values(self, names: list[str]) -> dict[str, int]:
        """``{name: value}`` of counters with this prefix (each with its own layout)."""
        r = self._values(list(names))
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def read(self, max_staleness: float = 0.25) -> Reading:
        """See [`redcount.ShardedCounter.read`][redcount.sharded.ShardedCounter.read]."""
        r = self._read(max_staleness)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def reshard(self, new_shards: int) -> ShardLayout:
        """See [`redcount.ShardedCounter.reshard`][redcount.sharded.ShardedCounter.reshard]."""
        r = self._reshard(new_shards)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def layout(self) -> ShardLayout:
        """See [`redcount.ShardedCounter.layout`][redcount.sharded.ShardedCounter.layout]."""
        r = self._layout()
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    @property
    def cached_layout(self) -> ShardLayout:
        return self.sync.cached_layout

    async def skew(self, window: float = 60.0, target_per_shard: float | None = None) -> Skew:
        """See [`redcount.ShardedCounter.skew`][redcount.sharded.ShardedCounter.skew]."""
        window_ms, min_id = skew_window(window, self.sync.store)
        gen = (await self.layout()).current
        logs = await AsyncStore(self.sync.store).execute_many(
            [("XRANGE", self.key_of(i, "log"), min_id, "+") for i in gen.shards]
        )
        return skew_of_logs(logs, window_ms, target_per_shard)

    async def flush(self, timeout: float | None = None) -> int:
        """[`redcount.ShardedCounter.flush`][redcount.sharded.ShardedCounter.flush], waited for off the loop."""
        return await off_loop(lambda: self.sync.flush(timeout))

    async def close(self, timeout: float | None = CLOSE_TIMEOUT) -> int:
        """[`redcount.ShardedCounter.close`][redcount.sharded.ShardedCounter.close] (of the shared core), off the loop."""
        return await off_loop(lambda: self.sync.close(timeout))

    def shard_of(self, request_id: str | bytes) -> int:
        return self.sync.shard_of(request_id)

    def key_of(self, shard: int, suffix: str = "") -> str:
        return self.sync.key_of(shard, suffix)

    def stats(self) -> RetryStats:
        return self.sync.stats()

    @property
    def pending(self) -> int:
        return self.sync.pending

    @property
    def name(self) -> str:
        return self.sync.name

    @property
    def shards(self) -> int:
        return self.sync.shards

    @property
    def store(self) -> Store:
        return self.sync.store

    async def __aenter__(self) -> ShardedCounter:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close(self.sync.exit_timeout)

    def __repr__(self) -> str:
        return "redcount.aio." + repr(self.sync)


class Quota:
    """The asyncio twin of [`redcount.Quota`][redcount.sharded.Quota]: the same arguments and behaviour, with
    [`take`][redcount.aio.Quota.take], [`give`][redcount.aio.Quota.give], [`set`][redcount.aio.Quota.set] and [`value`][redcount.aio.Quota.value] as coroutines.
    ``from_sync(quota)`` shares a sync quota's core; [`sync`][redcount.aio.Quota.sync] is the sync twin.
    Thread-safe.
    """

    sync: _SyncQuota
    """The sync twin, a [`redcount.Quota`][redcount.sharded.Quota], whose core this object shares."""

    @_same_arguments(_SyncQuota)
    def __init__(self, store: Store | AsyncStore, *args: Any, **options: Any) -> None:
        self._share(_SyncQuota(_unwrap(store), *args, **options))

    @classmethod
    def from_sync(cls, quota: _SyncQuota) -> Quota:
        """An async view of ``quota``, sharing its core."""
        self = cls.__new__(cls)
        self._share(quota)
        return self

    def _share(self, sync: _SyncQuota) -> None:
        self.sync = sync
        core, store = sync._core, sync.store
        self._take = engine_method(core, "take", store)
        self._give = engine_method(core, "give", store)
        self._set = engine_method(core, "set", store)
        self._value = engine_method(core, "value", store)

    async def take(self, n: int = 1, *, request_id: str | bytes | None = None) -> QuotaResult:
        """See [`redcount.Quota.take`][redcount.sharded.Quota.take]."""
        r = self._take(n, request_id=request_id)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def give(self, n: int = 1, *, request_id: str | bytes | None = None) -> QuotaResult:
        """See [`redcount.Quota.give`][redcount.sharded.Quota.give]."""
        r = self._give(n, request_id=request_id)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def set(self, value: int) -> QuotaResult:
        """See [`redcount.Quota.set`][redcount.sharded.Quota.set]."""
        r = self._set(value)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def value(self) -> int:
        """The current value."""
        r = self._value()
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    def storage_key(self) -> str:
        return self.sync.storage_key()

    def current_period(self) -> tuple[float, float] | None:
        """``(start, end)`` of the current period; None without a ``reset``."""
        return self.sync.current_period()

    @property
    def name(self) -> str:
        return self.sync.name

    @property
    def store(self) -> Store:
        return self.sync.store

    def __repr__(self) -> str:
        return "redcount.aio." + repr(self.sync)


class PNCounter:
    """The asyncio twin of [`redcount.PNCounter`][redcount.pn.PNCounter]: the same arguments and behaviour,
    with [`incr`][redcount.aio.PNCounter.incr], [`decr`][redcount.aio.PNCounter.decr], [`value`][redcount.aio.PNCounter.value], [`components`][redcount.aio.PNCounter.components], [`merge`][redcount.aio.PNCounter.merge] and
    [`merge_components`][redcount.aio.PNCounter.merge_components] as coroutines. ``from_sync(counter)`` shares a sync counter's
    core; [`sync`][redcount.aio.PNCounter.sync] is the sync twin. Thread-safe.
    """

    sync: _SyncPNCounter
    """The sync twin, a [`redcount.PNCounter`][redcount.pn.PNCounter], whose core this object shares."""

    @_same_arguments(_SyncPNCounter)
    def __init__(self, store: Store | AsyncStore, *args: Any, **options: Any) -> None:
        self._share(_SyncPNCounter(_unwrap(store), *args, **options))

    @classmethod
    def from_sync(cls, counter: _SyncPNCounter) -> PNCounter:
        """An async view of ``counter``, sharing its core."""
        self = cls.__new__(cls)
        self._share(counter)
        return self

    def _share(self, sync: _SyncPNCounter) -> None:
        self.sync = sync
        core, store = sync._core, sync.store
        self._incr = engine_method(core, "incr", store)
        self._decr = engine_method(core, "decr", store)
        self._value = engine_method(core, "value", store)
        self._components = engine_method(core, "components", store)
        self._merge_components = engine_method(core, "merge_components", store)

    async def incr(self, amount: int = 1) -> int:
        """See [`redcount.PNCounter.incr`][redcount.pn.PNCounter.incr]."""
        r = self._incr(amount)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def decr(self, amount: int = 1) -> int:
        """See [`redcount.PNCounter.decr`][redcount.pn.PNCounter.decr]."""
        r = self._decr(amount)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def value(self) -> int:
        """See [`redcount.PNCounter.value`][redcount.pn.PNCounter.value]."""
        r = self._value()
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def components(self) -> dict[str, tuple[int, int]]:
        """See [`redcount.PNCounter.components`][redcount.pn.PNCounter.components]."""
        r = self._components()
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def merge_components(self, components: dict[str, tuple[int, int]]) -> int:
        """See [`redcount.PNCounter.merge_components`][redcount.pn.PNCounter.merge_components]."""
        r = self._merge_components(components)
        return (await r) if r.__class__ is OpFuture else r  # type: ignore[no-any-return]

    async def merge(self, other: Store | AsyncStore | PNCounter | _SyncPNCounter) -> int:
        """See [`redcount.PNCounter.merge`][redcount.pn.PNCounter.merge]: the read on ``other`` and the merge here are
        each awaited, one after the other."""
        if isinstance(other, (PNCounter, _SyncPNCounter)):
            if other.name != self.name:
                raise InvalidInputError(f"cannot merge PN-counter {other.name!r} into {self.name!r}")
            there = other if isinstance(other, PNCounter) else PNCounter.from_sync(other)
        else:
            there = PNCounter(_unwrap(other), self.name, self.region, prefix=self.sync.prefix)
        return await self.merge_components(await there.components())

    def storage_keys(self) -> tuple[str, str]:
        return self.sync.storage_keys()

    @property
    def name(self) -> str:
        return self.sync.name

    @property
    def region(self) -> str:
        return self.sync.region

    @property
    def store(self) -> Store:
        return self.sync.store

    def __repr__(self) -> str:
        return "redcount.aio." + repr(self.sync)
