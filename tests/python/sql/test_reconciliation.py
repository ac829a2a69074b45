"""Reconciliation and adjustment: injected drift is found exactly, on the right
shard, and repair closes it; adjust() goes through the delta log into the adjustments table."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import redcount
import redcount.aio
from conftest import RedisServer
from redcount.sql import reconciliation as rec
from redcount.sql.reconciliation import runs

SHARDS = 4


def counter(store: redcount.Store, name: str = "likes") -> redcount.ShardedCounter:
    return redcount.ShardedCounter(store, name, shards=SHARDS, log_maxlen=1_000_000)


def write(c: redcount.ShardedCounter, n: int, prefix: str = "r") -> int:
    total = 0
    for i in range(n):
        amount = (i % 5) + 1
        assert c.incr(amount, request_id=f"{prefix}{i}")
        total += amount
    return total


def flushed(store: redcount.Store, sql: str, c: redcount.ShardedCounter) -> None:
    with redcount.Flusher(store, sql, [c]) as f:
        f.drain()


def drifts(rep: redcount.Report) -> dict[int, tuple[int, int]]:
    return {r.shard: (r.drift, r.audit_drift) for r in rep.rows if r.drift or r.audit_drift}


def test_no_drift_when_everything_agrees(store: redcount.Store, sql_url: str) -> None:
    c = counter(store)
    total = write(c, 40)
    flushed(store, sql_url, c)
    write(c, 10, prefix="later")  # logged, not flushed: counted as unflushed, not as drift
    rep = redcount.reconcile(store, sql_url, "likes")
    assert rep.ok and rep.drift == 0 and rep.abs_drift == 0 and rep.relative == 0.0
    assert rep.live == c.value() == rep.expected == rep.audited
    assert sum(r.snapshot for r in rep.rows) == total
    assert sum(r.unflushed_entries for r in rep.rows) == 10
    assert len(rep.rows) == SHARDS and not rep.repaired and rep.corrections == 0


def test_a_foreign_incrby_is_found_on_its_shard_and_repaired(store: redcount.Store, sql_url: str) -> None:
    c = counter(store)
    total = write(c, 40)
    flushed(store, sql_url, c)
    store.execute("INCRBY", c.key_of(2), 7)  # a write that bypassed the delta log
    rep = redcount.reconcile(store, sql_url, "likes")
    assert drifts(rep) == {2: (7, 0)}
    assert rep.drift == 7 and rep.abs_drift == 7 and rep.relative == pytest.approx(7 / total)
    assert not rep.ok  # 7 of ~120 is far above 0.1 %
    assert redcount.reconcile(store, sql_url, "likes", threshold=0.5).ok
    fixed = redcount.reconcile(store, sql_url, "likes", repair=True)
    assert fixed.repaired and fixed.corrections == 7
    assert [(r.shard, r.correction) for r in fixed.rows if r.correction] == [(2, -7)]
    assert c.value() == total
    after = redcount.reconcile(store, sql_url, "likes")
    assert after.ok and after.abs_drift == 0
    with redcount.SnapshotStore(sql_url) as snaps:
        adj = snaps.adjustments("likes")
        assert [(a.delta, a.reason, a.request_id) for a in adj] == [(-7, "reconcile", "reconcile:live:2")]
        assert snaps.total("likes")[0] == total  # the audited snapshot was the truth: unchanged
    recorded = runs(sql_url, "likes")
    assert [(r.abs_drift, r.ok, r.corrections) for r in recorded] == [(7, False, 0), (7, True, 0), (7, False, 7), (0, True, 0)]
    assert recorded[2].shards[0] == {"shard": 2, "drift": 7, "audit_drift": 0, "correction": -7, "audit_correction": 0}


def test_a_stream_entry_deleted_before_the_flush_is_found(store: redcount.Store, sql_url: str) -> None:
    c = counter(store)
    write(c, 20)
    flushed(store, sql_url, c)
    assert c.incr(9, request_id="doomed")
    shard = c.shard_of("doomed")
    entries = store.execute("XRANGE", c.key_of(shard, "log"), "-", "+")
    assert isinstance(entries, list)
    last = entries[-1]
    assert isinstance(last, list)
    assert store.execute("XDEL", c.key_of(shard, "log"), last[0]) == 1
    rep = redcount.reconcile(store, sql_url, "likes")
    assert drifts(rep) == {shard: (9, 0)}
    redcount.reconcile(store, sql_url, "likes", repair=True)
    assert redcount.reconcile(store, sql_url, "likes").abs_drift == 0
    flushed(store, sql_url, c)
    assert redcount.reconcile(store, sql_url, "likes").abs_drift == 0


def test_a_lost_sql_audit_row_is_found_and_repaired(store: redcount.Store, sql_url: str) -> None:
    c = counter(store)
    write(c, 30)
    flushed(store, sql_url, c)
    with redcount.SnapshotStore(sql_url) as snaps:
        victim = snaps.deltas("likes")[5]
        t = snaps.t.deltas
        with snaps.engine.begin() as conn:
            conn.execute(
                t.delete().where(
                    t.c.counter == "likes", t.c.shard == victim.shard,
                    t.c.stream_ms == victim.stream_id.ms, t.c.stream_seq == victim.stream_id.seq,
                )
            )
    rep = redcount.reconcile(store, sql_url, "likes")
    assert drifts(rep) == {victim.shard: (0, victim.delta)}
    assert rep.audit_drift == victim.delta and not rep.ok
    fixed = redcount.reconcile(store, sql_url, "likes", repair=True)
    assert [(r.shard, r.audit_correction) for r in fixed.rows if r.audit_correction] == [(victim.shard, victim.delta)]
    assert redcount.reconcile(store, sql_url, "likes").abs_drift == 0
    # The flusher goes on as before: the synthetic audit row is below every real stream id.
    write(c, 5, prefix="more")
    flushed(store, sql_url, c)
    assert redcount.reconcile(store, sql_url, "likes").abs_drift == 0


def test_adjust_goes_through_the_log_into_the_adjustments_table(store: redcount.Store, sql_url: str) -> None:
    c = counter(store)
    total = write(c, 10)
    assert c.adjust(-4, "refund order 77", request_id="adj-77")
    assert not c.adjust(-4, "refund order 77", request_id="adj-77")  # a retry is not applied twice
    assert c.adjust(2, "goodwill")
    assert c.value() == total - 2
    flushed(store, sql_url, c)
    with redcount.SnapshotStore(sql_url) as snaps:
        assert snaps.total("likes")[0] == total - 2
        adj = snaps.adjustments("likes")
        assert sorted((a.delta, a.reason, a.request_id) for a in adj) == [
            (-4, "refund order 77", "adj-77"),
            (2, "goodwill", None),
        ]
    assert redcount.reconcile(store, sql_url, "likes").abs_drift == 0


def test_adjust_async(store: redcount.Store, tmp_path: Path) -> None:
    sql = f"sqlite:///{tmp_path / 'a.db'}"
    c = counter(store)

    async def go() -> bool:
        return await redcount.aio.ShardedCounter.from_sync(c).adjust(5, "async fix")

    assert asyncio.run(go())
    assert c.value() == 5
    flushed(store, sql, c)
    with redcount.SnapshotStore(sql) as snaps:
        assert [(a.delta, a.reason) for a in snaps.adjustments("likes")] == [(5, "async fix")]


@pytest.mark.parametrize(
    ("delta", "reason", "match"),
    [
        (0, "x", "non-zero int"),
        (1.5, "x", "non-zero int"),
        (True, "x", "non-zero int"),
        ("3", "x", "non-zero int"),
        (3, "", "non-empty string"),
        (3, "   ", "non-empty string"),
        (3, None, "non-empty string"),
        (3, "é" * 200, "at most 255 bytes"),
        (2**60, "x", "2\\*\\*53"),
    ],
)
def test_adjust_refuses_bad_input_and_writes_nothing(store: redcount.Store, delta: object, reason: object, match: str) -> None:
    c = counter(store)
    with pytest.raises(redcount.InvalidInputError, match=match):
        c.adjust(delta, reason)  # type: ignore[arg-type]
    assert c.value() == 0
    assert all(store.execute("XLEN", c.key_of(i, "log")) == 0 for i in range(SHARDS))


def test_reconcile_refuses_bad_input(store: redcount.Store, tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'r.db'}"
    redcount.SnapshotStore(url).close()
    with pytest.raises(redcount.InvalidInputError, match="no snapshot of counter 'ghost'"):
        redcount.reconcile(store, url, "ghost")
    with pytest.raises(redcount.InvalidInputError, match="threshold"):
        redcount.reconcile(store, url, "ghost", threshold=-1)


def test_schema_1_is_migrated_to_2(tmp_path: Path) -> None:
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'old.db'}"
    redcount.SnapshotStore(url).close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # what a schema-1 database looks like
        conn.exec_driver_sql("DROP TABLE redcount_reconcile_runs")
        conn.exec_driver_sql("UPDATE redcount_schema SET version = 1")
    engine.dispose()
    with redcount.SnapshotStore(url) as snaps:
        assert snaps.schema_version() == 3  # and on to 3 (redcount_layouts)
        assert runs(snaps, "x") == []


@pytest.mark.redis_only
def test_the_command_line_reconciles_and_repairs(
    redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from redcount.tools.cli import main

    sql = f"sqlite:///{tmp_path / 'cli.db'}"
    store = redcount.connect(redis_server.url)
    store.execute("FLUSHALL")
    c = counter(store)
    write(c, 30)
    flushed(store, sql, c)
    args = ["reconcile", "--url", redis_server.url, "--sql", sql]
    assert main(args) == 0
    assert "OK:" in capsys.readouterr().out
    store.execute("INCRBY", c.key_of(1), -11)
    assert main([*args, "--counter", "likes"]) == 1
    out = capsys.readouterr().out
    assert "DRIFT:" in out and " -11 " in out
    assert main([*args, "--repair"]) == 1  # the run that repairs reports what it found
    assert main(args) == 0
    assert main([*args, "--every", "0"]) == 2
    assert "--every" in capsys.readouterr().err
    recorded = runs(sql, "likes")
    assert [json.dumps(r.shards) != "[]" for r in recorded] == [False, True, True, False]
    store.close()


def test_repair_leaves_a_shard_whose_drift_moves_between_measurements(
    store: redcount.Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sql = f"sqlite:///{tmp_path / 'm.db'}"
    c = counter(store)
    write(c, 10)
    flushed(store, sql, c)
    store.execute("INCRBY", c.key_of(1), 7)
    real = rec._measure
    calls = []

    def measure_then_write(*args: object) -> object:
        rows = real(*args)
        calls.append(1)
        if len(calls) == 1:
            store.execute("INCRBY", c.key_of(1), 1)  # a foreign write between the two reads
        return rows

    monkeypatch.setattr(rec, "_measure", measure_then_write)
    rep = redcount.reconcile(store, sql, "likes", repair=True)
    row = rep.rows[1]
    assert row.drift == 7 and not row.stable and row.correction == 0 and rep.corrections == 0
    assert "moving: not repaired" in rep.table()
    monkeypatch.setattr(rec, "_measure", real)
    assert drifts(redcount.reconcile(store, sql, "likes")) == {1: (8, 0)}
    redcount.reconcile(store, sql, "likes", repair=True)
    assert redcount.reconcile(store, sql, "likes").abs_drift == 0


def _fix_column(table: str) -> dict[str, str]:
    """The ``fix`` column of each row of a reconcile table, by its first column."""
    rows = {}
    for line in table.splitlines()[2:-1]:
        cells = line.split()
        rows[cells[0]] = cells[6] if len(cells) > 6 else ""
    return rows


def test_shard_rows_and_the_total_row_give_corrections_with_one_sign(store: redcount.Store, sql_url: str) -> None:
    c = counter(store)
    total = write(c, 40)
    flushed(store, sql_url, c)
    store.execute("INCRBY", c.key_of(2), 7)
    store.execute("INCRBY", c.key_of(1), -3)
    fixed = redcount.reconcile(store, sql_url, "likes", repair=True)
    assert {r.shard: r.correction for r in fixed.rows if r.correction} == {1: 3, 2: -7}
    assert fixed.corrections == 10  # the size of what was written, unsigned
    fixes = _fix_column(fixed.table())
    assert (fixes["1"], fixes["2"]) == ("3", "-7")
    assert fixes["total"] == "-4"  # the signed sum, as in the drift column (7 - 3 = 4)
    assert c.value() == total


@pytest.mark.redis_only
def test_the_command_line_and_the_recorded_runs_give_relative_drift_alike(
    redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import re

    from redcount.tools.cli import main

    sql = f"sqlite:///{tmp_path / 'cli.db'}"
    store = redcount.connect(redis_server.url)
    store.execute("FLUSHALL")
    c = counter(store)
    total = write(c, 30)
    flushed(store, sql, c)
    store.execute("INCRBY", c.key_of(0), 4)
    assert main(["reconcile", "--url", redis_server.url, "--sql", sql]) == 1
    out = capsys.readouterr().out
    m = re.search(r"relative ([0-9.e-]+) \(([0-9.e-]+) %\), threshold ([0-9.e-]+) \(([0-9.e-]+) %\)", out)
    assert m, out
    recorded = runs(sql, "likes")[-1]
    assert recorded.relative == pytest.approx(4 / total)
    assert float(m.group(1)) == pytest.approx(recorded.relative, rel=1e-5)  # both fractions
    assert float(m.group(2)) == pytest.approx(recorded.relative * 100, rel=1e-5)  # and its percentage
    assert (float(m.group(3)), float(m.group(4))) == (0.001, 0.1)
    store.close()


@pytest.mark.redis_only
def test_the_threshold_is_a_fraction_or_a_percentage(
    redis_server: RedisServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from redcount.tools.cli import main

    sql = f"sqlite:///{tmp_path / 'cli.db'}"
    store = redcount.connect(redis_server.url)
    store.execute("FLUSHALL")
    c = counter(store)
    total = write(c, 100)  # 300
    flushed(store, sql, c)
    store.execute("INCRBY", c.key_of(0), 6)  # 2 % of 300
    assert total == 300
    args = ["reconcile", "--url", redis_server.url, "--sql", sql, "--threshold"]
    assert main([*args, "0.1%"]) == 1
    assert "threshold 0.001 (0.1 %)" in capsys.readouterr().out
    assert main([*args, "2.5%"]) == 0
    assert main([*args, "2.5 %"]) == 0
    assert main([*args, "0.025"]) == 0
    assert main([*args, "1%"]) == 1
    for bad in ("abc%", "-1%", "nan", "%"):
        with pytest.raises(SystemExit) as e:
            main([*args, bad])
        assert e.value.code == 2
        assert "--threshold" in capsys.readouterr().err
    store.close()
