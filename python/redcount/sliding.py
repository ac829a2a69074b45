"""Sliding-window counters: [`SlidingWindowCounter`][redcount.sliding.SlidingWindowCounter]."""

from __future__ import annotations

from typing import Literal

from . import _core
from ._core import Store
from ._wrap import bind_fast_paths

__all__ = ["SlidingWindowCounter"]

Clock = Literal["client", "server", "server-offset"]

# Methods that go straight to the core object (see _wrap.py). Not add(): the core's add
# has no default for ``amount``, so it keeps its Python method here.
_FAST = ("count", "add_unique", "count_unique", "clear", "storage_keys")


class SlidingWindowCounter:
    """Counts the events, or the distinct items, of each key in the last ``window`` seconds.

    Unlike [`FixedWindowCounter`][redcount.counters.FixedWindowCounter], the window slides with the clock at
    millisecond precision: an event counts while it is less than ``window`` old.

    Each key's events live in a sorted set (score = time, member = time plus a unique id, so
    events of the same millisecond never overwrite each other); distinct items live in a
    second sorted set with the item as member, so re-adding an item refreshes its time.
    Every call is one atomic script that trims what left the window, adds, sets the key's
    TTL to the window and returns the count. The window size is part of the key, so one
    business key can have counters of several granularities. Storage is one set member
    per event (or item) in the window: use it where the window holds thousands of events
    per key, not millions (a [`FixedWindowCounter`][redcount.counters.FixedWindowCounter] is O(1)).

    Args:
        store: from [`redcount.connect`][redcount.store.connect].
        name: the counter's name, part of every key (no ``{`` or ``}``).
        window: seconds (>= 0.001).
        prefix: the first part of every key (default ``"redcount"``).
        clock: ``"client"`` (default) takes now from this process's clock; ``"server"``
            reads Redis ``TIME`` inside the script, so app servers with skewed clocks still
            agree (falling back to ``"server-offset"`` where the server refuses ``TIME``
            in scripts); ``"server-offset"`` corrects the client clock by an offset
            measured with ``TIME`` every 10 s.

    [`redcount.aio.SlidingWindowCounter`][redcount.aio.SlidingWindowCounter] is the asyncio twin; it can share this
    counter's core (``redcount.aio.SlidingWindowCounter.from_sync(counter)``).

    Thread-safe.
    """

    _core: _core.SlidingWindowCounter

    def __init__(
        self,
        store: Store,
        name: str,
        window: float,
        *,
        prefix: str = "redcount",
        clock: Clock = "client",
    ) -> None:
        core = _core.SlidingWindowCounter(store, name, window, prefix, clock)
        self._core = core
        bind_fast_paths(self, SlidingWindowCounter, core, _FAST)

    # The methods below document the calls; on an instance, bind_fast_paths has replaced
    # them by the core's own bound methods (same arguments, results and errors).

    def add(self, key: str | bytes, amount: int = 1) -> int:
        """Record ``amount`` events (1 .. 2**32) now; return the window's count including them.

        ``amount > 1`` is stored as one weighted member, not ``amount`` members."""
        return self._core.add(key, amount)

    def count(self, key: str | bytes) -> int:
        """The events of the last ``window`` seconds (read-only)."""
        return self._core.count(key)

    def add_unique(self, key: str | bytes, item: str | bytes) -> int:
        """Record that ``item`` was seen now; return the distinct items of the window."""
        return self._core.add_unique(key, item)

    def count_unique(self, key: str | bytes) -> int:
        """The distinct items seen in the last ``window`` seconds (read-only)."""
        return self._core.count_unique(key)

    def clear(self, key: str | bytes) -> None:
        """Forget ``key``'s events and items."""
        self._core.clear(key)

    def storage_keys(self, key: str | bytes) -> tuple[str, str, str]:
        """The Redis keys behind ``key``: (events, extra weight, distinct items)."""
        return self._core.storage_keys(key)

    @property
    def name(self) -> str:
        return self._core.name

    @property
    def prefix(self) -> str:
        return self._core.prefix

    @property
    def window(self) -> float:
        """Window in seconds."""
        return self._core.window

    @property
    def clock(self) -> str:
        """The time source in force: ``"client"``, ``"server"`` or ``"server-offset"``."""
        return self._core.clock

    @property
    def store(self) -> Store:
        return self._core.store

    def __repr__(self) -> str:
        return (
            f"SlidingWindowCounter(name={self.name!r}, window={self.window}, clock={self.clock!r}, "
            f"store={self.store.url!r})"
        )
