"""Analysis of sharded counters as pandas DataFrames, for notebooks and reports.

```python
from redcount import analysis

analysis.shard_table(likes)                        # value and share of every shard
analysis.skew_table([likes, views], writes="log")  # max/mean, CV, Gini of values and writes
analysis.hot_keys(redcount.HotKeys(...), n=10)     # or a {key: exact count} mapping
analysis.drift_history("sqlite:///counters.db", "likes:post:987")
analysis.lag_history(flusher, samples=20, interval=0.5)
analysis.shard_recommendation({"likes": per_shard_rates}, target_per_shard=20_000)
```

Every function returns a new `pandas.DataFrame`; the skew figures come from
[`redcount.skew`][redcount.skew] (the one definition the metrics and ``counter.skew()`` share).
Needs the ``analysis`` extra: ``pip install 'redcount[analysis]'`` (pandas and matplotlib;
matplotlib only for plotting the frames). Bad input raises [`redcount.InvalidInputError`][redcount.errors.InvalidInputError]
(a ValueError) before anything is read.

The functions keep no state and are thread-safe as far as the objects passed in are (a
[`Flusher`][redcount.sql.flusher.Flusher] is not: do not sample its lag while another thread runs
``run_once`` on the same object; sample a second Flusher, or one in another process).
"""

from __future__ import annotations

import importlib
import math
import numbers
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal, Protocol, Union

from .errors import InvalidInputError
from .sharded import ShardedCounter
from .skew import recommended_shards, skew_of
from .sql.reconciliation import runs as _runs
from .sql.snapshots import SnapshotStore

__all__ = [
    "drift_history",
    "hot_keys",
    "lag_history",
    "log_writes",
    "shard_recommendation",
    "shard_table",
    "skew_table",
]

# pandas ships no type information that mypy --strict accepts without pandas-stubs: frames are
# Any at this boundary, and the docstrings say which columns they have.
DataFrame = Any


class HotKey(Protocol):
    """One entry of a top-K sampler (``redcount.HotKeys.top(n)``)."""

    @property
    def key(self) -> object: ...

    @property
    def count(self) -> int: ...

    @property
    def error(self) -> int: ...


class TopK(Protocol):
    """Anything with ``top(n)`` returning [`HotKey`][redcount.analysis.HotKey] entries, largest count first."""

    def top(self, n: int) -> Sequence[HotKey]: ...


class LagSource(Protocol):
    """Anything with a ``lag`` property like [`redcount.Flusher.lag`][redcount.sql.flusher.Flusher.lag]."""

    @property
    def lag(self) -> Any: ...


Counters = Union[ShardedCounter, Iterable[ShardedCounter], Mapping[str, Sequence[int]]]
"""Counters to analyse: a ShardedCounter, several, or constructed data {name: per-shard values}."""
Writes = Union[Mapping[str, Sequence[float]], Literal["log"], None]
"""Writes per shard: {name: per-shard write counts}, or "log" to count each shard's delta log."""


def _figures(xs: object) -> list[Any] | None:
    """``xs`` as a list when it is a sequence of figures (a list, tuple, numpy array, pandas
    Series), else None."""
    if isinstance(xs, (str, bytes, Mapping)) or not isinstance(xs, Iterable) or not hasattr(xs, "__len__"):
        return None
    return list(xs)


def _is_int(v: object) -> bool:
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def _is_rate(v: object) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v)) and float(v) >= 0


def _pandas() -> Any:
    try:
        return importlib.import_module("pandas")
    except ImportError as exc:
        raise ImportError(
            "redcount.analysis needs pandas (and matplotlib for plots): pip install 'redcount[analysis]'"
        ) from exc


# ---- per-shard load and value ------------------------------------------------------------


