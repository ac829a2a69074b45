"""Shard-skew statistics: how unevenly load or value is spread over a counter's shards.

One definition of the figures, used by [`ShardedCounter.skew`][redcount.sharded.ShardedCounter.skew], the metrics snapshot and
[`redcount.analysis`][redcount.analysis], so that a notebook, a Prometheus gauge and a method call never
disagree:

```python
from redcount.skew import skew_of

s = skew_of([120.0, 80.0, 100.0, 900.0], target_per_shard=250.0)
s.max_over_mean      # 3.0: the hottest shard takes 3x its fair share
s.cv                 # coefficient of variation (population standard deviation / mean)
s.gini               # 0 = perfectly even, (n-1)/n = everything on one shard
s.recommended_shards # shards needed so that a fair share is at most 250/s: 5 -> 8
```

Pure Python, no dependencies; the functions are pure and thread-safe.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["Skew", "gini", "recommended_shards", "skew_of"]

MAX_RECOMMENDED_SHARDS = 1024
"""The largest shard count [`recommended_shards`][redcount.skew.recommended_shards] proposes (the sharded counter's own cap)."""


@dataclass(frozen=True)
class Skew:
    """Spread of per-shard figures (write rates, or values) over one counter's shards.

    ``max_over_mean`` is 1.0 when perfectly even; ``cv`` is the population standard deviation
    over the mean; ``gini`` is 0 when even and ``(n - 1) / n`` when one shard has everything.
    All three are 0.0 (``max_over_mean`` 1.0) when every figure is 0, since nothing is skewed.
    ``recommended_shards`` is None unless a target per-shard rate was given.
    """

    shards: int
    total: float
    mean: float
    max: float
    max_over_mean: float
    cv: float
    gini: float
    recommended_shards: int | None = None


def gini(values: Sequence[float]) -> float:
    """Gini coefficient of non-negative ``values``: 0 for an even spread.

    Raises ValueError for an empty sequence or a negative or non-finite value.
    """
    xs = _checked(values)
    total = math.fsum(xs)
    if total == 0.0:
        return 0.0
    ordered = sorted(xs)
    n = len(ordered)
    # Mean absolute difference form over the sorted values: sum_i (2i - n - 1) x_i / (n * sum).
    weighted = math.fsum((2 * (i + 1) - n - 1) * x for i, x in enumerate(ordered))
    return weighted / (n * total)


def recommended_shards(total_rate: float, target_per_shard: float, *, current: int = 1) -> int:
    """Shards needed so that an even share of ``total_rate`` is at most ``target_per_shard``.

    Rounded up to a power of two (resharding by doubling keeps the routing stable to reason
    about), never below ``current`` and never above 1024. Raises ValueError when
    ``target_per_shard`` is not positive or ``total_rate`` is negative.
    """
    if not (isinstance(target_per_shard, (int, float)) and math.isfinite(target_per_shard)) or target_per_shard <= 0:
        raise ValueError(f"target_per_shard must be a positive rate, got {target_per_shard!r}")
    if not (isinstance(total_rate, (int, float)) and math.isfinite(total_rate)) or total_rate < 0:
        raise ValueError(f"total_rate must be a non-negative rate, got {total_rate!r}")
    if isinstance(current, bool) or not isinstance(current, int) or current < 1:
        raise ValueError(f"current must be a shard count >= 1, got {current!r}")
    needed = max(1, math.ceil(total_rate / target_per_shard))
    power = 1
    while power < needed and power < MAX_RECOMMENDED_SHARDS:
        power *= 2
    return max(current, min(power, MAX_RECOMMENDED_SHARDS))


def skew_of(values: Sequence[float], *, target_per_shard: float | None = None) -> Skew:
    """The [`Skew`][redcount.skew.Skew] of per-shard ``values`` (one figure per shard, non-negative).

    With ``target_per_shard`` (a rate, in the same unit as ``values``), also the shard count
    [`recommended_shards`][redcount.skew.recommended_shards] proposes for the observed total. Raises ValueError for an empty
    sequence or a negative or non-finite value.
    """
    xs = _checked(values)
    n = len(xs)
    total = math.fsum(xs)
    mean = total / n
    top = max(xs)
    if total == 0.0:
        max_over_mean, cv = 1.0, 0.0
    else:
        max_over_mean = top / mean
        cv = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / n) / mean
    rec = None if target_per_shard is None else recommended_shards(total, target_per_shard, current=n)
    return Skew(
        shards=n,
        total=total,
        mean=mean,
        max=top,
        max_over_mean=max_over_mean,
        cv=cv,
        gini=gini(xs),
        recommended_shards=rec,
    )


def _checked(values: Sequence[float]) -> list[float]:
    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("skew needs at least one shard figure, got an empty sequence")
    for v in xs:
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"shard figures must be finite and non-negative, got {v!r}")
    return xs
