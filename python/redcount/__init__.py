"""redcount: fast, correct counters and rate limiters on Redis or an embedded store.

Quick start:

```python
import redcount

store = redcount.connect()                    # embedded store; or "redis://host:6379/0"
views = redcount.FixedWindowCounter(store, "views", window=3600)
views.incr("page:/home")                      # -> count in the current hour

limiter = redcount.Limiter(store, "sliding-window")
if not limiter.hit("5/second;100/hour", "ip:203.0.113.9"):
    ...  # reject: 429 Too Many Requests

recent = redcount.SlidingWindowCounter(store, "logins", window=60)
recent.add_unique("user:42", "ip:203.0.113.9")   # -> distinct ips in the last minute
```

asyncio: [`redcount.aio`][redcount.aio] has the same classes with coroutine methods
(``await redcount.aio.Limiter(store).hit("10/minute", key)``). The ``redcount`` command's
tools (demo, bench, accuracy, abuse) live in `redcount.tools`; snapshots of sharded
counters in SQL, the flusher, reconciliation and restore in [`redcount.sql`][redcount.sql]; the figures
behind [`metrics`][redcount.telemetry.metrics] in [`redcount.telemetry`][redcount.telemetry].
"""

from __future__ import annotations

from ._core import RateLimit
from .counters import FixedWindowCounter, RetryStats
from .errors import (
    AuthenticationError,
    ConnectionError,
    InvalidInputError,
    Outcome,
    ProtocolError,
    RateLimitExceeded,
    RedcountError,
    ReplyError,
    RetryQueueFull,
    ScriptError,
    SecurityWarning,
    StoreClosed,
    TimeoutError,
    Unavailable,
    WaitTimeout,
)
from .limiter import Decision, Lease, Limiter, LimitSet, LimitStats, parse_limits, strategies
from .hot_keys import HotKey, HotKeys
from .policies import Penalty
from .pn import PNCounter
from .reservations import Adjustment, Reservation
from .sharded import BufferedCounter, BufferedStats, Quota, QuotaResult, Reading, ShardedCounter
from .sharded import ShardGeneration, ShardLayout
from .sliding import SlidingWindowCounter
from .sql import Flusher, FlusherStats, Lag, Report, RestoreReport, SnapshotStore, reconcile, restore
from .store import ManualClock, ResilientStore, Store, connect
from .telemetry import MetricsSnapshot, RedcountCollector, metrics

# One place: _version.py, which pyproject.toml and CMake read too. Not read back from the
# installed metadata: importing importlib.metadata costs more than the rest of the package.
from ._version import __version__

__all__ = [
    "Adjustment",
    "AuthenticationError",
    "BufferedCounter",
    "BufferedStats",
    "ConnectionError",
    "Decision",
    "FixedWindowCounter",
    "Flusher",
    "FlusherStats",
    "HotKey",
    "HotKeys",
    "InvalidInputError",
    "Lag",
    "Lease",
    "LimitSet",
    "LimitStats",
    "Limiter",
    "ManualClock",
    "MetricsSnapshot",
    "Outcome",
    "PNCounter",
    "Penalty",
    "ProtocolError",
    "Quota",
    "QuotaResult",
    "RateLimit",
    "RateLimitExceeded",
    "Reading",
    "RedcountCollector",
    "RedcountError",
    "ReplyError",
    "Reservation",
    "ResilientStore",
    "RestoreReport",
    "RetryQueueFull",
    "RetryStats",
    "ScriptError",
    "SecurityWarning",
    "ShardedCounter",
    "ShardGeneration",
    "ShardLayout",
    "StoreClosed",
    "SlidingWindowCounter",
    "SnapshotStore",
    "Store",
    "TimeoutError",
    "Unavailable",
    "WaitTimeout",
    "__version__",
    "connect",
    "metrics",
    "parse_limits",
    "restore",
    "reconcile",
    "Report",
    "strategies",
]