def _shard_values(counters: Counters) -> tuple[dict[str, list[int]], dict[str, ShardedCounter]]:
    """``{name: shard values}`` and the live counters among them, validated."""
    if isinstance(counters, ShardedCounter):
        counters = [counters]
    values: dict[str, list[int]] = {}
    live: dict[str, ShardedCounter] = {}
    if isinstance(counters, Mapping):
        if not counters:
            raise InvalidInputError("counters: give at least one counter")
        for name, shard_vals in counters.items():
            if not isinstance(name, str) or not name:
                raise InvalidInputError(f"counter names must be non-empty strings, got {name!r}")
            xs = _figures(shard_vals)
            if not xs:
                raise InvalidInputError(f"counter {name!r}: give a non-empty sequence of shard values, got {shard_vals!r}")
            for v in xs:
                if not _is_int(v):
                    raise InvalidInputError(f"counter {name!r}: shard values must be ints, got {v!r}")
            values[name] = [int(v) for v in xs]
        return values, live
    if isinstance(counters, (str, bytes)):
        raise InvalidInputError(
            f"counters: give ShardedCounter objects or a {{name: shard values}} mapping, got the string {counters!r}"
        )
    items = list(counters)
    if not items:
        raise InvalidInputError("counters: give at least one counter")
    for c in items:
        if not isinstance(c, ShardedCounter):
            raise InvalidInputError(f"counters: expected ShardedCounter objects, got {type(c).__name__}")
        if c.name in live:
            raise InvalidInputError(f"counters: {c.name!r} is given twice")
        live[c.name] = c
    for name, c in live.items():
        values[name] = c.shard_values()
    return values, live


def log_writes(counter: ShardedCounter, *, since_ms: int | None = None) -> list[int]:
    """Entries in each shard's delta log (one per applied write), in shard order.

    With ``since_ms`` (epoch milliseconds), only entries logged at or after it (an entry's id
    is the server time of its write), so two calls give the writes per shard of an interval.
    The logs are trimmed to about ``log_maxlen`` entries per shard: a shard that wrote more
    than that shows at most about ``log_maxlen``, so size ``log_maxlen`` for the interval; a
    running [`Flusher`][redcount.sql.flusher.Flusher] also trims the entries it applied, unless its
    ``retain`` covers the interval.
    One round trip.
    """
    if not isinstance(counter, ShardedCounter):
        raise InvalidInputError(f"log_writes needs a ShardedCounter, got {type(counter).__name__}")
    if since_ms is not None and (isinstance(since_ms, bool) or not isinstance(since_ms, int) or since_ms < 0):
        raise InvalidInputError(f"since_ms must be epoch milliseconds >= 0, got {since_ms!r}")
    keys = [counter.key_of(i, "log") for i in range(counter.shards)]
    if since_ms is None:
        cmds: list[tuple[str | bytes | int | float, ...]] = [("XLEN", k) for k in keys]
        return [int(r) if isinstance(r, int) else 0 for r in counter.store.execute_many(cmds)]
    cmds = [("XRANGE", k, str(since_ms), "+") for k in keys]
    return [len(r) if isinstance(r, list) else 0 for r in counter.store.execute_many(cmds)]


def _writes_of(writes: Writes, values: dict[str, list[int]], live: dict[str, ShardedCounter]) -> dict[str, list[float]]:
    if writes is None:
        return {}
    if isinstance(writes, str):
        if writes != "log":
            raise InvalidInputError(f'writes must be a {{name: per-shard counts}} mapping or "log", got {writes!r}')
        missing = [n for n in values if n not in live]
        if missing:
            raise InvalidInputError(f'writes="log" needs live ShardedCounter objects, not constructed data ({missing[0]!r})')
        return {n: [float(x) for x in log_writes(c)] for n, c in live.items()}
    if not isinstance(writes, Mapping):
        raise InvalidInputError(f"writes must be a mapping of counter name to per-shard counts, got {type(writes).__name__}")
    out: dict[str, list[float]] = {}
    for name, per_shard in writes.items():
        if name not in values:
            raise InvalidInputError(f"writes: counter {name!r} is not among the counters analysed")
        figures = _figures(per_shard)
        if figures is None:
            raise InvalidInputError(f"writes[{name!r}]: give a sequence of per-shard counts, got {per_shard!r}")
        if len(figures) != len(values[name]):
            raise InvalidInputError(
                f"writes[{name!r}] has {len(figures)} figures for {len(values[name])} shards"
            )
        for x in figures:
            if not _is_rate(x):
                raise InvalidInputError(f"writes[{name!r}]: counts must be finite and >= 0, got {x!r}")
        out[name] = [float(x) for x in figures]
    return out


