"""Smoke test of ``redcount bench web``: the command starts its servers, loads them with wrk
and reports every contender (run or skipped, with the reason). Nothing about speed is
asserted: a one-second run on a shared machine means little."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.redis_only, pytest.mark.slow]


def test_bench_web_reports_every_contender(tmp_path: Path) -> None:
    for binary in ("wrk", "redis-server"):
        if shutil.which(binary) is None:
            pytest.fail(f"{binary!r} not found on PATH: apt-get install {binary}. Refusing to skip.")
    out = tmp_path / "web.json"
    done = subprocess.run(
        [sys.executable, "-m", "redcount", "bench", "web", "--seconds", "1", "--workers", "1",
         "--connections", "4", "--threads", "1", "--json", str(out)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(out.read_text())
    rows = {r["name"]: r for r in data["results"]}
    assert set(rows) == {
        "flask-none", "flask-floor", "flask-redcount", "flask-limiter-redis", "flask-limiter-redcount",
        "fastapi-none", "fastapi-floor", "fastapi-floor-blocking", "fastapi-redcount", "slowapi-redis",
        "slowapi-redcount", "fastapi-limiter", "django-none", "django-floor", "django-redcount", "django-ratelimit-redis",
        "flask-redcount-3", "flask-redcount-3-seq", "fastapi-redcount-3", "fastapi-redcount-3-seq",
        "flask-redcount-refused", "flask-redcount-refused-cache", "fastapi-redcount-refused",
        "fastapi-redcount-refused-cache",
        "flask-redcount-leased", "fastapi-redcount-leased",
    }
    for name in ("flask-none", "flask-floor", "flask-redcount", "fastapi-none", "fastapi-floor", "fastapi-floor-blocking",
                 "fastapi-redcount", "django-none", "django-floor", "django-redcount", "flask-redcount-3",
                 "flask-redcount-3-seq", "fastapi-redcount-3", "fastapi-redcount-3-seq", "flask-redcount-leased",
                 "fastapi-redcount-leased"):
        assert rows[name]["skipped"] is None and rows[name]["rps"] > 0, rows[name]
        assert rows[name]["non_2xx"] == 0, rows[name]  # the limit is never reached
    for name in ("flask-redcount-refused", "flask-redcount-refused-cache", "fastapi-redcount-refused",
                 "fastapi-redcount-refused-cache"):
        assert rows[name]["skipped"] is None and rows[name]["rps"] > 0, rows[name]
        assert rows[name]["non_2xx"] > 0, rows[name]  # a refused client's flood: 429s
    for r in rows.values():
        assert (r["skipped"] is None) == (r["rps"] > 0), r
        assert r["name"] in done.stdout
    assert set(data["summary"]) == {"flask", "fastapi", "django"}
    for fw in ("flask", "fastapi", "django"):
        summary = data["summary"][fw]
        base = rows[f"{fw}-none"]["rps"]
        floor = max(r["rps"] for name, r in rows.items() if name.startswith(f"{fw}-floor"))  # the lowest overhead
        assert summary["floor_overhead"] == pytest.approx(1 - floor / base), summary
        if summary["best_peer_overhead"] is not None:
            assert summary["target_overhead"] == pytest.approx(0.5 * summary["best_peer_overhead"])
            assert f"{fw}: lowest floor (one bare INCR round trip per request" in done.stdout


def test_bench_web_bad_arguments() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "redcount", "bench", "web", "--workers", "0"],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 2 and "--workers" in done.stderr


def test_bench_web_cpu_per_request_in_process() -> None:
    if shutil.which("redis-server") is None:
        pytest.fail("'redis-server' not found on PATH: apt-get install redis-server. Refusing to skip.")
    names = ["flask-none", "flask-redcount", "fastapi-none", "fastapi-redcount"]
    done = subprocess.run(
        [sys.executable, "-m", "redcount.tools.bench.web", "50", "--repeat", "1", "--only", ",".join(names)],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = {line.split()[0]: line for line in done.stdout.splitlines() if line.strip()}
    assert set(lines) == set(names), done.stdout
    for name in names:
        assert "us/request" in lines[name]
        assert ("over no limiter" in lines[name]) == name.endswith("redcount")
