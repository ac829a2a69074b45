"""Shaping instead of refusing: [`redcount.Limiter.wait`][redcount.limiter.Limiter.wait] and ``throttle``.

```python
limiter = redcount.Limiter(store, "sliding-window")
limiter.wait("10/second", "github", max_wait=30)     # sleeps until admitted, then charged

@limiter.throttle("10/second", key="github", max_wait=30)
def fetch(url: str) -> bytes: ...                    # each call waits for its turn, then runs
```

The public methods live on [`redcount.Limiter`][redcount.limiter.Limiter] and [`redcount.aio.Limiter`][redcount.aio.Limiter]; this
module holds what they share: argument checks, the per-process FIFO queues and the
decorator object.

How a wait goes. Waiters of one process queue per (limit, key) in order of arrival. Only the
head of a queue talks to the store: one ``hit`` call; if refused, it sleeps for the
``retry_after`` the limiter reported plus a small jitter, then calls ``hit`` once more. The
others sleep on a local event (threads) or future (coroutines) until they become the head,
so the store sees one call per retry of one waiter, never a poll per waiter. Within a
process the order of admission is therefore the order of arrival, exactly (no barging: a
later waiter, even one with a smaller cost, never passes an earlier one). Across processes,
each process's head competes for the refill; a waiter can be passed by waiters of other
processes that arrived up to about one retry interval (its ``retry_after`` plus the jitter)
later: best-effort, not FIFO.

Leaving the queue (``max_wait`` expired, ``KeyboardInterrupt``, task cancellation) charges
nothing. Two subtle cases. A coroutine cancelled while its ``hit`` is in flight on Redis
cannot take the call back: the call is left to finish (in a shielded task, so the connection
is not disturbed either); if it admitted the hit, the admission is handed to the next waiter
of the queue when that one has the same cost (it would have been charged the same), so the
charge is not lost; with no such waiter, that one unit of capacity goes unused. And a
``KeyboardInterrupt`` that lands in the instant a sync ``hit`` returns an admission (Python
handles the signal as the C++ call returns) loses that admission: charged and unused, as
after a crash. Nothing is ever admitted twice and no limit is ever exceeded.
"""

from __future__ import annotations

import functools
import inspect
import math
import random
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, overload

from ._core import Decision, InvalidInputError, LimitSet
from .errors import WaitTimeout

if TYPE_CHECKING:
    import asyncio

P = ParamSpec("P")
R = TypeVar("R")

# A retry sleeps retry_after plus this much: at least 1 ms (retry_after is whole ms, and a
# clock that reads a hair early must not make the retry a wasted call), plus up to 10 % of
# retry_after, at most 10 ms more, so that the heads of several processes do not all hit the
# store in the same millisecond.
_JITTER_FLOOR = 0.001
_JITTER_SPREAD = 0.010
# A refusal that reports retry_after 0 (it should not happen) still sleeps this long before
# the next call, so wait() can never spin on the store.
_MIN_RETRY = 0.001

_BUCKETS = ("token-bucket", "gcra")


def retry_delay(retry_after: float) -> float:
    """How long a refused head waiter sleeps before its next store call."""
    base = max(retry_after, _MIN_RETRY)
    return base + _JITTER_FLOOR + random.uniform(0.0, min(_JITTER_SPREAD, 0.1 * base))


def check_wait_args(
    limit: str | LimitSet, key: str | bytes, cost: int, strategy: str, max_wait: float | None
) -> tuple[tuple[object, str | bytes], int]:
    """Validate the arguments of a wait before queueing; return the queue's name and the
    smallest amount of the limits (for [`WaitTimeout`][redcount.errors.WaitTimeout]). Raises
    [`InvalidInputError`][redcount.errors.InvalidInputError] (bad values) or ``TypeError`` (wrong types) at
    once, so a hit that could never be admitted is never waited for."""
    if max_wait is not None:
        if isinstance(max_wait, bool) or not isinstance(max_wait, (int, float)):
            raise TypeError(f"max_wait must be a number of seconds or None, got {max_wait!r}")
        if not math.isfinite(max_wait) or max_wait < 0:
            raise InvalidInputError(
                f"max_wait must be finite and >= 0 seconds (None waits as long as needed), got {max_wait!r}"
            )
    if isinstance(cost, bool) or not isinstance(cost, int):
        raise TypeError(f"cost must be an int, got {cost!r}")
    if not isinstance(key, (str, bytes)):
        raise TypeError(f"key must be str or bytes, got {type(key).__name__}")
    limits = limit if isinstance(limit, LimitSet) else LimitSet(limit)
    if cost < 1:
        raise InvalidInputError(f"cost must be >= 1, got {cost}")
    by_capacity = strategy in _BUCKETS
    for rl in limits.limits:
        most = rl.burst if by_capacity and rl.burst > 0 else rl.amount
        if cost > most:
            what = "capacity" if by_capacity else "amount"
            raise InvalidInputError(
                f"cost {cost} exceeds the {what} {most} of '{limits.text}': wait() could never admit it, "
                "so it does not wait"
            )
    return _queue_name(limits, key), min(rl.amount for rl in limits.limits)


