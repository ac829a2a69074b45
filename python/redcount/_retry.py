"""Defaults of the retry queue (``on_error="queue"``), the one place that names them: the
counters that have a queue ([`FixedWindowCounter`][redcount.counters.FixedWindowCounter],
[`ShardedCounter`][redcount.sharded.ShardedCounter]) and their asyncio twins take them from here."""

from __future__ import annotations

QUEUE_CAPACITY = 100_000
"""The queue's bound, in writes: beyond it a queued write is refused ([`RetryQueueFull`][redcount.errors.RetryQueueFull])."""
RETRY_BACKOFF = 0.05
"""Seconds before the first retry; each failed attempt doubles it, with jitter ..."""
RETRY_BACKOFF_MAX = 5.0
"""... up to this many seconds."""
CLOSE_TIMEOUT = 5.0
"""Seconds ``close()`` waits for the queue by default; also a counter's ``exit_timeout``, what
the end of a ``with`` block and the interpreter's exit allow it."""
