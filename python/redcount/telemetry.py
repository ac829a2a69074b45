"""Per-process observability: the figures behind ``redcount.metrics()`` and a Prometheus
collector.

```python
hk = redcount.HotKeys(1000)
store = redcount.connect("redis://localhost:6379/0", hot_keys=hk)   # hot keys: optional
...
m = redcount.metrics()             # rates since the previous call of metrics()
m.increments_per_second, m.write_success_rate, m.idempotency_hit_rate
m.hot_keys[:3], m.skew, m.snapshot_lag_seconds, m.drift

redcount.metrics.register()        # prometheus_client: a RedcountCollector in REGISTRY
```

What is counted, and where:

- *increments* are counter writes that reach a store: [`FixedWindowCounter`][redcount.counters.FixedWindowCounter]
  ``incr`` (``incr_many`` counts each item) and [`ShardedCounter`][redcount.sharded.ShardedCounter] writes (a
  [`BufferedCounter`][redcount.sharded.BufferedCounter] flush is one write per counter, its ``incr`` calls are
  local and not counted, so its fast path pays nothing). *Reads* are ``get``/``get_many``,
  ``value`` and ``read`` (served from the cache or not). The C++ drivers count each operation
  once when it completes, with relaxed atomics; an operation that raised to its caller is an
  error (bad input, refused before anything is sent, is not). A write queued for retry
  (``on_error="queue"``) counts as a success.
- *idempotency hits*: sharded writes with a request id that the store answered "already
  applied", over all answered writes with a request id.
- *hot keys*: the top keys of every [`HotKeys`][redcount.hot_keys.HotKeys] passed to
  [`redcount.connect`][redcount.store.connect]; *skew*: for each sharded counter among them, [`redcount.skew.skew_of`][redcount.skew.skew_of]
  over its shards' observed write counts (shards never observed count as 0, up to the highest
  shard seen).
- *lag*: of the open [`Flusher`][redcount.sql.flusher.Flusher] objects in this process (each ``lag`` reads
  Redis and SQL: a few round trips per metrics() call); *trimmed*: delta-log entries this
  process's flushers found trimmed from a log before any flusher of their group applied
  them (lost to the snapshots; ``FlusherStats.trimmed`` summed); *drift*: the last
  [`redcount.reconcile`][redcount.sql.reconciliation.reconcile] of each counter run in this process.
- *undecided requests*: web requests (Flask, FastAPI, Starlette, Django, DRF) that some limit
  decided without the store, by the failure policy, by reason (``timeout``,
  ``breaker-open``, ``unavailable``; see [`redcount.web.engine.UNDECIDED_REASONS`][redcount.web.engine.UNDECIDED_REASONS]).
  Each one was let through (``fail="open"``) or refused with 503 (``"closed"``) without
  being counted against its limits, so a rise means limits were not enforced exactly.
- *retry queue*: the traffic of every [`FixedWindowCounter`][redcount.counters.FixedWindowCounter] made with
  ``on_error="queue"`` in this process, summed (``RetryStats``: queued, retried, delivered,
  dropped, overflowed, failed, and pending now).
- *leased units*: units this process's leases (``Limiter.hit(..., lease=N)``) hold and have
  not admitted yet, over every limiter: what the process would lose if it were killed now
  (SIGKILL; docs/leased-limits.md), and what other processes cannot admit meanwhile.

A forked child starts from zero (its counts are its own). Thread-safe.
"""

from __future__ import annotations

import os
import re
import threading
import time
import weakref
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from . import _core
from .skew import Skew, skew_of

if TYPE_CHECKING:
    from .hot_keys import HotKeys
    from .otel import OpenTelemetryMetrics

__all__ = [
    "Metrics",
    "MetricsSnapshot",
    "RedcountCollector",
    "disable_opentelemetry",
    "enable_opentelemetry",
    "metrics",
    "register",
    "reset",
    "snapshot",
    "track_retry_queue",
]

