"""An event loop that ends with redcount calls in flight is freed, with its file descriptors.

A process that runs ``asyncio.run`` per task ends many loops while calls are still in flight
(``asyncio.wait_for`` gave up, the task was cancelled, a future was dropped). Neither the
call still waiting in the store, nor its late completion, may keep that loop (or the eventfd
of its completion queue) alive: after many such runs no loop is left (``gc`` and
``weakref``) and the process's fd count is back where it started. The server is a real
redis-server, SIGSTOPped so that every call stays in flight until the test continues it.
"""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import sys
import weakref
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
import redcount
import redcount.aio as aio
import uvloop
from conftest import RedisServer
from helpers import wait_until
from redcount import _aio_runtime, _core

RUNS = int(os.environ.get("REDCOUNT_LOOP_RUNS", "500"))
FD_SLACK = 3  # a loop or two being torn down by the collector at the moment of counting


class NoReaderLoop(asyncio.SelectorEventLoop):
    """A loop whose add_reader is missing, as on Windows' proactor loop."""

    def add_reader(self, fd: Any, callback: Callable[..., Any], *args: Any) -> None:  # type: ignore[override]
        raise NotImplementedError


LOOPS: dict[str, tuple[Callable[[], asyncio.AbstractEventLoop], int]] = {
    "asyncio": (asyncio.new_event_loop, RUNS),
    "uvloop": (uvloop.new_event_loop, max(RUNS // 5, 1)),
    "call_soon_threadsafe": (NoReaderLoop, max(RUNS // 5, 1)),
}


def run_on_new_loop(factory: Callable[[], asyncio.AbstractEventLoop],
                    coro: Coroutine[Any, Any, None]) -> None:
    """asyncio.run on a loop of the kind under test (asyncio.Runner's loop_factory is 3.11+)."""
    loop = factory()
    try:
        loop.run_until_complete(coro)
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


def live(loops: list[weakref.ref[asyncio.AbstractEventLoop]]) -> int:
    gc.collect()
    return sum(1 for r in loops if r() is not None)


@pytest.fixture
def frozen(redis_factory: Callable[..., RedisServer]) -> Iterator[tuple[RedisServer, redcount.Store]]:
    """A store connected to a server that is then SIGSTOPped (continued at the end)."""
    server = redis_factory()
    store = redcount.connect(server.url, command_timeout=60)
    store.ping()
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)
    try:
        yield server, store
    finally:
        if server.proc.poll() is None:
            os.kill(server.proc.pid, signal.SIGCONT)
        store.close()


def thaw(server: RedisServer, store: redcount.Store) -> None:
    """Continue the server and wait until every late reply has been handed back: replies on a
    connection come in order, so a ping sent now returns after all of them."""
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGCONT)
    assert store.ping()


Frozen = tuple[RedisServer, redcount.Store]


@pytest.mark.parametrize("kind", list(LOOPS))
def test_loops_that_end_while_a_call_waits_are_freed(kind: str, frozen: Frozen) -> None:
    server, store = frozen
    factory, runs = LOOPS[kind]
    astore = aio.AsyncStore(store)
    counter = aio.FixedWindowCounter(astore, "lifetime", 3600)
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def gives_up() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(astore.ping(), 0.002)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(counter.incr("k"), 0.002)

    # One run first, so that what is made once per process (and the fd of the first loop's
    # bookkeeping) is counted in the baseline.
    run_on_new_loop(factory, gives_up())
    baseline = fd_count()
    for _ in range(runs):
        run_on_new_loop(factory, gives_up())
    # (A loop without add_reader has a waker thread, which ends within WAKER_POLL of its loop.)
    wait_until(lambda: live(loops) == 0, timeout=5, what="no loop kept alive by the calls still waiting")
    wait_until(lambda: fd_count() <= baseline + FD_SLACK, timeout=5, what="the fds back to the baseline")

    # The late replies complete calls whose loops are gone: nothing may bring them back.
    thaw(server, store)
    assert live(loops) == 0
    assert fd_count() <= baseline + FD_SLACK


def test_a_loop_closed_with_a_future_nobody_awaited_is_freed(frozen: Frozen) -> None:
    """A future made and dropped, never awaited nor cancelled: its loop ends, then its late
    completion arrives."""
    server, store = frozen
    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

    async def drops_a_future() -> None:
        loops.append(weakref.ref(asyncio.get_running_loop()))
        fut = _core.ping_async(store)
        assert fut.__class__ is _aio_runtime.OpFuture

    asyncio.run(drops_a_future())
    baseline = fd_count()
    for _ in range(max(RUNS // 5, 1)):
        asyncio.run(drops_a_future())
    thaw(server, store)

    async def one_more_call() -> None:
        assert await aio.AsyncStore(store).ping()

    asyncio.run(one_more_call())
    wait_until(lambda: live(loops) == 0, what="every loop freed")
    assert fd_count() <= baseline + FD_SLACK


def test_a_late_completion_whose_queue_is_gone_lets_go_of_its_future(frozen: Frozen) -> None:
    """The store's I/O thread may end up the last owner of a completion that still holds its
    future (here: the loop's queue was dropped by hand before the reply came); it cannot
    touch Python, so the future is released on the main thread a moment later."""
    server, store = frozen
    from redcount._core import _testing

    before = _testing.inflight()
    held: list[Any] = []

    async def drop_the_queue() -> None:
        held.append(_core.ping_async(store))
        _aio_runtime.queues.clear()

    asyncio.run(drop_the_queue())
    fut = held.pop()
    owners = sys.getrefcount(fut)
    assert _testing.inflight() == before + 1
    thaw(server, store)
    wait_until(lambda: sys.getrefcount(fut) == owners - 1, what="the completion's reference released")
    assert _testing.inflight() == before
    assert not fut.done()  # its loop is closed: nothing completes it
