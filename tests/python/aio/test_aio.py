"""redcount.aio: awaitable stores, counters and limiters.

Every test runs on asyncio's default loop, on uvloop, and on a loop without ``add_reader``
(the ``call_soon_threadsafe`` fallback). Stores: the memory store and Redis complete calls
inline today (Redis until the I/O engine lands); ``deferred-*`` wraps either in
``_testing.DeferredStore``, which completes batches on a worker thread as the engine will, so
futures, the completion queue and cancellation are exercised for real. ``_testing`` is the
test-only submodule ``redcount._core._testing`` (built with -DREDCOUNT_TEST_HOOKS=ON, as
tests/run_all.sh does).
"""

from __future__ import annotations

import asyncio
import contextvars
import gc
import importlib
import random
import sys
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any, TypeVar

import pytest
import redcount
import redcount.aio as aio
import uvloop
from conftest import RedisServer
from redcount import _aio_runtime, _core

try:
    from redcount._core import _testing
except ImportError as e:  # a build without the test-only submodule
    raise ImportError("these tests need redcount built with -DREDCOUNT_TEST_HOOKS=ON (tests/run_all.sh does)") from e

T = TypeVar("T")
Runner = Callable[[Coroutine[Any, Any, T]], T]



class NoReaderLoop(asyncio.SelectorEventLoop):
    """A loop whose add_reader is missing, as on Windows' proactor loop."""

    def add_reader(self, fd: Any, callback: Callable[..., Any], *args: Any) -> None:
        raise NotImplementedError


LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "asyncio": asyncio.new_event_loop,
    "uvloop": uvloop.new_event_loop,
    "call_soon_threadsafe": NoReaderLoop,
}


@pytest.fixture(params=list(LOOPS))
def run(request: pytest.FixtureRequest) -> Iterator[Runner[Any]]:
    """Runs a coroutine to completion on a fresh loop of the kind under test."""
    loops: list[asyncio.AbstractEventLoop] = []

    def runner(coro: Coroutine[Any, Any, T]) -> T:
        loop = LOOPS[request.param]()
        loops.append(loop)
        return loop.run_until_complete(coro)

    yield runner
    for loop in loops:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
    assert _testing.inflight() == 0  # no future left registered for cancellation


def _open(request: pytest.FixtureRequest, kind: str) -> redcount.Store:
    if kind == "memory":
        return redcount.connect()
    server: RedisServer = request.getfixturevalue("redis_server")
    s = redcount.connect(server.url)
    s.execute("FLUSHALL")
    return s


STORES = ["memory", pytest.param("redis", marks=pytest.mark.redis_only)]


@pytest.fixture(params=[*STORES, "deferred-memory", pytest.param("deferred-redis", marks=pytest.mark.redis_only)])
def store(request: pytest.FixtureRequest) -> Iterator[redcount.Store]:
    kind: str = request.param
    inner = _open(request, kind.removeprefix("deferred-"))
    s: redcount.Store = _testing.DeferredStore(inner) if kind.startswith("deferred") else inner
    try:
        yield s
    finally:
        s.close()


@pytest.fixture(params=STORES)
def deferred(request: pytest.FixtureRequest) -> Iterator[_testing.DeferredStore]:
    """A store whose calls complete on another thread, through the completion queue."""
    s = _testing.DeferredStore(_open(request, request.param))
    try:
        yield s
    finally:
        s.close()


async def settle(r: Any) -> Any:
    """What the core's *_async functions return, awaited if it is a future."""
    return (await r) if isinstance(r, _aio_runtime.OpFuture) else r


# ------------------------------------------------------------------------- store level


def test_execute_results(run: Runner[Any], store: redcount.Store) -> None:
    astore = aio.AsyncStore(store)

    async def main() -> None:
        assert await astore.ping() is True
        assert await astore.execute("SET", "k", "v") == "OK"
        assert await astore.execute("GET", "k") == b"v"
        assert await astore.execute("GET", "missing") is None
        assert await astore.execute("INCRBY", "n", 5) == 5
        assert await astore.execute_many([("INCR", "n"), ("INCR", "k"), ("GET", "n")]) == [
            6,
            "ERR value is not an integer or out of range",
            b"6",
        ]

    run(main())
    assert store.execute("GET", "n") == b"6"  # the sync view sees what the async one did