TOP_N = 10
"""Hot keys reported (and exported as labels: the cardinality bound)."""
MAX_DRIFT_COUNTERS = 100
"""Reconciled counters reported (the most recent ones)."""


class KeyCount(Protocol):
    """A hot key in a snapshot: a [`redcount.HotKey`][redcount.hot_keys.HotKey], or its figures summed over several
    HotKeys tables."""

    @property
    def key(self) -> str: ...
    @property
    def count(self) -> int: ...
    @property
    def error(self) -> int: ...


class LagFigures(Protocol):
    """What a flusher's ``lag`` reports ([`redcount.sql.Lag`][redcount.sql.flusher.Lag])."""

    @property
    def entries(self) -> int: ...
    @property
    def seconds(self) -> float: ...


class LagSource(Protocol):
    """What this module reads of a [`redcount.sql.Flusher`][redcount.sql.flusher.Flusher]. (A protocol, not the class:
    the SQL layer reports here, so this module must not import it.)"""

    @property
    def lag(self) -> LagFigures: ...


class DriftReport(Protocol):
    """What this module keeps of a reconciliation [`redcount.sql.Report`][redcount.sql.reconciliation.Report]."""

    @property
    def counter(self) -> str: ...
    @property
    def relative(self) -> float: ...


@dataclass(frozen=True)
class MetricsSnapshot:
    """The process's figures at ``at`` (Unix time). Totals count since the process started
    (or [`reset`][redcount.telemetry.reset]); ``*_per_second`` and the rates cover the ``interval`` seconds since
    the previous [`metrics`][redcount.telemetry.metrics] call. A rate with nothing to measure is 1.0 (success) or 0.0
    (hits)."""

    at: float
    interval: float
    increments: int
    increments_per_second: float
    reads: int
    reads_per_second: float
    write_errors: int
    read_errors: int
    write_success_rate: float
    idempotent_writes: int
    idempotency_hits: int
    idempotency_hit_rate: float
    hot_keys: list[KeyCount] = field(default_factory=list)
    hot_keys_total: int = 0
    hottest_key_share: float = 0.0
    """The hottest key's share of every observed key access (0.0 without hot keys)."""
    skew: dict[str, Skew] = field(default_factory=dict)
    """``{"<prefix>:<name>": Skew}`` for the sharded counters among the hot keys."""
    snapshot_lag_seconds: float | None = None
    """The largest age (s) of a delta not yet in SQL over this process's flushers; None without one."""
    watermark_lag_entries: int | None = None
    """Delta-log entries after the SQL watermarks, summed over this process's flushers."""
    drift: dict[str, float] = field(default_factory=dict)
    """``{counter: relative drift}`` of the last reconciliation of each counter run here."""
    trimmed_entries: int = 0
    undecided_requests: int = 0
    """Web requests some limit decided without the store (see the module's docstring)."""
    undecided_by_reason: dict[str, int] = field(default_factory=dict)
    """The same by reason: ``{"timeout": n, "breaker-open": n, "unavailable": n}``."""
    leased_units: int = 0
    """Leased units this process holds and has not admitted yet, over every limiter."""
    retry_queue: dict[str, int] = field(default_factory=dict)
    """The retry queues' traffic, summed over this process's counters: ``{"queued": n,
    "retried": n, "delivered": n, "dropped": n, "overflowed": n, "failed": n, "pending": n}``."""


_lock = threading.Lock()
_hot_keys: list[weakref.ref[HotKeys]] = []
_flushers: weakref.WeakSet[LagSource] = weakref.WeakSet()
_reports: dict[str, DriftReport] = {}
_trimmed = 0
_undecided: dict[str, int] = {}
_previous: tuple[float, tuple[int, ...]] | None = None


