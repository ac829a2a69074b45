"""redcount.analysis: exact frames from constructed data and from real counters
(both stores), the skew figures agreeing with redcount.skew, and clear errors for bad input."""

from __future__ import annotations

import math
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import redcount
from redcount import analysis
from redcount.skew import skew_of


def test_shard_table_of_constructed_data_is_exact() -> None:
    t = analysis.shard_table({"a": [1, 3], "b": [0, 0, 0]}, writes={"a": [2, 6]})
    assert list(t.columns) == ["counter", "shard", "value", "share", "writes", "write_share"]
    assert t[["counter", "shard", "value"]].values.tolist() == [
        ["a", 0, 1], ["a", 1, 3], ["b", 0, 0], ["b", 1, 0], ["b", 2, 0]
    ]
    assert t["share"].tolist()[:2] == [0.25, 0.75]
    assert t["share"].iloc[2:].isna().all()  # a counter summing to 0 has no shares
    assert t["writes"].tolist()[:2] == [2.0, 6.0] and t["write_share"].tolist()[:2] == [0.25, 0.75]
    assert t["writes"].iloc[2:].isna().all()  # no writes given for b
    plain = analysis.shard_table({"a": [1, 3]})
    assert list(plain.columns) == ["counter", "shard", "value", "share"]


def test_skew_table_of_constructed_data_is_exact() -> None:
    t = analysis.skew_table({"even": [5, 5, 5, 5], "one": [0, 0, 0, 8]})
    assert t["basis"].tolist() == ["value", "value"]
    even, one = t.iloc[0], t.iloc[1]
    assert (even["shards"], even["total"], even["mean"], even["max"]) == (4, 20.0, 5.0, 5.0)
    assert (even.max_over_mean, even.cv, even.gini) == (1.0, 0.0, 0.0)
    assert (one.max_over_mean, one.gini) == (4.0, 0.75)
    assert one.cv == pytest.approx(math.sqrt(3))
    assert t["recommended_shards"].isna().all()


def test_skew_table_rates_and_recommendation() -> None:
    # 8 shards wrote 4,000 writes in 2 s: 2,000/s; at most 300/s a shard needs 7 -> 8 (current).
    # 16,000 writes in 2 s: 8,000/s -> 27 -> 32.
    t = analysis.skew_table(
        {"x": [1] * 8, "y": [1] * 8},
        writes={"x": [500] * 8, "y": [4000, 1000, 1000, 2000, 2000, 2000, 2000, 2000]},
        seconds=2,
        target_per_shard=300,
    )
    w = t[t.basis == "writes"].set_index("counter")
    assert w.loc["x", "total"] == 2000.0 and w.loc["x", "max"] == 250.0
    assert w.loc["x", "recommended_shards"] == 8
    assert w.loc["y", "total"] == 8000.0 and w.loc["y", "recommended_shards"] == 32
    # The one definition: the same figures as redcount.skew on the rates.
    ref = skew_of([x / 2 for x in [4000, 1000, 1000, 2000, 2000, 2000, 2000, 2000]], target_per_shard=300)
    assert (w.loc["y", "max_over_mean"], w.loc["y", "cv"], w.loc["y", "gini"]) == (ref.max_over_mean, ref.cv, ref.gini)
    assert t[t.basis == "value"]["recommended_shards"].isna().all()
    assert str(t["recommended_shards"].dtype) == "Int64"


def _written(store: redcount.Store, shards: int = 4) -> tuple[redcount.ShardedCounter, list[int], list[int]]:
    c = redcount.ShardedCounter(store, "likes", shards=shards, log_maxlen=10_000)
    values = [0] * shards
    writes = [0] * shards
    for i in range(60):
        amount = 1 + i % 4
        assert c.incr(amount, request_id=f"r{i}")
        s = c.shard_of(f"r{i}")
        values[s] += amount
        writes[s] += 1
    return c, values, writes


def test_a_real_counter_on_both_stores(store: redcount.Store) -> None:
    c, values, writes = _written(store)
    assert analysis.log_writes(c) == writes
    t = analysis.shard_table(c, writes="log")
    assert t["value"].tolist() == values == c.shard_values()
    assert t["writes"].tolist() == [float(w) for w in writes]
    assert t["share"].tolist() == [v / sum(values) for v in values]
    s = analysis.skew_table([c], writes="log").set_index("basis")
    ref = skew_of(values)
    assert s.loc["value", "gini"] == ref.gini and s.loc["value", "max_over_mean"] == ref.max_over_mean
    assert s.loc["writes", "total"] == 60.0
    # A second counter in the same call, and a repeat of the request ids counts nothing.
    other = redcount.ShardedCounter(store, "views", shards=2)
    assert other.incr(5) and not c.incr(1, request_id="r0")
    both = analysis.shard_table([c, other])
    assert both.groupby("counter")["value"].sum().to_dict() == {"likes": sum(values), "views": 5}


