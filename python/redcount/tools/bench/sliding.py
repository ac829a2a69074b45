"""Sliding windows and buckets (``--only sliding``): redcount's exact log and two-bucket
estimate against their ``limits`` twins, and the token bucket and GCRA on their own."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial

from ...limiter import Limiter, Strategy
from ...store import Store
from .harness import Contender, PythonOp, RatioSpec, limits_redis_storage
from .rows import LIM_MW, LIM_SWC, RC_GCRA, RC_SW, RC_SWA, RC_TB, SLIDING_LIMIT


def sliding_block(
    store: Store,
    where: str,
    storage: str,
    prefix: str,
    keys: Sequence[str],
    moving_window_hit: Callable[[str], object],
    sliding_counter_hit: Callable[[str], object],
    target: float,
) -> tuple[list[Contender], list[RatioSpec]]:
    """The sliding-window and bucket contenders on one store, and their ratios.

    redcount's exact log and two-bucket estimate each run right before their ``limits``
    twin, so that each per-turn ratio compares two slices taken back to back."""

    def hit(strategy: Strategy) -> Callable[[str], object]:
        return partial(Limiter(store, strategy, prefix=prefix).hit, SLIDING_LIMIT)

    sw, mw = RC_SW.format(store=where), LIM_MW.format(storage=storage)
    swa, swc = RC_SWA.format(store=where), LIM_SWC.format(storage=storage)
    tb, gcra = RC_TB.format(store=where), RC_GCRA.format(store=where)
    contenders: list[Contender] = [
        PythonOp(sw, hit("sliding-window"), keys),
        PythonOp(mw, moving_window_hit, keys),
        PythonOp(swa, hit("sliding-window-approx"), keys),
        PythonOp(swc, sliding_counter_hit, keys),
        PythonOp(tb, hit("token-bucket"), keys),
        PythonOp(gcra, hit("gcra"), keys),
    ]
    ratios: list[RatioSpec] = [
        (f"redcount sliding-window / limits MovingWindow ({where})", sw, mw, target),
        (f"redcount sliding-window-approx / limits SlidingWindowCounter ({where})", swa, swc, target),
        (f"redcount token-bucket / redcount sliding-window ({where})", tb, sw, None),
        (f"redcount gcra / redcount sliding-window ({where})", gcra, sw, None),
    ]
    return contenders, ratios



def sliding_blocks(
    store: Store, mem: Store, url: str, prefix: str, keys: Sequence[str]
) -> tuple[list[Contender], list[RatioSpec]]:
    """`sliding_block` on Redis and on the memory store ``mem``, with their targets."""
    import limits
    import limits.storage
    import limits.strategies

    sliding_item = limits.parse(SLIDING_LIMIT)
    contenders: list[Contender] = []
    ratios: list[RatioSpec] = []
    # One limits storage per limiter, like the fixed-window one: in memory each brings its
    # own expiry timer thread, which would otherwise sweep the other's keys too.
    for where, storage, rc_store, mw, swc, target in [
        (
            "Redis",
            "RedisStorage",
            store,
            limits_redis_storage(url, f"{prefix}:limits-mw"),
            limits_redis_storage(url, f"{prefix}:limits-swc"),
            1.6,
        ),
        (
            "memory",
            "MemoryStorage",
            mem,
            limits.storage.MemoryStorage(),
            limits.storage.MemoryStorage(),
            5.0,
        ),
    ]:
        more, more_ratios = sliding_block(
            rc_store,
            where,
            storage,
            f"{prefix}:lim",
            keys,
            partial(limits.strategies.MovingWindowRateLimiter(mw).hit, sliding_item),
            partial(limits.strategies.SlidingWindowCounterRateLimiter(swc).hit, sliding_item),
            target,
        )
        contenders += more
        ratios += more_ratios
    return contenders, ratios