def attach_hot_keys(hk: HotKeys) -> None:
    """Report ``hk``'s top keys in [`metrics`][redcount.telemetry.metrics] (connect(hot_keys=...) calls this)."""
    with _lock:
        _hot_keys[:] = [r for r in _hot_keys if r() is not None and r() is not hk]
        _hot_keys.append(weakref.ref(hk))


def track_flusher(flusher: LagSource) -> None:
    """Report ``flusher``'s lag while it is alive (Flusher's constructor calls this)."""
    with _lock:
        _flushers.add(flusher)


def untrack_flusher(flusher: LagSource) -> None:
    """Stop reporting ``flusher`` (Flusher.close() calls this)."""
    with _lock:
        _flushers.discard(flusher)


def note_trimmed(entries: int) -> None:
    """Count ``entries`` delta-log entries lost to the snapshots: trimmed from their log
    before the flusher's group applied them (the flusher calls this when it finds some)."""
    global _trimmed
    with _lock:
        _trimmed += entries


def _trimmed_total() -> int:
    with _lock:
        return _trimmed


def note_undecided(reason: str) -> None:
    """Count one web request decided without the store, for ``reason`` (the web engine
    calls this once per such request)."""
    with _lock:
        _undecided[reason] = _undecided.get(reason, 0) + 1


def _undecided_counts() -> dict[str, int]:
    with _lock:
        return dict(_undecided)


def note_reconcile(report: DriftReport) -> None:
    """Keep ``report`` as its counter's last reconciliation (reconcile() calls this)."""
    with _lock:
        _reports.pop(report.counter, None)
        _reports[report.counter] = report
        while len(_reports) > MAX_DRIFT_COUNTERS:
            del _reports[next(iter(_reports))]


def reset() -> None:
    """Zero the counts, forget the previous snapshot and the recorded reconciliations (tests;
    a fresh start). Open flushers and hot-key tables stay watched."""
    global _previous, _trimmed
    with _lock:
        _core._reset_metrics()
        _reports.clear()
        _undecided.clear()
        _previous = None
        _trimmed = 0


RETRY_FIGURES = ("queued", "retried", "delivered", "dropped", "overflowed", "failed", "pending")
"""The retry-queue figures, as ``RetryStats`` names them (``pending``: waiting now)."""


class RetrySource(Protocol):
    """A counter with a retry queue, as [`track_retry_queue`][redcount.telemetry.track_retry_queue] takes it."""

    def stats(self) -> Any: ...


_retrying: weakref.WeakSet[RetrySource] = weakref.WeakSet()


def track_retry_queue(counter: RetrySource) -> None:
    """Count ``counter``'s retry queue in the process's figures while it lives (a
    [`FixedWindowCounter`][redcount.counters.FixedWindowCounter] with ``on_error="queue"`` calls this)."""
    _retrying.add(counter)


def _retry_totals() -> dict[str, int]:
    totals = dict.fromkeys(RETRY_FIGURES, 0)
    for counter in list(_retrying):
        st = counter.stats()
        for name in RETRY_FIGURES:
            totals[name] += int(getattr(st, name))
    return totals


# What the web engine reports to besides a sink it was given: the OpenTelemetry metrics
# once enable_opentelemetry() ran (a tuple, replaced whole, so readers need no lock).
_web_sinks: tuple[Any, ...] = ()


class _Fanout:
    """The web engine's sink when global sinks are on: forwards every record to each."""

    __slots__ = ("sinks",)

    def __init__(self, sinks: tuple[Any, ...]) -> None:
        self.sinks = sinks

    def decision(self, check: Any, decision: Any, shadow: bool, seconds: float) -> None:
        for s in self.sinks:
            s.decision(check, decision, shadow, seconds)

    def store_error(self, check: Any, policy: str) -> None:
        for s in self.sinks:
            s.store_error(check, policy)

    def undecided(self, reason: str) -> None:
        for s in self.sinks:
            note = getattr(s, "undecided", None)
            if note is not None:
                note(reason)


