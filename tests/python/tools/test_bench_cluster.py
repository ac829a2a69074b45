"""Smoke test of ``redcount bench --only cluster`` against the shared 3-master cluster.

Checks that the block runs, reads every master, and reports CPU per call and the projection
for each workload and for each master loaded alone; it asserts nothing about speed."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.skipif(
    shutil.which("redis-server") is None or shutil.which("redis-cli") is None,
    reason="redis-server and redis-cli are needed to start a cluster",
)

WORKLOADS = [
    "fixed-window incr, many counters",
    "fixed-window incr_many x1000 (per key)",
    "sharded incr with a request id, one counter, 64 shards",
    "sharded incr with a request id, one counter, 16 shards",
]


def test_bench_cluster_block(redis_cluster: Any, tmp_path: Path) -> None:
    out_json = tmp_path / "bench.json"
    done = subprocess.run(
        [sys.executable, "-m", "redcount", "bench", "--only", "cluster", "--url", redis_cluster.url,
         "--seconds", "0.2", "--json", str(out_json)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    for name in WORKLOADS:
        assert name in done.stdout, f"{name!r} missing from:\n{done.stdout}"
    assert "projected" in done.stdout and "server CPU/call" in done.stdout and "client CPU/call" in done.stdout
    assert "each master alone" in done.stdout and "projected from these per-node figures" in done.stdout

    data = json.loads(out_json.read_text())
    assert data["only"] == "cluster"
    assert [w["name"] for w in data["workloads"]] == WORKLOADS
    for w in data["workloads"]:
        assert w["masters"] == 3
        assert len(w["cluster"]["node_cpu"]) == 3  # every master read through Store.nodes()
        assert len(w["single"]["node_cpu"]) == 1
        assert w["cluster"]["calls"] > 0 and w["single"]["calls"] > 0
        assert w["cluster"]["busiest"] >= 1.0
        assert w["projected_calls_per_sec"] > 0
    # Each master measured alone, against the single server on the same keys.
    assert len(data["per_node"]) == 3
    for node in data["per_node"]:
        assert node["calls"] > 0 and node["server_us"] >= 0 and node["single_server_us"] >= 0
        assert node["command_usec_per_call"] > 0
    # No key of the run is left on any master.
    import redcount

    store = redcount.connect(redis_cluster.url)
    try:
        for node in store.nodes():
            assert node.execute("DBSIZE") == 0
    finally:
        store.close()


def test_bench_cluster_needs_a_cluster_url(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "redcount", "bench", "--only", "cluster", "--seconds", "0.2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode != 0
    assert "redis+cluster://" in done.stderr
