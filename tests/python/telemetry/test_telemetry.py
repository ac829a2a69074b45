"""redcount.metrics() and the Prometheus collector: exact counts after a known
workload on both stores, the collector's exposition parsed back, flusher lag, reconciliation
drift, hot keys and skew, and errors counted while the store is down."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import redcount
from redcount.telemetry import register
from conftest import RedisServer


@pytest.fixture(autouse=True)
def fresh_metrics() -> None:
    redcount.metrics.reset()


def test_counts_after_a_known_workload(store: redcount.Store) -> None:
    likes = redcount.ShardedCounter(store, "likes", shards=4)
    views = redcount.FixedWindowCounter(store, "views", window=3600)
    applied = [likes.incr(request_id=f"r{i}") for i in range(80)]
    retried = [likes.incr(request_id=f"r{i}") for i in range(20)]  # retries: already applied
    assert all(applied) and not any(retried)
    views.incr_many({"a": 1, "b": 2, "c": 3})
    assert likes.value() == 80
    likes.read(max_staleness=10)
    views.get("a")
    with pytest.raises(redcount.InvalidInputError):
        likes.incr(0)  # bad input: refused before anything is sent, not a failed write
    m = redcount.metrics()
    assert isinstance(m, redcount.MetricsSnapshot)
    assert m.increments == 103
    assert m.write_errors == 0 and m.write_success_rate == 1.0
    assert m.idempotent_writes == 100 and m.idempotency_hits == 20
    assert m.idempotency_hit_rate == pytest.approx(0.2)
    assert m.reads == 3
    assert m.increments_per_second == pytest.approx(103 / m.interval)
    # The next snapshot's rates cover only what happened since.
    likes.incr(request_id="new")
    m2 = redcount.metrics()
    assert m2.increments == 104 and m2.increments_per_second == pytest.approx(1 / m2.interval)
    assert m2.idempotency_hit_rate == 0.0


def test_errors_counted_while_the_store_is_down(redis_factory: object) -> None:
    server: RedisServer = redis_factory()  # type: ignore[operator]
    store = redcount.connect(server.url, connect_timeout=0.5, command_timeout=0.5)
    try:
        c = redcount.ShardedCounter(store, "down", shards=2)
        for i in range(3):
            c.incr(request_id=f"ok{i}")
        server.kill()
        with pytest.raises(redcount.ConnectionError):
            c.incr(request_id="lost")
        with pytest.raises(redcount.ConnectionError):
            c.value()
        m = redcount.metrics()
        assert m.increments == 4 and m.write_errors == 1
        assert m.write_success_rate == pytest.approx(0.75)
        assert m.read_errors == 1
    finally:
        store.close()


def test_hot_keys_share_and_skew() -> None:
    hk = redcount.HotKeys(capacity=100)
    store = redcount.connect(hot_keys=hk)
    try:
        c = redcount.ShardedCounter(store, "hot", shards=4)
        for i in range(40):
            c.incr(request_id=f"x{i}")
        m = redcount.metrics(top=3)
        assert len(m.hot_keys) == 3
        assert m.hot_keys[0].count == max(k.count for k in hk.top(100))
        assert m.hottest_key_share == pytest.approx(m.hot_keys[0].count / m.hot_keys_total)
        s = m.skew["redcount:hot"]
        counts = [0] * 4
        for i in range(40):
            counts[c.shard_of(f"x{i}")] += 1
        expected = redcount.skew.skew_of([float(n) for n in counts])
        assert s == expected
    finally:
        store.close()


def test_flusher_lag_and_reconcile_drift(tmp_path: object) -> None:
    sql = f"sqlite:///{tmp_path}/m.db"
    store = redcount.connect()
    try:
        c = redcount.ShardedCounter(store, "lagged", shards=2)
        with redcount.Flusher(store, sql, [c]) as f:
            for i in range(7):
                c.incr(request_id=f"l{i}")
            m = redcount.metrics()
            assert m.watermark_lag_entries == 7
            assert m.snapshot_lag_seconds is not None and m.snapshot_lag_seconds >= 0.0
            f.drain()
            m = redcount.metrics()
            assert m.watermark_lag_entries == 0 and m.snapshot_lag_seconds == 0.0
            report = redcount.reconcile(store, sql, "lagged")
            assert redcount.metrics().drift == {"lagged": report.relative} == {"lagged": 0.0}
            store.execute("INCRBY", c.key_of(0), 5)  # a foreign write: drift
            report = redcount.reconcile(store, sql, "lagged")
            assert report.relative > 0
            assert redcount.metrics().drift["lagged"] == report.relative
        assert redcount.metrics().watermark_lag_entries is None  # closed flushers are not reported
    finally:
        store.close()


def test_prometheus_exposition() -> None:
    hk = redcount.HotKeys(capacity=100)
    store = redcount.connect(hot_keys=hk)
    registry = CollectorRegistry()
    collector = redcount.metrics.register(registry, top=2)
    assert isinstance(collector, redcount.RedcountCollector)
    try:
        views = redcount.FixedWindowCounter(store, "pviews", window=3600)
        for i in range(9):
            views.incr(f"k{i % 3}")
        likes = redcount.ShardedCounter(store, "plikes", shards=2)
        likes.incr(request_id="a")
        likes.incr(request_id="a")
        views.get("k0")
        text = generate_latest(registry).decode()
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
        }
        assert samples[("redcount_counter_writes_total", (("result", "ok"),))] == 11
        assert samples[("redcount_counter_writes_total", (("result", "error"),))] == 0
        assert samples[("redcount_counter_reads_total", (("result", "ok"),))] == 1
        assert samples[("redcount_idempotent_writes_total", ())] == 2
        assert samples[("redcount_idempotent_hits_total", ())] == 1
        hot = {
            dict(lbl)["key"]: v for (name, lbl), v in samples.items() if name == "redcount_hot_key_count"
        }
        assert len(hot) == 2  # bounded by top
        touched = {views.storage_key(f"k{i}") for i in range(3)} | {likes.key_of(i) for i in range(2)}
        assert set(hot) <= touched
        assert all(v >= 3 for v in hot.values())
        assert samples[("redcount_hot_keys_observed_total", ())] == hk.total
        assert not [k for k in samples if k[0] == "redcount_undecided_requests_total"]  # none yet
        # What the web engine reports for each request decided without the store.
        for reason in ("timeout", "timeout", "breaker-open"):
            redcount.telemetry.note_undecided(reason)
        samples = {
            (s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(generate_latest(registry).decode())
            for s in fam.samples
        }
        assert samples[("redcount_undecided_requests_total", (("reason", "timeout"),))] == 2
        assert samples[("redcount_undecided_requests_total", (("reason", "breaker-open"),))] == 1
        m = redcount.metrics()
        assert m.undecided_requests == 3 and m.undecided_by_reason == {"timeout": 2, "breaker-open": 1}
        redcount.metrics.reset()
        assert redcount.metrics().undecided_requests == 0
    finally:
        registry.unregister(collector)
        store.close()


def test_metrics_object_and_bad_input() -> None:
    assert redcount.metrics.register is register
    with pytest.raises(redcount.InvalidInputError):
        redcount.metrics(top=-1)


def test_several_hot_key_tables_are_merged() -> None:
    a, b = redcount.HotKeys(10), redcount.HotKeys(10)
    sa, sb = redcount.connect(hot_keys=a), redcount.connect(hot_keys=b)
    try:
        for s, n in ((sa, 3), (sb, 4)):
            c = redcount.FixedWindowCounter(s, "merged", window=3600)
            for _ in range(n):
                c.incr("k")
        key = c.storage_key("k")
        m = redcount.metrics(top=1)
        assert [(k.key, k.count, k.error) for k in m.hot_keys] == [(key, 7, 0)]
        assert m.hot_keys_total == 7 and m.hottest_key_share == 1.0
    finally:
        sa.close()
        sb.close()


def test_leased_units_held_are_a_metric() -> None:
    # Other tests' limiters may still hold units in this process: compare with the start.
    before = redcount.metrics().leased_units
    store = redcount.connect()
    registry = CollectorRegistry()
    collector = redcount.metrics.register(registry)
    try:
        a, b = redcount.Limiter(store), redcount.Limiter(store, prefix="other")
        a.hit("100/hour", "k", lease=10)  # takes 10, holds 9
        b.hit("1000/hour", "k", lease=4)  # takes 4, holds 3
        assert a.leased_units + b.leased_units == 12
        assert redcount.metrics().leased_units == before + 12
        text = generate_latest(registry).decode()
        gauge = [
            s.value
            for fam in text_string_to_metric_families(text)
            for s in fam.samples
            if s.name == "redcount_leased_units"
        ]
        assert gauge == [before + 12]
        a.return_leases()
        assert redcount.metrics().leased_units == before + 3
    finally:
        registry.unregister(collector)
        store.close()
    assert redcount.metrics().leased_units == before  # closing the store gave b's back
