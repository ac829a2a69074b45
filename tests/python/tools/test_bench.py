"""End-to-end smoke test of ``redcount bench`` against a private redis-server.

Checks that the command runs and reports every measurement and ratio; it asserts nothing
about speed (figures from a 0.2 s run on a shared machine mean little).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REDIS_SERVER, server_product

pytestmark = pytest.mark.redis_only


def _need(binary: str) -> None:
    # Like conftest.py: a missing redis-server is a broken test setup, not a reason to skip.
    if shutil.which(binary) is None:
        pytest.fail(f"{binary!r} not found on PATH: apt-get install redis-server. Refusing to skip.")


def _bench_json(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    """``redcount bench --seconds 0.2 ARGS --json FILE`` in ``tmp_path``: the finished run
    and the JSON file's path."""
    out_json = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "redcount", "bench", "--seconds", "0.2", *args, "--json", str(out_json)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    return done, out_json


FIXED_ROWS = [
    "redis-benchmark INCR -c1 -P1",
    "redcount incr (Redis)",
    "limits FixedWindow hit (RedisStorage)",
    "redcount Limiter.hit (Redis)",
    "redis-benchmark INCR -c1 -P128",
    "redcount incr_many x128 (Redis, per key)",
    "redcount incr_many x1000 (Redis, per key)",
    "redcount incr (memory)",
    "limits FixedWindow hit (MemoryStorage)",
    "redcount Limiter.hit (memory)",
]
SLIDING_ROWS = [
    "redcount sliding-window hit (Redis)",
    "limits MovingWindow hit (RedisStorage)",
    "redcount sliding-window-approx hit (Redis)",
    "limits SlidingWindowCounter hit (RedisStorage)",
    "redcount token-bucket hit (Redis)",
    "redcount gcra hit (Redis)",
    "redcount sliding-window hit (memory)",
    "limits MovingWindow hit (MemoryStorage)",
    "redcount sliding-window-approx hit (memory)",
    "limits SlidingWindowCounter hit (MemoryStorage)",
    "redcount token-bucket hit (memory)",
    "redcount gcra hit (memory)",
]
ROWS = FIXED_ROWS + SLIDING_ROWS
FIXED_RATIOS = [
    "redcount incr (Redis) / limits hit (Redis)",
    "redcount incr (Redis) / redis-benchmark -c1 -P1",
    "redcount incr_many / redis-benchmark -c1 -P128",
    "redcount incr_many x1000 / redis-benchmark -c1 -P128",
    "redcount incr (memory) / limits hit (memory)",
    "redcount Limiter.hit / limits hit (Redis)",
    "redcount Limiter.hit / limits hit (memory)",
]
SLIDING_RATIOS = [
    "redcount sliding-window / limits MovingWindow (Redis)",
    "redcount sliding-window-approx / limits SlidingWindowCounter (Redis)",
    "redcount token-bucket / redcount sliding-window (Redis)",
    "redcount gcra / redcount sliding-window (Redis)",
    "redcount sliding-window / limits MovingWindow (memory)",
    "redcount sliding-window-approx / limits SlidingWindowCounter (memory)",
    "redcount token-bucket / redcount sliding-window (memory)",
    "redcount gcra / redcount sliding-window (memory)",
]
RATIOS = FIXED_RATIOS + SLIDING_RATIOS
FIXED_TARGETS = [1.6, 0.8, 0.4, 0.5, 3.0, None, None]
SLIDING_TARGETS = [1.6, 1.6, None, None, 5.0, 5.0, None, None]


def test_bench_reports_every_row_and_ratio(tmp_path: Path) -> None:
    _need("redis-server")
    _need("redis-benchmark")
    out_json = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "redcount", "bench", "--seconds", "0.2", "--json", str(out_json)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for name in ROWS + RATIOS:
        assert name in done.stdout, f"{name!r} missing from:\n{done.stdout}"
    assert done.stdout.count("PASS") + done.stdout.count("MISS") == 20  # 9 + the engine's 7 + hot keys' 4
    for name in ROWS:  # progress: one line per measurement, on stderr
        assert name in done.stderr

    data = json.loads(out_json.read_text())
    assert [r["name"] for r in data["results"]][: len(ROWS)] == ROWS  # then the engine's rows
    assert all(r["ops_per_sec"] > 0 and r["falsy"] == 0 for r in data["results"])
    assert [q["name"] for q in data["ratios"]][: len(RATIOS)] == RATIOS
    assert [q["target"] for q in data["ratios"]][: len(RATIOS)] == FIXED_TARGETS + SLIDING_TARGETS
    assert data["only"] == "all"
    assert data["sliding_limit"] == "100/second"
    assert not list(tmp_path.glob("*.rdb"))  # the private server saved nothing here