def web_sink(metrics: Any) -> Any:
    """``metrics`` (the sink an integration was given, or None) joined with the global
    sinks: what the web engine records a request's decisions to."""
    sinks = _web_sinks
    if not sinks or isinstance(metrics, _Fanout):
        return metrics
    return _Fanout(sinks if metrics is None else (metrics, *sinks))


def add_web_sink(sink: Any) -> None:
    global _web_sinks
    with _lock:
        _web_sinks = (*(s for s in _web_sinks if s is not sink), sink)


def remove_web_sink(sink: Any) -> None:
    global _web_sinks
    with _lock:
        _web_sinks = tuple(s for s in _web_sinks if s is not sink)


def _counts() -> tuple[int, ...]:
    return tuple(int(x) for x in _core._metrics_counts())


def _live_hot_keys() -> list[HotKeys]:
    with _lock:
        return [hk for hk in (r() for r in _hot_keys) if hk is not None]


@dataclass(frozen=True)
class _Merged:
    """A key's figures summed over several HotKeys tables (the fields of a HotKey)."""

    key: str
    count: int
    error: int


_SHARD_KEY = re.compile(r"^\{(?P<counter>.+):(?P<shard>\d+)\}$")


def _hot(limit: int) -> tuple[list[KeyCount], int, dict[str, Skew]]:
    tables = _live_hot_keys()
    if not tables:
        return [], 0, {}
    total = sum(hk.total for hk in tables)
    every: list[KeyCount]
    if len(tables) == 1:
        every = list(tables[0].top(tables[0].capacity))
    else:  # one key in several tables: its counts and errors add up
        merged: dict[str, tuple[int, int]] = {}
        for hk in tables:
            for hot in hk.top(hk.capacity):
                c, e = merged.get(hot.key, (0, 0))
                merged[hot.key] = (c + hot.count, e + hot.error)
        ranked = sorted(merged.items(), key=lambda kv: (-kv[1][0], kv[0]))
        every = [_Merged(key, c, e) for key, (c, e) in ranked]
    top = every[:limit]
    hot_counters = {m.group("counter") for m in (_SHARD_KEY.match(k.key) for k in top) if m}
    per_shard: dict[str, dict[int, int]] = {c: {} for c in hot_counters}
    for k in every:
        m = _SHARD_KEY.match(k.key)
        if m and m.group("counter") in per_shard:
            shards = per_shard[m.group("counter")]
            shards[int(m.group("shard"))] = shards.get(int(m.group("shard")), 0) + k.count
    skew = {
        c: skew_of([float(shards.get(i, 0)) for i in range(max(shards) + 1)])
        for c, shards in sorted(per_shard.items())
    }
    return top, total, skew


def _lag() -> tuple[float | None, int | None]:
    with _lock:
        flushers = list(_flushers)
    seconds: float | None = None
    entries: int | None = None
    for f in flushers:
        try:
            lag = f.lag
        except Exception:  # a flusher whose store or database is down reports no lag
            continue
        seconds = lag.seconds if seconds is None else max(seconds, lag.seconds)
        entries = lag.entries if entries is None else entries + lag.entries
    return seconds, entries


def _drift() -> dict[str, float]:
    with _lock:
        return {name: r.relative for name, r in _reports.items()}


def _ratio(num: int, den: int, empty: float) -> float:
    return num / den if den > 0 else empty


