"""Fixed windows (``--only fixed``): redcount ``incr``, ``incr_many`` and ``Limiter.hit`` on
Redis and in memory against ``limits``' ``FixedWindowRateLimiter.hit`` and ``redis-benchmark``
INCR, all under a limit that is never reached."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from ...counters import FixedWindowCounter
from ...limiter import Limiter
from ...store import Store
from .harness import Contender, PythonOp, RatioSpec, limits_redis_storage
from .redis_benchmark import RedisBenchmark
from .rows import (
    BIG_LIMIT,
    COUNTER_WINDOW,
    MANY_BIG,
    RB_MANY_DEPTH,
    LIM_HIT_MEM,
    LIM_HIT_REDIS,
    RB_P1,
    RB_PN,
    RC_HIT_MEM,
    RC_HIT_REDIS,
    RC_INCR,
    RC_INCR_MEM,
    RC_MANY,
)


def fixed_block(
    store: Store,
    mem: Store,
    url: str,
    prefix: str,
    keys: Sequence[str],
    batches: Sequence[dict[str, int]],
    batch: int,
    bench_bin: str,
    rb_key: str,
) -> tuple[list[Contender], list[RatioSpec], list[FixedWindowCounter]]:
    """The fixed-window contenders, their ratios, and the counters to close after the run."""
    import limits
    import limits.storage
    import limits.strategies

    item = limits.parse(BIG_LIMIT)
    counter = FixedWindowCounter(store, "incr", COUNTER_WINDOW, prefix=prefix)
    limiter = Limiter(store, prefix=f"{prefix}:lim")
    mem_counter = FixedWindowCounter(mem, "incr", COUNTER_WINDOW, prefix=prefix)
    mem_limiter = Limiter(mem, prefix=f"{prefix}:lim")
    lim_redis = limits.strategies.FixedWindowRateLimiter(
        limits_redis_storage(url, f"{prefix}:limits")
    )
    lim_mem = limits.strategies.FixedWindowRateLimiter(limits.storage.MemoryStorage())
    contenders: list[Contender] = [
        RedisBenchmark(RB_P1, bench_bin, url, 1, rb_key),
        PythonOp(RC_INCR, counter.incr, keys),
        PythonOp(LIM_HIT_REDIS, partial(lim_redis.hit, item), keys),
        PythonOp(RC_HIT_REDIS, partial(limiter.hit, BIG_LIMIT), keys),
        RedisBenchmark(RB_PN.format(batch=batch), bench_bin, url, batch, rb_key),
        PythonOp(RC_MANY.format(batch=batch), counter.incr_many, batches, per_call=batch),
    ]
    big = RC_MANY.format(batch=MANY_BIG)
    rb_depth = RB_PN.format(batch=RB_MANY_DEPTH)
    if batch != RB_MANY_DEPTH:  # the -P128 row, when --batch did not already plan it
        contenders.append(RedisBenchmark(rb_depth, bench_bin, url, RB_MANY_DEPTH, rb_key))
    if batch != MANY_BIG:
        n = len(keys)
        big_batches = [{keys[(j * MANY_BIG + i) % n]: 1 for i in range(MANY_BIG)} for j in range(max(1, n // MANY_BIG))]
        contenders.append(PythonOp(big, counter.incr_many, big_batches, per_call=MANY_BIG))
    contenders += [
        PythonOp(RC_INCR_MEM, mem_counter.incr, keys),
        PythonOp(LIM_HIT_MEM, partial(lim_mem.hit, item), keys),
        PythonOp(RC_HIT_MEM, partial(mem_limiter.hit, BIG_LIMIT), keys),
    ]
    ratios: list[RatioSpec] = [
        ("redcount incr (Redis) / limits hit (Redis)", RC_INCR, LIM_HIT_REDIS, 1.6),
        ("redcount incr (Redis) / redis-benchmark -c1 -P1", RC_INCR, RB_P1, 0.8),
        (
            f"redcount incr_many / redis-benchmark -c1 -P{batch}",
            RC_MANY.format(batch=batch),
            RB_PN.format(batch=batch),
            0.4,
        ),
        (f"redcount incr_many x{MANY_BIG} / redis-benchmark -c1 -P{RB_MANY_DEPTH}", big, rb_depth, 0.5),
        ("redcount incr (memory) / limits hit (memory)", RC_INCR_MEM, LIM_HIT_MEM, 3.0),
        ("redcount Limiter.hit / limits hit (Redis)", RC_HIT_REDIS, LIM_HIT_REDIS, None),
        ("redcount Limiter.hit / limits hit (memory)", RC_HIT_MEM, LIM_HIT_MEM, None),
    ]
    return contenders, ratios, [counter, mem_counter]