def test_bench_only_sliding(tmp_path: Path) -> None:
    # --only sliding measures the sliding windows and buckets alone, and needs no
    # redis-benchmark (only the fixed-window rows run it).
    _need("redis-server")
    out_json = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "redcount",
            "bench",
            "--seconds",
            "0.2",
            "--only",
            "sliding",
            "--redis-benchmark",
            str(tmp_path / "no-such-redis-benchmark"),
            "--json",
            str(out_json),
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for name in SLIDING_ROWS + SLIDING_RATIOS:
        assert name in done.stdout, f"{name!r} missing from:\n{done.stdout}"
    for name in FIXED_ROWS + FIXED_RATIOS:
        assert name not in done.stdout
    assert done.stdout.count("PASS") + done.stdout.count("MISS") == 4

    data = json.loads(out_json.read_text())
    assert [r["name"] for r in data["results"]] == SLIDING_ROWS
    assert all(r["ops_per_sec"] > 0 and r["falsy"] == 0 for r in data["results"])
    assert [q["name"] for q in data["ratios"]] == SLIDING_RATIOS
    assert [q["target"] for q in data["ratios"]] == SLIDING_TARGETS
    assert data["only"] == "sliding"


def test_bench_refuses_a_missing_binary(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "redcount",
            "bench",
            "--seconds",
            "0.2",
            "--redis-benchmark",
            str(tmp_path / "no-such-redis-benchmark"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "apt-get install redis-server" in done.stderr


ENGINE_ROWS = [
    "redis-benchmark INCR -c1 -P1",
    "redcount incr x1 threads (Redis)",
    "redcount incr x1 threads (Redis, one socket)",
    "redcount incr x1 threads (Redis, max_connections=2)",
    "redcount incr x1 threads (Redis, spin=0)",
    "redis-benchmark INCR -c8 -P1",
    "redcount incr x8 threads (Redis)",
    "redcount incr x8 threads (Redis, one socket)",
    "redcount incr x8 threads (Redis, max_connections=9)",
    "redis-benchmark INCR -c32 -P1",
    "redcount incr x32 threads (Redis)",
    "redcount incr x32 threads (Redis, one socket)",
    "redcount incr x32 threads (Redis, max_connections=33)",
    "redcount incr (Redis)",
    "limits async FixedWindow hit x1000 coroutines (RedisStorage)",
    "redcount aio Limiter.hit x1000 coroutines (Redis)",
    "redcount Limiter.hit (Redis)",
]
ENGINE_RATIOS = [
    "redcount incr x1 threads, default store / redis-benchmark -c1 -P1",
    "redcount incr x1 threads, one socket / redis-benchmark -c1 -P1",
    "redcount incr x1 threads, thread connections / redis-benchmark -c1 -P1",
    "redcount incr x1 thread: default / spin=0",
    "redcount incr x8 threads, default store / redis-benchmark -c8 -P1",
    "redcount incr x8 threads, one socket / redis-benchmark -c8 -P1",
    "redcount incr x8 threads, thread connections / redis-benchmark -c8 -P1",
    "redcount incr x32 threads, default store / redis-benchmark -c32 -P1",
    "redcount incr x32 threads, one socket / redis-benchmark -c32 -P1",
    "redcount incr x32 threads, thread connections / redis-benchmark -c32 -P1",
    "redcount incr x8 threads, thread connections / x1 thread (Redis)",
    "redcount aio hit / limits async hit, x1000 coroutines (Redis)",
    "redcount aio hit x1000 coroutines / sync Limiter.hit x1 thread (Redis)",
    "redcount incr x8 threads, default store / x1 thread (Redis)",
]


def test_bench_only_engine(tmp_path: Path) -> None:
    # Threads, 1,000 coroutines and TLS against private servers; the uvloop row is optional.
    _need("redis-server")
    _need("redis-benchmark")
    _need("openssl")
    done, out_json = _bench_json(tmp_path, "--only", "engine")
    assert done.returncode == 0, done.stderr
    data = json.loads(out_json.read_text())
    names = [r["name"] for r in data["results"]]
    assert names[: len(ENGINE_ROWS)] == ENGINE_ROWS
    assert "redcount incr (Redis over TLS)" in names
    assert all(r["ops_per_sec"] > 0 and r["falsy"] == 0 for r in data["results"])
    ratios = {q["name"]: q for q in data["ratios"]}
    assert [q["name"] for q in data["ratios"]][: len(ENGINE_RATIOS)] == ENGINE_RATIOS
    assert [ratios[n]["target"] for n in ENGINE_RATIOS] == [
        0.9, None, None, None, 0.75, None, 1.3, 0.75, None, None, 6.0, 8.0, 4.0, None]
    assert ratios["redcount incr rediss:// / redis:// (one thread)"]["value"] > 0
    assert data["only"] == "engine"
    assert any("no regression" in note for note in data["notes"])
    # The quiet-machine check: says whether the machine was quiet, and the idle round trip.
    assert any(note.startswith("machine check before the engine rows: ") and "idle round trip" in note
               for note in data["notes"])
    # CPU per op of the Redis rows, this process and the server apart; none for TLS (another server).
    by_name = {r["name"]: r for r in data["results"]}
    for name in ENGINE_ROWS:
        assert by_name[name]["cpu_client_us"] > 0 and by_name[name]["cpu_server_us"] > 0, by_name[name]
    assert by_name["redcount incr (Redis over TLS)"]["cpu_client_us"] is None
    assert sum(note.startswith("CPU per call, measured: ") for note in data["notes"]) == 1
    assert any(note.startswith("at 6x one thread (") for note in data["notes"])
    assert "cpu us/op: client + server" in done.stdout
    for name in FIXED_ROWS[4:] + SLIDING_ROWS:  # only the engine group ran
        assert name not in names


def test_bench_only_sharded(tmp_path: Path) -> None:
    # The sharded group: sharded incr with request ids, incr_many, the buffered writer and value() latency.
    _need("redis-server")
    _need("redis-benchmark")
    done, out_json = _bench_json(tmp_path, "--only", "sharded")
    assert done.returncode == 0, done.stderr
    data = json.loads(out_json.read_text())
    names = [r["name"] for r in data["results"]]
    assert "redcount sharded incr, new request id per call (Redis)" in names
    assert "redcount BufferedCounter.incr (memory, one thread)" in names
    assert all(r["ops_per_sec"] > 0 and r["falsy"] == 0 for r in data["results"])
    assert data["only"] == "sharded"
    assert sum("sharded value() with" in note for note in data["notes"]) == 4
    assert "redcount sharded incr_many x100 counters, request ids x8 threads (Redis, per write)" in names
    assert any(note.startswith("incr_many, one process (8 threads):") for note in data["notes"])
    assert any(note.startswith("incr_many from one thread:") for note in data["notes"])


HOT_ROWS = [
    "redcount incr (Redis) (100 hot keys)",
    "limits FixedWindow hit (RedisStorage) (100 hot keys)",
    "redcount sliding-window hit (Redis) (100 hot keys)",
    "limits MovingWindow hit (RedisStorage) (100 hot keys)",
    "redcount incr (memory) (100 hot keys)",
    "limits FixedWindow hit (MemoryStorage) (100 hot keys)",
    "redcount sliding-window hit (memory) (100 hot keys)",
    "limits MovingWindow hit (MemoryStorage) (100 hot keys)",
]


def test_bench_only_hot(tmp_path: Path) -> None:
    # Hot keys: the same contenders over 100 keys hit in turn, the logs growing.
    _need("redis-server")
    done, out_json = _bench_json(tmp_path, "--only", "hot")
    assert done.returncode == 0, done.stderr
    data = json.loads(out_json.read_text())
    assert [r["name"] for r in data["results"]] == HOT_ROWS
    assert all(r["ops_per_sec"] > 0 and r["falsy"] == 0 for r in data["results"])
    assert [q["target"] for q in data["ratios"]] == [1.6, 1.6, 3.0, 5.0]
    assert data["only"] == "hot"


def test_bench_only_leased(tmp_path: Path) -> None:
    # A hot key with and without lease=, under threads and processes; exactness checked.
    _need("redis-server")
    done, out_json = _bench_json(tmp_path, "--only", "leased")
    assert done.returncode == 0, done.stderr
    data = json.loads(out_json.read_text())
    assert data["only"] == "leased"
    assert [(r["callers"], r["lease"], r["strategy"]) for r in data["rows"]] == [
        ("threads", None, "fixed-window"),
        ("threads", 1000, "fixed-window"),
        ("processes", None, "fixed-window"),
        ("processes", 1000, "fixed-window"),
        ("threads", None, "fixed-window"),
        ("threads", 1000, "fixed-window"),
        ("threads", 1000, "fixed-window"),
        ("threads", None, "sliding-window-approx"),
        ("threads", 1000, "sliding-window-approx"),
    ]
    rates = [r for r in data["rows"] if not r["refusals"]]
    assert all(r["decisions"] > 0 and r["admitted"] == r["decisions"] for r in rates)
    # Every admitted unit was charged; what was held went back when the callers closed.
    assert all(r["charged"] == r["admitted"] and r["held"] >= 0 for r in rates)
    # On an exhausted key every decision is a refusal, at most one script call each; with a
    # refusal cache, none reach the store.
    refusals = [r for r in data["rows"] if r["refusals"]]
    assert [r["refusal_cache"] for r in refusals] == [0, 0, 1000]
    assert all(r["decisions"] > 0 and r["admitted"] == 0 for r in refusals)
    assert all(r["calls_per_decision"] <= 1.0 for r in refusals[:2])
    assert refusals[2]["store_calls"] == 0
    assert [(e["callers"], e["strategy"], e["over"], e["under"]) for e in data["exact"]] == [
        ("threads", "fixed-window", 0, 0),
        ("processes", "fixed-window", 0, 0),
        ("threads", "sliding-window-approx", 0, 0),
    ]
    assert set(data["ratios"]) == {"threads", "processes", "threads, approx", "refusals, threads"}
    assert data["targets"]["refusals, threads"] == 1.0
    assert "leased / unleased decisions per second, threads:" in done.stdout
    assert "leased / unleased refusals of an exhausted key per second, threads:" in done.stdout


@pytest.mark.parametrize("strategy", ["sliding-window", "token-bucket", "gcra"])
def test_bench_only_leased_strategy(tmp_path: Path, strategy: str) -> None:
    # --strategy: one strategy's threads rates, refusals and exactness.
    _need("redis-server")
    done, out_json = _bench_json(tmp_path, "--only", "leased", "--strategy", strategy)
    assert done.returncode == 0, done.stderr
    data = json.loads(out_json.read_text())
    assert data["strategy"] == strategy
    assert [(r["lease"], r["refusals"], r["strategy"]) for r in data["rows"]] == [
        (None, False, strategy),
        (1000, False, strategy),
        (None, True, strategy),
        (1000, True, strategy),
    ]
    rates = [r for r in data["rows"] if not r["refusals"]]
    # (The exact log's largest limit, 100000/second, may be reached by the leased threads.)
    assert all(r["decisions"] > 0 and 0 < r["admitted"] <= r["decisions"] for r in rates)
    assert strategy == "sliding-window" or all(r["admitted"] == r["decisions"] for r in rates)
    refusals = [r for r in data["rows"] if r["refusals"]]
    assert all(r["decisions"] > 0 and r["admitted"] == 0 for r in refusals)
    assert [(e["strategy"], e["over"]) for e in data["exact"]] == [(strategy, 0)]
    assert set(data["ratios"]) == {f"threads, {strategy}", f"refusals, threads, {strategy}"}
    assert f"leased / unleased decisions per second, threads, {strategy}:" in done.stdout


def test_bench_names_the_server_it_measured(tmp_path: Path) -> None:
    # Valkey answers redis_version:7.2.4 (for clients' sake); the report names the server
    # as the binary itself does (`--version`): "Redis 7.0.15", "Valkey 9.1.2".
    _need(REDIS_SERVER)
    expected = server_product(REDIS_SERVER)
    done, out_json = _bench_json(tmp_path, "--only", "hot", "--redis-server", REDIS_SERVER)
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert f", {expected} at redis://127.0.0.1:" in first and first.endswith("(private)"), first
    assert json.loads(out_json.read_text())["server_version"] == expected
