"""Hot keys (``--only hot``): redcount ``incr`` against ``limits``' ``FixedWindowRateLimiter.hit``,
and the exact sliding log against ``MovingWindowRateLimiter.hit`` under a limit whose logs grow
through the run, on Redis and in memory, over a few keys hit in turn."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from functools import partial

from ...counters import FixedWindowCounter
from ...limiter import Limiter
from ...store import Store, connect
from .harness import Contender, PythonOp, RatioSpec, limits_redis_storage
from .rows import (
    BIG_LIMIT,
    COUNTER_WINDOW,
    HOT,
    HOT_KEYS,
    HOT_SLIDING_LIMIT,
    LIM_HIT_MEM,
    LIM_HIT_REDIS,
    LIM_MW,
    RC_INCR,
    RC_INCR_MEM,
    RC_SW,
)


def hot_block(
    stack: ExitStack, store: Store, url: str, prefix: str, keys: Sequence[str]
) -> tuple[list[Contender], list[RatioSpec], list[FixedWindowCounter]]:
    """The hot-key contenders, their ratios, and the counters to close after the run;
    resources to release go on ``stack``."""
    import limits
    import limits.storage
    import limits.strategies

    item = limits.parse(BIG_LIMIT)
    hot_keys = keys[:HOT_KEYS]
    hot_item = limits.parse(HOT_SLIDING_LIMIT)
    mem_hot = connect()
    stack.callback(mem_hot.close)
    contenders: list[Contender] = []
    ratios: list[RatioSpec] = []
    counters: list[FixedWindowCounter] = []
    for where, storage, rc_store, fixed_storage, mw_storage, incr_target, sw_target in [
        (
            "Redis",
            "RedisStorage",
            store,
            limits_redis_storage(url, f"{prefix}:limits-hot-fw"),
            limits_redis_storage(url, f"{prefix}:limits-hot-mw"),
            1.6,
            1.6,
        ),
        (
            "memory",
            "MemoryStorage",
            mem_hot,
            limits.storage.MemoryStorage(),
            limits.storage.MemoryStorage(),
            3.0,
            5.0,
        ),
    ]:
        hot_counter = FixedWindowCounter(rc_store, "hot", COUNTER_WINDOW, prefix=prefix)
        counters.append(hot_counter)
        log = Limiter(rc_store, "sliding-window", prefix=f"{prefix}:hotlim")
        names = (
            (RC_INCR_MEM if where == "memory" else RC_INCR) + HOT,
            (LIM_HIT_MEM if where == "memory" else LIM_HIT_REDIS) + HOT,
            RC_SW.format(store=where) + HOT,
            LIM_MW.format(storage=storage) + HOT,
        )
        contenders += [
            PythonOp(names[0], hot_counter.incr, hot_keys),
            PythonOp(names[1], partial(limits.strategies.FixedWindowRateLimiter(fixed_storage).hit, item), hot_keys),
            PythonOp(names[2], partial(log.hit, HOT_SLIDING_LIMIT), hot_keys),
            PythonOp(names[3], partial(limits.strategies.MovingWindowRateLimiter(mw_storage).hit, hot_item), hot_keys),
        ]
        ratios += [
            (f"redcount incr / limits hit ({where}, 100 hot keys)", names[0], names[1], incr_target),
            (f"redcount sliding-window / limits MovingWindow ({where}, 100 hot keys)", names[2], names[3], sw_target),
        ]
    return contenders, ratios, counters
