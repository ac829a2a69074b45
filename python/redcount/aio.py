"""Native asyncio: awaitable stores, counters and limiters.

::

    import redcount, redcount.aio

    store = redcount.connect("redis://localhost:6379/0")   # the same store object as for sync code
    limiter = redcount.aio.Limiter(store, "sliding-window")
    if not await limiter.hit("10/minute", "ip:203.0.113.9"):
        ...  # 429

    astore = redcount.aio.AsyncStore(store)
    await astore.execute("GET", "k")

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

Not there yet: until the I/O engine (issue 7) lands, a Redis store runs each batch on the
calling thread, so an await on Redis blocks the loop for one round trip; and the counters'
and limiters' async calls on Redis need the core's operation bindings (``hit_async``...):
without them they raise ``NotImplementedError`` (the memory store works fully).
"""

from __future__ import annotations

import asyncio
import weakref
from types import TracebackType
from typing import TYPE_CHECKING, Any

from . import _core
from ._core import CompletionQueue, Store
from .store import connect as _connect

if TYPE_CHECKING:
    from ._core import Value

__all__ = ["AsyncStore", "connect"]


class _OpFuture(asyncio.Future[Any]):
    """The future of one call that did not complete inline. Cancelling it cancels the
    operation in the store (an unsent batch is dropped, a late reply discarded)."""

    __slots__ = ()

    def cancel(self, msg: Any | None = None) -> bool:
        if not self.done():
            _core._aio_cancel(self)
        return super().cancel(msg)


# The completion queue of each loop; a loop's queue lives as long as the loop.
_queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, CompletionQueue] = weakref.WeakKeyDictionary()
_last: tuple[weakref.ref[asyncio.AbstractEventLoop], CompletionQueue] | None = None


def _queue_for_running_loop() -> CompletionQueue:
    """The running loop's completion queue, made and registered with the loop on first use."""
    global _last
    loop = asyncio.get_running_loop()
    last = _last
    if last is not None and last[0]() is loop:
        return last[1]
    q = _queues.get(loop)
    if q is None:
        q = CompletionQueue(loop)
        try:
            loop.add_reader(q.fd, q.drain)
        except NotImplementedError:  # e.g. the proactor loop on Windows
            q.use_call_soon_threadsafe()
        _queues[loop] = q
    _last = (weakref.ref(loop), q)
    return q


_core._aio_setup(_OpFuture, _queue_for_running_loop)


class AsyncStore:
    """An awaitable view of a :class:`~redcount.Store`, with the same vocabulary.

    ``await astore.execute("GET", key)``, ``await astore.execute_many([...])``,
    ``await astore.ping()``. The store itself is :attr:`store` (close it there, or use
    ``async with``). Thread-safe, like the store.
    """

    def __init__(self, store: Store) -> None:
        if isinstance(store, AsyncStore):
            store = store.store
        self.store = store

    async def execute(self, *args: str | bytes | int | float) -> Value:
        """Run one command; bulk strings come back as bytes, status replies as str; an error
        reply raises :class:`~redcount.ReplyError` (or a subclass)."""
        r = _core.execute_async(self.store, *args)
        return (await r) if r.__class__ is _OpFuture else r  # type: ignore[no-any-return]

    async def execute_many(self, commands: list[tuple[str | bytes | int | float, ...]]) -> list[Value]:
        """Run several commands in one round trip; error replies are returned as str."""
        r = _core.execute_many_async(self.store, commands)
        return (await r) if r.__class__ is _OpFuture else r  # type: ignore[no-any-return]

    async def ping(self) -> bool:
        """Round-trip a PING; raises ConnectionError/AuthenticationError if the store is unusable."""
        r = _core.ping_async(self.store)
        return (await r) if r.__class__ is _OpFuture else r  # type: ignore[no-any-return]

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


def connect(url: str | None = None, **options: Any) -> AsyncStore:
    """:func:`redcount.connect` for asyncio: the same arguments, an :class:`AsyncStore`."""
    return AsyncStore(_connect(url, **options))
