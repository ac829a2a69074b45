"""How an asyncio call completes: the runtime under [`redcount.aio`][redcount.aio].

A call that cannot complete inline returns an `OpFuture`; the store's I/O thread
finishes it through the running loop's completion queue (one eventfd wake-up completes every
call finished since the last one; see [`redcount.aio`][redcount.aio]). Everything here is shared by the
async twins and by [`redcount.Limiter.throttle`][redcount.limiter.Limiter.throttle], which waits on a loop without importing
[`redcount.aio`][redcount.aio] (that module builds on the sync classes, so they must not import it).
"""

from __future__ import annotations

import asyncio
import os
import select
import threading
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from . import _core
from ._core import CompletionQueue, Store

T = TypeVar("T")


class OpFuture(asyncio.Future[Any]):
    """The future of one call that did not complete inline. Cancelling it cancels the
    operation in the store (an unsent batch is dropped, a late reply discarded).

    ``_core._aio_setup`` gives this class its ``add_done_callback``: asyncio's, as a C
    method that also notes the callbacks added, so that the core, completing the future,
    can run the awaiting task's wake-up at once instead of through ``loop.call_soon``."""

    __slots__ = ()

    def cancel(self, msg: Any | None = None) -> bool:
        if not self.done():
            _core._aio_cancel(self)
        return super().cancel(msg)


# The completion queue of each loop; a loop's queue lives as long as the loop.
# (The core remembers the last loop's queue itself and calls this only for another loop.)
queues: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, CompletionQueue] = weakref.WeakKeyDictionary()


def close_queues_of_closed_loops() -> None:
    """Closes the queues of loops that were closed: a future still pending there (one nobody
    awaited, say) would otherwise keep its loop, and so its own entry here, alive for good."""
    for loop, q in list(queues.items()):
        if loop.is_closed():
            q.close()
            queues.pop(loop, None)


def queue_for_running_loop() -> CompletionQueue:
    """The running loop's completion queue, made and registered with the loop on first use."""
    loop = asyncio.get_running_loop()
    q = queues.get(loop)
    if q is None:
        close_queues_of_closed_loops()  # once per new loop: a process running loop after loop
        q = CompletionQueue(loop)
        try:
            loop.add_reader(q.fd, q.drain)
        except NotImplementedError:  # a loop that cannot watch an fd
            q.use_call_soon_threadsafe()
            start_waker(loop, q)
        queues[loop] = q
    return q


WAKER_POLL = 0.1  # how soon a waker notices that its loop was closed or is gone


def start_waker(loop: asyncio.AbstractEventLoop, q: CompletionQueue) -> None:
    """For a loop without ``add_reader``: a daemon thread waits on the queue's fd and wakes
    the loop with ``call_soon_threadsafe(q.drain)``, once per signal. So the store's I/O
    thread never takes the GIL (at interpreter exit that could end or park it inside the
    core). The thread holds the loop weakly and ends soon after the loop is closed or gone."""
    loop_ref = weakref.ref(loop)
    fd = q.fd

    def wake() -> None:
        while not q.closed:
            ready, _, _ = select.select([fd], [], [], WAKER_POLL)
            target = loop_ref()
            if target is None or target.is_closed():
                return
            if ready:
                try:
                    os.read(fd, 64)  # an eventfd is reset by one read; a pipe may hold several bytes
                except BlockingIOError:
                    pass
                try:
                    target.call_soon_threadsafe(q.drain)
                except RuntimeError:  # closed meanwhile
                    return
            del target

    threading.Thread(target=wake, name="redcount-aio-waker", daemon=True).start()


_core._aio_setup(OpFuture, queue_for_running_loop)


def engine_method(core: object, name: str, store: Store) -> Callable[..., Any]:
    """How an async class calls ``name``: on the memory store the sync core method itself
    (it completes inline and cannot block); elsewhere the core's ``<name>_async``, which
    returns the result or an `OpFuture`."""
    if store.is_memory:
        return getattr(core, name)  # type: ignore[no-any-return]
    return getattr(core, name + "_async")  # type: ignore[no-any-return]


def awaitable_method(core: object, name: str, store: Store) -> Callable[..., Awaitable[Any]]:
    """``engine_method`` as a coroutine function (for callers off the hot path; the async
    classes inline the same two lines)."""
    method = engine_method(core, name, store)

    async def call(*args: Any, **kwargs: Any) -> Any:
        r = method(*args, **kwargs)
        return (await r) if r.__class__ is OpFuture else r

    return call


async def off_loop(fn: Callable[[], T]) -> T:
    """Runs ``fn`` in the default executor: only for calls that wait on a background thread
    (a retry queue's flush or close), never for a request."""
    return await asyncio.get_running_loop().run_in_executor(None, fn)
