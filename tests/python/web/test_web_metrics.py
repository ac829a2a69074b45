"""Prometheus metrics of the web integrations, read back from a private registry."""

from __future__ import annotations

from typing import Any

import pytest
import redcount
import redcount.flask
from flask import Flask
from prometheus_client import CollectorRegistry, generate_latest
from redcount.web.metrics import PrometheusMetrics


def value(reg: CollectorRegistry, name: str, **labels: str) -> float:
    got = reg.get_sample_value(name, labels)
    return 0.0 if got is None else got


def test_decisions_near_limit_latency_and_shadow(memory_store: redcount.Store) -> None:
    reg = CollectorRegistry()
    metrics = PrometheusMetrics(reg)
    app = Flask(__name__)
    rl = redcount.flask.RateLimiter(app, limiter=redcount.Limiter(memory_store), metrics=metrics)

    @app.get("/a")
    @rl.limit("10/hour", name="search")
    def a() -> str:
        return "a"

    @app.get("/dry")
    @rl.limit("1/hour", name="dry", shadow=True)
    def dry() -> str:
        return "d"

    c = app.test_client()
    codes = [c.get("/a").status_code for _ in range(12)]
    assert codes == [200] * 10 + [429] * 2
    assert value(reg, "redcount_decisions_total", limit="search", result="allowed") == 10
    assert value(reg, "redcount_decisions_total", limit="search", result="denied") == 2
    assert value(reg, "redcount_near_limit_total", limit="search") == 2  # the 9th and 10th left <= 10 %
    assert value(reg, "redcount_decision_seconds_count") == 12
    assert [c.get("/dry").status_code for _ in range(3)] == [200] * 3
    assert value(reg, "redcount_decisions_total", limit="dry", result="shadow_denied") == 2
    assert value(reg, "redcount_breaker_open") == 0
    assert value(reg, "redcount_fallback_active") == 0
    assert b"redcount_decisions_total" in generate_latest(reg)


@pytest.mark.redis_only
def test_store_errors_counted_with_the_policy(redis_factory: Any) -> None:
    server = redis_factory()
    store = redcount.connect(server.url, connect_timeout=0.5, command_timeout=0.5)
    reg = CollectorRegistry()
    app = Flask(__name__)
    rl = redcount.flask.RateLimiter(app, limiter=redcount.Limiter(store), metrics=PrometheusMetrics(reg))

    @app.get("/a")
    @rl.limit("10/hour", name="search")
    def a() -> str:
        return "a"

    c = app.test_client()
    assert c.get("/a").status_code == 200
    server.kill()
    assert [c.get("/a").status_code for _ in range(3)] == [200] * 3
    assert value(reg, "redcount_store_errors_total", limit="search", policy="open") == 3
    store.close()


def test_gauges_read_the_store_and_bad_arguments() -> None:
    class FakeBreakerStore:
        breaker_open = True
        fallback_active = False

    reg = CollectorRegistry()
    m = PrometheusMetrics(reg, namespace="app")
    m.watch_store(FakeBreakerStore())
    assert value(reg, "app_breaker_open") == 1 and value(reg, "app_fallback_active") == 0
    with pytest.raises(redcount.InvalidInputError, match="near must be a fraction"):
        PrometheusMetrics(CollectorRegistry(), near=1.5)
    with pytest.raises(redcount.InvalidInputError, match="metrics must be"):
        redcount.flask.RateLimiter(Flask(__name__), metrics=object())  # type: ignore[arg-type]