def snapshot(top: int = TOP_N) -> MetricsSnapshot:
    """The process's [`MetricsSnapshot`][redcount.telemetry.MetricsSnapshot], with up to ``top`` hot keys; rates are over the
    time since the previous call (since the process started, or [`reset`][redcount.telemetry.reset], for the first)."""
    global _previous
    if isinstance(top, bool) or not isinstance(top, int) or top < 0:
        raise _core.InvalidInputError(f"top must be an int >= 0, got {top!r}")
    now_mono = time.monotonic()
    counts = _counts()
    with _lock:
        prev = _previous
        _previous = (now_mono, counts)
    start_mono, before = prev if prev is not None else (_START, (0,) * len(counts))
    interval = max(now_mono - start_mono, 1e-9)
    d = [a - b for a, b in zip(counts, before)]
    ok, failed, reads, reads_failed, idem, hits = counts
    d_ok, d_failed, d_reads, d_reads_failed, d_idem, d_hits = d
    hot, hot_total, skew = _hot(top)
    lag_s, lag_entries = _lag()
    undecided = _undecided_counts()
    return MetricsSnapshot(
        at=time.time(),
        interval=interval,
        increments=ok + failed,
        increments_per_second=(d_ok + d_failed) / interval,
        reads=reads + reads_failed,
        reads_per_second=(d_reads + d_reads_failed) / interval,
        write_errors=failed,
        read_errors=reads_failed,
        write_success_rate=_ratio(d_ok, d_ok + d_failed, 1.0),
        idempotent_writes=idem,
        idempotency_hits=hits,
        idempotency_hit_rate=_ratio(d_hits, d_idem, 0.0),
        hot_keys=hot,
        hot_keys_total=hot_total,
        hottest_key_share=_ratio(hot[0].count, hot_total, 0.0) if hot else 0.0,
        skew=skew,
        snapshot_lag_seconds=lag_s,
        watermark_lag_entries=lag_entries,
        drift=_drift(),
        trimmed_entries=_trimmed_total(),
        undecided_requests=sum(undecided.values()),
        undecided_by_reason=undecided,
        leased_units=_core._leased_units(),
        retry_queue=_retry_totals(),
    )


_START = time.monotonic()


