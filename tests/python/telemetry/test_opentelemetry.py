"""OpenTelemetry metrics, read back through the SDK's in-memory reader: the web decisions of
a sync (Flask) and an asyncio (FastAPI) app, next to Prometheus; the process figures;
store errors and the breaker of a store whose server died; turning it off and on again."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import redcount
import redcount.aio
import redcount.fastapi
import redcount.flask
from fastapi import Depends, FastAPI
from flask import Flask
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client import CollectorRegistry
from redcount.web.metrics import PrometheusMetrics

Points = dict[str, list[Any]]


@pytest.fixture
def reader() -> Iterator[InMemoryMetricReader]:
    redcount.metrics.reset()
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    redcount.metrics.enable_opentelemetry(provider)
    try:
        yield reader
    finally:
        redcount.metrics.disable_opentelemetry()
        provider.shutdown()


def collect(reader: InMemoryMetricReader) -> Points:
    """{instrument name: its data points} of the redcount meter."""
    out: Points = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data is not None else []:
        for sm in rm.scope_metrics:
            if sm.scope.name != "redcount":
                continue
            for metric in sm.metrics:
                out[metric.name] = list(metric.data.data_points)
    return out


def value(points: Points, name: str, **attributes: str) -> float:
    """The value of ``name``'s point whose attributes are ``attributes`` (0 if none)."""
    for p in points.get(name, []):
        if dict(p.attributes or {}) == attributes:
            return p.value  # type: ignore[no-any-return]
    return 0


def test_flask_decisions_reach_opentelemetry_and_prometheus_alike(
    reader: InMemoryMetricReader, memory_store: redcount.Store
) -> None:
    registry = CollectorRegistry()
    app = Flask(__name__)
    rl = redcount.flask.RateLimiter(app, limiter=redcount.Limiter(memory_store), metrics=PrometheusMetrics(registry))

    @app.get("/a")
    @rl.limit("10/hour", name="search")
    def a() -> str:
        return "a"

    @app.get("/dry")
    @rl.limit("1/hour", name="dry", shadow=True)
    def dry() -> str:
        return "d"

    c = app.test_client()
    assert [c.get("/a").status_code for _ in range(12)] == [200] * 10 + [429] * 2
    assert [c.get("/dry").status_code for _ in range(3)] == [200] * 3
    points = collect(reader)
    decisions = "redcount.limiter.decisions"
    assert value(points, decisions, **{"redcount.limit": "search", "redcount.decision.result": "allowed"}) == 10
    assert value(points, decisions, **{"redcount.limit": "search", "redcount.decision.result": "denied"}) == 2
    assert value(points, decisions, **{"redcount.limit": "dry", "redcount.decision.result": "shadow_denied"}) == 2
    assert value(points, "redcount.limiter.near_limit", **{"redcount.limit": "search"}) == 2
    (latency,) = points["redcount.limiter.decision.duration"]
    assert latency.count == 15 and latency.sum > 0
    assert list(latency.explicit_bounds) == list(redcount.otel.DURATION_BUCKETS)
    # The integration's own Prometheus sink saw the same decisions.
    prom = registry.get_sample_value
    assert prom("redcount_decisions_total", {"limit": "search", "result": "allowed"}) == 10
    assert prom("redcount_decisions_total", {"limit": "search", "result": "denied"}) == 2
    assert prom("redcount_decision_seconds_count") == 15