def test_log_writes_since(store: redcount.Store) -> None:
    c, _, writes = _written(store)
    assert analysis.log_writes(c, since_ms=0) == writes
    assert analysis.log_writes(c, since_ms=2**62) == [0] * 4  # nothing logged in the far future


def test_shard_recommendation_is_exact() -> None:
    t = analysis.shard_recommendation({"x": [100, 50, 50, 0], "cold": [1.0, 1.0]}, 40)
    x, cold = t.iloc[0], t.iloc[1]
    assert (x.shards, x.total_rate, x.max_rate, x.recommended_shards, x.even_rate_after, x.hot_now) == (
        4, 200.0, 100.0, 8, 25.0, True
    )
    assert (cold.recommended_shards, cold.hot_now) == (2, False)  # never below the current count
    assert analysis.shard_recommendation({"huge": [1e9]}, 1).iloc[0].recommended_shards == 1024


@dataclass
class _Entry:
    key: str
    count: int
    error: int


class _Sampler:
    total = 1000

    def __init__(self, entries: list[_Entry]) -> None:
        self.entries = entries

    def top(self, n: int) -> list[_Entry]:
        return self.entries[:n]


def test_hot_keys_from_exact_counts() -> None:
    t = analysis.hot_keys({"b": 30, "a": 30, "c": 40, b"d": 0}, n=3)
    assert t["key"].tolist() == ["c", "a", "b"]  # ties by key, so every run gives the same table
    assert t["rank"].tolist() == [1, 2, 3]
    assert t["count"].tolist() == t["lower"].tolist() == t["upper"].tolist() == [40, 30, 30]
    assert t["error"].tolist() == [0, 0, 0]
    assert t["share"].tolist() == [0.4, 0.3, 0.3]
    assert t["cumulative_share"].tolist() == pytest.approx([0.4, 0.7, 1.0])
    assert analysis.hot_keys({"a": 1}, n=10, total=4)["share"].tolist() == [0.25]
    assert len(analysis.hot_keys({}, n=5)) == 0


def test_hot_keys_from_a_sampler_carry_its_bounds() -> None:
    s = _Sampler([_Entry("k1", 500, 0), _Entry("k2", 120, 20), _Entry("k3", 90, 90)])
    t = analysis.hot_keys(s, n=2)
    assert t[["key", "count", "error", "lower", "upper"]].values.tolist() == [
        ["k1", 500, 0, 500, 500], ["k2", 120, 20, 100, 120]
    ]
    assert t["share"].tolist() == [0.5, 0.12]  # of the sampler's total
    del _Sampler.total
    try:
        assert analysis.hot_keys(s, n=1)["share"].isna().all()  # no total known: no shares
    finally:
        _Sampler.total = 1000


def test_drift_history_from_recorded_runs(store: redcount.Store, tmp_path: Path) -> None:
    sql = f"sqlite:///{tmp_path / 'snap.db'}"
    c, _, _ = _written(store)
    with redcount.Flusher(store, sql, [c]) as f:
        f.drain()
    assert redcount.reconcile(store, sql, "likes").ok
    store.execute("INCRBY", c.key_of(1), 7)
    redcount.reconcile(store, sql, "likes")
    redcount.reconcile(store, sql, "likes", repair=True)
    redcount.reconcile(store, sql, "likes")
    h = analysis.drift_history(sql, "likes")
    assert list(h.columns) == ["counter", "run_ms", "time", "drift", "abs_drift", "relative", "ok", "corrections"]
    assert h["drift"].tolist() == [0, 7, 7, 0]
    assert h["corrections"].tolist() == [0, 0, 7, 0]
    assert h["run_ms"].is_monotonic_increasing
    assert (h["time"] == pd.to_datetime(h["run_ms"], unit="ms", utc=True)).all()
    p = analysis.drift_history(sql, ["likes"], per_shard=True)
    assert p[["shard", "drift", "correction"]].values.tolist() == [[1, 7, 0], [1, 7, -7]]
    with redcount.SnapshotStore(sql) as snaps:  # an open SnapshotStore is used and left open
        assert len(analysis.drift_history(snaps, "likes")) == 4
        assert snaps.total("likes")[0] > 0
    empty = analysis.drift_history(sql, "never-reconciled")
    assert len(empty) == 0 and "time" in empty.columns


def test_lag_history_with_a_flusher_round_between_samples(store: redcount.Store, tmp_path: Path) -> None:
    c = redcount.ShardedCounter(store, "likes", shards=1, log_maxlen=1000)
    for i in range(12):
        assert c.incr(request_id=f"r{i}")
    done = threading.Event()
    with redcount.Flusher(store, f"sqlite:///{tmp_path / 'snap.db'}", [c], batch=5) as f:

        def one_round(i: int) -> None:
            if f.run_once() == 0:
                done.set()

        lag = analysis.lag_history(f, samples=100, between=one_round, stop=done)
    assert lag["entries"].tolist() == [12, 7, 2, 0, 0]  # the last sample is taken after the stop
    assert lag["sample"].tolist() == [0, 1, 2, 3, 4]
    assert lag["seconds"].iloc[-1] == 0.0 and lag["seconds"].iloc[0] >= 0.0
    assert lag["elapsed"].is_monotonic_increasing