class RedcountCollector:
    """A ``prometheus_client`` collector of the process's figures, read at each scrape.

    Series (``namespace`` default ``redcount``; labels are bounded: at most ``top`` hot keys,
    the sharded counters among them, and the last 100 reconciled counters):

    - ``redcount_counter_writes_total{result="ok|error"}``, ``redcount_counter_reads_total{result}``
    - ``redcount_idempotent_writes_total``, ``redcount_idempotent_hits_total``
    - ``redcount_hot_key_count{key}``, ``redcount_hot_key_error{key}``, ``redcount_hot_key_share{key}``
      (count over every observed access), ``redcount_hot_keys_observed_total``
    - ``redcount_shard_skew_max_over_mean{counter}``, ``redcount_shard_skew_cv{counter}``,
      ``redcount_shard_skew_gini{counter}``
    - ``redcount_snapshot_lag_seconds``, ``redcount_watermark_lag_entries`` (with a Flusher)
    - ``redcount_flusher_trimmed_entries_total``: delta-log entries the flushers found trimmed
      before they were applied (lost to the snapshots; alert on any increase)
    - ``redcount_reconcile_drift_ratio{counter}`` (after a reconcile in this process)
    - ``redcount_undecided_requests_total{reason}``: web requests a limit decided without the
      store (``timeout``, ``breaker-open``, ``unavailable``; alert on any increase)
    - ``redcount_leased_units``: leased units held and not admitted yet (what a SIGKILL of the
      process would lose until their windows end)
    - ``redcount_retry_{queued,retried,delivered,dropped,overflowed,failed}_total`` and
      ``redcount_retry_pending``: the retry queues of counters with ``on_error="queue"``

    Rates are Prometheus's business (``rate(redcount_counter_writes_total[5m])``): a scrape
    does not disturb the intervals of [`metrics`][redcount.telemetry.metrics].
    """

    def __init__(self, *, namespace: str = "redcount", top: int = TOP_N) -> None:
        try:
            import prometheus_client  # noqa: F401
        except ImportError:
            raise ImportError(
                "redcount's Prometheus collector needs prometheus_client: pip install 'redcount[prometheus]'"
            ) from None
        self.namespace = namespace
        self.top = top

    def describe(self) -> Iterable[Any]:
        return []  # unchecked collector: series come and go with the hot keys

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        ns = self.namespace

        def counter(name: str, doc: str, **kw: Any) -> Any:
            return CounterMetricFamily(f"{ns}_{name}", doc, **kw)

        def gauge(name: str, doc: str, **kw: Any) -> Any:
            return GaugeMetricFamily(f"{ns}_{name}", doc, **kw)

        ok, failed, reads, reads_failed, idem, hits = _counts()
        writes = counter("counter_writes", "Counter increments sent to a store", labels=["result"])
        writes.add_metric(["ok"], ok)
        writes.add_metric(["error"], failed)
        yield writes
        rd = counter("counter_reads", "Counter reads", labels=["result"])
        rd.add_metric(["ok"], reads)
        rd.add_metric(["error"], reads_failed)
        yield rd
        yield counter("idempotent_writes", "Sharded writes with a request id, answered", value=idem)
        yield counter("idempotent_hits", "Sharded writes answered: already applied", value=hits)

        hot, total, skew = _hot(self.top)
        if _live_hot_keys():
            yield counter("hot_keys_observed", "Key accesses observed by HotKeys", value=total)
            count = gauge("hot_key_count", "A hot key's estimated accesses (upper bound)", labels=["key"])
            err = gauge("hot_key_error", "A hot key's count error bound", labels=["key"])
            share = gauge("hot_key_share", "A hot key's share of observed accesses", labels=["key"])
            for k in hot:
                count.add_metric([k.key], k.count)
                err.add_metric([k.key], k.error)
                share.add_metric([k.key], _ratio(k.count, total, 0.0))
            yield count
            yield err
            yield share
        if skew:
            mom = gauge("shard_skew_max_over_mean", "Hottest shard over the mean", labels=["counter"])
            cv = gauge("shard_skew_cv", "Coefficient of variation over shards", labels=["counter"])
            gini = gauge("shard_skew_gini", "Gini coefficient over shards", labels=["counter"])
            for name, s in skew.items():
                mom.add_metric([name], s.max_over_mean)
                cv.add_metric([name], s.cv)
                gini.add_metric([name], s.gini)
            yield mom
            yield cv
            yield gini
        lag_s, lag_entries = _lag()
        if lag_s is not None and lag_entries is not None:
            yield gauge("snapshot_lag_seconds", "Age of the oldest delta not in SQL", value=lag_s)
            yield gauge("watermark_lag_entries", "Delta-log entries after the watermarks", value=lag_entries)
        yield counter(
            "flusher_trimmed_entries",
            "Delta-log entries trimmed before a flusher applied them (lost to the snapshots)",
            value=_trimmed_total(),
        )
        undecided = counter("undecided_requests", "Web requests a limit decided without the store", labels=["reason"])
        for reason, n in sorted(_undecided_counts().items()):
            undecided.add_metric([reason], n)
        yield undecided
        held = _core._leased_units()
        yield gauge("leased_units", "Leased units this process holds and has not admitted yet", value=held)
        retry = _retry_totals()
        for name in RETRY_FIGURES[:-1]:
            yield counter(f"retry_{name}", f"Retry-queue increments {name}", value=retry[name])
        yield gauge("retry_pending", "Increments waiting in retry queues", value=retry["pending"])
        drift = _drift()
        if drift:
            g = gauge("reconcile_drift_ratio", "Last reconciliation's relative drift", labels=["counter"])
            for name, rel in drift.items():
                g.add_metric([name], rel)
            yield g


def register(registry: Any = None, *, namespace: str = "redcount", top: int = TOP_N) -> RedcountCollector:
    """Register a [`RedcountCollector`][redcount.telemetry.RedcountCollector] in ``registry`` (default: prometheus_client's
    global ``REGISTRY``) and return it."""
    collector = RedcountCollector(namespace=namespace, top=top)
    if registry is None:
        from prometheus_client import REGISTRY

        registry = REGISTRY
    registry.register(collector)
    return collector