@pytest.mark.parametrize(
    "command",
    [
        ("INCR", "k"),  # a string that is not an integer
        ("LPUSH", "k", "x"),  # WRONGTYPE
        ("INCRBY", "n"),  # wrong number of arguments
        ("EVALSHA", "0" * 40, "0"),  # NOSCRIPT
    ],
)
def test_error_replies_raise_the_same_class_as_sync(
    run: Runner[Any], store: redcount.Store, command: tuple[str, ...]
) -> None:
    store.execute("SET", "k", "v")
    with pytest.raises(redcount.RedcountError) as sync_error:
        store.execute(*command)
    astore = aio.AsyncStore(store)
    with pytest.raises(redcount.RedcountError) as async_error:
        run(astore.execute(*command))
    assert type(async_error.value) is type(sync_error.value)
    assert isinstance(async_error.value, redcount.ReplyError)
    assert str(async_error.value) == str(sync_error.value)


def test_bad_input_raises_before_anything_is_sent(run: Runner[Any], store: redcount.Store) -> None:
    astore = aio.AsyncStore(store)
    with pytest.raises(redcount.InvalidInputError):
        run(astore.execute())
    with pytest.raises(TypeError):
        run(astore.execute("SET", "k", object()))  # type: ignore[arg-type]
    assert run(astore.execute("EXISTS", "k")) == 0


def test_many_concurrent_coroutines_get_exact_results(run: Runner[Any], store: redcount.Store) -> None:
    astore = aio.AsyncStore(store)
    n = 500

    async def one(i: int) -> tuple[int, int]:
        count = await astore.execute("INCR", "hits")
        mine = await astore.execute("INCRBY", f"own:{i}", i)
        assert isinstance(count, int) and isinstance(mine, int)
        return count, mine

    async def main() -> list[tuple[int, int]]:
        return await asyncio.gather(*(one(i) for i in range(n)))

    results = run(main())
    assert sorted(c for c, _ in results) == list(range(1, n + 1))  # each INCR got its own reply
    assert [m for _, m in results] == list(range(n))
    assert store.execute("GET", "hits") == str(n).encode()


def test_memory_awaits_complete_without_a_future(run: Runner[Any]) -> None:
    store = redcount.connect()
    try:
        # The core returns the reply itself: no future, no completion queue, no loop needed.
        assert _core.execute_async(store, "SET", "k", "v") == "OK"
        assert _core.ping_async(store) is True
        astore = aio.AsyncStore(store)
        limiter = aio.Limiter(store)
        counter = aio.FixedWindowCounter(store, "c", 60)

        def completes_at_once(coro: Coroutine[Any, Any, T]) -> T:
            # A coroutine that never suspends finishes on its first step.
            with pytest.raises(StopIteration) as done:
                coro.send(None)
            return done.value.value  # type: ignore[no-any-return]

        assert completes_at_once(astore.execute("GET", "k")) == b"v"
        assert completes_at_once(limiter.hit("10/minute", "x")).remaining == 9
        assert completes_at_once(counter.incr("x")) == 1

        async def in_a_loop() -> None:
            assert await astore.execute("GET", "k") == b"v"
            assert await limiter.hit("10/minute", "x")
            assert asyncio.get_running_loop() not in _aio_runtime.queues  # no queue was made for this loop

        run(in_a_loop())
    finally:
        store.close()


def test_outside_a_running_loop_nothing_is_sent(deferred: _testing.DeferredStore) -> None:
    with pytest.raises(RuntimeError, match="no running event loop"):
        _core.execute_async(deferred, "INCR", "k")
    deferred.wait_idle()
    assert deferred.executed == 0


# ------------------------------------------------------------------------- completion queue