def _share(x: float, total: float) -> float:
    return x / total if total else math.nan


def shard_table(counters: Counters, *, writes: Writes = None) -> DataFrame:
    """One row per counter and shard: how value (and writes) spread over the shards.

    ``counters``: a [`ShardedCounter`][redcount.sharded.ShardedCounter], several, or constructed data
    ``{name: [shard values]}``. ``writes``: ``{name: [writes per shard]}`` (for example from a
    workload you replayed, or two [`log_writes`][redcount.analysis.log_writes] readings subtracted), or ``"log"`` to count
    each live counter's delta log now. Columns: ``counter``, ``shard``, ``value``, ``share``
    (of the counter's sum of values; NaN when it is 0), and with writes ``writes``,
    ``write_share``. Counters without writes have NaN there.
    """
    pd = _pandas()
    values, live = _shard_values(counters)
    per_writes = _writes_of(writes, values, live)
    rows: list[dict[str, Any]] = []
    for name, vals in values.items():
        total = float(sum(vals))
        w = per_writes.get(name)
        wtotal = math.fsum(w) if w is not None else 0.0
        for i, v in enumerate(vals):
            row: dict[str, Any] = {"counter": name, "shard": i, "value": v, "share": _share(v, total)}
            if per_writes:
                row["writes"] = w[i] if w is not None else math.nan
                row["write_share"] = _share(w[i], wtotal) if w is not None else math.nan
            rows.append(row)
    columns = ["counter", "shard", "value", "share"] + (["writes", "write_share"] if per_writes else [])
    return pd.DataFrame(rows, columns=columns)


_SKEW_COLUMNS = [
    "counter",
    "basis",
    "shards",
    "total",
    "mean",
    "max",
    "max_over_mean",
    "cv",
    "gini",
    "recommended_shards",
]


def skew_table(
    counters: Counters,
    *,
    writes: Writes = None,
    seconds: float | None = None,
    target_per_shard: float | None = None,
) -> DataFrame:
    """Shard skew of each counter: one row per counter and basis, from [`redcount.skew.skew_of`][redcount.skew.skew_of].

    Basis ``"value"`` is the spread of the shard values (every counter; a counter with a
    negative shard value has no meaningful share and raises InvalidInputError: analyse its
    writes instead); basis ``"writes"`` the spread of the writes per shard (when ``writes`` is
    given, see [`shard_table`][redcount.analysis.shard_table]). With ``seconds``, the writes were observed over that many
    seconds and ``total``, ``mean`` and ``max`` of the writes rows are rates per second; with
    ``target_per_shard`` (writes per second a shard should take at most, which needs
    ``seconds``), ``recommended_shards`` says how many shards an even spread needs
    ([`redcount.skew.recommended_shards`][redcount.skew.recommended_shards]; never below the current count). Columns:
    ``counter``, ``basis``, ``shards``, ``total``, ``mean``, ``max``, ``max_over_mean``,
    ``cv``, ``gini``, ``recommended_shards`` (None where not computed).
    """
    pd = _pandas()
    if seconds is not None and (
        isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) or seconds <= 0
    ):
        raise InvalidInputError(f"seconds must be a positive duration, got {seconds!r}")
    if target_per_shard is not None:
        if seconds is None or writes is None:
            raise InvalidInputError("target_per_shard needs writes and the seconds they were observed over")
        _check_target(target_per_shard)
    values, live = _shard_values(counters)
    per_writes = _writes_of(writes, values, live)
    for name, vals in values.items():
        if any(v < 0 for v in vals):
            raise InvalidInputError(
                f"counter {name!r} has a negative shard value: the value skew is undefined; analyse its writes"
            )
    rows: list[dict[str, Any]] = []
    for name, vals in values.items():
        s = skew_of([float(v) for v in vals])
        rows.append(_skew_row(name, "value", s.shards, s.total, s.mean, s.max, s.max_over_mean, s.cv, s.gini, None))
        w = per_writes.get(name)
        if w is not None:
            rates = [x / seconds for x in w] if seconds is not None else w
            s = skew_of(rates, target_per_shard=target_per_shard)
            rows.append(
                _skew_row(name, "writes", s.shards, s.total, s.mean, s.max, s.max_over_mean, s.cv, s.gini,
                          s.recommended_shards)
            )
    frame = pd.DataFrame(rows, columns=_SKEW_COLUMNS)
    # A nullable integer column: <NA> where no recommendation was asked for, not a float NaN.
    frame["recommended_shards"] = pd.array([r["recommended_shards"] for r in rows], dtype="Int64")
    return frame


