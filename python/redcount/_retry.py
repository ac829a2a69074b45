"""Defaults of the retry queue (``on_error="queue"``), the one place that names them: the
counters that have a queue (:class:`~redcount.FixedWindowCounter`,
:class:`~redcount.ShardedCounter`) and their asyncio twins take them from here."""

from __future__ import annotations

#: The queue's bound, in writes: beyond it a queued write is refused (:class:`~redcount.RetryQueueFull`).
QUEUE_CAPACITY = 100_000
#: Seconds before the first retry; each failed attempt doubles it, with jitter ...
RETRY_BACKOFF = 0.05
#: ... up to this many seconds.
RETRY_BACKOFF_MAX = 5.0
#: Seconds ``close()`` waits for the queue by default; also a counter's ``exit_timeout``, what
#: the end of a ``with`` block and the interpreter's exit allow it.
CLOSE_TIMEOUT = 5.0
