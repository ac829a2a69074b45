"""OpenTelemetry metrics (``pip install 'redcount[opentelemetry]'``): the process's figures
and the web integrations' decisions through ``opentelemetry-api`` instruments.

```python
import redcount

otel = redcount.metrics.enable_opentelemetry()   # the global MeterProvider, or meter_provider=...
otel.watch_store(store)                          # breaker and fallback gauges of a budgeted store
```

One call turns it on: from then on every web integration (Flask, FastAPI, Starlette,
Django, DRF) records its decisions here as well as to a ``metrics=`` sink it was given (a
[`PrometheusMetrics`][redcount.web.metrics.PrometheusMetrics] keeps working beside it), and the
meter's reader collects the process figures of [`redcount.metrics`][redcount.telemetry.metrics]
at each collection. Without an SDK (``opentelemetry-sdk``) configured, the API's no-op
provider records nothing, at the cost of a function call per decision.

Instruments (names follow OpenTelemetry's naming guidelines: dotted, units in UCUM with
``{annotations}`` for counts, no ``_total``; exporters add their own suffixes):

| instrument | kind | unit | attributes |
| --- | --- | --- | --- |
| ``redcount.limiter.decisions`` | counter | ``{decision}`` | ``redcount.limit``, ``redcount.decision.result`` (``allowed``, ``denied``, ``shadow_denied``) |
| ``redcount.limiter.near_limit`` | counter | ``{decision}`` | ``redcount.limit`` |
| ``redcount.limiter.store_errors`` | counter | ``{error}`` | ``redcount.limit``, ``redcount.failure_policy`` (``open``, ``closed``) |
| ``redcount.limiter.decision.duration`` | histogram | ``s`` | |
| ``redcount.limiter.undecided`` | observable counter | ``{request}`` | ``redcount.undecided.reason`` |
| ``redcount.lease.units`` | observable up-down counter | ``{unit}`` | |
| ``redcount.counter.writes``, ``redcount.counter.reads`` | observable counter | ``{operation}`` | ``redcount.result`` (``ok``, ``error``) |
| ``redcount.counter.idempotent_writes``, ``redcount.counter.idempotent_hits`` | observable counter | ``{operation}`` | |
| ``redcount.retry_queue.<figure>`` (queued, retried, delivered, dropped, overflowed, failed) | observable counter | ``{increment}`` | |
| ``redcount.retry_queue.pending`` | observable up-down counter | ``{increment}`` | |
| ``redcount.hot_key.count``, ``redcount.hot_key.share`` | observable gauge | ``{access}``, ``1`` | ``redcount.key`` (at most ``top`` keys) |
| ``redcount.shard.skew`` | observable gauge | ``1`` | ``redcount.counter``, ``redcount.skew.statistic`` (``max_over_mean``, ``cv``, ``gini``) |
| ``redcount.flusher.lag`` | observable gauge | ``s`` | |
| ``redcount.flusher.lag_entries`` | observable gauge | ``{entry}`` | |
| ``redcount.flusher.trimmed`` | observable counter | ``{entry}`` | |
| ``redcount.reconcile.drift_ratio`` | observable gauge | ``1`` | ``redcount.counter`` |
| ``redcount.store.breaker.open``, ``redcount.store.fallback.active`` | observable gauge | ``1`` | ``redcount.store`` (watched stores) |

Labels are bounded as the Prometheus collector's are: policy names, never client keys
(hot keys are the ``top`` ones), and the last 100 reconciled counters.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable
from typing import Any, Protocol

from ._core import Decision
from ._version import __version__
from .errors import InvalidInputError

__all__ = ["DURATION_BUCKETS", "Figures", "OpenTelemetryMetrics"]

DURATION_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
"""The decision-duration histogram's bucket bounds (s): the Prometheus histogram's."""


class Figures(Protocol):
    """Where the observable instruments read the process's figures at each collection
    ([`redcount.telemetry`][redcount.telemetry] gives them; see
    [`enable_opentelemetry`][redcount.telemetry.enable_opentelemetry])."""

    def counts(self) -> tuple[int, ...]:
        """(writes ok, writes failed, reads ok, reads failed, idempotent writes, hits)."""

    def undecided(self) -> dict[str, int]:
        """Web requests decided without the store, by reason."""

    def leased_units(self) -> int: ...
    def retry_queue(self) -> dict[str, int]:
        """The retry queues' figures, by ``RetryStats`` name."""

    def hot_keys(self, top: int) -> tuple[list[Any], int, dict[str, Any]]:
        """(the top keys, every observed access, skew by sharded counter); ([], 0, {})
        without a hot-key table."""

    def lag(self) -> tuple[float | None, int | None]: ...
    def trimmed(self) -> int: ...
    def drift(self) -> dict[str, float]: ...