class _Figures:
    """The process's figures as [`OpenTelemetryMetrics`][redcount.otel.OpenTelemetryMetrics] reads them."""

    def counts(self) -> tuple[int, ...]:
        return _counts()

    def undecided(self) -> dict[str, int]:
        return _undecided_counts()

    def leased_units(self) -> int:
        return int(_core._leased_units())

    def retry_queue(self) -> dict[str, int]:
        return _retry_totals()

    def hot_keys(self, top: int) -> tuple[list[KeyCount], int, dict[str, Skew]]:
        return _hot(top) if _live_hot_keys() else ([], 0, {})

    def lag(self) -> tuple[float | None, int | None]:
        return _lag()

    def trimmed(self) -> int:
        return _trimmed_total()

    def drift(self) -> dict[str, float]:
        return _drift()


_otel: OpenTelemetryMetrics | None = None


def enable_opentelemetry(
    meter_provider: Any = None, *, top: int = TOP_N, near: float = 0.1, stores: Sequence[Any] = ()
) -> OpenTelemetryMetrics:
    """Turn OpenTelemetry metrics on for the process (``pip install 'redcount[opentelemetry]'``)
    and return them: an [`OpenTelemetryMetrics`][redcount.otel.OpenTelemetryMetrics] whose
    instruments are on ``meter_provider``'s meter (default: the global provider), read the
    process's figures at each collection, and record every web integration's decisions from
    now on. ``stores``: stores whose breaker and fallback state to report (see
    [`OpenTelemetryMetrics.watch_store`][redcount.otel.OpenTelemetryMetrics.watch_store]). A second
    call replaces the first (whose instruments then report nothing)."""
    global _otel
    from .otel import OpenTelemetryMetrics

    fresh = OpenTelemetryMetrics(_Figures(), meter_provider, top=top, near=near)
    for store in stores:
        fresh.watch_store(store)
    with _lock:
        previous, _otel = _otel, fresh
    if previous is not None:
        remove_web_sink(previous)
        previous.close()
    add_web_sink(fresh)
    return fresh


def disable_opentelemetry() -> None:
    """Turn off what [`enable_opentelemetry`][redcount.telemetry.enable_opentelemetry] turned on."""
    global _otel
    with _lock:
        previous, _otel = _otel, None
    if previous is not None:
        remove_web_sink(previous)
        previous.close()


class Metrics:
    """The type of ``redcount.metrics``, the one object of this module exported at the top:
    ``redcount.metrics()`` is the process's [`MetricsSnapshot`][redcount.telemetry.MetricsSnapshot] (see [`snapshot`][redcount.telemetry.snapshot]);
    ``redcount.metrics.register()`` adds a [`RedcountCollector`][redcount.telemetry.RedcountCollector] to a Prometheus registry;
    ``redcount.metrics.reset()`` zeroes the counts; ``redcount.metrics.enable_opentelemetry()``
    exports them, and every web integration's decisions, through OpenTelemetry.
    """

    register = staticmethod(register)
    reset = staticmethod(reset)
    snapshot = staticmethod(snapshot)

    enable_opentelemetry = staticmethod(enable_opentelemetry)
    disable_opentelemetry = staticmethod(disable_opentelemetry)

    def __call__(self, top: int = TOP_N) -> MetricsSnapshot:
        return snapshot(top)

    def __repr__(self) -> str:
        return "<redcount.metrics>"


metrics = Metrics()
"""``redcount.metrics``: call it for a snapshot; ``.register()`` for Prometheus."""


def _after_fork_in_child() -> None:
    global _lock, _previous, _START
    _lock = threading.Lock()  # another thread may have held it at the fork
    _core._reset_metrics()
    _undecided.clear()
    _previous = None
    _START = time.monotonic()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
