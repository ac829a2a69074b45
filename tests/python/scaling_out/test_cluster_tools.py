"""The ``redcount`` command's tools against a Redis Cluster URL (the shared ``redis_cluster``
fixture): demo, bench and abuse as real subprocesses; flush, reconcile, restore and reshard
through the command's ``main``. What is about one node (KEYS, SCAN, INFO, MEMORY USAGE) goes
through ``Store.nodes()``, so every master is seen."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redcount
from topologies import Cluster

SHARDS = 8


def run(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONWARNINGS="error")
    return subprocess.run([sys.executable, "-m", "redcount", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, check=False, stdin=subprocess.DEVNULL, cwd=cwd)


def all_keys(store: redcount.Store) -> list[bytes]:
    out: list[bytes] = []
    for node in store.nodes():
        found = node.execute("KEYS", "*")
        assert isinstance(found, list)
        out.extend(k for k in found if isinstance(k, bytes))
    return out


@pytest.fixture
def store(redis_cluster: Cluster) -> Iterator[redcount.Store]:
    s = redcount.connect(redis_cluster.url)
    yield s
    s.close()


@pytest.mark.slow
def test_demo(redis_cluster: Cluster, store: redcount.Store) -> None:
    proc = run("demo", "--url", redis_cluster.url, "--windows", "2", "--window", "1", "--clients", "50",
               "--rate", "1500")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("redcount demo on redis+cluster://")
    windows = [line for line in lines if line.startswith("window ")]
    assert len(windows) == 2 and all(" 0 requests" not in w for w in windows), proc.stdout
    keys = all_keys(store)
    assert keys, "the demo wrote nothing to the cluster"
    assert sum(1 for n in store.nodes() if n.execute("DBSIZE")) == 3  # its keys are on every master
    assert all(store.execute("PTTL", k) != -1 for k in keys)


@pytest.mark.slow
def test_bench_runs_the_blocks_that_make_sense_and_cleans_up(
    redis_cluster: Cluster, store: redcount.Store, tmp_path: Path
) -> None:
    out = tmp_path / "bench.json"
    done = run("bench", "--url", redis_cluster.url, "--seconds", "0.2", "--json", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    data = json.loads(out.read_text())
    names = [r["name"] for r in data["results"]]
    assert "redcount sliding-window hit (Redis)" in names and "limits MovingWindow hit (RedisStorage)" in names
    assert not any(n.startswith("redis-benchmark") for n in names)
    assert all(r["ops_per_sec"] > 0 and r["falsy"] == 0 for r in data["results"])
    assert any("Redis Cluster" in note for note in data["notes"])
    assert all_keys(store) == []  # the run's keys were deleted on every master
    refused = run("bench", "--url", redis_cluster.url, "--seconds", "0.2", "--only", "engine", cwd=tmp_path)
    assert refused.returncode == 2 and "--only sliding" in refused.stderr
    assert "Traceback" not in refused.stderr


@pytest.mark.slow
def test_abuse(redis_cluster: Cluster, store: redcount.Store, tmp_path: Path) -> None:
    out = tmp_path / "abuse.json"
    done = run("abuse", "--url", redis_cluster.url, "--limits", "10", "--factor", "3", "--json", str(out), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rows = json.loads(out.read_text())["rows"]
    assert rows and all(r["keys"] >= 1 and r["bytes"] > 0 for r in rows), rows
    assert all_keys(store) == []


def write(c: redcount.ShardedCounter, n: int) -> int:
    total = 0
    for i in range(n):
        amount = (i % 5) + 1
        assert c.incr(amount, request_id=f"r{i}")
        total += amount
    return total


def test_flush_reconcile_restore_reshard(
    redis_cluster: Cluster, store: redcount.Store, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from redcount.tools.cli import main

    url = redis_cluster.url
    sql = f"sqlite:///{tmp_path / 'cli.db'}"
    c = redcount.ShardedCounter(store, "likes", shards=SHARDS, log_maxlen=1_000_000)
    total = write(c, 60)
    assert main(["flush", "--url", url, "--sql", sql, "--counter", "likes", "--shards", str(SHARDS), "--once"]) == 0
    assert "applied 60" in capsys.readouterr().err
    assert main(["reconcile", "--url", url, "--sql", sql]) == 0
    assert "OK:" in capsys.readouterr().out
    store.execute("INCRBY", c.key_of(3), -11)
    assert main(["reconcile", "--url", url, "--sql", sql, "--repair"]) == 1
    assert "DRIFT:" in capsys.readouterr().out
    assert main(["reconcile", "--url", url, "--sql", sql]) == 0
    capsys.readouterr()
    for node in store.nodes():
        node.execute("FLUSHALL")
    assert main(["restore", "--url", url, "--sql", sql, "--counter", "likes"]) == 0
    assert f"restore likes: {total} = snapshot {total} + 0" in capsys.readouterr().out
    assert c.value() == total
    assert main(["reshard", "--url", url, "--counter", "likes", "--initial-shards", str(SHARDS),
                 "--shards", "16"]) == 0
    assert f"reshard likes: {SHARDS} -> 16 shards" in capsys.readouterr().out
    assert redcount.ShardedCounter(store, "likes", shards=SHARDS).value() == total
