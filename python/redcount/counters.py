"""TTL-compensated fixed-window counters."""

from __future__ import annotations

import atexit
import weakref
from types import TracebackType
from typing import Literal

from . import _core
from ._core import RetryStats, Store

__all__ = ["FixedWindowCounter", "RetryStats"]

_QUEUED: weakref.WeakSet[FixedWindowCounter] = weakref.WeakSet()


class FixedWindowCounter(_core.FixedWindowCounter):
    """Counts events per key in clock-aligned windows of ``window`` seconds.

    Windows start at multiples of ``window`` since the Unix epoch, so an hourly counter turns
    over on the hour. Each window's count lives in its own key (see :meth:`storage_key`),
    whose TTL is set to the window's end plus ``grace`` in the same atomic step as the
    increment; a key whose TTL was lost (PERSIST, a foreign SET, a replica promotion) gets it
    back on its next increment.

    Args:
        store: from :func:`redcount.connect`.
        name: the counter's name, part of every key (no ``{`` or ``}``).
        window: window length in seconds (>= 0.001).
        mode: ``"script"`` (one atomic Lua script, the default) or ``"commands"`` (a
            pipelined command sequence for servers and proxies that forbid scripting).
        grace: seconds a window's key outlives the window (default 1.0).
        on_error: ``"raise"`` (default) raises transient errors; ``"queue"`` puts the
            increment in a bounded retry queue and returns 0.
        prefix: the first part of every key (default ``"redcount"``).
        stagger: shift each key's windows by a deterministic per-key offset, so resets of
            many keys spread over the window instead of all landing on the boundary.
        queue_capacity: the retry queue's bound, in increments.
        retry_backoff, retry_backoff_max: the retry thread's first delay and its cap, in
            seconds; delays double per failed attempt, with jitter.

    Thread-safe; share one instance between threads.
    """

    def __init__(
        self,
        store: Store,
        name: str,
        window: float,
        *,
        mode: Literal["script", "commands"] = "script",
        grace: float = 1.0,
        on_error: Literal["raise", "queue"] = "raise",
        prefix: str = "redcount",
        stagger: bool = False,
        queue_capacity: int = 100_000,
        retry_backoff: float = 0.05,
        retry_backoff_max: float = 5.0,
    ) -> None:
        super().__init__(
            store,
            name,
            window,
            prefix,
            grace,
            stagger,
            mode,
            on_error,
            queue_capacity,
            retry_backoff,
            retry_backoff_max,
        )
        #: Seconds :func:`close` may wait for the retry queue at interpreter exit.
        self.exit_timeout = 5.0
        if on_error == "queue":
            _QUEUED.add(self)

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