def _queue_name(limits: LimitSet, key: str | bytes) -> tuple[object, str | bytes]:
    # What the limits mean, not how they were spelled: "10/second" and "10 per second" share
    # a queue, as they share the stored state.
    return tuple((rl.amount, rl.window, rl.burst) for rl in limits.limits), key


def queue_name(limit: str | LimitSet, key: str | bytes) -> tuple[object, str | bytes]:
    """The name of the queue of waiters for ``limit`` and ``key``."""
    return _queue_name(limit if isinstance(limit, LimitSet) else LimitSet(limit), key)


def _timeout(
    limit: str | LimitSet,
    key: str | bytes,
    amount: int,
    started: float,
    retry_after: float | None,
    max_wait: float,
) -> WaitTimeout:
    waited = time.monotonic() - started
    text = limit.text if isinstance(limit, LimitSet) else limit
    if retry_after is None:
        why = "still queued behind earlier waiters of this process"
    else:
        why = f"the limiter would admit it in {retry_after:.3f} s"
    return WaitTimeout(
        f"gave up waiting for {text!r} on {key!r} after {waited:.3f} s (max_wait={max_wait} s): {why}; "
        "nothing was charged",
        key,
        amount,
        waited=waited,
        retry_after=retry_after,
        max_wait=max_wait,
    )


class _Ticket:
    """One waiter's place in a queue. ``turn`` is set when it becomes the head; ``handed``
    holds an admission passed on by a head that could not use it."""

    __slots__ = ("cost", "handed", "turn")

    def __init__(self, cost: int, turn: threading.Event | asyncio.Future[None]) -> None:
        self.cost = cost
        self.turn = turn
        self.handed: Decision | None = None


def _signal(ticket: _Ticket) -> None:
    turn = ticket.turn
    if isinstance(turn, threading.Event):
        turn.set()
    elif not turn.done():
        turn.set_result(None)