def _api() -> Any:
    try:
        from opentelemetry import metrics as otel_metrics
    except ImportError:
        raise ImportError(
            "redcount's OpenTelemetry metrics need opentelemetry-api: pip install 'redcount[opentelemetry]'"
        ) from None
    return otel_metrics


class OpenTelemetryMetrics:
    """redcount's instruments on one meter (see the module's docstring for the list).

    ``figures``: where the process's figures are read; ``meter_provider``: an OpenTelemetry
    ``MeterProvider`` (default: the global one, as ``opentelemetry.metrics.get_meter_provider()``
    returns it); ``top``: hot keys reported; ``near``: the fraction of a limit left under which
    an allowed decision counts as near the limit. Made by
    [`enable_opentelemetry`][redcount.telemetry.enable_opentelemetry], which also makes it every
    web integration's sink; it can be passed as ``metrics=`` to one integration too. Thread-safe.
    """

    def __init__(self, figures: Figures, meter_provider: Any = None, *, top: int = 10, near: float = 0.1) -> None:
        api = _api()
        if isinstance(top, bool) or not isinstance(top, int) or top < 0:
            raise InvalidInputError(f"top must be an int >= 0, got {top!r}")
        if isinstance(near, bool) or not isinstance(near, (int, float)) or not 0.0 <= near < 1.0:
            raise InvalidInputError(f"near must be a fraction in [0, 1), got {near!r}")
        provider = meter_provider if meter_provider is not None else api.get_meter_provider()
        self.meter = provider.get_meter("redcount", __version__)
        self.figures = figures
        self.top = top
        self.near = float(near)
        self._closed = False
        self._stores: weakref.WeakValueDictionary[str, Any] = weakref.WeakValueDictionary()
        self._lock = threading.Lock()
        m = self.meter
        self.decisions = m.create_counter(
            "redcount.limiter.decisions", unit="{decision}", description="Rate-limit decisions of the web integrations"
        )
        self.near_limit = m.create_counter(
            "redcount.limiter.near_limit", unit="{decision}", description="Allowed decisions close to the limit"
        )
        self.store_errors = m.create_counter(
            "redcount.limiter.store_errors", unit="{error}", description="Store failures seen by the web integrations"
        )
        self.duration = m.create_histogram(
            "redcount.limiter.decision.duration",
            unit="s",
            description="Decision latency, store round trip included",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS),
        )
        self._observe(m)

    # -- the web engine's sink -------------------------------------------------------------

    def decision(self, check: Any, decision: Decision, shadow: bool, seconds: float) -> None:
        """Record one decision (called by the web engine)."""
        if self._closed:
            return
        name = check.spec.name
        self.duration.record(seconds)
        if decision.allowed:
            self.decisions.add(1, {"redcount.limit": name, "redcount.decision.result": "allowed"})
            if decision.remaining <= decision.limit * self.near:
                self.near_limit.add(1, {"redcount.limit": name})
        else:
            result = "shadow_denied" if shadow else "denied"
            self.decisions.add(1, {"redcount.limit": name, "redcount.decision.result": result})

    def store_error(self, check: Any, policy: str) -> None:
        """Record one store failure (called by the web engine)."""
        if not self._closed:
            self.store_errors.add(1, {"redcount.limit": check.spec.name, "redcount.failure_policy": policy})

    def watch_store(self, store: Any) -> None:
        """Report ``store``'s breaker and fallback state (a store opened with a latency
        budget has them; others report 0) while it lives."""
        with self._lock:
            self._stores[str(getattr(store, "url", id(store)))] = store

    def close(self) -> None:
        """Stop recording: the synchronous instruments ignore further records and the
        observable ones report nothing (OpenTelemetry's API cannot remove an instrument)."""
        self._closed = True

    # -- the process figures, read at each collection -------------------------------------

    def _observe(self, m: Any) -> None:
        api = _api()
        obs = api.Observation
        f = self.figures

        def guarded(read: Any) -> Any:
            def callback(_options: Any) -> Iterable[Any]:
                if self._closed:
                    return []
                return list(read(obs))

            return [callback]

        def writes(o: Any) -> Iterable[Any]:
            ok, failed, *_ = f.counts()
            return [o(ok, {"redcount.result": "ok"}), o(failed, {"redcount.result": "error"})]

        def reads(o: Any) -> Iterable[Any]:
            _, _, ok, failed, *_ = f.counts()
            return [o(ok, {"redcount.result": "ok"}), o(failed, {"redcount.result": "error"})]

        m.create_observable_counter(
            "redcount.counter.writes", guarded(writes), unit="{operation}", description="Counter increments sent to a store"
        )
        m.create_observable_counter(
            "redcount.counter.reads", guarded(reads), unit="{operation}", description="Counter reads"
        )
        m.create_observable_counter(
            "redcount.counter.idempotent_writes",
            guarded(lambda o: [o(f.counts()[4])]),
            unit="{operation}",
            description="Sharded writes with a request id, answered",
        )
        m.create_observable_counter(
            "redcount.counter.idempotent_hits",
            guarded(lambda o: [o(f.counts()[5])]),
            unit="{operation}",
            description="Sharded writes answered: already applied",
        )
        m.create_observable_counter(
            "redcount.limiter.undecided",
            guarded(lambda o: [o(n, {"redcount.undecided.reason": r}) for r, n in f.undecided().items()]),
            unit="{request}",
            description="Web requests a limit decided without the store",
        )
        m.create_observable_up_down_counter(
            "redcount.lease.units",
            guarded(lambda o: [o(f.leased_units())]),
            unit="{unit}",
            description="Leased units this process holds and has not admitted yet",
        )
        for figure in ("queued", "retried", "delivered", "dropped", "overflowed", "failed"):
            m.create_observable_counter(
                f"redcount.retry_queue.{figure}",
                guarded(lambda o, name=figure: [o(f.retry_queue()[name])]),
                unit="{increment}",
                description=f"Retry-queue increments {figure}",
            )
        m.create_observable_up_down_counter(
            "redcount.retry_queue.pending",
            guarded(lambda o: [o(f.retry_queue()["pending"])]),
            unit="{increment}",
            description="Increments waiting in retry queues",
        )

        def hot(o: Any, share: bool) -> Iterable[Any]:
            keys, total, _ = f.hot_keys(self.top)
            return [o((k.count / total if total else 0.0) if share else k.count, {"redcount.key": k.key}) for k in keys]

        m.create_observable_gauge(
            "redcount.hot_key.count",
            guarded(lambda o: hot(o, False)),
            unit="{access}",
            description="A hot key's estimated accesses (upper bound)",
        )
        m.create_observable_gauge(
            "redcount.hot_key.share",
            guarded(lambda o: hot(o, True)),
            unit="1",
            description="A hot key's share of observed accesses",
        )

        def skew(o: Any) -> Iterable[Any]:
            _, _, by_counter = f.hot_keys(self.top)
            out = []
            for name, s in by_counter.items():
                for stat in ("max_over_mean", "cv", "gini"):
                    out.append(o(getattr(s, stat), {"redcount.counter": name, "redcount.skew.statistic": stat}))
            return out

        m.create_observable_gauge("redcount.shard.skew", guarded(skew), unit="1", description="Skew over a counter's shards")

        def lag(o: Any, entries: bool) -> Iterable[Any]:
            seconds, n = f.lag()
            if seconds is None or n is None:
                return []
            return [o(n if entries else seconds)]

        m.create_observable_gauge(
            "redcount.flusher.lag", guarded(lambda o: lag(o, False)), unit="s", description="Age of the oldest delta not in SQL"
        )
        m.create_observable_gauge(
            "redcount.flusher.lag_entries",
            guarded(lambda o: lag(o, True)),
            unit="{entry}",
            description="Delta-log entries after the watermarks",
        )
        m.create_observable_counter(
            "redcount.flusher.trimmed",
            guarded(lambda o: [o(f.trimmed())]),
            unit="{entry}",
            description="Delta-log entries trimmed before a flusher applied them (lost to the snapshots)",
        )
        m.create_observable_gauge(
            "redcount.reconcile.drift_ratio",
            guarded(lambda o: [o(rel, {"redcount.counter": c}) for c, rel in f.drift().items()]),
            unit="1",
            description="Last reconciliation's relative drift",
        )

        def stores(o: Any, attr: str) -> Iterable[Any]:
            with self._lock:
                watched = list(self._stores.items())
            return [o(float(bool(getattr(s, attr, False))), {"redcount.store": url}) for url, s in watched]

        m.create_observable_gauge(
            "redcount.store.breaker.open",
            guarded(lambda o: stores(o, "breaker_open")),
            unit="1",
            description="1 while the store's circuit breaker is open",
        )
        m.create_observable_gauge(
            "redcount.store.fallback.active",
            guarded(lambda o: stores(o, "fallback_active")),
            unit="1",
            description="1 while calls go to the fallback store",
        )
