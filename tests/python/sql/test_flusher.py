"""The flusher: delta logs to SQL exactly once, on both stores and every SQL backend.

The crash tests: a flusher that dies before its commit (entries stay pending and are claimed),
after its commit and before XACK (entries redelivered and skipped), and a real process killed
with SIGKILL at random points while writers keep writing.
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
from conftest import RedisServer
from redcount.sql.snapshots import StreamId

SHARDS = 4


def counter(store: redcount.Store, name: str = "likes") -> redcount.ShardedCounter:
    return redcount.ShardedCounter(store, name, shards=SHARDS, log_maxlen=1_000_000)


def write(c: redcount.ShardedCounter, ids: range, prefix: str = "r") -> int:
    total = 0
    for i in ids:
        amount = (i % 7) - 2 or 5
        assert c.incr(amount, request_id=f"{prefix}{i}")
        total += amount
    return total


def check_exact(snaps: redcount.SnapshotStore, c: redcount.ShardedCounter, request_ids: set[str]) -> None:
    """SQL equals Redis shard by shard, and the audit log has every request id exactly once."""
    value, watermark = snaps.total(c.name)
    assert value == c.value()
    assert [s.value for s in snaps.shard_values(c.name)] == c.shard_values()
    seen = Counter(d.request_id for d in snaps.deltas(c.name))
    assert set(seen) == request_ids
    assert max(seen.values(), default=1) == 1
    assert sum(s.version for s in snaps.shard_values(c.name)) == len(request_ids)
    assert watermark == max(s.watermark for s in snaps.shard_values(c.name))


def test_drain_applies_every_delta_once(store: redcount.Store, sql_url: str) -> None:
    c = counter(store)
    total = write(c, range(300))
    with redcount.Flusher(store, sql_url, [c], batch=64) as f:
        assert f.lag.entries == 300
        assert f.lag.seconds >= 0
        assert f.drain() == 300
        assert f.stats.applied == 300 and f.stats.skipped == 0
        assert f.lag == redcount.Lag(0, 0.0)
        snaps = f.snapshots
        assert snaps.total("likes")[0] == total
        check_exact(snaps, c, {f"r{i}" for i in range(300)})
        # More writes, flushed incrementally on top of the watermark.
        write(c, range(300, 350))
        assert f.run_once() == 50
        check_exact(snaps, c, {f"r{i}" for i in range(350)})
        assert f.run_once() == 0
    # Entries are acknowledged: nothing is pending in the group.
    for shard in range(SHARDS):
        assert store.execute("XPENDING", c.key_of(shard, "log"), "redcount-flusher")[0] == 0


def test_a_crash_after_the_commit_redelivers_and_skips(store: redcount.Store, sql_url: str) -> None:
    c = counter(store)
    write(c, range(120))
    crashed = redcount.Flusher(store, sql_url, [c], consumer="crashed", batch=1000)

    def die(*_: object) -> None:
        raise SystemExit("killed between commit and XACK")

    crashed._ack = die  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        crashed.run_once()
    assert crashed.stats.applied == 120
    crashed.close()
    # The same consumer name restarting re-reads its own pending entries first.
    with redcount.Flusher(store, sql_url, [c], consumer="crashed") as again:
        assert again.drain() == 120
        assert again.stats.applied == 0 and again.stats.skipped == 120
        check_exact(again.snapshots, c, {f"r{i}" for i in range(120)})


def test_a_crash_before_the_commit_leaves_entries_for_another_flusher(store: redcount.Store, sql_url: str) -> None:
    c = counter(store)
    write(c, range(80))
    crashed = redcount.Flusher(store, sql_url, [c], consumer="crashed")

    def die(*_: object) -> None:
        raise SystemExit("killed inside the transaction")

    crashed._apply = die  # type: ignore[method-assign]
    with pytest.raises(SystemExit):
        crashed.run_once()
    crashed.close()
    pending = store.execute("XPENDING", c.key_of(0, "log"), "redcount-flusher")
    assert isinstance(pending, list) and pending[3] == [[b"crashed", str(pending[0]).encode()]]
    # Another consumer claims them once they have been idle long enough.
    with redcount.Flusher(store, sql_url, [c], consumer="rescuer", claim_after=0.2) as rescuer:
        deadline = time.monotonic() + 10
        while rescuer.stats.claimed < 80:
            assert time.monotonic() < deadline, "the pending entries were never claimed"
            rescuer.run_once()
            time.sleep(0.05)
        rescuer.drain()
        assert rescuer.stats.applied == 80 and rescuer.stats.skipped == 0
        check_exact(rescuer.snapshots, c, {f"r{i}" for i in range(80)})


def test_several_flushers_share_a_group(store: redcount.Store, sql_url: str) -> None:
    a, b = counter(store, "a"), counter(store, "b")
    stop = threading.Event()
    errors: list[BaseException] = []
    flushers = [
        redcount.Flusher(store, sql_url, [a, b], consumer=f"f{i}", batch=16, claim_after=0.5) for i in range(3)
    ]

    def flush(f: redcount.Flusher) -> None:
        try:
            f.run(stop, idle=0.01)
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)

    threads = [threading.Thread(target=flush, args=(f,)) for f in flushers]
    for t in threads:
        t.start()
    try:
        write(a, range(400), "a")
        write(b, range(300), "b")
    finally:
        # Let them catch up, then stop.
        deadline = time.monotonic() + 30
        while sum(f.stats.applied for f in flushers) < 700 and time.monotonic() < deadline and not errors:
            time.sleep(0.05)
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
    flushers[0].drain()
    assert sum(f.stats.applied for f in flushers) == 700
    assert sum(1 for f in flushers if f.stats.applied > 0) >= 2, "the work was not shared"
    check_exact(flushers[0].snapshots, a, {f"a{i}" for i in range(400)})
    check_exact(flushers[0].snapshots, b, {f"b{i}" for i in range(300)})
    for f in flushers:
        f.close()


def test_a_malformed_entry_is_skipped_counted_and_acknowledged(store: redcount.Store, sql_url: str) -> None:
    c = counter(store)
    write(c, range(10))
    log = c.key_of(1, "log")
    bad = [
        store.execute("XADD", log, "*", "counter", "likes", "shard", "1", "delta", "lots"),
        store.execute("XADD", log, "*", "nothing", "here"),
        store.execute("XADD", log, "*", "counter", "other", "shard", "1", "delta", "1"),
    ]
    write(c, range(10, 20))
    with redcount.Flusher(store, sql_url, [c]) as f:
        assert f.drain() == 23
        assert f.stats.malformed == 3
        assert f.stats.malformed_ids == [f"{log} {b.decode()}" for b in bad if isinstance(b, bytes)]
        check_exact(f.snapshots, c, {f"r{i}" for i in range(20)})
        assert store.execute("XPENDING", log, "redcount-flusher")[0] == 0


def test_entries_in_the_earlier_longer_layout_are_still_applied(store: redcount.Store, sql_url: str) -> None:
    # Earlier builds repeated the counter and shard of the log's key in every entry; a log
    # written by them (or by both, across an upgrade) flushes exactly like the current layout.
    c = counter(store)
    total = write(c, range(4)) + 5
    shard = c.shard_of("old-1")
    store.execute("INCRBY", c.key_of(shard), 5)
    store.execute("XADD", c.key_of(shard, "log"), "*", "counter", "likes", "shard", str(shard), "delta", "5",
                  "request_id", "old-1")
    total += write(c, range(4, 8))
    with redcount.Flusher(store, sql_url, [c]) as f:
        assert f.drain() == 9
        assert f.stats.malformed == 0
        assert c.value() == total
        check_exact(f.snapshots, c, {f"r{i}" for i in range(8)} | {"old-1"})


def test_adjustments_in_the_log_are_recorded_with_their_reason(store: redcount.Store, sql_url: str) -> None:
    c = counter(store)
    write(c, range(5))
    log = c.key_of(2, "log")
    store.execute("INCRBY", c.key_of(2), -3)
    store.execute("XADD", log, "*", "counter", "likes", "shard", "2", "delta", "-3", "request_id", "fix-1",
                  "reason", "reconcile")
    with redcount.Flusher(store, sql_url, [c]) as f:
        f.drain()
        assert f.snapshots.total("likes")[0] == c.value()
        adj = f.snapshots.adjustments("likes")
        assert [(a.delta, a.reason, a.request_id) for a in adj] == [(-3, "reconcile", "fix-1")]


def test_bad_arguments_are_refused(store: redcount.Store, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 's.db'}"
    with pytest.raises(redcount.InvalidInputError, match="at least one"):
        redcount.Flusher(store, url, [])
    with pytest.raises(redcount.InvalidInputError, match="batch"):
        redcount.Flusher(store, url, ["x"], batch=0)
    with pytest.raises(redcount.InvalidInputError, match="claim_after"):
        redcount.Flusher(store, url, ["x"], claim_after=-1)
    with pytest.raises(redcount.InvalidInputError, match="counter name"):
        redcount.Flusher(store, url, [""])
    with pytest.raises(redcount.RedcountError) as info:
        redcount.Flusher(store, "postgresql+psycopg://u:hunter2@127.0.0.1:1/x", ["x"])
    assert "hunter2" not in str(info.value)


# ---------------------------------------------------------------- SIGKILL, with real processes


FLUSH_CMD = [sys.executable, "-m", "redcount", "flush"]


def _writer(url: str, prefix: str, stop: threading.Event, written: dict[str, int]) -> None:
    store = redcount.connect(url)
    c = counter(store)
    i = 0
    try:
        while not stop.is_set():
            assert c.incr(1 + i % 3, request_id=f"{prefix}-{i}")
            i += 1
            if i % 50 == 0:
                time.sleep(0.001)  # leave the flusher some CPU on a 2-core machine
    finally:
        written[prefix] = i
        store.close()


def _sigkill_run(redis_server: RedisServer, sql: str, kills: int, budget: float) -> None:
    url = redis_server.url
    store = redcount.connect(url)
    store.execute("FLUSHALL")
    c = counter(store)
    stop = threading.Event()
    written: dict[str, int] = {}
    writers = [threading.Thread(target=_writer, args=(url, f"w{k}", stop, written)) for k in range(2)]
    for t in writers:
        t.start()
    rng = random.Random(1234)
    cmd = [*FLUSH_CMD, "--url", url, "--sql", sql, "--counter", "likes", "--shards", str(SHARDS), "--batch",
           "200", "--claim-after", "0"]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    try:
        started = time.monotonic()
        killed = 0
        while killed < kills:
            proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            assert proc.stderr is not None
            # Its set-up (imports, tables, groups) takes a while on a loaded machine: kill it
            # at a random point after it starts flushing, when it is inside its batches.
            ready = proc.stderr.readline()
            assert ready.startswith(b"flush: started"), ready + proc.stderr.read()
            time.sleep(rng.uniform(0.0, budget / kills / 2))
            if proc.poll() is not None:
                raise AssertionError(f"the flusher exited by itself: {proc.stderr.read().decode()[-2000:]}")
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc.stderr.close()
            killed += 1
        assert time.monotonic() - started < budget * 4, "the kill loop overran its budget"
    finally:
        stop.set()
        for t in writers:
            t.join()
    # The killed flushers made progress (the kills landed while they were working), and left
    # work behind; drain what they left.
    with redcount.SnapshotStore(sql) as snaps:
        assert snaps.total("likes")[1] > StreamId(0, 0), "no killed flusher ever committed a batch"
    done = subprocess.run([*cmd, "--once"], env=env, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr.decode()
    with redcount.SnapshotStore(sql) as snaps:
        ids = {f"{w}-{i}" for w, n in written.items() for i in range(n)}
        assert len(ids) == sum(written.values()) > 0
        check_exact(snaps, c, ids)
    store.close()


@pytest.mark.redis_only
@pytest.mark.slow
def test_sigkill_at_random_points_never_loses_or_doubles(redis_server: RedisServer, sql_url: str) -> None:
    """20 SIGKILLs of a real flusher process while two writers keep writing (about 10 s of
    flushing between the kills, plus the processes' start-up)."""
    _sigkill_run(redis_server, sql_url, kills=20, budget=20.0)


@pytest.mark.redis_only
@pytest.mark.soak
@pytest.mark.skipif(not os.environ.get("REDCOUNT_SOAK"), reason="set REDCOUNT_SOAK=1 for the long soak (200 kills)")
def test_sigkill_soak(redis_server: RedisServer, tmp_path: Path) -> None:
    _sigkill_run(redis_server, f"sqlite:///{tmp_path / 'soak.db'}", kills=200, budget=300.0)


def test_watermark_is_the_newest_applied_id(store: redcount.Store, tmp_path: Path) -> None:
    c = counter(store)
    write(c, range(40))
    with redcount.Flusher(store, f"sqlite:///{tmp_path / 'w.db'}", [c]) as f:
        f.drain()
        for s in f.snapshots.shard_values("likes"):
            # The newest id the log ever gave (the flusher has trimmed the applied entries).
            info = store.execute("XINFO", "STREAM", c.key_of(s.shard, "log"))
            assert isinstance(info, list)
            fields = dict(zip(info[::2], info[1::2]))
            assert s.watermark == StreamId.parse(fields[b"last-generated-id"])  # type: ignore[arg-type]


# ---------------------------------------------------------------- restore


def test_restore_after_flushall_from_the_snapshot_alone(store: redcount.Store, sql_url: str) -> None:
    c = counter(store)
    total = write(c, range(200))
    with redcount.Flusher(store, sql_url, [c]) as f:
        f.drain()
    store.execute("FLUSHALL")
    assert c.value() == 0
    rep = redcount.restore(store, sql_url, "likes")
    assert rep.lost_streams == list(range(SHARDS)) and rep.missing_since is not None
    assert rep.from_log == 0
    assert c.value() == total == rep.total
    # Writing and flushing go on from there.
    write(c, range(200, 220))
    with redcount.Flusher(store, sql_url, [c]) as f:
        f.drain()
        assert f.snapshots.total("likes")[0] == c.value()


def test_restore_adds_the_deltas_logged_after_the_snapshot(store: redcount.Store, sql_url: str) -> None:
    c = counter(store)
    write(c, range(100))
    with redcount.Flusher(store, sql_url, [c]) as f:
        f.drain()
    write(c, range(100, 160))  # logged, never flushed
    expected = c.shard_values()
    for shard in range(SHARDS):
        store.execute("DEL", c.key_of(shard))  # the values are lost, the logs survive
    rep = redcount.restore(store, sql_url, "likes")
    assert rep.lost_streams == [] and rep.missing_since is None
    assert rep.log_entries == 60
    assert c.shard_values() == expected


def test_restore_refuses_an_unknown_counter(store: redcount.Store, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    redcount.SnapshotStore(url).close()
    with pytest.raises(redcount.InvalidInputError, match="no snapshot of counter 'ghost'"):
        redcount.restore(store, url, "ghost")


@pytest.mark.redis_only
def test_the_command_line_flushes_and_restores(
    redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from redcount.tools.cli import main

    sql = f"sqlite:///{tmp_path / 'cli.db'}"
    store = redcount.connect(redis_server.url)
    store.execute("FLUSHALL")
    c = counter(store)
    total = write(c, range(50))
    args = ["--url", redis_server.url, "--sql", sql, "--counter", "likes", "--shards", str(SHARDS)]
    handler = signal.getsignal(signal.SIGTERM)
    assert main(["flush", *args, "--once"]) == 0
    assert "applied 50" in capsys.readouterr().err
    # Run in-process, the command leaves the caller's SIGTERM handler as it found it (a leftover
    # handler that only stops the flush loop would make SIGTERM, and Pool.terminate(), a no-op).
    assert signal.getsignal(signal.SIGTERM) is handler
    store.execute("FLUSHALL")
    assert main(["restore", "--url", redis_server.url, "--sql", sql, "--counter", "likes"]) == 0
    out = capsys.readouterr().out
    assert f"restore likes: {total} = snapshot {total} + 0" in out and "were lost" in out
    assert c.value() == total
    assert main(["flush", "--url", redis_server.url, "--sql", sql]) == 2
    assert "give at least one --counter" in capsys.readouterr().err
    assert main(["restore", "--url", redis_server.url, "--sql", "postgresql+psycopg://u:pw9@127.0.0.1:1/x",
                 "--counter", "likes"]) == 2
    err = capsys.readouterr().err
    assert "pw9" not in err and "error" in err
    store.close()


def test_run_retries_a_failed_round_and_loses_nothing(store: redcount.Store, tmp_path: Path) -> None:
    import sqlalchemy as sa

    c = counter(store)
    write(c, range(60))
    f = redcount.Flusher(store, f"sqlite:///{tmp_path / 'retry.db'}", [c], batch=1000)
    real_apply = f._apply
    failures = [2]

    def flaky(deltas: list[object]) -> None:
        if failures[0] > 0:
            failures[0] -= 1
            raise sa.exc.OperationalError("INSERT ...", {}, Exception("database is locked"))
        real_apply(deltas)  # type: ignore[arg-type]

    f._apply = flaky  # type: ignore[method-assign, assignment]
    stop = threading.Event()
    t = threading.Thread(target=f.run, args=(stop,), kwargs={"idle": 0.01})
    t.start()
    deadline = time.monotonic() + 20
    while f.stats.applied < 60 and time.monotonic() < deadline:
        time.sleep(0.02)
    stop.set()
    t.join()
    assert failures == [0]
    check_exact(f.snapshots, c, {f"r{i}" for i in range(60)})
    f.close()


PROGRESS_LINE = (
    r"^flush: so far (\d+) entries handled: applied (\d+), skipped (\d+) \(already applied\), "
    r"malformed (\d+), claimed (\d+)$"
)


def test_the_progress_line_says_what_each_number_is(store: redcount.Store, tmp_path: Path) -> None:
    import io
    import re

    c = counter(store)
    write(c, range(30))
    out = io.StringIO()
    with redcount.Flusher(store, f"sqlite:///{tmp_path / 'p.db'}", [c], progress=True, progress_stream=out) as f:
        assert f.drain() == 30
    lines = out.getvalue().splitlines()
    assert lines, "a progress line is printed at the first round"
    for line in lines:
        m = re.match(PROGRESS_LINE, line)
        assert m, line
        handled, applied, skipped, malformed, _ = (int(g) for g in m.groups())
        assert handled == applied + skipped + malformed and 0 < handled <= 30


@pytest.mark.redis_only
def test_the_command_line_s_progress_and_summary_use_the_same_words(
    redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import re

    from redcount.tools.cli import main

    store = redcount.connect(redis_server.url)
    store.execute("FLUSHALL")
    c = counter(store)
    write(c, range(40))
    sql = f"sqlite:///{tmp_path / 'cli.db'}"
    assert main(["flush", "--url", redis_server.url, "--sql", sql, "--counter", "likes",
                 "--shards", str(SHARDS), "--once"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert any(re.match(PROGRESS_LINE, line) for line in err), err
    assert "flush: done: 40 entries handled in all: applied 40, skipped 0 (already applied)" in err[-1], err
    store.close()


@pytest.mark.redis_only
@pytest.mark.parametrize("command", ["flush", "restore", "reconcile"])
def test_without_sqlalchemy_the_commands_print_one_line(redis_server: RedisServer, tmp_path: Path, command: str) -> None:
    # SQLAlchemy made unimportable in the child (a None entry in sys.modules makes `import`
    # raise ImportError, as when the package is not installed).
    argv = [command, "--url", redis_server.url, "--sql", f"sqlite:///{tmp_path / 'x.db'}", "--counter", "likes"]
    code = (
        "import sys\n"
        "sys.modules['sqlalchemy'] = None\n"
        "from redcount.tools.cli import main\n"
        f"sys.exit(main({argv!r}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                          stdin=subprocess.DEVNULL)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"redcount {command}: error: ") and "pip install 'redcount[sql]'" in lines[0]
