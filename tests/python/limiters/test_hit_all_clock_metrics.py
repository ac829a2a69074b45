"""hit_all/test_all keep to the limiter's clock as hit does (clock="server", and the way it
fails where the server refuses TIME), report each item's own figures (Decision.per_key),
and the web layer's metrics record one decision per check with that check's own figures."""

from __future__ import annotations

import asyncio
import time

import pytest
import redcount
import redcount.aio as aio
import redcount.flask
from flask import Flask
from helpers import all_keys
from prometheus_client import CollectorRegistry
from redcount.limiter import Strategy
from redcount.tools.servers import RedisServer
from redcount.web.metrics import PrometheusMetrics

RATE: list[Strategy] = ["fixed-window", "sliding-window", "sliding-window-approx", "token-bucket", "gcra"]


@pytest.mark.parametrize("strategy", RATE)
@pytest.mark.usefixtures("away_from_hour_boundary")
def test_per_key_figures(store: redcount.Store, strategy: Strategy) -> None:
    lim = redcount.Limiter(store, strategy)
    items = [("100/hour", "org"), ("3/hour;50/day", "user")]
    d = lim.hit_all(items)
    assert d and d.per_key == [(100, 99), (3, 2)]
    assert lim.test_all(items).per_key == [(100, 99), (3, 2)]
    assert lim.hit("3/hour", "x").per_key is None


@pytest.mark.redis_only
@pytest.mark.parametrize("mode", ["server", "server-offset"])
@pytest.mark.parametrize("strategy", RATE)
def test_server_time_is_immune_to_client_skew(redis_server: RedisServer, mode: str, strategy: Strategy) -> None:
    """Two app servers 90 s apart share one limit through hit_all, as through hit."""
    ahead = redcount.connect(redis_server.url, clock=redcount.ManualClock(time.time() + 45))
    behind = redcount.connect(redis_server.url, clock=redcount.ManualClock(time.time() - 45))
    ahead.execute("FLUSHALL")
    la = redcount.Limiter(ahead, strategy, clock=mode)  # type: ignore[arg-type]
    lb = redcount.Limiter(behind, strategy, clock=mode)  # type: ignore[arg-type]
    admitted = 0
    for _ in range(10):
        admitted += bool(la.hit_all([("5/minute", "shared"), ("1000/hour", "org")]))
        admitted += bool(lb.hit_all([("5/minute", "shared"), ("1000/hour", "org")]))
    assert admitted == 5
    expect = "server-offset" if strategy == "fixed-window" or mode == "server-offset" else "server"
    assert la.clock == expect
    ahead.close()
    behind.close()


@pytest.mark.redis_only
@pytest.mark.parametrize("strategy", ["sliding-window", "gcra"])
def test_where_time_is_refused_hit_all_fails_as_hit_does(redis_factory: object, strategy: Strategy) -> None:
    """A user whose ACL forbids TIME: hit_all, test_all and refund with clock='server' probe,
    switch to the offset and then say plainly what is wrong, as hit does; nothing is stored."""
    server: RedisServer = redis_factory()  # type: ignore[operator]
    admin = redcount.connect(server.url)
    admin.execute("ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-time")
    app = redcount.connect(f"redis://app:pw@127.0.0.1:{server.port}/0")
    for call in (
        lambda lim: lim.hit_all([("5/minute", "k"), ("9/hour", "j")]),
        lambda lim: lim.test_all([("5/minute", "k")]),
        lambda lim: lim.refund("5/minute", "k"),
    ):
        lim = redcount.Limiter(app, strategy, clock="server")
        with pytest.raises(redcount.ReplyError, match="clock='server' needs the Redis TIME command"):
            call(lim)
        assert lim.clock == "server-offset"  # the probe found TIME refused inside scripts
    assert all_keys(admin) == []
    assert redcount.Limiter(app, strategy).hit_all([("5/minute", "k")])
    admin.close()
    app.close()


def test_async_per_key(store: redcount.Store) -> None:
    async def main() -> None:
        lim = aio.Limiter(store, "gcra")
        d = await lim.hit_all([("10/day", "a"), ("4/day", "b")], 2)
        assert d.per_key == [(10, 8), (4, 2)]
        assert (await lim.test_all([("10/day", "a")])).per_key == [(10, 8)]

    asyncio.run(main())


def value(reg: CollectorRegistry, name: str, **labels: str) -> float:
    """The sample's value; a ``limit`` label matches its policy name with any suffix the
    integration adds to tell stacked limits apart ("wide-2")."""
    total = 0.0
    for metric in reg.collect():
        for sample in metric.samples:
            if sample.name != name:
                continue
            if all(
                sample.labels.get(k) == v or (k == "limit" and sample.labels.get(k, "").startswith(v + "-"))
                for k, v in labels.items()
            ):
                total += sample.value
    return total


@pytest.mark.usefixtures("away_from_hour_boundary")
def test_web_metrics_record_each_check_with_its_own_figures(memory_store: redcount.Store) -> None:
    """A route under a wide and a narrow limit, decided together: one record per check per
    request, and "near the limit" judged on each check's own remaining, not the binding one's."""
    reg = CollectorRegistry()
    app = Flask(__name__)
    rl = redcount.flask.RateLimiter(app, limiter=redcount.Limiter(memory_store), metrics=PrometheusMetrics(reg))

    @app.get("/a")
    @rl.limit("100/day", name="wide")
    @rl.limit("3/hour", name="narrow")
    def a() -> str:
        return "a"

    c = app.test_client()
    assert [c.get("/a").status_code for _ in range(4)] == [200, 200, 200, 429]
    assert value(reg, "redcount_decisions_total", limit="wide", result="allowed") == 3
    assert value(reg, "redcount_decisions_total", limit="narrow", result="allowed") == 3
    assert value(reg, "redcount_decisions_total", limit="narrow", result="denied") == 1
    assert value(reg, "redcount_near_limit_total", limit="narrow") == 1  # the 3rd left 0
    assert value(reg, "redcount_near_limit_total", limit="wide") == 0  # 97 of 100 left
