"""SnapshotStore: the schema on SQLite files, a real PostgreSQL and a real MariaDB."""

from __future__ import annotations

from pathlib import Path

import pytest
import redcount
import sqlalchemy as sa
from redcount.sql.snapshots import SCHEMA_VERSION, StreamId, redact_url


def test_create_is_idempotent_and_records_the_schema_version(sql_url: str) -> None:
    snaps = redcount.SnapshotStore(sql_url)
    try:
        assert snaps.schema_version() == SCHEMA_VERSION
        assert snaps.create() == SCHEMA_VERSION  # found the current version: nothing to migrate
        insp = sa.inspect(snaps.engine)
        tables = set(insp.get_table_names())
        assert {
            "redcount_schema",
            "redcount_counters",
            "redcount_shard_snapshots",
            "redcount_totals",
            "redcount_deltas",
            "redcount_adjustments",
        } <= tables
        uniques = insp.get_unique_constraints("redcount_deltas")
        assert any(u["column_names"] == ["counter", "shard", "stream_ms", "stream_seq"] for u in uniques)
    finally:
        snaps.close()


def test_a_registered_counter_starts_at_zero_and_unknown_ones_are_refused(sql_url: str) -> None:
    with redcount.SnapshotStore(sql_url) as snaps:
        snaps.ensure_counter("likes:post:1", "redcount", 4)
        snaps.ensure_counter("likes:post:1", "redcount", 4)  # again: nothing changes
        assert snaps.total("likes:post:1") == (0, StreamId(0, 0))
        shards = snaps.shard_values("likes:post:1")
        assert [s.shard for s in shards] == [0, 1, 2, 3]
        assert all(s.value == 0 and s.version == 0 and s.watermark == StreamId(0, 0) for s in shards)
        assert snaps.counters() == ["likes:post:1"]
        assert snaps.adjustments("likes:post:1") == []
        assert snaps.deltas("likes:post:1") == []
        with pytest.raises(redcount.InvalidInputError, match="no snapshot of counter 'nope'"):
            snaps.total("nope")
        with pytest.raises(redcount.InvalidInputError, match="no snapshot"):
            snaps.shard_values("nope")
        with pytest.raises(redcount.InvalidInputError, match="4 shards .* more than the 2 of its layout"):
            snaps.ensure_counter("likes:post:1", "redcount", 2)
        snaps.ensure_counter("likes:post:1", "redcount", 8)  # a reshard added shards 4..7
        assert [s.shard for s in snaps.shard_values("likes:post:1")] == list(range(8))
        with pytest.raises(redcount.InvalidInputError, match="counter name"):
            snaps.ensure_counter("", "redcount", 4)


def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'new.db'}"
    with redcount.SnapshotStore(url) as snaps:
        with snaps.engine.begin() as conn:
            conn.execute(snaps.t.schema.insert().values(version=SCHEMA_VERSION + 1))
    with pytest.raises(redcount.RedcountError, match="newer than this redcount"):
        redcount.SnapshotStore(url)


def test_stream_ids_parse_and_order() -> None:
    assert StreamId.parse("1700000000000-3") == StreamId(1700000000000, 3)
    assert StreamId.parse(b"5-0") < StreamId.parse("5-1") < StreamId.parse("6-0")
    assert str(StreamId(7, 2)) == "7-2"
    for bad in ("", "5", "a-1", "5-", "-5", "5-x"):
        with pytest.raises(redcount.InvalidInputError, match="not a stream id"):
            StreamId.parse(bad)


def test_bad_urls_are_named_without_their_password() -> None:
    with pytest.raises(redcount.InvalidInputError, match="not an SQL URL"):
        redcount.SnapshotStore("definitely not a url")
    # Nothing listens on port 1: an unreachable server, reported with the password hidden.
    with pytest.raises(redcount.RedcountError) as info:
        redcount.SnapshotStore("postgresql+psycopg://user:s3cret-pw@127.0.0.1:1/db")
    assert "s3cret-pw" not in str(info.value)
    assert "user:***@127.0.0.1:1/db" in str(info.value)
    assert redact_url("mysql+pymysql://u:pw@h/db") == "mysql+pymysql://u:***@h/db"