def test_lag_history_samples_at_an_interval() -> None:
    class Fake:
        n = 0

        @property
        def lag(self) -> redcount.Lag:
            self.n += 1
            return redcount.Lag(entries=10 - self.n, seconds=0.5)

    lag = analysis.lag_history(Fake(), samples=3, interval=0)
    assert lag["entries"].tolist() == [9, 8, 7] and lag["seconds"].tolist() == [0.5] * 3


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: analysis.shard_table("likes"), "the string"),
        (lambda: analysis.shard_table([]), "at least one counter"),
        (lambda: analysis.shard_table({}), "at least one counter"),
        (lambda: analysis.shard_table({"a": {"x": 1}}), "non-empty sequence"),
        (lambda: analysis.shard_table([object()]), "expected ShardedCounter"),
        (lambda: analysis.shard_table({"a": []}), "non-empty sequence"),
        (lambda: analysis.shard_table({"a": [1.5]}), "must be ints"),
        (lambda: analysis.shard_table({"": [1]}), "non-empty strings"),
        (lambda: analysis.shard_table({"a": [1]}, writes="log"), "live ShardedCounter"),
        (lambda: analysis.shard_table({"a": [1]}, writes="bogus"), '"log"'),
        (lambda: analysis.shard_table({"a": [1]}, writes={"b": [1]}), "not among the counters"),
        (lambda: analysis.shard_table({"a": [1, 2]}, writes={"a": [1]}), "1 figures for 2 shards"),
        (lambda: analysis.shard_table({"a": [1]}, writes={"a": [-1]}), ">= 0"),
        (lambda: analysis.shard_table({"a": [1]}, writes={"a": [math.nan]}), ">= 0"),
        (lambda: analysis.skew_table({"a": [1, -2]}), "negative shard value"),
        (lambda: analysis.skew_table({"a": [1]}, target_per_shard=10), "needs writes and the seconds"),
        (lambda: analysis.skew_table({"a": [1]}, writes={"a": [1]}, seconds=0), "positive duration"),
        (lambda: analysis.skew_table({"a": [1]}, writes={"a": [1]}, seconds=1, target_per_shard=0), "positive rate"),
        (lambda: analysis.shard_recommendation({}, 10), "non-empty"),
        (lambda: analysis.shard_recommendation({"a": [1]}, 0), "positive rate"),
        (lambda: analysis.shard_recommendation({"a": [1, -1]}, 10), ">= 0"),
        (lambda: analysis.hot_keys({"a": -1}), "ints >= 0"),
        (lambda: analysis.hot_keys({"a": 1}, n=0), "n must be"),
        (lambda: analysis.hot_keys({"a": 1}, total=-1), "total must be"),
        (lambda: analysis.hot_keys(42), "top(n)"),
        (lambda: analysis.hot_keys(_Sampler([_Entry("k", 5, 6)])), "error <= count"),
        (lambda: analysis.drift_history("sqlite://", []), "one or more"),
        (lambda: analysis.lag_history(object()), "lag property"),
        (lambda: analysis.lag_history(_Sampler([]), samples=0), "samples must be"),
        (lambda: analysis.lag_history(_Sampler([]), interval=-1), "interval must be"),
    ],
)
def test_bad_input_is_refused_clearly(call: object, message: str) -> None:
    with pytest.raises(redcount.InvalidInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        call()  # type: ignore[operator]


def test_bad_input_on_a_real_counter(memory_store: redcount.Store) -> None:
    c = redcount.ShardedCounter(memory_store, "likes", shards=2)
    with pytest.raises(redcount.InvalidInputError, match="given twice"):
        analysis.shard_table([c, c])
    with pytest.raises(redcount.InvalidInputError, match="since_ms"):
        analysis.log_writes(c, since_ms=-1)
    with pytest.raises(redcount.InvalidInputError, match="needs a ShardedCounter"):
        analysis.log_writes("likes")  # type: ignore[arg-type]
    assert c.shard_values() == [0, 0]  # nothing was written by the refusals


def test_without_pandas_the_error_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)  # an import of it now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'redcount\[analysis\]'"):
        analysis.shard_table({"a": [1]})


def test_numpy_and_pandas_figures_are_accepted() -> None:
    t = analysis.skew_table({"a": np.array([1, 3])}, writes={"a": pd.Series([2.0, 6.0])})
    assert t.set_index("basis").loc["writes", "max_over_mean"] == 1.5
    assert analysis.hot_keys({"k": np.int64(4)})["count"].tolist() == [4]
    assert analysis.shard_recommendation({"a": np.array([10.0, 30.0])}, 10).iloc[0].recommended_shards == 4
