"""Restore after data loss: rebuild a sharded counter's Redis shards from SQL.

```python
report = redcount.restore(store, "sqlite:///counters.db", "likes:post:987")
report.values        # the value written to each shard
report.from_log      # deltas taken from the streams (logged after the snapshot)
report.missing_since # None, or the time (ms) after which deltas may be missing
```

Each shard's value becomes its SQL snapshot plus every delta still in its stream that the
snapshot does not have (after the watermark, or at or below it and absent from the audit log).
When a shard's stream is gone too (FLUSHALL), the snapshot alone is written and the report says
from when deltas may be missing: everything after the shard's watermark that was not flushed.

Run it with the counter's writers stopped: a write between the read of a stream and the SET of
its shard would be overwritten. Request-id keys are not restored: a client retrying, after the
loss, a write it had sent before it may be counted again.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._core import Store
from ..errors import InvalidInputError
from ..sharded import ShardedCounter
from .snapshots import SnapshotStore, StreamId

__all__ = ["RestoreReport", "restore"]


@dataclass(frozen=True)
class RestoreReport:
    """What [`restore`][redcount.sql.restoration.restore] wrote: the value of each shard, how much came from the
    SQL snapshot and how much from the stream entries on top of it, and what may be missing
    (shards whose stream was gone; deltas after ``missing_since`` ms). ``total`` is their sum."""

    name: str
    values: list[int]  # per shard, as written
    from_snapshot: int  # the snapshot total
    from_log: int  # deltas applied from the streams on top of it
    log_entries: int
    lost_streams: list[int]  # shards whose stream was gone
    missing_since: int | None  # ms: deltas after this may be missing (None: nothing may be)

    @property
    def total(self) -> int:
        return sum(self.values)


def restore(store: Store, sql_url: str | SnapshotStore, name: str) -> RestoreReport:
    """Rebuild ``name``'s shards in ``store`` from the SQL snapshot plus the streams."""
    snaps = sql_url if isinstance(sql_url, SnapshotStore) else SnapshotStore(sql_url, create=False)
    try:
        if name not in snaps.counters():
            raise InvalidInputError(f"no snapshot of counter {name!r} in {snaps.url}: nothing to restore from")
        sa = snaps._sa
        cc = snaps.t.counters.c
        with snaps.engine.connect() as conn:
            prefix, shards = conn.execute(sa.select(cc.prefix, cc.shards).where(cc.name == name)).one()
        counter = ShardedCounter(store, name, shards=int(shards), prefix=str(prefix))
        # A resharded counter's generations first (the flusher kept its layout in SQL): without
        # its layout key, readers and writers would see only the first generation's shards.
        kept = _kept_layout(snaps, name)
        if kept:
            store.execute("SET", counter.layout_key, kept, "NX")
        total = counter.layout().total
        if total > int(shards):
            snaps.ensure_counter(name, str(prefix), total)  # shards no flusher registered yet
        rows = snaps.shard_values(name)
        values: list[int] = []
        from_log = 0
        log_entries = 0
        lost: list[int] = []
        missing_since: int | None = None
        dc = snaps.t.deltas.c
        for row in rows:
            key = counter.key_of(row.shard, "log")
            entries = store.execute("XRANGE", key, "-", "+")
            assert isinstance(entries, list)
            value = row.value
            if not entries:
                if store.execute("EXISTS", key) == 0:
                    lost.append(row.shard)
                    ms = row.watermark.ms
                    missing_since = ms if missing_since is None else min(missing_since, ms)
            else:
                parsed: list[tuple[StreamId, int]] = []
                for e in entries:
                    assert isinstance(e, list) and isinstance(e[1], list)
                    sid = StreamId.parse(e[0])  # type: ignore[arg-type]
                    f = e[1]
                    kv = {
                        (k.decode() if isinstance(k, bytes) else str(k)): v for k, v in zip(f[::2], f[1::2])
                    }
                    try:
                        raw = kv["delta"]
                        parsed.append((sid, int(raw.decode() if isinstance(raw, bytes) else str(raw))))
                    except (KeyError, ValueError):
                        continue  # not a delta: the flusher skips it too
                old = [sid for sid, _ in parsed if sid <= row.watermark]
                applied: set[StreamId] = set()
                if old:
                    with snaps.engine.connect() as conn:
                        applied = {
                            StreamId(int(r[0]), int(r[1]))
                            for r in conn.execute(
                                sa.select(dc.stream_ms, dc.stream_seq).where(
                                    dc.counter == name, dc.shard == row.shard, dc.stream_ms >= min(old).ms
                                )
                            )
                        }
                for sid, delta in parsed:
                    if sid > row.watermark or sid not in applied:
                        value += delta
                        from_log += delta
                        log_entries += 1
            store.execute("SET", counter.key_of(row.shard), value)
            values.append(value)
        return RestoreReport(
            name=name,
            values=values,
            from_snapshot=sum(r.value for r in rows),
            from_log=from_log,
            log_entries=log_entries,
            lost_streams=lost,
            missing_since=missing_since,
        )
    finally:
        if not isinstance(sql_url, SnapshotStore):
            snaps.close()


def _kept_layout(snaps: SnapshotStore, name: str) -> str | None:
    try:
        return snaps.layout(name)
    except snaps._sa.exc.SQLAlchemyError:
        return None  # a schema older than 3 (no layouts table): never resharded through a flusher
