"""The delta logs never drop an entry the flusher still needs, and what the memory guard does
drop is counted exactly.

The flusher trims each log after its commits, only up to the oldest entry some consumer group
still needs (pending with a live or crashed consumer, or not yet delivered); the writers'
``MAXLEN ~ log_maxlen`` is only a memory guard (default 1,000,000 per shard). When a tiny guard
trims entries before any flusher applied them, ``FlusherStats.trimmed``, the metric and
reconcile all report exactly the entries lost. And a flusher SIGKILLed again and again while
writers write at full speed loses nothing with the default guard, on every SQL backend.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import redcount
from conftest import RedisServer, server_product

GROUP = "redcount-flusher"


def amount_of(i: int) -> int:
    return (i % 7) - 2 or 5


def write(c: redcount.ShardedCounter, ids: range, prefix: str = "r") -> dict[str, int]:
    """Writes with request ids; returns {request id: amount}."""
    out = {}
    for i in ids:
        assert c.incr(amount_of(i), request_id=f"{prefix}{i}")
        out[f"{prefix}{i}"] = amount_of(i)
    return out


def log_ids(store: redcount.Store, key: str) -> list[str]:
    return [e[0].decode() for e in store.execute("XRANGE", key, "-", "+")]


def test_the_flusher_trims_only_entries_every_group_acknowledged(store: redcount.Store, tmp_path: Path) -> None:
    sql = f"sqlite:///{tmp_path / 'trim.db'}"
    c = redcount.ShardedCounter(store, "trimmed", shards=2)
    assert c._core.log_maxlen == 1_000_000
    keys = [c.key_of(i, "log") for i in range(2)]
    written = write(c, range(200))
    with redcount.Flusher(store, sql, [c], batch=64, claim_after=3600) as f:
        assert f.drain() == 200
        # Everything applied and acknowledged: the logs are trimmed (Redis's MINID ~ keeps a
        # partly applied node of at most 100 entries; memory:// trims exactly).
        left = [store.execute("XLEN", k) for k in keys]
        assert all(n <= 100 for n in left), left
        if store.url.startswith("memory"):
            assert left == [0, 0]
        # A consumer of the group that read entries and died: its pending entries stay in the
        # log until they are applied, and so does everything after them.
        written.update(write(c, range(200, 260)))
        dead = store.execute("XREADGROUP", "GROUP", GROUP, "dead", "COUNT", 5, "STREAMS", keys[0], ">")
        held = [e[0].decode() for e in dead[0][1]]
        written.update(write(c, range(260, 400)))
        f.drain()
        assert f.stats.trimmed == 0
        present = log_ids(store, keys[0])
        assert set(held) <= set(present)
        if store.url.startswith("memory"):
            assert present[0] == held[0]  # trimmed up to the oldest pending entry, exactly
        # Claimed and applied: then they go too.
        f.claim_after = 0
        f.drain()
        assert store.execute("XPENDING", keys[0], GROUP)[0] == 0
        if store.url.startswith("memory"):
            assert held[0] not in log_ids(store, keys[0])
        # Another group on the same logs (another deployment's snapshots) that has read
        # nothing: nothing it has not read is trimmed.
        last = {}
        for k in keys:
            store.execute("XGROUP", "CREATE", k, "other", "$")
            tail = store.execute("XREVRANGE", k, "+", "-", "COUNT", 1)
            last[k] = tail[0][0].decode() if tail else "0-0"
        written.update(write(c, range(400, 500)))
        f.drain()
        assert sum(len(store.execute("XRANGE", k, f"({last[k]}", "+")) for k in keys) == 100
        assert f.stats.trimmed == 0
        snaps = f.snapshots
        assert snaps.total(c.name)[0] == c.value() == sum(written.values())
        seen = Counter(d.request_id for d in snaps.deltas(c.name))
        assert set(seen) == set(written) and max(seen.values()) == 1


def test_retain_keeps_applied_entries_for_windowed_reads(store: redcount.Store, tmp_path: Path) -> None:
    sql = f"sqlite:///{tmp_path / 'retain.db'}"
    c = redcount.ShardedCounter(store, "kept", shards=2)
    write(c, range(50))
    with redcount.Flusher(store, sql, [c], retain=3600) as f:
        assert f.drain() == 50
    assert sum(store.execute("XLEN", c.key_of(i, "log")) for i in range(2)) == 50
    with pytest.raises(redcount.InvalidInputError, match="retain"):
        redcount.Flusher(store, sql, [c], retain=-1)


def test_the_guard_counts_what_it_trims_before_the_flusher_applied_it(store: redcount.Store, tmp_path: Path) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    sql = f"sqlite:///{tmp_path / 'guard.db'}"
    registry = prometheus_client.CollectorRegistry()
    redcount.metrics.register(registry)
    metric_before = redcount.metrics().trimmed_entries
    c = redcount.ShardedCounter(store, "guarded", shards=2, log_maxlen=10)
    keys = [c.key_of(i, "log") for i in range(2)]
    written: dict[str, int] = {}

    def lost_now(snaps: redcount.SnapshotStore) -> dict[str, int]:
        applied = {d.request_id for d in snaps.deltas(c.name)}
        return {r: a for r, a in written.items() if r not in applied}

    # 1. Written before any flusher existed: the guard trimmed most of it already.
    written.update(write(c, range(300)))
    with redcount.Flusher(store, sql, [c], batch=50) as f:
        f.drain()
        lost1 = lost_now(f.snapshots)
        assert len(lost1) > 0
        assert f.stats.trimmed == len(lost1)
        # 2. A running flusher with a backlog below the guard loses nothing and counts nothing.
        written.update(write(c, range(300, 305)))
        f.drain()
        assert f.stats.trimmed == len(lost1) and lost_now(f.snapshots) == lost1
    # 3. The flusher stopped: a consumer of the group had read entries and died (pending, then
    # trimmed by the guard), and far more was written than the guard keeps.
    store.execute("XREADGROUP", "GROUP", GROUP, "dead", "COUNT", 5, "STREAMS", keys[0], ">")
    written.update(write(c, range(305, 800)))
    with redcount.Flusher(store, sql, [c], batch=50, claim_after=0) as f2:  # a restart
        f2.drain()
        lost2 = lost_now(f2.snapshots)
        assert len(lost2) > len(lost1)
        assert f2.stats.trimmed == len(lost2) - len(lost1), (f2.stats, len(lost1), len(lost2))
        # 4. Again, with the same flusher: the second gap is counted from an exact position.
        written.update(write(c, range(800, 1200)))
        f2.drain()
        lost3 = lost_now(f2.snapshots)
        assert f2.stats.trimmed == len(lost3) - len(lost1)
        snaps = f2.snapshots
        # Exactly the lost increments are missing from SQL.
        assert snaps.total(c.name)[0] + sum(lost3.values()) == c.value() == sum(written.values())
    total_lost = len(lost3)
    assert redcount.metrics().trimmed_entries - metric_before == total_lost
    assert registry.get_sample_value("redcount_flusher_trimmed_entries_total") == redcount.metrics().trimmed_entries
    report = redcount.reconcile(store, sql, c.name)
    assert report.drift == sum(lost3.values()) and not report.ok


def test_a_log_with_an_xdel_tombstone_is_not_counted_but_said_so(
    store: redcount.Store, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sql = f"sqlite:///{tmp_path / 'xdel.db'}"
    c = redcount.ShardedCounter(store, "xdel", shards=1, log_maxlen=10)
    key = c.key_of(0, "log")
    with redcount.Flusher(store, sql, [c], batch=50) as f:
        write(c, range(3))
        f.drain()
        write(c, range(3, 400))
        store.execute("XDEL", key, log_ids(store, key)[-1])
        with caplog.at_level("WARNING", logger="redcount.flusher"):
            f.drain()
        assert f.stats.trimmed == 0
        assert "cannot count entries trimmed" in caplog.text


# ---------------------------------------------------------------- SIGKILL with the default guard

SHARDS = 8
KILLS = 8


def _writer(url: str, prefix: str, stop: threading.Event, written: dict[str, int]) -> None:
    store = redcount.connect(url)
    c = redcount.ShardedCounter(store, "kills", shards=SHARDS)  # the default guard
    i = 0
    try:
        while not stop.is_set():
            assert c.incr(1 + i % 3, request_id=f"{prefix}-{i}")
            i += 1
    finally:
        written[prefix] = i
        store.close()


@pytest.mark.redis_only
def test_eight_sigkills_of_the_flusher_lose_nothing_with_the_default_guard(
    redis_server: RedisServer, sql_url: str
) -> None:
    """Writers at full speed, the flusher SIGKILLed 8 times within a few seconds, then one
    ``redcount flush --once --claim-after 0``: SQL equals Redis and the audit log holds every
    request id once. (With the old 1,000-entry MAXLEN, tens of thousands of increments were
    trimmed before they were flushed.)"""
    url = redis_server.url
    store = redcount.connect(url)
    store.execute("FLUSHALL")
    c = redcount.ShardedCounter(store, "kills", shards=SHARDS)
    stop = threading.Event()
    written: dict[str, int] = {}
    writers = [threading.Thread(target=_writer, args=(url, f"w{k}", stop, written)) for k in range(2)]
    cmd = [sys.executable, "-m", "redcount", "flush", "--url", url, "--sql", sql_url, "--counter", "kills",
           "--shards", str(SHARDS), "--batch", "500", "--claim-after", "0"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    rng = random.Random(8)
    for t in writers:
        t.start()
    try:
        for _ in range(KILLS):
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            assert proc.stderr is not None
            ready = proc.stderr.readline()
            assert ready.startswith(b"flush: started"), ready + proc.stderr.read()
            time.sleep(rng.uniform(0.05, 0.4))
            assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc.stderr.close()
    finally:
        stop.set()
        for t in writers:
            t.join()
    done = subprocess.run([*cmd, "--once"], env=env, capture_output=True, timeout=120)
    assert done.returncode == 0, done.stderr.decode()
    summary = done.stderr.decode().strip().splitlines()[-1]
    ids = {f"{w}-{i}" for w, n in written.items() for i in range(n)}
    with redcount.SnapshotStore(sql_url) as snaps:
        value = snaps.total("kills")[0]
        seen = Counter(d.request_id for d in snaps.deltas("kills"))
    live = c.value()
    missing = len(ids - set(seen))
    assert value == live, f"SQL {value} != Redis {live}: {live - value} short, {missing} of {len(ids)} writes lost; {summary}"
    assert set(seen) == ids and max(seen.values()) == 1
    assert " trimmed 0;" in summary, summary
    store.close()


# ---------------------------------------------------------------- memory:// answers as Redis does


def _info(reply: object) -> object:
    """An XINFO reply without the fields that describe Redis's internal nodes."""
    if isinstance(reply, list) and reply and isinstance(reply[0], list):
        return [_info(r) for r in reply]
    if isinstance(reply, list):
        pairs = dict(zip(reply[::2], reply[1::2]))
        pairs.pop(b"radix-tree-keys", None)
        pairs.pop(b"radix-tree-nodes", None)
        return pairs
    return reply


