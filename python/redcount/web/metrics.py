"""Prometheus metrics for the web integrations (``pip install 'redcount[prometheus]'``).

```python
from redcount.web.metrics import PrometheusMetrics

metrics = PrometheusMetrics()                      # the default registry; or registry=...
rl = redcount.flask.RateLimiter(app, default="100/minute", metrics=metrics)
# then expose prometheus_client's registry as usual (make_wsgi_app, start_http_server)
```

Series (labels are policy names, never client keys, so cardinality stays bounded):

- ``redcount_decisions_total{limit, result}``: ``result`` is ``allowed``, ``denied`` or
  ``shadow_denied`` (a shadow limit that would have refused);
- ``redcount_near_limit_total{limit}``: allowed with at most ``near`` (default 10 %) of the
  limit left;
- ``redcount_store_errors_total{limit, policy}``: the store failed; ``policy`` is what the
  request got (``open``: let through, ``closed``: 503);
- ``redcount_undecided_total{reason}``: requests some limit decided without the store, by the
  failure policy (``timeout``, ``breaker-open``, ``unavailable``); each is one request let
  through or refused without being counted, so any increase means limits were not enforced
  exactly;
- ``redcount_decision_seconds``: a histogram of the decision latency, store round trip
  included;
- ``redcount_breaker_open`` and ``redcount_fallback_active``: gauges read from the store's
  ``breaker_open`` / ``fallback_active`` attributes when it has them (0 otherwise).
"""

from __future__ import annotations

from typing import Any

from .._core import Decision
from ..errors import InvalidInputError
from .spec import Check

__all__ = ["PrometheusMetrics"]

_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class PrometheusMetrics:
    """Counters, a latency histogram and store gauges in a ``prometheus_client`` registry.

    ``registry``: a ``prometheus_client.CollectorRegistry`` (default: the global one);
    ``namespace``: the series prefix (default ``redcount``); ``near``: the fraction of a
    limit left under which an allowed decision counts as near the limit. Thread-safe
    (prometheus_client's metrics are).
    """

    def __init__(self, registry: Any = None, *, namespace: str = "redcount", near: float = 0.1) -> None:
        try:
            import prometheus_client as prom
        except ImportError:
            raise ImportError(
                "redcount's Prometheus metrics need prometheus_client: pip install 'redcount[prometheus]'"
            ) from None
        if not 0.0 <= near < 1.0:
            raise InvalidInputError(f"near must be a fraction in [0, 1), got {near!r}")
        if registry is None:
            registry = prom.REGISTRY
        self.near = near
        kw: dict[str, Any] = {"namespace": namespace, "registry": registry}
        self.decisions = prom.Counter("decisions", "Rate-limit decisions", ["limit", "result"], **kw)
        self.near_limit = prom.Counter("near_limit", "Allowed decisions close to the limit", ["limit"], **kw)
        self.store_errors = prom.Counter("store_errors", "Store failures seen by the limiter", ["limit", "policy"], **kw)
        self.undecided_requests = prom.Counter(
            "undecided", "Requests a limit decided without the store", ["reason"], **kw
        )
        self.latency = prom.Histogram("decision_seconds", "Decision latency", buckets=_BUCKETS, **kw)
        self.breaker_open = prom.Gauge("breaker_open", "1 while the store's circuit breaker is open", **kw)
        self.fallback_active = prom.Gauge("fallback_active", "1 while calls go to the fallback store", **kw)

    def watch_store(self, store: object) -> None:
        """Read the gauges from ``store`` at every scrape."""
        self.breaker_open.set_function(lambda: float(bool(getattr(store, "breaker_open", False))))
        self.fallback_active.set_function(lambda: float(bool(getattr(store, "fallback_active", False))))

    def decision(self, check: Check, decision: Decision, shadow: bool, seconds: float) -> None:
        """Record one decision (called by the engine)."""
        name = check.spec.name
        self.latency.observe(seconds)
        if decision.allowed:
            self.decisions.labels(name, "allowed").inc()
            if decision.remaining <= decision.limit * self.near:
                self.near_limit.labels(name).inc()
        else:
            self.decisions.labels(name, "shadow_denied" if shadow else "denied").inc()

    def store_error(self, check: Check, policy: str) -> None:
        """Record one store failure (called by the engine)."""
        self.store_errors.labels(check.spec.name, policy).inc()

    def undecided(self, reason: str) -> None:
        """Record one request decided without the store (called by the engine)."""
        self.undecided_requests.labels(reason).inc()
