"""The operations commands (flush, restore, reconcile, reshard) act on counters that live on a
Redis server: they have no default store. Without ``--url`` or ``REDCOUNT_URL`` they refuse
to run; memory:// (a new, empty store in the command's own process) is used only when named,
and a repair never writes SQL corrections for it. Run as real subprocesses."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redcount
from conftest import RedisServer
from redcount.sql.reconciliation import runs

pytestmark = pytest.mark.redis_only

SHARDS = 4


def cli(*args: str, url_env: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "REDCOUNT_URL"}
    if url_env is not None:
        env["REDCOUNT_URL"] = url_env
    return subprocess.run([sys.executable, "-m", "redcount", *args], capture_output=True, text=True, timeout=120,
                          check=False, env=env, stdin=subprocess.DEVNULL)


@pytest.fixture
def flushed_counter(redis_server: RedisServer, tmp_path: Path) -> Iterator[tuple[redcount.ShardedCounter, str]]:
    """Counter ``likes`` (4 shards) on the session server, written and flushed to SQLite."""
    store = redcount.connect(redis_server.url)
    store.execute("FLUSHALL")
    c = redcount.ShardedCounter(store, "likes", shards=SHARDS, log_maxlen=1_000_000)
    for i in range(20):
        assert c.incr(i + 1, request_id=f"r{i}")
    sql = f"sqlite:///{tmp_path / 'ops.db'}"
    with redcount.Flusher(store, sql, [c]) as f:
        f.drain()
    try:
        yield c, sql
    finally:
        store.close()


def _sql_rows(sql: str) -> tuple[int, int]:
    """(adjustments, recorded reconcile runs) of ``likes``."""
    with redcount.SnapshotStore(sql) as snaps:
        return len(snaps.adjustments("likes")), len(runs(snaps, "likes"))


def _refused(proc: subprocess.CompletedProcess[str], command: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert f"redcount {command}: error: --url is required (or set REDCOUNT_URL)" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


def test_reconcile_without_a_url_refuses_and_writes_nothing_to_sql(
    flushed_counter: tuple[redcount.ShardedCounter, str],
) -> None:
    c, sql = flushed_counter
    proc = cli("reconcile", "--sql", sql, "--counter", "likes", "--repair")
    _refused(proc, "reconcile")
    assert proc.stdout == ""
    assert _sql_rows(sql) == (0, 0)  # no bogus corrections, no recorded run
    assert c.value() == 210


def test_restore_without_a_url_refuses(flushed_counter: tuple[redcount.ShardedCounter, str]) -> None:
    c, sql = flushed_counter
    c.store.execute("DEL", *[c.key_of(s) for s in range(SHARDS)])  # the values were lost
    proc = cli("restore", "--sql", sql, "--counter", "likes")
    _refused(proc, "restore")
    assert c.value() == 0  # and nothing claims they were restored
    assert "restore likes:" not in proc.stdout


def test_reshard_without_a_url_refuses(flushed_counter: tuple[redcount.ShardedCounter, str]) -> None:
    c, _ = flushed_counter
    proc = cli("reshard", "--counter", "likes", "--shards", "8", "--initial-shards", str(SHARDS))
    _refused(proc, "reshard")
    assert c.layout().current.count == SHARDS


def test_flush_without_a_url_refuses(flushed_counter: tuple[redcount.ShardedCounter, str]) -> None:
    _, sql = flushed_counter
    _refused(cli("flush", "--sql", sql, "--counter", "likes", "--once"), "flush")


def test_redcount_url_in_the_environment_is_used(
    redis_server: RedisServer, flushed_counter: tuple[redcount.ShardedCounter, str]
) -> None:
    c, sql = flushed_counter
    c.store.execute("DEL", *[c.key_of(s) for s in range(SHARDS)])
    proc = cli("restore", "--sql", sql, "--counter", "likes", url_env=redis_server.url)
    assert proc.returncode == 0, proc.stderr
    assert "restore likes: 210 = snapshot 210" in proc.stdout
    assert c.value() == 210
    proc = cli("reconcile", "--sql", sql, url_env=redis_server.url)
    assert proc.returncode == 0 and "OK:" in proc.stdout, proc.stderr


def test_memory_is_used_only_when_named_and_never_repaired_into_sql(
    flushed_counter: tuple[redcount.ShardedCounter, str],
) -> None:
    c, sql = flushed_counter
    proc = cli("reconcile", "--url", "memory://", "--sql", sql, "--counter", "likes", "--repair")
    assert proc.returncode == 2, proc.stderr
    assert "reconcile --repair refuses memory://" in proc.stderr
    proc = cli("reconcile", "--sql", sql, "--counter", "likes", "--repair", url_env="memory://")
    assert proc.returncode == 2 and "refuses memory://" in proc.stderr, proc.stderr
    assert _sql_rows(sql) == (0, 0)
    # Named, without a repair, it runs, and says what memory:// is here.
    proc = cli("reshard", "--url", "memory://", "--counter", "likes", "--shards", "8", "--initial-shards", "4")
    assert proc.returncode == 0, proc.stderr
    assert "memory:// is this process's own in-process store" in proc.stderr
    assert c.layout().current.count == SHARDS  # the Redis counter is another one