def _skew_row(
    name: str, basis: str, shards: int, total: float, mean: float, top: float, mom: float, cv: float, gini: float,
    rec: int | None,
) -> dict[str, Any]:
    return {
        "counter": name,
        "basis": basis,
        "shards": shards,
        "total": total,
        "mean": mean,
        "max": top,
        "max_over_mean": mom,
        "cv": cv,
        "gini": gini,
        "recommended_shards": rec,
    }


def shard_recommendation(rates: Mapping[str, Sequence[float]], target_per_shard: float) -> DataFrame:
    """How many shards each counter needs so that an even share of its write rate is at most
    ``target_per_shard`` writes per second ([`redcount.skew.recommended_shards`][redcount.skew.recommended_shards]: a power
    of two, never below the current count, at most 1024).

    ``rates``: ``{name: [writes per second of each shard]}`` (the current shard count is the
    length). Columns: ``counter``, ``shards``, ``total_rate``, ``max_rate`` (the hottest shard
    now), ``target_per_shard``, ``recommended_shards``, ``even_rate_after`` (the total over the
    recommended count), ``hot_now`` (the hottest shard is above the target). An even share
    after resharding is what routing by request id gives on average; a single hot *request*
    cannot be split, so check ``max_rate`` of the new layout once it runs.
    """
    pd = _pandas()
    _check_target(target_per_shard)
    if not isinstance(rates, Mapping) or not rates:
        raise InvalidInputError("rates: give a non-empty {counter name: per-shard rates} mapping")
    rows: list[dict[str, Any]] = []
    for name, per_shard in rates.items():
        figures = _figures(per_shard)
        if not figures:
            raise InvalidInputError(f"rates[{name!r}]: give a non-empty sequence of per-shard rates, got {per_shard!r}")
        s = skew_of(_checked_rates(name, figures))
        rec = recommended_shards(s.total, target_per_shard, current=s.shards)
        rows.append(
            {
                "counter": name,
                "shards": s.shards,
                "total_rate": s.total,
                "max_rate": s.max,
                "target_per_shard": float(target_per_shard),
                "recommended_shards": rec,
                "even_rate_after": s.total / rec,
                "hot_now": s.max > target_per_shard,
            }
        )
    return pd.DataFrame(rows)


def _check_target(target: object) -> None:
    if isinstance(target, bool) or not isinstance(target, (int, float)) or not math.isfinite(target) or target <= 0:
        raise InvalidInputError(f"target_per_shard must be a positive rate (writes per second), got {target!r}")


