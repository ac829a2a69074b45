"""What ``redcount bench`` measures, by name: the row names (in the order they are measured
and printed), the limits and sizes they run at, and the absolute targets. Shared by the blocks
that measure the rows and the report that prints them."""

from __future__ import annotations

N_KEYS = 10_000
BIG_LIMIT = "1000000000/minute"  # never reached: every hit is allowed
COUNTER_WINDOW = 60.0
INSTALL_REDIS = "install it with `apt-get install redis-server` (which also provides redis-benchmark)"
INSTALL_LIMITS = "pip install 'redcount[bench]'"

# Row names, in the order they are measured and printed.
RB_P1 = "redis-benchmark INCR -c1 -P1"
RC_INCR = "redcount incr (Redis)"
LIM_HIT_REDIS = "limits FixedWindow hit (RedisStorage)"
RC_HIT_REDIS = "redcount Limiter.hit (Redis)"
RB_PN = "redis-benchmark INCR -c1 -P{batch}"
RC_MANY = "redcount incr_many x{batch} (Redis, per key)"
# A large batch against redis-benchmark at its usual pipeline depth: the per-key cost of the
# batch path (formatting, replies, conversion) shows here, not the round trip.
MANY_BIG = 1000
RB_MANY_DEPTH = 128
RC_INCR_MEM = "redcount incr (memory)"
LIM_HIT_MEM = "limits FixedWindow hit (MemoryStorage)"
RC_HIT_MEM = "redcount Limiter.hit (memory)"

SLIDING_LIMIT = "100/second"  # see the module docstring: never reached, and windows stay small
# {store}: "Redis" or "memory"; {storage}: limits' "RedisStorage" or "MemoryStorage".
RC_SW = "redcount sliding-window hit ({store})"
LIM_MW = "limits MovingWindow hit ({storage})"
RC_SWA = "redcount sliding-window-approx hit ({store})"
LIM_SWC = "limits SlidingWindowCounter hit ({storage})"
RC_TB = "redcount token-bucket hit ({store})"
RC_GCRA = "redcount gcra hit ({store})"
# The engine (--only engine): threads, coroutines and TLS sharing one store.
THREADS = 8
# Every thread count the engine block measures (the default store, one shared socket and a
# thread connection per thread, each beside redis-benchmark with as many clients); THREADS
# is one of them.
THREAD_COUNTS = (1, THREADS, 32)
TASKS = 1000
RB_C8 = "redis-benchmark INCR -c{threads} -P1"
RC_INCR_THREADS = "redcount incr x{threads} threads (Redis)"
RC_INCR_THREADS_TC = "redcount incr x{threads} threads (Redis, max_connections={cap})"
RC_INCR_THREADS_ONE = "redcount incr x{threads} threads (Redis, one socket)"
RC_INCR_NO_SPIN = "redcount incr x1 threads (Redis, spin=0)"
LIM_AIO = "limits async FixedWindow hit x{tasks} coroutines (RedisStorage)"
RC_AIO = "redcount aio Limiter.hit x{tasks} coroutines (Redis)"
RC_AIO_UVLOOP = "redcount aio Limiter.hit x{tasks} coroutines (Redis, uvloop)"
RC_INCR_TLS = "redcount incr (Redis over TLS)"
# Hot keys (--only hot): the same contenders over 100 keys hit in turn.
HOT_KEYS = 100
# A limit under which the exact logs grow through the run (a million an hour was the aim); the
# member strategies cap a limit at 100,000 (bounded server work per call), so the largest allowed.
HOT_SLIDING_LIMIT = "100000/hour"
HOT = " (100 hot keys)"
# Sharded counters (--only sharded).
RC_SH_INCR = "redcount sharded incr, new request id per call (Redis)"
RC_SH_INCR_THREADS = "redcount sharded incr, new request ids x{threads} threads (Redis)"
SH_MANY = 100  # counters (and writes) per incr_many call
RC_SH_MANY = "redcount sharded incr_many x{n} counters, request ids (Redis, per write)"
RC_SH_MANY_THREADS = "redcount sharded incr_many x{n} counters, request ids x{threads} threads (Redis, per write)"
RC_BUF = "redcount BufferedCounter.incr (memory, one thread)"
SH_MANY_TARGET = 100_000.0  # applied increments per second, absolute, from one process
BUF_TARGET = 2_000_000.0  # calls per second, absolute
SH_LATENCY_SHARDS = (1, 16, 64, 256)