def test_fastapi_decisions_reach_opentelemetry(reader: InMemoryMetricReader, memory_store: redcount.Store) -> None:
    rl = redcount.fastapi.RateLimiter(redcount.aio.Limiter(memory_store))
    app = FastAPI()

    @app.get("/r", dependencies=[Depends(rl.limit("3/hour", name="route"))])
    async def r() -> dict[str, str]:
        return {"ok": "y"}

    async def main() -> list[int]:
        transport = httpx.ASGITransport(app=app, client=("198.51.100.7", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return [(await client.get("/r")).status_code for _ in range(5)]

    assert asyncio.run(main()) == [200] * 3 + [429] * 2
    points = collect(reader)
    decisions = "redcount.limiter.decisions"
    assert value(points, decisions, **{"redcount.limit": "route", "redcount.decision.result": "allowed"}) == 3
    assert value(points, decisions, **{"redcount.limit": "route", "redcount.decision.result": "denied"}) == 2
    assert points["redcount.limiter.decision.duration"][0].count == 5


def test_process_figures(reader: InMemoryMetricReader) -> None:
    hk = redcount.HotKeys(capacity=100)
    store = redcount.connect(hot_keys=hk)
    try:
        views = redcount.FixedWindowCounter(store, "oviews", window=3600)
        for i in range(9):
            views.incr(f"k{i % 3}")
        views.get("k0")
        likes = redcount.ShardedCounter(store, "olikes", shards=2)
        likes.incr(request_id="a")
        likes.incr(request_id="a")
        for reason in ("timeout", "timeout", "breaker-open"):
            redcount.telemetry.note_undecided(reason)
        limiter = redcount.Limiter(store)
        assert limiter.hit("20/hour", "leased", lease=5).allowed  # takes 5, admits 1 of them
        points = collect(reader)
        assert value(points, "redcount.counter.writes", **{"redcount.result": "ok"}) == 11
        assert value(points, "redcount.counter.writes", **{"redcount.result": "error"}) == 0
        assert value(points, "redcount.counter.reads", **{"redcount.result": "ok"}) == 1
        assert value(points, "redcount.counter.idempotent_writes") == 2
        assert value(points, "redcount.counter.idempotent_hits") == 1
        assert value(points, "redcount.limiter.undecided", **{"redcount.undecided.reason": "timeout"}) == 2
        assert value(points, "redcount.limiter.undecided", **{"redcount.undecided.reason": "breaker-open"}) == 1
        assert value(points, "redcount.lease.units") == redcount.metrics().leased_units == 4
        hot = {dict(p.attributes)["redcount.key"]: p.value for p in points["redcount.hot_key.count"]}
        assert {views.storage_key(f"k{i}") for i in range(3)} <= set(hot)  # each touched 3 or 4 times
        assert all(hot[views.storage_key(f"k{i}")] >= 3 for i in range(3))
        shares = [p.value for p in points["redcount.hot_key.share"]]
        assert all(0 < s <= 1 for s in shares)
        stats = {dict(p.attributes)["redcount.skew.statistic"] for p in points["redcount.shard.skew"]}
        assert stats == {"max_over_mean", "cv", "gini"}
        assert value(points, "redcount.flusher.trimmed") == 0
        assert "redcount.flusher.lag" not in points or not points["redcount.flusher.lag"]  # no flusher here
    finally:
        store.close()


@pytest.mark.redis_only
def test_store_errors_retry_queue_and_breaker_of_a_dead_server(reader: InMemoryMetricReader, redis_factory: Any) -> None:
    server = redis_factory()
    store = redcount.connect(server.url, connect_timeout=0.5, command_timeout=0.5)
    budgeted = redcount.connect(server.url, budget=0.2, connect_timeout=0.5, command_timeout=0.5)
    redcount.telemetry._otel.watch_store(budgeted)  # type: ignore[union-attr]
    app = Flask(__name__)
    rl = redcount.flask.RateLimiter(app, limiter=redcount.Limiter(store))

    @app.get("/a")
    @rl.limit("10/hour", name="search")
    def a() -> str:
        return "a"

    queued = redcount.FixedWindowCounter(store, "oq", window=3600, on_error="queue", retry_backoff=30, retry_backoff_max=30)
    try:
        c = app.test_client()
        assert c.get("/a").status_code == 200
        server.kill()
        assert [c.get("/a").status_code for _ in range(3)] == [200] * 3
        assert queued.incr("k") == 0 and queued.incr("k", 2) == 0  # both queued for retry
        for _ in range(20):  # a budgeted store opens its breaker after failures in a row
            try:
                budgeted.execute("PING")
            except redcount.RedcountError:
                pass
            if budgeted.breaker_open:
                break
        assert budgeted.breaker_open
        points = collect(reader)
        assert value(points, "redcount.limiter.store_errors", **{"redcount.limit": "search", "redcount.failure_policy": "open"}) == 3
        assert value(points, "redcount.limiter.undecided", **{"redcount.undecided.reason": "unavailable"}) == 3
        assert value(points, "redcount.retry_queue.queued") == 2
        assert value(points, "redcount.retry_queue.pending") == 2
        assert value(points, "redcount.store.breaker.open", **{"redcount.store": budgeted.url}) == 1
        assert value(points, "redcount.store.fallback.active", **{"redcount.store": budgeted.url}) == 0
        m = redcount.metrics()
        assert m.retry_queue["queued"] == 2 and m.retry_queue["pending"] == 2
    finally:
        queued.close(timeout=0)
        budgeted.close()
        store.close()


def test_disable_and_a_second_enable(memory_store: redcount.Store) -> None:
    first, second = InMemoryMetricReader(), InMemoryMetricReader()
    p1, p2 = MeterProvider(metric_readers=[first]), MeterProvider(metric_readers=[second])
    app = Flask(__name__)
    rl = redcount.flask.RateLimiter(app, limiter=redcount.Limiter(memory_store))

    @app.get("/a")
    @rl.limit("100/hour", name="a")
    def a() -> str:
        return "a"

    c = app.test_client()
    try:
        redcount.metrics.enable_opentelemetry(p1)
        c.get("/a")
        redcount.metrics.enable_opentelemetry(p2)  # replaces the first
        c.get("/a")
        c.get("/a")
        allowed = {"redcount.limit": "a", "redcount.decision.result": "allowed"}
        assert value(collect(first), "redcount.limiter.decisions", **allowed) == 1
        assert value(collect(second), "redcount.limiter.decisions", **allowed) == 2
        assert "redcount.counter.writes" not in collect(first)  # a replaced one reports nothing
        redcount.metrics.disable_opentelemetry()
        c.get("/a")
        assert value(collect(second), "redcount.limiter.decisions", **allowed) == 2
        assert redcount.telemetry._web_sinks == ()
    finally:
        redcount.metrics.disable_opentelemetry()
        p1.shutdown()
        p2.shutdown()


def test_bad_settings_are_refused() -> None:
    with pytest.raises(redcount.InvalidInputError, match="top must be an int >= 0"):
        redcount.metrics.enable_opentelemetry(top=-1)
    with pytest.raises(redcount.InvalidInputError, match=r"near must be a fraction in \[0, 1\)"):
        redcount.metrics.enable_opentelemetry(near=1.5)
    assert redcount.telemetry._web_sinks == ()