def test_one_wakeup_completes_many_calls(run: Runner[Any], deferred: _testing.DeferredStore) -> None:
    astore = aio.AsyncStore(deferred)
    n = 200

    async def main() -> None:
        queue = _aio_runtime.queue_for_running_loop()
        deferred.hold()
        tasks = [asyncio.ensure_future(astore.execute("INCR", "k")) for _ in range(n)]
        while deferred.queued < n:  # let every task submit its batch
            await asyncio.sleep(0)
        signals, wakeups, delivered = queue.signals, queue.wakeups, queue.delivered
        deferred.resume()
        deferred.wait_idle()  # every batch completes while the loop is busy here
        results = await asyncio.gather(*tasks)
        assert sorted(results) == list(range(1, n + 1))
        # The first completion signalled; the other 199 found the queue non-empty. The one
        # wake-up delivers them in slices of at most 8 (each later slice scheduled with
        # call_soon behind the loop's other ready callbacks), never one wake-up per reply.
        assert queue.signals - signals == 1
        assert queue.wakeups - wakeups == -(-n // 8)
        assert queue.delivered - delivered == n

    run(main())


def test_each_loop_gets_its_own_queue(run: Runner[Any], deferred: _testing.DeferredStore) -> None:
    astore = aio.AsyncStore(deferred)

    async def main() -> tuple[_core.CompletionQueue, Any]:
        assert await astore.execute("INCR", "k") in (1, 2)
        return _aio_runtime.queue_for_running_loop(), asyncio.get_running_loop()

    q1, loop1 = run(main())
    q2, loop2 = run(main())
    assert q1 is not q2 and loop1 is not loop2
    assert q1.uses_call_soon_threadsafe == isinstance(loop1, NoReaderLoop)
    assert deferred.execute("GET", "k") == b"2"


# ------------------------------------------------------------------------- cancellation


def test_a_cancelled_call_that_was_not_sent_is_dropped(run: Runner[Any], deferred: _testing.DeferredStore) -> None:
    astore = aio.AsyncStore(deferred)

    async def main() -> None:
        deferred.hold()
        task = asyncio.ensure_future(astore.execute("INCR", "dropped"))
        while deferred.queued < 1:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        deferred.resume()
        # The store is usable, and the next calls get their own replies.
        assert await astore.execute("INCR", "kept") == 1
        assert await astore.execute("GET", "dropped") is None

    run(main())
    assert deferred.dropped == 1


def test_a_timeout_while_held_drops_the_request(run: Runner[Any], deferred: _testing.DeferredStore) -> None:
    astore = aio.AsyncStore(deferred)

    async def main() -> None:
        deferred.hold()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(astore.execute("INCR", "k"), timeout=0.05)
        deferred.resume()
        assert await astore.execute("INCR", "k") == 1  # the first one never ran

    run(main())


def test_a_late_reply_of_a_cancelled_call_is_discarded(run: Runner[Any], deferred: _testing.DeferredStore) -> None:
    astore = aio.AsyncStore(deferred)

    async def main() -> None:
        deferred.hold()
        task = asyncio.ensure_future(astore.execute("INCR", "sent"))
        while deferred.queued < 1:
            await asyncio.sleep(0)
        deferred.resume()
        deferred.wait_idle()  # it ran: its completion waits in the queue (the loop is busy here)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The discarded reply went nowhere: the next calls read their own.
        assert await astore.execute("GET", "sent") == b"1"
        assert await astore.execute("INCR", "sent") == 2

    run(main())
    assert deferred.dropped == 0


def test_cancelling_many_in_flight_calls_keeps_results_exact(run: Runner[Any], deferred: _testing.DeferredStore) -> None:
    astore = aio.AsyncStore(deferred)

    async def main() -> None:
        deferred.hold()
        tasks = [asyncio.ensure_future(astore.execute("INCR", "c")) for _ in range(100)]
        while deferred.queued < 100:
            await asyncio.sleep(0)
        for t in tasks[::2]:
            t.cancel()
        deferred.resume()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        got = [r for r in done if not isinstance(r, BaseException)]
        assert all(isinstance(r, asyncio.CancelledError) for r in done[::2])
        assert sorted(got) == list(range(1, 51))  # only the 50 that were not cancelled ran
        assert await astore.execute("GET", "c") == b"50"

    run(main())
    assert deferred.dropped == 50


def test_dropping_a_loop_with_calls_in_flight_leaks_nothing_python_can_see(deferred: _testing.DeferredStore) -> None:
    loop = asyncio.new_event_loop()
    astore = aio.AsyncStore(deferred)

    async def start() -> None:
        deferred.hold()
        asyncio.ensure_future(astore.execute("INCR", "k"))
        while deferred.queued < 1:
            await asyncio.sleep(0)

    loop.run_until_complete(start())
    for task in asyncio.all_tasks(loop):
        task.cancel()
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
    deferred.resume()
    deferred.wait_idle()
    del loop
    gc.collect()
    assert deferred.execute("INCR", "k") == 1  # the cancelled one was dropped
    assert _testing.inflight() == 0


def test_random_cancellations_under_load_keep_every_reply_in_place(
    run: Runner[Any], deferred: _testing.DeferredStore
) -> None:
    # The worker runs while calls are submitted, so completions race with the making of
    # their futures (the inline/detached hand-over) and with the cancellations.
    astore = aio.AsyncStore(deferred)
    rng = random.Random(7)
    n = 2000

    async def main() -> list[object]:
        tasks: list[asyncio.Future[Any]] = []
        for _ in range(n // 10):
            tasks += [asyncio.ensure_future(astore.execute("INCR", "c")) for _ in range(10)]
            await asyncio.sleep(0)
            for t in rng.sample(tasks[-40:], k=4):
                t.cancel()
        return await asyncio.gather(*tasks, return_exceptions=True)

    done = run(main())
    got = [r for r in done if not isinstance(r, BaseException)]
    assert all(isinstance(r, (int, asyncio.CancelledError)) for r in done)
    assert len(set(got)) == len(got)  # no reply delivered twice or to the wrong caller
    deferred.wait_idle()
    final = deferred.execute("GET", "c")
    assert final is not None and int(final) == deferred.executed  # every sent INCR ran once
    assert set(got) <= set(range(1, int(final) + 1))
    assert len(got) < n and deferred.executed + deferred.dropped <= n


def test_loops_in_several_threads(deferred: _testing.DeferredStore) -> None:
    astore = aio.AsyncStore(deferred)
    errors: list[BaseException] = []

    def worker(make_loop: Callable[[], asyncio.AbstractEventLoop]) -> None:
        async def main() -> None:
            results = await asyncio.gather(*(astore.execute("INCR", "t") for _ in range(300)))
            assert len(set(results)) == 300

        loop = make_loop()
        try:
            loop.run_until_complete(main())
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)
        finally:
            loop.close()

    threads = [threading.Thread(target=worker, args=(list(LOOPS.values())[i % 3],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert deferred.execute("GET", "t") == b"1200"


def test_a_python_context_reaches_convert_and_is_released(run: Runner[Any], store: redcount.Store) -> None:
    # submit_async's context: what a conversion needs from Python (incr_many's key objects),
    # held while the call is in flight and released once it settles, cancelled or not.
    value = object()
    base = sys.getrefcount(value)
    deferred = store if isinstance(store, _testing.DeferredStore) else None

    async def main() -> None:
        r = _testing.echo_async(store, value)
        assert (await r if isinstance(r, _aio_runtime.OpFuture) else r) is value
        results = await asyncio.gather(*(settle(_testing.echo_async(store, value)) for _ in range(50)))
        assert all(x is value for x in results)
        if deferred is not None:
            deferred.hold()
            task = asyncio.ensure_future(settle(_testing.echo_async(store, value)))
            while deferred.queued < 1:
                await asyncio.sleep(0)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            queue = _aio_runtime.queue_for_running_loop()
            delivered = queue.delivered
            deferred.resume()
            deferred.wait_idle()
            for _ in range(100_000):  # poll: the queue's drain runs on the loop
                if queue.delivered > delivered:
                    break
                await asyncio.sleep(0)
            assert queue.delivered == delivered + 1

    run(main())
    gc.collect()
    assert sys.getrefcount(value) == base


# ------------------------------------------------------------------------- async classes


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis_only)])
def class_store(request: pytest.FixtureRequest) -> Iterator[redcount.Store]:
    s = _open(request, request.param)
    try:
        yield s
    finally:
        s.close()


def test_async_limiter_shares_its_core_with_the_sync_one(run: Runner[Any], class_store: redcount.Store) -> None:
    limiter = redcount.Limiter(class_store, "sliding-window")
    alimiter = aio.Limiter.from_sync(limiter)
    assert alimiter.sync is limiter and alimiter.sync._core is limiter._core
    assert (alimiter.strategy, alimiter.clock, alimiter.store) == ("sliding-window", "client", class_store)

    async def main() -> None:
        assert (await alimiter.hit("3/minute", "u")).remaining == 2
        assert limiter.hit("3/minute", "u").remaining == 1  # one count, whichever side hits
        d = await alimiter.hit("3/minute", "u")
        assert d.allowed and d.remaining == 0
        denied = await alimiter.hit("3/minute", "u")
        assert not denied and denied.retry_after > 0
        assert (await alimiter.test("3/minute", "u")).allowed is False
        [stats] = await alimiter.stats("3/minute", "u")
        assert stats.count == 3
        await alimiter.reset("3/minute", "u")
        assert limiter.test("3/minute", "u").remaining == 3

    run(main())
    assert repr(alimiter) == "redcount.aio." + repr(limiter)


def test_async_limiter_same_arguments_and_errors(run: Runner[Any], class_store: redcount.Store) -> None:
    alimiter = aio.Limiter(aio.AsyncStore(class_store), "token-bucket", prefix="p", clock="client")
    assert alimiter.prefix == "p" and alimiter.sync.store is class_store

    async def main() -> None:
        with pytest.raises(redcount.InvalidInputError):
            await alimiter.hit("ten per fortnight", "k")
        with pytest.raises(redcount.InvalidInputError):
            await alimiter.hit("10/second", "")
        assert (await alimiter.hit(redcount.parse_limits("10/second burst 20"), "k", cost=5)).remaining == 15

    run(main())


def test_async_lease(run: Runner[Any], class_store: redcount.Store) -> None:
    alimiter = aio.Limiter(class_store, "concurrency")

    async def main() -> None:
        async with alimiter.lease(1, "job") as lease:
            assert await alimiter.in_flight("job") == 1
            with pytest.raises(redcount.RateLimitExceeded):
                async with alimiter.lease(1, "job"):
                    pass
        assert lease.released and await alimiter.in_flight("job") == 0
        got = await alimiter.acquire(2, "job", lease_timeout=5)
        assert got is not None and await alimiter.release(got) is True

    run(main())


def test_async_fixed_window_counter(run: Runner[Any], class_store: redcount.Store) -> None:
    counter = redcount.FixedWindowCounter(class_store, "views", 60)
    acounter = aio.FixedWindowCounter.from_sync(counter)
    own = aio.FixedWindowCounter(class_store, "views", 60)  # its own core, the same keys

    async def main() -> None:
        assert await acounter.incr("p") == 1
        assert counter.incr("p", 2) == 3
        assert await own.incr("p", request_id="r1") == 4
        assert await own.incr("p", request_id="r1") == 4  # counted once
        assert await acounter.get("p") == 4
        assert await acounter.incr_many({"a": 2, "b": 3}) == {"a": 2, "b": 3}
        assert await acounter.get_many(["a", "b", "c"]) == {"a": 2, "b": 3, "c": 0}
        assert 0 < await acounter.ttl("p") <= 61
        with pytest.raises(redcount.InvalidInputError):
            await acounter.incr("p", 0)
        async with own:
            pass
        assert await acounter.flush(1.0) == 0

    run(main())
    assert acounter.storage_key("p") == counter.storage_key("p") and acounter.window == 60.0
    assert acounter.stats().queued == 0 and acounter.pending == 0


def test_async_sliding_window_counter(run: Runner[Any], class_store: redcount.Store) -> None:
    counter = redcount.SlidingWindowCounter(class_store, "logins", 60)
    acounter = aio.SlidingWindowCounter.from_sync(counter)

    async def main() -> None:
        assert await acounter.add("u") == 1
        assert await acounter.add("u", 4) == 5
        assert counter.count("u") == 5 and await acounter.count("u") == 5
        assert await acounter.add_unique("u", "ip1") == 1
        assert await acounter.add_unique("u", "ip1") == 1
        assert await acounter.count_unique("u") == 1
        await acounter.clear("u")
        assert await acounter.count("u") == 0

    run(main())
    assert acounter.storage_keys("u") == counter.storage_keys("u")


def test_many_coroutines_on_one_async_counter_are_exact(run: Runner[Any], class_store: redcount.Store) -> None:
    acounter = aio.FixedWindowCounter(class_store, "c", 3600)
    alimiter = aio.Limiter(class_store, "fixed-window")

    async def one(i: int) -> tuple[int, bool]:
        return await acounter.incr("k"), bool(await alimiter.hit("300/hour", "k"))

    async def main() -> list[tuple[int, bool]]:
        return await asyncio.gather(*(one(i) for i in range(1000)))

    results = run(main())
    assert sorted(c for c, _ in results) == list(range(1, 1001))
    assert sum(ok for _, ok in results) == 300


# ------------------------------------------------------------- waking the awaiting tasks


def test_a_drain_wakes_the_awaiting_tasks_in_order_and_runs_other_callbacks(
    run: Runner[Any], deferred: _testing.DeferredStore
) -> None:
    # A drain resumes each task awaiting a completed call at once (not through call_soon),
    # in the order the replies came; a future with other callbacks than its task's (only
    # possible through the private core API) completes the usual way, every callback run.
    n = 20

    async def main() -> None:
        resumed: list[int] = []

        async def one(i: int) -> None:
            resumed.append(await settle(_core.execute_async(deferred, "INCR", "k")))

        deferred.hold()
        tasks = [asyncio.ensure_future(one(i)) for i in range(n)]
        while deferred.queued < n:
            await asyncio.sleep(0)
        fut = _core.execute_async(deferred, "INCR", "k")
        seen: list[int] = []
        fut.add_done_callback(lambda f: seen.append(f.result()))
        extra = asyncio.ensure_future(settle(fut))
        while deferred.queued < n + 1:
            await asyncio.sleep(0)
        deferred.resume()
        deferred.wait_idle()
        await asyncio.gather(*tasks)
        assert resumed == list(range(1, n + 1))
        assert await extra == n + 1 and seen == [n + 1]

    run(main())


def test_a_task_that_raises_keyboardinterrupt_on_waking_leaves_the_others_completed(
    deferred: _testing.DeferredStore,
) -> None:
    # KeyboardInterrupt escapes a task step, and so the drain that runs it: it reaches the
    # loop's caller as it would without redcount, and the other calls of that drain still
    # complete with their own results.
    loop = asyncio.new_event_loop()
    try:
        results: list[int] = []

        async def one(i: int) -> None:
            v = await settle(_core.execute_async(deferred, "INCR", "k"))
            if i == 0:
                raise KeyboardInterrupt
            results.append(v)

        async def start() -> list[asyncio.Task[None]]:
            deferred.hold()
            tasks = [asyncio.ensure_future(one(i)) for i in range(4)]
            while deferred.queued < 4:
                await asyncio.sleep(0)
            return tasks

        tasks = loop.run_until_complete(start())
        deferred.resume()
        deferred.wait_idle()
        with pytest.raises(KeyboardInterrupt):
            loop.run_until_complete(asyncio.wait_for(asyncio.gather(*tasks[1:]), 10))
        loop.run_until_complete(asyncio.wait_for(asyncio.gather(*tasks[1:]), 10))
        assert sorted(results) == [2, 3, 4]
        assert tasks[0].done() and isinstance(tasks[0].exception(), KeyboardInterrupt)
    finally:
        loop.close()


def test_callbacks_added_and_removed_before_the_reply_are_honoured(
    run: Runner[Any], deferred: _testing.DeferredStore
) -> None:
    # The drain runs a future's callback itself only when it is the one callback the future
    # holds: one removed again, or one of several, completes the usual way; contextvars
    # reach a callback through the context it was added in.
    var: contextvars.ContextVar[str] = contextvars.ContextVar("var", default="unset")

    async def main() -> None:
        deferred.hold()
        removed = _core.execute_async(deferred, "INCR", "k")
        dropped: list[int] = []

        def drop(f: Any) -> None:
            dropped.append(f.result())

        removed.add_done_callback(drop)
        assert removed.remove_done_callback(drop) == 1
        waiter = asyncio.ensure_future(settle(removed))

        alone = _core.execute_async(deferred, "INCR", "k")
        seen: list[tuple[int, str]] = []
        var.set("from-the-adder")
        alone.add_done_callback(lambda f: seen.append((f.result(), var.get())))
        var.set("later")
        while deferred.queued < 2:
            await asyncio.sleep(0)
        deferred.resume()
        deferred.wait_idle()
        assert await waiter == 1
        for _ in range(100_000):  # poll: the drain runs on the loop
            if seen:
                break
            await asyncio.sleep(0)
        assert seen == [(2, "from-the-adder")] and dropped == []

        with pytest.raises(TypeError):
            alone.add_done_callback()  # asyncio's own errors for a call it refuses
        with pytest.raises(TypeError):
            alone.add_done_callback(drop, ctx=None)

    run(main())


def test_test_support_lives_in_its_own_submodule() -> None:
    # The public module carries no test-only class; redcount._core._testing (this build's
    # REDCOUNT_TEST_HOOKS) does, importable both ways.
    for name in ("_DeferredStore", "_aio_inflight", "_aio_echo_async"):
        assert not hasattr(_core, name)
    assert _testing.__name__ == "redcount._core._testing"
    assert importlib.import_module("redcount._core._testing") is _testing
