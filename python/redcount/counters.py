"""TTL-compensated fixed-window counters."""

from __future__ import annotations

import atexit
import weakref
from types import TracebackType
from typing import Literal

from . import _core, telemetry
from ._core import RetryStats, Store
from ._retry import CLOSE_TIMEOUT, QUEUE_CAPACITY, RETRY_BACKOFF, RETRY_BACKOFF_MAX
from ._calendar import CALENDAR_UNITS, calendar_arg, calendar_unit
from ._wrap import bind_fast_paths

__all__ = ["FixedWindowCounter", "RetryStats"]

_QUEUED: weakref.WeakSet[FixedWindowCounter] = weakref.WeakSet()

# Methods that go straight to the core object (see _wrap.py).
_FAST = ("incr", "incr_many", "get", "get_many", "ttl", "storage_key", "current_window", "flush", "close", "stats")


class FixedWindowCounter:
    """Counts events per key in clock-aligned windows of ``window`` seconds.

    Windows start at multiples of ``window`` since the Unix epoch, so an hourly counter turns
    over on the hour. Each window's count lives in its own key (see [`storage_key`][redcount.counters.FixedWindowCounter.storage_key]),
    whose TTL is set to the window's end plus ``grace`` in the same atomic step as the
    increment; a key whose TTL was lost (PERSIST, a foreign SET, a replica promotion) gets it
    back on its next increment.

    Args:
        store: from [`redcount.connect`][redcount.store.connect].
        name: the counter's name, part of every key (no ``{`` or ``}``).
        window: window length in seconds (>= 0.001); with ``calendar``, the period instead:
            ``"day"``, ``"week"``, ``"month"`` or ``"year"``.
        mode: ``"script"`` (one atomic Lua script, the default) or ``"commands"`` (a
            pipelined command sequence for servers and proxies that forbid scripting).
        grace: seconds a window's key outlives the window (default 1.0).
        on_error: ``"raise"`` (default) raises transient errors; ``"queue"`` puts the
            increment in a bounded retry queue and returns 0.
        prefix: the first part of every key (default ``"redcount"``).
        stagger: shift each key's windows by a deterministic per-key offset, so resets of
            many keys spread over the window instead of all landing on the boundary.
        queue_capacity: the retry queue's bound, in increments.
        retry_backoff: the retry thread's first delay, in seconds; delays double per failed
            attempt, with jitter.
        retry_backoff_max: the cap of those delays, in seconds.

    ``calendar``: an IANA time zone; windows are then that zone's calendar periods (days
    from local midnight, ISO weeks from Monday, months from ``anchor_day`` (1..31, clamped
    to the last day of shorter months), years from January 1), each key expiring at its
    period's end plus ``grace``. See docs/fixed-windows.md.

    [`redcount.aio.FixedWindowCounter`][redcount.aio.FixedWindowCounter] is the asyncio twin; it can share this
    counter's core (``redcount.aio.FixedWindowCounter.from_sync(counter)``).

    Thread-safe; share one instance between threads.
    """

    _core: _core.FixedWindowCounter
    exit_timeout: float
    """Seconds [`close`][redcount.counters.FixedWindowCounter.close] may wait for the retry queue at interpreter exit."""

    def __init__(
        self,
        store: Store,
        name: str,
        window: float | str,
        *,
        mode: Literal["script", "commands"] = "script",
        grace: float = 1.0,
        on_error: Literal["raise", "queue"] = "raise",
        prefix: str = "redcount",
        stagger: bool = False,
        queue_capacity: int = QUEUE_CAPACITY,
        retry_backoff: float = RETRY_BACKOFF,
        retry_backoff_max: float = RETRY_BACKOFF_MAX,
        calendar: str | None = None,
        anchor_day: int = 1,
    ) -> None:
        cal = calendar_arg(calendar, anchor_day)
        unit = ""
        seconds = window
        if cal is not None:
            unit = calendar_unit(window)
            seconds = CALENDAR_UNITS[unit]
        core = _core.FixedWindowCounter(
            store,
            name,
            seconds,  # type: ignore[arg-type]  # a str without a calendar: the core raises
            prefix,
            grace,
            stagger,
            mode,
            on_error,
            queue_capacity,
            retry_backoff,
            retry_backoff_max,
            cal,
            unit,
        )
        self._core = core
        self.calendar = calendar
        self.anchor_day = anchor_day
        bind_fast_paths(self, FixedWindowCounter, core, _FAST)
        self.exit_timeout = CLOSE_TIMEOUT
        if on_error == "queue":
            _QUEUED.add(self)
            telemetry.track_retry_queue(self)

    # The methods below document the calls; on an instance, bind_fast_paths has replaced
    # them by the core's own bound methods (same arguments, results and errors).

    def incr(self, key: str | bytes, amount: int = 1, *, request_id: str | bytes | None = None) -> int:
        """Add ``amount`` (>= 1) to ``key``'s count in the current window and return the new count.

        With ``on_error="queue"``, a transient failure queues the increment for retry and
        returns 0. With ``request_id``, a repeat of the same id in the same window is
        counted once."""
        return self._core.incr(key, amount, request_id=request_id)

    def incr_many(
        self, amounts: dict[str, int] | dict[bytes, int] | dict[str | bytes, int]
    ) -> dict[str | bytes, int]:
        """Increment many keys in one round trip: ``{key: amount} -> {key: count}``. Every key
        and amount is validated before anything is sent."""
        return self._core.incr_many(amounts)

    def get(self, key: str | bytes) -> int:
        """The count of ``key`` in the current window (0 if none)."""
        return self._core.get(key)

    def get_many(self, keys: list[str] | list[bytes] | list[str | bytes]) -> dict[str | bytes, int]:
        """Counts of many keys in the current window, in one round trip."""
        return self._core.get_many(keys)

    def ttl(self, key: str | bytes) -> float:
        """Seconds until the current window's key expires; -2.0 if it does not exist, -1.0 if
        it has no TTL (which redcount never leaves behind)."""
        return self._core.ttl(key)

    def storage_key(self, key: str | bytes) -> str:
        """The Redis key that holds ``key``'s count in the current window."""
        return self._core.storage_key(key)

    def current_window(self, key: str | bytes) -> tuple[float, float]:
        """``(start, end)`` of ``key``'s current window, in seconds since the epoch."""
        return self._core.current_window(key)

    def flush(self, timeout: float | None = None) -> int:
        """Retry everything queued now and wait until the queue is empty or ``timeout``
        seconds pass. Returns how many increments are still pending (0 = all delivered or
        dropped)."""
        return self._core.flush(timeout)

    def close(self, timeout: float | None = CLOSE_TIMEOUT) -> int:
        """Flush within ``timeout`` seconds, then stop the retry thread; returns within
        ``timeout`` even if the server is stalled (an attempt still waiting for it ends on its
        own). Returns how many increments were not delivered by then (what is never
        delivered is counted in ``stats().failed``)."""
        return self._core.close(timeout)

    def stats(self) -> RetryStats:
        """A snapshot of the retry queue's counters."""
        return self._core.stats()

    @property
    def pending(self) -> int:
        """Increments waiting in the retry queue."""
        return self._core.pending

    @property
    def name(self) -> str:
        return self._core.name

    @property
    def prefix(self) -> str:
        return self._core.prefix

    @property
    def window(self) -> float:
        """Window length in seconds."""
        return self._core.window

    @property
    def grace(self) -> float:
        return self._core.grace

    @property
    def mode(self) -> str:
        return self._core.mode

    @property
    def on_error(self) -> str:
        return self._core.on_error

    @property
    def store(self) -> Store:
        return self._core.store

    def __enter__(self) -> FixedWindowCounter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(self.exit_timeout)

    def __repr__(self) -> str:
        return (
            f"FixedWindowCounter(name={self.name!r}, window={self.window}, mode={self.mode!r}, "
            f"on_error={self.on_error!r}, store={self.store.url!r})"
        )


@atexit.register
def _drain_retry_queues() -> None:
    """Give queued increments a last chance at interpreter exit."""
    for counter in list(_QUEUED):
        try:
            counter.close(counter.exit_timeout)
        except Exception:  # noqa: BLE001 - exit must go on; stats().failed records losses
            pass