def _checked_rates(name: str, xs: Sequence[float]) -> list[float]:
    out = []
    for x in xs:
        if not _is_rate(x):
            raise InvalidInputError(f"rates[{name!r}]: rates must be finite and >= 0, got {x!r}")
        out.append(float(x))
    return out


# ---- hot keys ----------------------------------------------------------------------------


def hot_keys(source: TopK | Mapping[Any, int], n: int = 10, *, total: int | None = None) -> DataFrame:
    """The ``n`` hottest keys with bounds on their true counts, largest first.

    ``source``: a top-K sampler (``redcount.HotKeys``, or anything whose ``top(n)`` returns
    entries with ``key``, ``count`` and ``error``: Space-Saving's ``count`` overestimates the
    true count by at most ``error``), or a mapping ``{key: exact count}`` (bounds equal the
    count, error 0). ``total``: all traffic the keys were drawn from, for the shares; defaults
    to the mapping's sum, or the sampler's ``total`` attribute when it has one (else the
    shares are NaN). Columns: ``rank`` (1 = hottest), ``key``, ``count``, ``error``,
    ``lower`` (``count - error``), ``upper`` (``count``), ``share`` and ``cumulative_share``
    (of ``total``, by the estimated count).
    """
    pd = _pandas()
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise InvalidInputError(f"n must be an int >= 1, got {n!r}")
    if total is not None and (isinstance(total, bool) or not isinstance(total, int) or total < 0):
        raise InvalidInputError(f"total must be an int >= 0, got {total!r}")
    entries: list[tuple[Any, int, int]] = []
    if isinstance(source, Mapping):
        for key, count in source.items():
            if not _is_int(count) or count < 0:
                raise InvalidInputError(f"hot_keys: counts must be ints >= 0, got {count!r} for {key!r}")
            entries.append((key, int(count), 0))
        if total is None:
            total = sum(c for _, c, _ in entries)
        # Ties broken by key text, so that equal counts give the same table every run.
        entries.sort(key=lambda e: (-e[1], str(e[0])))
        entries = entries[:n]
    elif callable(getattr(source, "top", None)):
        for e in source.top(n):
            est: Any = getattr(e, "count", None)
            err: Any = getattr(e, "error", None)
            if (
                not _is_int(est) or est < 0 or not _is_int(err) or not 0 <= err <= est
            ):
                raise InvalidInputError(
                    f"hot_keys: top() entries need int count >= 0 and 0 <= error <= count, got {e!r}"
                )
            entries.append((getattr(e, "key", None), int(est), int(err)))
        entries.sort(key=lambda e: -e[1])
        entries = entries[:n]
        if total is None:
            t = getattr(source, "total", None)
            total = int(t) if isinstance(t, int) and not isinstance(t, bool) else None
    else:
        raise InvalidInputError(
            f"hot_keys needs a mapping of key -> count or an object with top(n), got {type(source).__name__}"
        )
    rows = []
    running = 0
    for rank, (key, count, error) in enumerate(entries, start=1):
        running += count
        rows.append(
            {
                "rank": rank,
                "key": key.decode() if isinstance(key, bytes) else key,
                "count": count,
                "error": error,
                "lower": count - error,
                "upper": count,
                "share": count / total if total else math.nan,
                "cumulative_share": running / total if total else math.nan,
            }
        )
    return pd.DataFrame(
        rows, columns=["rank", "key", "count", "error", "lower", "upper", "share", "cumulative_share"]
    )


# ---- drift and lag over time -------------------------------------------------------------


