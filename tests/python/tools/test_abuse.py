"""Redis memory under abuse (``redcount abuse``): a client sending many times its limit.

The exact sliding log stores only admitted hits, so its key holds at most `limit` members
and its size follows the limit, not the request count; the naive log (ZADD every request)
grows with the requests; the approximate window, fixed window, token bucket and GCRA hold a
few bytes whatever happens. Measured with MEMORY USAGE on a real redis-server; the client
clock is a ManualClock, so a whole minute of requests takes a fraction of a second.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redcount
from conftest import REDIS_SERVER, RedisServer, server_product
from redcount.tools.abuse import NAIVE, SimClock, measure_abuse, measure_limiter, measure_naive, open_sim_store
from redcount.tools.accuracy import STRATEGIES, limit_text

pytestmark = pytest.mark.redis_only

FIXED, SLIDING, APPROX1, APPROX4, TB, GCRA = STRATEGIES
SMALL = [FIXED, APPROX1, APPROX4, TB, GCRA]
WINDOW = 60


@pytest.fixture
def sim(redis_server: RedisServer) -> Iterator[tuple[redcount.Store, SimClock]]:
    store, clock = open_sim_store(redis_server.url, WINDOW)
    store.execute("FLUSHALL")
    try:
        yield store, clock
    finally:
        store.close()


def test_exact_log_holds_at_most_limit_members_at_every_step(sim: tuple[redcount.Store, SimClock]) -> None:
    store, clock = sim
    lim = redcount.Limiter(store, "sliding-window", prefix="step")
    zkey = "step:sw:{client}:60000"
    start = clock.next_window(WINDOW * 1000)
    admitted = 0
    for i in range(200):  # 20× the limit over one window
        clock.to(start + i * 300)
        admitted += lim.hit(limit_text(10, WINDOW), "client").allowed
        card = store.execute("ZCARD", zkey)
        assert isinstance(card, int) and card <= 10
    assert admitted == 10
    assert store.execute("ZCARD", zkey) == 10


def test_exact_log_grows_with_the_limit_not_the_requests(sim: tuple[redcount.Store, SimClock]) -> None:
    store, clock = sim
    x10 = measure_limiter(store, clock, SLIDING, 100, 1_000, WINDOW, "a")
    x100 = measure_limiter(store, clock, SLIDING, 100, 10_000, WINDOW, "b")
    for r in (x10, x100):
        assert r.keys == 1 and r.admitted == 100 and r.entries == 100  # ZCARD == limit
    # Ten times the requests, the same key: within 10 % (member ids differ in length a little).
    assert abs(x100.bytes - x10.bytes) <= x10.bytes // 10, (x10, x100)
    small = measure_limiter(store, clock, SLIDING, 10, 100, WINDOW, "c")
    big = measure_limiter(store, clock, SLIDING, 1000, 2_000, WINDOW, "d")
    assert small.entries == 10 and big.entries == 1000
    assert small.bytes < x10.bytes < big.bytes  # O(limit)
    assert big.bytes > 5 * x10.bytes


def test_naive_log_grows_with_the_requests(sim: tuple[redcount.Store, SimClock]) -> None:
    store, clock = sim
    x10 = measure_naive(store, clock, 100, 1_000, WINDOW, "n1")
    x100 = measure_naive(store, clock, 100, 10_000, WINDOW, "n2")
    assert (x10.entries, x100.entries) == (1_000, 10_000)  # every request is stored
    assert x100.bytes > 5 * x10.bytes
    exact = measure_limiter(store, clock, SLIDING, 100, 10_000, WINDOW, "e")
    assert x100.bytes > 20 * exact.bytes


def test_constant_size_strategies(sim: tuple[redcount.Store, SimClock]) -> None:
    store, clock = sim
    for case in SMALL:
        rows = [
            measure_limiter(
                store, clock, case, limit, sent, WINDOW, f"{case.strategy}:{case.sub_buckets}:{n}"
            )
            for n, (limit, sent) in enumerate([(10, 100), (1000, 2_000), (50, 5_000)])
        ]
        for r in rows:
            assert r.keys == 1, r
            assert r.bytes <= 256, r
            # (a token bucket's hash holds tokens, ts and the capacity they were counted against)
            most = {"sliding-window-approx": case.sub_buckets + 1, "token-bucket": 3}.get(case.strategy, 2)
            assert r.entries <= most, r
        sizes = [r.bytes for r in rows]
        assert max(sizes) - min(sizes) <= 32, (case.label, sizes)  # O(1): not the limit, not the requests
        if case.strategy in ("fixed-window", "sliding-window-approx"):
            assert [r.admitted for r in rows] == [10, 1000, 50]


def test_measure_abuse_rows(sim: tuple[redcount.Store, SimClock]) -> None:
    store, clock = sim
    rows = measure_abuse(store, clock, "t", limits=(10, 50))
    assert [(r.strategy, r.limit) for r in rows] == [
        (name, limit) for limit in (10, 50) for name in [c.label for c in STRATEGIES] + [NAIVE]
    ]
    for r in rows:
        assert r.sent == 10 * r.limit and r.keys == 1 and r.bytes > 0
        if r.strategy == SLIDING.label:
            assert r.admitted == r.entries == r.limit
        if r.strategy in (TB.label, GCRA.label):  # a full bucket, then a window's refill
            assert r.limit < r.admitted < 2 * r.limit


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONWARNINGS="error")
    return subprocess.run(
        [sys.executable, "-m", "redcount", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def check_table(stdout: str, limits: list[int]) -> None:
    lines = stdout.splitlines()
    assert lines[0] == "| strategy | limit | requests sent | admitted | entries stored | bytes per key |"
    rows = [line for line in lines[2:] if line.startswith("| ")]
    assert len(rows) == 7 * len(limits)
    names = [c.label for c in STRATEGIES] + [NAIVE]
    assert [r.split(" | ")[0][2:] for r in rows] == names * len(limits)


def test_cli_abuse_on_an_existing_server(redis_server: RedisServer, tmp_path: Path) -> None:
    probe = redcount.connect(redis_server.url)
    probe.execute("FLUSHALL")
    probe.execute("SET", "someone-else", "1")
    out = tmp_path / "abuse.json"
    proc = run_cli("abuse", "--url", redis_server.url, "--limits", "10,20", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    check_table(proc.stdout, [10, 20])
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["private_server"] is False and data["window"] == 60 and data["factor"] == 10
    assert len(data["rows"]) == 14
    # Only the run's own keys were written, and they are gone; the rest is untouched.
    assert probe.execute("KEYS", "*") == [b"someone-else"]
    probe.close()


def test_cli_abuse_on_a_private_server() -> None:
    proc = run_cli("abuse", "--limits", "5")
    assert proc.returncode == 0, proc.stderr
    check_table(proc.stdout, [5])
    assert "Traceback" not in proc.stderr


def test_cli_abuse_bad_arguments() -> None:
    proc = run_cli("abuse", "--limits", "0")
    assert proc.returncode == 2 and "redcount abuse: error: --limits" in proc.stderr
    proc = run_cli("abuse", "--url", "memory://", "--limits", "5")
    assert proc.returncode == 2 and "redcount abuse: error:" in proc.stderr and "Redis" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_report_names_the_server_it_measured(redis_server: RedisServer, tmp_path: Path) -> None:
    # Valkey answers redis_version:7.2.4 (for clients' sake); the report names the server
    # as the binary itself does (`--version`): "Redis 7.0.15", "Valkey 9.1.2".
    expected = server_product(REDIS_SERVER)
    out = tmp_path / "abuse.json"
    proc = run_cli("abuse", "--url", redis_server.url, "--limits", "5", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    assert f"`MEMORY USAGE <key> SAMPLES 0` on {expected}." in proc.stdout, proc.stdout
    assert json.loads(out.read_text(encoding="utf-8"))["server_version"] == expected
    proc = run_cli("abuse", "--redis-server", REDIS_SERVER, "--limits", "5")  # a private server
    assert proc.returncode == 0, proc.stderr
    assert f"on {expected}." in proc.stdout, proc.stdout