class Shaper:
    """The FIFO queues of one limiter core's waiters in this process: one per (limit, key)
    for threads, and one per (event loop, limit, key) for coroutines. Shared by the sync
    limiter and every [`redcount.aio.Limiter`][redcount.aio.Limiter] view of it. Thread-safe (one lock,
    never held across I/O or a sleep)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queues: dict[tuple[object, ...], deque[_Ticket]] = {}

    def join(self, qname: tuple[object, ...], ticket: _Ticket) -> None:
        with self._lock:
            q = self._queues.get(qname)
            if q is None:
                q = self._queues[qname] = deque()
            q.append(ticket)
            if len(q) == 1:
                _signal(ticket)

    def leave(self, qname: tuple[object, ...], ticket: _Ticket, spare: Decision | None) -> None:
        """Take ``ticket`` out of its queue; when it was the head, the next waiter becomes
        the head, and ``spare`` (an admission the leaver holds but will not use) is handed
        to it when it has the same cost."""
        with self._lock:
            q = self._queues[qname]
            was_head = q[0] is ticket
            q.remove(ticket)
            if was_head and q:
                nxt = q[0]
                if spare is not None and spare.allowed and nxt.cost == ticket.cost:
                    nxt.handed = spare
                _signal(nxt)
            if not q:
                del self._queues[qname]

    def waiting(self, qname: tuple[object, str | bytes]) -> int:
        with self._lock:
            return sum(len(q) for name, q in self._queues.items() if name[-2:] == qname)


def shaper_of(limiter: object) -> Shaper:
    """The shaper of a sync limiter, made on first use (no constructor change needed)."""
    d = vars(limiter)
    s = d.get("_shaper")
    if s is None:
        # setdefault is atomic under the GIL: two racing first waiters get the same one.
        s = d.setdefault("_shaper", Shaper())
    return s  # type: ignore[no-any-return]


def wait_sync(
    shaper: Shaper,
    hit: Callable[[str | LimitSet, str | bytes, int], Decision],
    strategy: str,
    limit: str | LimitSet,
    key: str | bytes,
    cost: int,
    max_wait: float | None,
) -> Decision:
    """The body of [`redcount.Limiter.wait`][redcount.limiter.Limiter.wait]."""
    qname, amount = check_wait_args(limit, key, cost, strategy, max_wait)
    started = time.monotonic()
    deadline = None if max_wait is None else started + max_wait
    event = threading.Event()
    ticket = _Ticket(cost, event)
    shaper.join(qname, ticket)
    held: Decision | None = None  # an admission this waiter holds but has not returned yet
    done = False
    try:
        if not event.is_set():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not event.wait(left):
                assert max_wait is not None
                raise _timeout(limit, key, amount, started, None, max_wait)
        if ticket.handed is not None:
            done = True
            return ticket.handed
        while True:
            d = hit(limit, key, cost)
            if d.allowed:
                held = d
                done = True
                return d
            now = time.monotonic()
            if deadline is not None and now + d.retry_after > deadline:
                assert max_wait is not None
                raise _timeout(limit, key, amount, started, d.retry_after, max_wait)
            delay = retry_delay(d.retry_after)
            if deadline is not None:
                delay = min(delay, max(0.0, deadline - now))
            time.sleep(delay)
    finally:
        # On success nothing is spare; on any exception (KeyboardInterrupt included) an
        # admission already taken, or handed over, goes to the next waiter.
        shaper.leave(qname, ticket, None if done else (held if held is not None else ticket.handed))


async def wait_async(
    shaper: Shaper,
    hit: Callable[[str | LimitSet, str | bytes, int], Awaitable[Decision]],
    strategy: str,
    limit: str | LimitSet,
    key: str | bytes,
    cost: int,
    max_wait: float | None,
) -> Decision:
    """The body of [`redcount.aio.Limiter.wait`][redcount.aio.Limiter.wait]; ``hit`` is the limiter's public
    ``hit`` coroutine function (so whatever it does, a failure policy included, applies)."""
    import asyncio  # here, not at the top: a running loop has imported it already, and
    # `import redcount` stays without asyncio's cost for programs that never use it

    qname0, amount = check_wait_args(limit, key, cost, strategy, max_wait)
    loop = asyncio.get_running_loop()
    qname = (loop, *qname0)
    started = time.monotonic()
    deadline = None if max_wait is None else started + max_wait
    turn: asyncio.Future[None] = loop.create_future()
    ticket = _Ticket(cost, turn)
    # Joined before the first await: coroutines queue in the order they called wait().
    shaper.join(qname, ticket)
    held: Decision | None = None
    done = False
    in_flight: asyncio.Future[Decision] | None = None
    try:
        if not turn.done():
            if deadline is None:
                await turn
            else:
                # asyncio.wait does not cancel ``turn`` on a timeout; a cancellation of this
                # task still interrupts it.
                await asyncio.wait((turn,), timeout=max(0.0, deadline - time.monotonic()))
                if not turn.done():
                    assert max_wait is not None
                    raise _timeout(limit, key, amount, started, None, max_wait)
        if ticket.handed is not None:
            done = True
            return ticket.handed
        while True:
            # A task of its own, shielded: a cancellation must not cut a call that may
            # already have charged the hit; the finally clause settles it when it ends.
            in_flight = asyncio.ensure_future(hit(limit, key, cost))
            d = await asyncio.shield(in_flight)
            in_flight = None
            if d.allowed:
                held = d
                done = True
                return d
            now = time.monotonic()
            if deadline is not None and now + d.retry_after > deadline:
                assert max_wait is not None
                raise _timeout(limit, key, amount, started, d.retry_after, max_wait)
            delay = retry_delay(d.retry_after)
            if deadline is not None:
                delay = min(delay, max(0.0, deadline - now))
            await asyncio.sleep(delay)
    finally:
        if in_flight is not None and not in_flight.done():
            # Cancelled during the store call: stay the head until it ends, then leave,
            # handing on an admission it may have made.
            def settle(f: asyncio.Future[Decision]) -> None:
                got = None
                if not f.cancelled() and f.exception() is None:
                    got = f.result()
                shaper.leave(qname, ticket, got)

            in_flight.add_done_callback(settle)
        else:
            if in_flight is not None and not in_flight.cancelled() and in_flight.exception() is None:
                held = in_flight.result()
            shaper.leave(qname, ticket, None if done else (held if held is not None else ticket.handed))


class Throttle:
    """A decorator made by [`redcount.Limiter.throttle`][redcount.limiter.Limiter.throttle] (and its asyncio twin): each
    call of the decorated function first waits for its turn ([`wait`][redcount.limiter.Limiter.wait]),
    then runs. Coroutine functions wait without blocking the event loop; plain functions
    block their thread. The wrapped function keeps its signature, return value and
    exceptions; [`WaitTimeout`][redcount.errors.WaitTimeout] is raised instead of calling it when
    ``max_wait`` runs out. Thread-safe."""

    def __init__(self, wait_sync: Callable[[], object], wait_async: Callable[[], Awaitable[object]]) -> None:
        self._wait_sync = wait_sync
        self._wait_async = wait_async

    @overload
    def __call__(self, fn: Callable[P, Coroutine[Any, Any, R]]) -> Callable[P, Coroutine[Any, Any, R]]: ...
    @overload
    def __call__(self, fn: Callable[P, R]) -> Callable[P, R]: ...
    def __call__(self, fn: Callable[P, Any]) -> Callable[P, Any]:
        if inspect.iscoroutinefunction(fn):
            wait_async = self._wait_async

            @functools.wraps(fn)
            async def throttled_async(*args: P.args, **kwargs: P.kwargs) -> Any:
                await wait_async()
                return await fn(*args, **kwargs)

            return throttled_async
        wait_sync = self._wait_sync

        @functools.wraps(fn)
        def throttled(*args: P.args, **kwargs: P.kwargs) -> Any:
            wait_sync()
            return fn(*args, **kwargs)

        return throttled