def drift_history(sql_url: str | SnapshotStore, names: str | Iterable[str], *, per_shard: bool = False) -> DataFrame:
    """The recorded reconciliation runs (``redcount_reconcile_runs``) of one or more counters,
    oldest first, for plotting drift over time.

    Columns: ``counter``, ``run_ms``, ``time`` (a UTC timestamp), ``drift`` (live minus
    expected, summed over shards), ``abs_drift`` (absolute live and audit drift, summed),
    ``relative`` (a fraction, 0.001 being 0.1 %: the figure ``redcount reconcile`` prints
    before its percentage), ``ok``, ``corrections`` (the unsigned size of what a repair wrote). With ``per_shard=True``, one
    row per run and drifting or corrected shard instead: ``counter``, ``run_ms``, ``time``,
    ``shard``, ``drift``, ``audit_drift``, ``correction``, ``audit_correction`` (a run where
    every shard agreed has no rows there).
    """
    pd = _pandas()
    if isinstance(names, str):
        names = [names]
    names = list(names)
    if not names or not all(isinstance(n, str) and n for n in names):
        raise InvalidInputError(f"names: give one or more non-empty counter names, got {names!r}")
    snaps = sql_url if isinstance(sql_url, SnapshotStore) else SnapshotStore(sql_url)
    try:
        recorded = [(name, _runs(snaps, name)) for name in names]
    finally:
        if snaps is not sql_url:
            snaps.close()
    if per_shard:
        cols = ["counter", "run_ms", "shard", "drift", "audit_drift", "correction", "audit_correction"]
        rows = [
            {"counter": name, "run_ms": r.run_ms, **{k: int(s.get(k, 0)) for k in cols[2:]}}
            for name, rs in recorded
            for r in rs
            for s in r.shards
        ]
    else:
        cols = ["counter", "run_ms", "drift", "abs_drift", "relative", "ok", "corrections"]
        rows = [
            {"counter": name, "run_ms": r.run_ms, "drift": r.drift, "abs_drift": r.abs_drift,
             "relative": r.relative, "ok": r.ok, "corrections": r.corrections}
            for name, rs in recorded
            for r in rs
        ]
    frame = pd.DataFrame(rows, columns=cols)
    frame.insert(2, "time", pd.to_datetime(frame["run_ms"].astype("int64"), unit="ms", utc=True))
    return frame


def lag_history(
    flusher: LagSource,
    *,
    samples: int = 10,
    interval: float = 1.0,
    stop: threading.Event | None = None,
    between: Callable[[int], None] | None = None,
) -> DataFrame:
    """Sample a flusher's [`lag`][redcount.sql.flusher.Flusher.lag] ``samples`` times, ``interval``
    seconds apart, while something else writes and flushes.

    ``between(i)``, when given, runs after sample ``i`` instead of the wait (a notebook can
    write or flush a batch there, making the samples deterministic). ``stop`` ends sampling
    early: once it is set (by another thread, or by ``between``), one last sample is taken,
    so the frame ends with the state at the stop. Columns: ``sample``, ``elapsed`` (seconds
    since the first sample), ``entries`` (stream entries not yet in SQL), ``seconds`` (age of
    the oldest of them).
    """
    pd = _pandas()
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 1:
        raise InvalidInputError(f"samples must be an int >= 1, got {samples!r}")
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not math.isfinite(interval) or interval < 0:
        raise InvalidInputError(f"interval must be a duration >= 0 seconds, got {interval!r}")
    # On the type, not the instance: reading a Flusher's lag property costs round trips.
    if not hasattr(type(flusher), "lag") and "lag" not in getattr(flusher, "__dict__", {}):
        raise InvalidInputError(f"lag_history needs an object with a lag property (a Flusher), got {type(flusher).__name__}")
    stop = stop or threading.Event()
    rows = []
    start = time.monotonic()
    for i in range(samples):
        lag = flusher.lag
        rows.append({"sample": i, "elapsed": time.monotonic() - start, "entries": int(lag.entries),
                     "seconds": float(lag.seconds)})
        if i == samples - 1 or stop.is_set():
            break
        if between is not None:
            between(i)
        else:
            stop.wait(interval)
    return pd.DataFrame(rows, columns=["sample", "elapsed", "entries", "seconds"])
