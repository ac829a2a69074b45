"""redcount: fast, correct counters and rate limiters on Redis or an embedded store.

Quick start::

    import redcount

    store = redcount.connect()                    # embedded store; or "redis://host:6379/0"
    views = redcount.FixedWindowCounter(store, "views", window=3600)
    views.incr("page:/home")                      # -> count in the current hour

    limiter = redcount.Limiter(store)
    if not limiter.hit("5/second;100/hour", "ip:203.0.113.9"):
        ...  # reject: 429 Too Many Requests
"""

from __future__ import annotations

from ._core import RateLimit
from .counters import FixedWindowCounter, RetryStats
from .errors import (
    AuthenticationError,
    ConnectionError,
    InvalidInputError,
    ProtocolError,
    RedcountError,
    ReplyError,
    RetryQueueFull,
    ScriptError,
    TimeoutError,
)
from .limiter import Decision, Limiter, LimitSet, LimitStats, parse_limits, strategies
from .store import ManualClock, Store, connect

__version__ = "0.1.0"

__all__ = [
    "AuthenticationError",
    "ConnectionError",
    "Decision",
    "FixedWindowCounter",
    "InvalidInputError",
    "LimitSet",
    "LimitStats",
    "Limiter",
    "ManualClock",
    "ProtocolError",
    "RateLimit",
    "RedcountError",
    "ReplyError",
    "RetryQueueFull",
    "RetryStats",
    "ScriptError",
    "Store",
    "TimeoutError",
    "__version__",
    "connect",
    "parse_limits",
    "strategies",
]
