"""Snapshots of sharded counters in SQL: what the flusher wrote, read back.

```python
snaps = redcount.SnapshotStore("sqlite:///counters.db")   # or postgresql+psycopg://..., mysql+pymysql://...
value, watermark = snaps.total("likes:post:987")
snaps.shard_values("likes:post:987")      # [ShardSnapshot(shard=0, value=..., version=..., watermark=...), ...]
snaps.deltas("likes:post:987")            # the audit log: every applied delta, with its request id
```

The tables (created, and migrated, by [`SnapshotStore.create`][redcount.sql.snapshots.SnapshotStore.create], which the flusher calls):

- ``redcount_schema``: one row: the schema version.
- ``redcount_counters``: counter metadata: name, key prefix, shard count, created.
- ``redcount_shard_snapshots``: per (counter, shard): value, version (deltas applied so far)
  and watermark, the id of the newest stream entry applied (``<ms>-<seq>``, as ``wm_ms``,
  ``wm_seq``).
- ``redcount_totals``: per counter: the sum of its shard snapshots, the newest stream id in it,
  and the version.
- ``redcount_deltas``: the audit log: one row per applied stream entry (counter, shard, stream
  id, delta, request id, event time); unique per (counter, shard, stream id).
- ``redcount_adjustments``: audited corrections (a delta with a reason).
- ``redcount_reconcile_runs`` (schema 2): one row per reconciliation run and counter: time,
  total and absolute drift, relative drift, whether it passed, the corrections written, and the
  per-shard rows as JSON.

SQLAlchemy (2.x) is an optional dependency: ``pip install redcount[sql]`` (SQLite),
``redcount[postgres]`` (psycopg 3) or ``redcount[mysql]`` (PyMySQL). Thread-safe: the engine
pools connections and each call runs in its own transaction.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, NamedTuple

from ..errors import InvalidInputError, RedcountError
from ._shared import MAX_NAME, check_name, first_line

__all__ = [
    "SCHEMA_VERSION",
    "AppliedDelta",
    "Adjustment",
    "ShardSnapshot",
    "SnapshotStore",
    "StreamId",
    "Total",
    "redact_url",
]

SCHEMA_VERSION = 3
"""The schema this code writes; [`SnapshotStore.create`][redcount.sql.snapshots.SnapshotStore.create] migrates older ones up to it."""

class StreamId(NamedTuple):
    """A stream entry id ``<ms>-<seq>``; ordered as Redis orders them."""

    ms: int
    seq: int

    @classmethod
    def parse(cls, text: str | bytes) -> StreamId:
        if isinstance(text, bytes):
            text = text.decode()
        ms, sep, seq = text.partition("-")
        if not sep or not ms.isdigit() or not seq.isdigit():
            raise InvalidInputError(f"not a stream id: {text!r} (expected <ms>-<seq>)")
        return cls(int(ms), int(seq))

    def __str__(self) -> str:
        return f"{self.ms}-{self.seq}"


ZERO = StreamId(0, 0)


@dataclass(frozen=True)
class ShardSnapshot:
    """One shard's row of ``redcount_shard_snapshots``: its ``value``, its ``version`` (deltas
    applied so far), its ``watermark`` (the newest stream entry applied) and when it was last
    written (``updated_ms``, ms since the epoch)."""

    shard: int
    value: int
    version: int
    watermark: StreamId
    updated_ms: int


@dataclass(frozen=True)
class Total:
    """A counter's row of ``redcount_totals``: the sum of its shard snapshots (``value``), the
    newest stream id in it, its version and when it was last written (ms since the epoch)."""

    value: int
    watermark: StreamId
    version: int
    updated_ms: int


@dataclass(frozen=True)
class AppliedDelta:
    """One row of the audit log (``redcount_deltas``): a stream entry of ``shard`` applied to
    the snapshots, with its request id, when it happened and when it was applied (ms)."""

    shard: int
    stream_id: StreamId
    delta: int
    request_id: str | None
    event_ms: int
    applied_ms: int


@dataclass(frozen=True)
class Adjustment:
    """One audited correction (``redcount_adjustments``): a ``delta`` with its ``reason``, its
    request id and when it was written (ms since the epoch)."""

    delta: int
    reason: str
    request_id: str | None
    created_ms: int


def _sqlalchemy() -> Any:
    try:
        import sqlalchemy
    except ImportError as exc:  # pragma: no cover - exercised only without the extra
        raise ImportError(
            "redcount's SQL snapshots need SQLAlchemy 2: pip install 'redcount[sql]' "
            "(or redcount[postgres] / redcount[mysql] for those databases' drivers)"
        ) from exc
    return sqlalchemy


def redact_url(url: str) -> str:
    """``url`` with its password replaced by ``***``, for error messages and logs."""
    try:
        sa = _sqlalchemy()
        return str(sa.engine.make_url(url).render_as_string(hide_password=True))
    except Exception:  # noqa: BLE001 - an unparsable URL: show only its scheme
        return url.split("://", 1)[0] + "://***" if "://" in url else "***"


class _Tables:
    """The schema as SQLAlchemy Core objects (one MetaData per SnapshotStore)."""

    def __init__(self, sa: Any) -> None:
        md = sa.MetaData()
        name = sa.String(MAX_NAME)
        big = sa.BigInteger()
        self.metadata = md
        self.schema = sa.Table("redcount_schema", md, sa.Column("version", sa.Integer, primary_key=True))
        self.counters = sa.Table(
            "redcount_counters",
            md,
            sa.Column("name", name, primary_key=True),
            sa.Column("prefix", name, nullable=False),
            sa.Column("shards", sa.Integer, nullable=False),
            sa.Column("created_ms", big, nullable=False),
        )
        self.shards = sa.Table(
            "redcount_shard_snapshots",
            md,
            sa.Column("counter", name, primary_key=True),
            sa.Column("shard", sa.Integer, primary_key=True, autoincrement=False),
            sa.Column("value", big, nullable=False),
            sa.Column("version", big, nullable=False),
            sa.Column("wm_ms", big, nullable=False),
            sa.Column("wm_seq", big, nullable=False),
            sa.Column("updated_ms", big, nullable=False),
        )
        self.totals = sa.Table(
            "redcount_totals",
            md,
            sa.Column("counter", name, primary_key=True),
            sa.Column("value", big, nullable=False),
            sa.Column("version", big, nullable=False),
            sa.Column("wm_ms", big, nullable=False),
            sa.Column("wm_seq", big, nullable=False),
            sa.Column("updated_ms", big, nullable=False),
        )
        self.deltas = sa.Table(
            "redcount_deltas",
            md,
            sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
            sa.Column("counter", name, nullable=False),
            sa.Column("shard", sa.Integer, nullable=False),
            sa.Column("stream_ms", big, nullable=False),
            sa.Column("stream_seq", big, nullable=False),
            sa.Column("delta", big, nullable=False),
            sa.Column("request_id", name, nullable=True),
            sa.Column("event_ms", big, nullable=False),
            sa.Column("applied_ms", big, nullable=False),
            sa.UniqueConstraint("counter", "shard", "stream_ms", "stream_seq", name="uq_redcount_deltas_entry"),
            sa.Index("ix_redcount_deltas_request", "counter", "request_id"),
        )
        self.adjustments = sa.Table(
            "redcount_adjustments",
            md,
            sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
            sa.Column("counter", name, nullable=False, index=True),
            sa.Column("delta", big, nullable=False),
            sa.Column("reason", name, nullable=False),
            sa.Column("request_id", name, nullable=True),
            sa.Column("created_ms", big, nullable=False),
        )
        # Schema 2: the reconciliation runs.
        self.reconcile_runs = sa.Table(
            "redcount_reconcile_runs",
            md,
            sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
            sa.Column("counter", name, nullable=False, index=True),
            sa.Column("run_ms", big, nullable=False),
            sa.Column("drift", big, nullable=False),
            sa.Column("abs_drift", big, nullable=False),
            sa.Column("relative", sa.Float, nullable=False),
            sa.Column("ok", sa.Boolean, nullable=False),
            sa.Column("corrections", big, nullable=False),
            sa.Column("shards_json", sa.Text, nullable=False),
        )
        # Schema 3 (resharding): a counter's shard layout as its layout key
        # held it when the flusher last looked, so restore can write it back.
        self.layouts = sa.Table(
            "redcount_layouts",
            md,
            sa.Column("counter", name, primary_key=True),
            sa.Column("layout", sa.Text, nullable=False),
            sa.Column("version", sa.Integer, nullable=False),
            sa.Column("updated_ms", big, nullable=False),
        )


def _now_ms() -> int:
    return int(time.time() * 1000)


class SnapshotStore:
    """The SQL side of redcount's sharded counters: read what the flusher applied.

    ``sql_url`` is an SQLAlchemy URL: ``sqlite:///path.db`` (the default kind: a file, no
    server), ``postgresql+psycopg://user:pw@host/db`` or ``mysql+pymysql://user:pw@host/db``
    (MariaDB too). Tables are created on first use (``create=False`` to only read an existing
    schema). Thread-safe.
    """

    def __init__(self, sql_url: str, *, create: bool = True, echo: bool = False) -> None:
        sa = _sqlalchemy()
        self._sa = sa
        self.url = redact_url(sql_url)
        try:
            url = sa.engine.make_url(sql_url)
        except Exception as exc:
            raise InvalidInputError(f"not an SQL URL: {self.url} ({exc})") from None
        kwargs: dict[str, Any] = {"echo": echo, "future": True}
        if url.get_backend_name() == "sqlite":
            # One writer at a time, taken at BEGIN: a transaction reads the watermarks it
            # then advances under the write lock, so two flushers never both apply an entry.
            kwargs["connect_args"] = {"timeout": 60, "isolation_level": None}
        else:
            kwargs["pool_pre_ping"] = True
        try:
            self.engine: Any = sa.create_engine(url, **kwargs)
        except Exception as exc:
            raise InvalidInputError(f"cannot use SQL URL {self.url}: {exc}") from None
        self.dialect = url.get_backend_name()
        if self.dialect == "sqlite":

            def _begin_immediate(conn: Any) -> None:
                conn.exec_driver_sql("BEGIN IMMEDIATE")

            def _pragmas(dbapi_conn: Any, _record: Any) -> None:
                cur = dbapi_conn.cursor()
                # WAL: readers do not wait for the flusher. synchronous stays FULL, so that a
                # commit the flusher acknowledges to Redis survives a power loss too.
                cur.execute("PRAGMA journal_mode=WAL")
                cur.close()

            sa.event.listen(self.engine, "begin", _begin_immediate)
            sa.event.listen(self.engine, "connect", _pragmas)

        self.t = _Tables(sa)
        if create:
            self.create()
        else:
            try:
                found = self.schema_version()
            except sa.exc.SQLAlchemyError as exc:
                raise RedcountError(f"cannot open the SQL database at {self.url}: {first_line(exc)}") from None
            if found == 0:
                raise InvalidInputError(f"no redcount snapshots in the SQL database at {self.url}")

    # ---- schema -------------------------------------------------------------------------

    def create(self) -> int:
        """Create the tables that are missing and migrate the schema to
        [`SCHEMA_VERSION`][redcount.sql.snapshots.SCHEMA_VERSION]; returns the version found before (0 for a new database)."""
        sa = self._sa
        try:
            self.t.metadata.create_all(self.engine, checkfirst=True)
            with self.engine.begin() as conn:
                found = conn.execute(sa.select(sa.func.max(self.t.schema.c.version))).scalar()
                if found is None:
                    conn.execute(self.t.schema.insert().values(version=SCHEMA_VERSION))
                    return 0
                if found > SCHEMA_VERSION:
                    raise RedcountError(
                        f"the database at {self.url} has redcount schema {found}, newer than this "
                        f"redcount's {SCHEMA_VERSION}: upgrade redcount"
                    )
                # Migrations from older versions, one step per version. 1 -> 2 adds
                # redcount_reconcile_runs, 2 -> 3 redcount_layouts, which create_all above has
                # just created.
                if found < SCHEMA_VERSION:
                    conn.execute(self.t.schema.update().values(version=SCHEMA_VERSION))
                return int(found)
        except sa.exc.SQLAlchemyError as exc:
            raise RedcountError(f"cannot open the SQL database at {self.url}: {first_line(exc)}") from None

    def schema_version(self) -> int:
        sa = self._sa
        with self.engine.connect() as conn:
            return int(conn.execute(sa.select(sa.func.max(self.t.schema.c.version))).scalar() or 0)

    def ensure_counter(self, name: str, prefix: str, shards: int) -> None:
        """Register a counter and its zeroed shard rows (idempotent; safe to race)."""
        sa = self._sa
        check_name(name)
        now = _now_ms()
        with self.engine.begin() as conn:
            row = conn.execute(
                sa.select(self.t.counters.c.shards).where(self.t.counters.c.name == name)
            ).first()
            if row is not None and row[0] > shards:
                # A reshard only adds shard indices: fewer means the layout key was lost.
                raise InvalidInputError(
                    f"counter {name!r} has {row[0]} shards in {self.url}, more than the {shards} of its "
                    "layout in Redis: was the layout key lost? run `redcount restore` first"
                )
        try:
            with self.engine.begin() as conn:
                if row is None:
                    conn.execute(
                        self.t.counters.insert().values(name=name, prefix=prefix, shards=shards, created_ms=now)
                    )
                elif row[0] < shards:
                    # A reshard added a generation: its shards are registered below.
                    conn.execute(
                        self.t.counters.update().where(self.t.counters.c.name == name).values(shards=shards)
                    )
                have = {r[0] for r in conn.execute(sa.select(self.t.shards.c.shard).where(self.t.shards.c.counter == name))}
                missing = [
                    {"counter": name, "shard": i, "value": 0, "version": 0, "wm_ms": 0, "wm_seq": 0, "updated_ms": now}
                    for i in range(shards)
                    if i not in have
                ]
                if missing:
                    conn.execute(self.t.shards.insert(), missing)
                if conn.execute(sa.select(self.t.totals.c.counter).where(self.t.totals.c.counter == name)).first() is None:
                    conn.execute(
                        self.t.totals.insert().values(
                            counter=name, value=0, version=0, wm_ms=0, wm_seq=0, updated_ms=now
                        )
                    )
        except sa.exc.IntegrityError:
            pass  # another flusher registered it at the same moment

    def record_layout(self, name: str, layout: str, version: int) -> None:
        """Keep ``name``'s shard layout text (its layout key's value; '' = none) when it is
        newer than the one kept (safe to race: the highest version stays)."""
        sa = self._sa
        c = self.t.layouts.c
        try:
            with self.engine.begin() as conn:
                row = conn.execute(sa.select(c.version).where(c.counter == name)).first()
                if row is None:
                    conn.execute(
                        self.t.layouts.insert().values(
                            counter=name, layout=layout, version=version, updated_ms=_now_ms()
                        )
                    )
                elif int(row[0]) < version:
                    conn.execute(
                        self.t.layouts.update()
                        .where(c.counter == name, c.version < version)
                        .values(layout=layout, version=version, updated_ms=_now_ms())
                    )
        except sa.exc.IntegrityError:
            pass  # another flusher recorded it at the same moment

    def layout(self, name: str) -> str | None:
        """The shard layout text kept for ``name`` ('' = the first generation), or None."""
        sa = self._sa
        c = self.t.layouts.c
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(c.layout).where(c.counter == name)).first()
        return None if row is None else str(row[0])

    # ---- reads --------------------------------------------------------------------------

    def counters(self) -> list[str]:
        """Every counter registered here, by name."""
        sa = self._sa
        with self.engine.connect() as conn:
            return [r[0] for r in conn.execute(sa.select(self.t.counters.c.name).order_by(self.t.counters.c.name))]

    def total(self, name: str) -> tuple[int, StreamId]:
        """``(value, watermark)``: the counter's total snapshot and the newest stream id
        applied to it (``0-0`` before any). Unknown counters raise InvalidInputError."""
        t = self.total_snapshot(name)
        return t.value, t.watermark

    def total_snapshot(self, name: str) -> Total:
        sa = self._sa
        c = self.t.totals.c
        with self.engine.connect() as conn:
            row = conn.execute(
                sa.select(c.value, c.wm_ms, c.wm_seq, c.version, c.updated_ms).where(c.counter == name)
            ).first()
        if row is None:
            raise InvalidInputError(f"no snapshot of counter {name!r} in {self.url}")
        return Total(int(row[0]), StreamId(int(row[1]), int(row[2])), int(row[3]), int(row[4]))

    def shard_values(self, name: str) -> list[ShardSnapshot]:
        """Each shard's snapshot, in shard order."""
        sa = self._sa
        c = self.t.shards.c
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.select(c.shard, c.value, c.version, c.wm_ms, c.wm_seq, c.updated_ms)
                .where(c.counter == name)
                .order_by(c.shard)
            ).all()
        if not rows:
            raise InvalidInputError(f"no snapshot of counter {name!r} in {self.url}")
        return [ShardSnapshot(int(r[0]), int(r[1]), int(r[2]), StreamId(int(r[3]), int(r[4])), int(r[5])) for r in rows]

    def deltas(self, name: str, *, limit: int | None = None) -> list[AppliedDelta]:
        """The audit log of ``name``: every applied delta, in the order applied."""
        sa = self._sa
        c = self.t.deltas.c
        q = (
            sa.select(c.shard, c.stream_ms, c.stream_seq, c.delta, c.request_id, c.event_ms, c.applied_ms)
            .where(c.counter == name)
            .order_by(c.id)
        )
        if limit is not None:
            q = q.limit(limit)
        with self.engine.connect() as conn:
            return [
                AppliedDelta(int(r[0]), StreamId(int(r[1]), int(r[2])), int(r[3]), r[4], int(r[5]), int(r[6]))
                for r in conn.execute(q)
            ]

    def adjustments(self, name: str) -> list[Adjustment]:
        """Audited corrections of ``name``, oldest first."""
        sa = self._sa
        c = self.t.adjustments.c
        with self.engine.connect() as conn:
            return [
                Adjustment(int(r[0]), r[1], r[2], int(r[3]))
                for r in conn.execute(
                    sa.select(c.delta, c.reason, c.request_id, c.created_ms).where(c.counter == name).order_by(c.id)
                )
            ]

    def close(self) -> None:
        self.engine.dispose()

    def __enter__(self) -> SnapshotStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SnapshotStore({self.url!r})"
