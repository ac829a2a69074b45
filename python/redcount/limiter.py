"""Rate limiting on top of the counters: :class:`Limiter`."""

from __future__ import annotations

from . import _core
from ._core import Decision, LimitSet, LimitStats, Store

__all__ = ["Decision", "LimitSet", "LimitStats", "Limiter", "parse_limits", "strategies"]


def parse_limits(text: str) -> LimitSet:
    """Parse a limit string such as ``"10/minute"``, ``"10 per minute"``, ``"100/5 minutes"``
    or ``"5/second;100/hour"`` (all must hold). Raises ``ValueError``
    (:class:`~redcount.InvalidInputError`) naming the bad part."""
    return LimitSet(text)


def strategies() -> list[str]:
    """The strategy names :class:`Limiter` accepts."""
    return _core.limiter_strategies()


class Limiter:
    """Decides whether a key may do something, under one or more rate limits.

    ``limit`` arguments are strings like ``"10/minute"`` or ``"5/second;100/hour"`` (parsed
    once and cached) or a :class:`LimitSet`. Several limits are decided in one round trip and
    all-or-nothing: a hit is charged against every limit or, when any limit refuses it,
    against none, so a denied hit stores nothing.

    Strategies: ``"fixed-window"`` (clock-aligned windows; a burst straddling a boundary can
    get up to twice the limit through). More strategies plug in behind the same methods.

    Thread-safe.
    """

    def __init__(self, store: Store, strategy: str = "fixed-window", *, prefix: str = "redcount:lim") -> None:
        self._core = _core.LimiterCore(store, strategy, prefix)
        self._parsed: dict[str, LimitSet] = {}
        self.store = store
        self.strategy = strategy
        self.prefix = prefix

    def _limits(self, limit: str | LimitSet) -> LimitSet:
        if isinstance(limit, LimitSet):
            return limit
        parsed = self._parsed.get(limit)
        if parsed is None:
            if not isinstance(limit, str):
                raise TypeError(f"limit must be a str or LimitSet, got {type(limit).__name__}")
            parsed = LimitSet(limit)
            if len(self._parsed) < 4096:
                self._parsed[limit] = parsed
        return parsed

    def hit(self, limit: str | LimitSet, key: str | bytes, cost: int = 1) -> Decision:
        """Charge ``cost`` against ``key`` if every limit allows it; return the decision."""
        parsed = self._parsed.get(limit) if isinstance(limit, str) else None
        return self._core.hit(parsed or self._limits(limit), key, cost)

    def test(self, limit: str | LimitSet, key: str | bytes, cost: int = 1) -> Decision:
        """What :meth:`hit` would decide now, without charging anything."""
        return self._core.test(self._limits(limit), key, cost)

    def stats(self, limit: str | LimitSet, key: str | bytes) -> list[LimitStats]:
        """The count, remaining hits and reset time of ``key`` under each limit."""
        return self._core.stats(self._limits(limit), key)

    def reset(self, limit: str | LimitSet, key: str | bytes) -> None:
        """Forget ``key``'s current windows under these limits."""
        self._core.reset(self._limits(limit), key)

    def __repr__(self) -> str:
        return f"Limiter(strategy={self.strategy!r}, store={self.store.url!r})"