def _without_group_counters(reply: object, exact: bool) -> None:
    """Take entries-read and lag out of every consumer group in ``reply`` (as _info leaves
    it); with ``exact``, check first that entries-read is the position of last-delivered-id
    among the entries ever added (or unknown, nil)."""
    if isinstance(reply, dict) and b"entries-read" in reply:
        read = reply.pop(b"entries-read")
        reply.pop(b"lag")
        if exact:
            position = int(bytes(reply[b"last-delivered-id"]).split(b"-")[0])
            assert read is None or read == position, reply
    elif isinstance(reply, list):
        for r in reply:
            _without_group_counters(r, exact)


@pytest.mark.redis_only
def test_the_memory_store_answers_the_flusher_s_stream_commands_as_redis(redis_store: redcount.Store) -> None:
    # Compared with Redis 7, whose arithmetic for a group's read counter the memory store
    # keeps (t_stream.c): one more per entry delivered while the counter is known, not counting
    # entries a MAXLEN trimmed unread. Valkey 9 counts those too, so its entries-read (and lag)
    # are exact: the position of last-delivered-id among every entry ever added. On Valkey,
    # XINFO GROUPS is compared without entries-read and lag, and Valkey's entries-read is
    # checked to be that exact position (entry i-1 below is the i-th ever added).
    exact_server = server_product().startswith("Valkey")
    memory = redcount.connect()
    script: list[object] = [
        ("XGROUP", "CREATE", "s", "g", "0", "MKSTREAM", "ENTRIESREAD", "0"),
        ("XGROUP", "CREATE", "s", "late", "$"),
        *[("XADD", "s", "MAXLEN", "5", f"{i}-1", "delta", "1") for i in range(1, 9)],
        ("XINFO", "STREAM", "s"),
        ("XINFO", "GROUPS", "s"),
        [("MULTI",), ("XINFO", "GROUPS", "s"), ("XREADGROUP", "GROUP", "g", "c", "COUNT", "2", "STREAMS", "s", ">"),
         ("EXEC",)],
        ("XINFO", "GROUPS", "s"),
        ("XGROUP", "SETID", "s", "g", "5-1", "ENTRIESREAD", "5"),
        ("XINFO", "GROUPS", "s"),
        ("XPENDING", "s", "g"),
        ("XTRIM", "s", "MINID", "5-1"),
        ("XTRIM", "s", "MINID", "=", "6-1"),
        ("XTRIM", "s", "MAXLEN", "2"),
        ("XINFO", "STREAM", "s"),
        ("XDEL", "s", "8-1"),
        ("XINFO", "STREAM", "s"),
        ("XINFO", "GROUPS", "s"),
        [("MULTI",), ("SET", "k", "1"), ("DISCARD",), ("GET", "k")],
        ("XGROUP", "SETID", "s", "g", "$"),
        ("XINFO", "GROUPS", "s"),
    ]
    try:
        for step in script:
            batch = step if isinstance(step, list) else [step]
            got = [[_info(r) for r in st.execute_many(batch)] for st in (memory, redis_store)]  # type: ignore[arg-type]
            if exact_server:
                _without_group_counters(got[0], exact=False)
                _without_group_counters(got[1], exact=True)
            assert got[0] == got[1], step
    finally:
        memory.close()
