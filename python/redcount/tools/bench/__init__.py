"""``redcount bench``: redcount's throughput against ``limits`` and ``redis-benchmark``.

Every figure comes from one run against one redis-server (a private one on a free loopback
port unless ``--url`` names an existing server), so the ratios compare like with like.

Fixed windows (``--only fixed``; all of them under a limit of 10^9/minute that is never reached):

- redcount ``FixedWindowCounter.incr`` and ``incr_many`` (per key) on Redis;
- the ``limits`` library's ``FixedWindowRateLimiter.hit`` on ``RedisStorage`` and on
  ``MemoryStorage``;
- redcount ``incr`` and ``Limiter.hit`` on the embedded memory store, ``Limiter.hit`` on Redis;
- ``redis-benchmark`` INCR with one client, unpipelined (``-P 1``) and pipelined (``-P N``):
  the floor set by the round trip and by the server itself.

Sliding windows and buckets (``--only sliding``), on Redis and on the embedded memory store:

- redcount ``Limiter("sliding-window").hit`` against ``limits``' ``MovingWindowRateLimiter.hit``
  (both an exact log of the hits in the window);
- redcount ``Limiter("sliding-window-approx").hit`` (``sub_buckets=1``, the classic two-bucket
  estimate) against ``limits``' ``SlidingWindowCounterRateLimiter.hit`` (the same estimate);
- redcount ``Limiter("token-bucket")`` and ``Limiter("gcra")`` ``hit`` on their own (``limits``
  has neither), also shown relative to redcount's sliding window, without a target.

Both sides use the same limit, `SLIDING_LIMIT` ``"100/second"``, and the same key
rotation. A limit that is never reached keeps every hit allowed, as in the fixed-window rows,
but an exact log stores every hit still in its window: under the fixed rows' 10^9/minute a key
would pile up every hit of the run, and each hit would cost more than the last (``limits``'
memory log is a Python list that grows at the front). A per-second window keeps each key's log
at the hits of the last second instead, ``rate / 10,000`` of them with the keys hit in turn
(about 2 on Redis, at most a few dozen in memory), however long the run; 100 per second is then
never reached (it would take a million hits per second), and the buckets, refilled at 100 per
second, never run dry.

The engine (``--only engine``): ``incr`` from 8 threads sharing one store against
``redis-benchmark -c 8 -P 1`` and one thread; ``await redcount.aio.Limiter.hit`` from 1,000
coroutines on one loop (run on the measuring thread) against ``limits``' async Redis storage
(redis-py) with as many coroutines and against one synchronous thread; uvloop if installed; and
``incr`` over ``rediss://`` on a second private, TLS-only server against ``redis://``.

Hot keys (``--only hot``): redcount ``incr`` against ``limits``'
``FixedWindowRateLimiter.hit``, and the exact sliding log against ``MovingWindowRateLimiter.hit``
under ``100000/hour`` (the logs grow through the run; 100,000 is the member strategies' cap),
on Redis and in memory, over 100 keys hit in turn.

Sharded counters (``--only sharded``): ``ShardedCounter.incr`` with a fresh request id
per call (so every write is applied and pays the id's ``SET NX``, the ``INCRBY`` and the
``XADD``) from one thread and from 8, against plain redcount ``incr`` and ``redis-benchmark``
INCR with as many clients; ``incr_many`` over 100 counters with request ids, in applied
increments per second from one thread and from 8 threads of one process (target >= 100,000/s
from one process, read on the 8-thread row: one thread leaves the server idle while it builds
its next call); ``BufferedCounter.incr`` calls per second from one
thread (target >= 2,000,000/s); and ``value()`` latency p50/p99 against the shard count (1, 16,
64, 256), idle and while 8 threads write (printed as notes).

Leased limits (``--only leased``, not part of ``all``): one hot key decided by ``Limiter.hit``
with and without ``lease=1000``, under 8 threads and under 4 processes, in decisions per
second with the client's and the server's CPU per decision, the ratio (target >= 20x), the
refusals per second of a key whose window is used up, with and without ``lease=`` (target
>= 1.0x) and with a refusal cache, and the over- and under-admission of callers that run a
limit out (see `leased`).

Unless said otherwise above, each measurement runs single-threaded for about ``--seconds`` in all, after a short warm-up,
over 10,000 rotating keys under a key prefix unique to the run. The measurements take turns
in slices of about 0.4 s (see `rounds`), so a change in the machine's state mid-run
hits every contender alike; the two sides of each ratio with a target run back to back. On a
``--url`` server only the run's own keys are written, and they are deleted (SCAN + DEL) at the
end.

The package: `run` (arguments, the order of the blocks),
`harness` (contenders taking turns, the CPU probe),
`report` (rows, ratios, the table, JSON),
`rows` (what is measured, by name), one module per block
(`fixed`, `sliding`,
`hot`, `engine`,
`sharded`), `redis_benchmark`, and the
two benchmarks of their own: `web` (``redcount bench web``) and
`flush` (the flusher's throughput and snapshot lag). Servers come
from `redcount.tools.servers`.
"""

from __future__ import annotations

from .harness import BenchError
from .run import run_bench

__all__ = ["BenchError", "run_bench"]
