"""The flusher: sharded counters' delta logs applied to SQL snapshots exactly once.

```python
store = redcount.connect("redis://localhost:6379/0")
likes = redcount.ShardedCounter(store, "likes:post:987", shards=16)
with redcount.Flusher(store, "sqlite:///counters.db", counters=[likes]) as flusher:
    flusher.drain()                  # apply everything logged so far, then return
    flusher.lag                      # Lag(entries=0, seconds=0.0)
redcount.SnapshotStore("sqlite:///counters.db").total("likes:post:987")
```

or ``redcount flush --url redis://... --sql sqlite:///counters.db --counter likes:post:987``.

Why exactly once. Every shard's stream is read through one consumer group. A batch of entries is
applied in ONE SQL transaction that also records each entry in the audit log (unique per
counter, shard and stream id) and advances each shard's watermark (the newest stream id
applied); entries are acknowledged (XACK) only after that commit. An entry above its shard's
watermark cannot have been applied and is applied at once; an entry at or below it
(a redelivery after a crash, or one that another flusher sharing the group overtook) is applied
only if the audit log does not have it. So a crash before the commit applies nothing and the
entries stay pending (read again, or claimed by another flusher after ``claim_after``); a crash
after the commit and before XACK redelivers entries that the check skips. The watermark and audit
rows are read under a lock on the counter's total row (``SELECT ... FOR UPDATE``; on SQLite the
database write lock), so flushers sharing the work never both apply one entry.

Why the logs never drop an entry the flusher still needs. The writers' ``MAXLEN ~ log_maxlen``
is only a memory guard (default 1,000,000 entries per shard, far above a flusher's working
set); the flusher trims each log it committed from itself, after the XACK, with
``XTRIM <log> MINID ~ <id>`` where ``<id>`` is, over every consumer group of the log, the oldest
entry still pending (delivered, not acknowledged: its consumer may have crashed and the entry
waits for XAUTOCLAIM) or else the one after the group's last-delivered id (entries after it
are undelivered). So only entries every group has acknowledged are trimmed. The group's
state is read first (XINFO GROUPS, then XPENDING): an entry acknowledged by then stays so, and
one delivered afterwards lies after the last-delivered id read first, so the trim point can
only be too low (trimming less), never too high.

How a guard trim is counted, exactly. If the flusher stops for long enough, the guard does
trim entries the group has not read. Each log's stream counts every entry ever added
(``entries-added``, Redis 7), and the group keeps ``entries-read``, the position in that count
of its last-delivered entry; the flusher creates its groups with ``ENTRIESREAD 0``. Every
read of new entries is one transaction (MULTI ... EXEC; a memory:// batch is atomic) of
XINFO STREAM, XINFO GROUPS and the XREADGROUP: when the stream's first entry lies after the
group's last-delivered id, the entries between them were trimmed unread, and there are exactly
``entries-added - length - entries-read`` of them (the log's entries are contiguous in that
count, since redcount never XDELs them: a log with an XDEL tombstone is not counted, and
said so). The flusher that makes the read counts them (``FlusherStats.trimmed``, the
``redcount_flusher_trimmed_entries_total`` metric, one warning) and then sets the group's
``entries-read`` to the position of the last entry it read (XGROUP SETID ... ENTRIESREAD), which
Redis 7.0 does not do by itself across a trimmed gap, so the next gap is measured from an exact
count again. Pending entries trimmed before they were applied (XAUTOCLAIM reports them
deleted, a history read returns them without fields) are counted the same way. Reconcile sees
the lost increments as drift (Redis has them, SQL never will).
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO, Union

from .._core import Store
from ..errors import InvalidInputError, RedcountError, ReplyError
from ..sharded import ShardedCounter, layout_text
from ..telemetry import note_trimmed, track_flusher, untrack_flusher
from ._shared import MAX_NAME, as_text, check_name, first_line
from .snapshots import SnapshotStore, StreamId

__all__ = ["Flusher", "FlusherStats", "Lag"]

log = logging.getLogger("redcount.flusher")

CounterSpec = Union[ShardedCounter, str]


@dataclass(frozen=True)
class Lag:
    """How far the snapshots are behind the delta logs: stream entries not yet applied
    (after each shard's watermark) and the age in seconds of the oldest of them."""

    entries: int
    seconds: float


@dataclass
class FlusherStats:
    """Counts since the flusher started (not thread-safe to mutate; read freely)."""

    applied: int = 0  # deltas applied to SQL
    skipped: int = 0  # redelivered entries already applied (at or below the watermark, in the audit log)
    malformed: int = 0  # entries that are not a delta: skipped, acknowledged, logged
    claimed: int = 0  # entries claimed from crashed consumers
    trimmed: int = 0  # entries trimmed from a log before they were applied (lost to the snapshot)
    batches: int = 0
    malformed_ids: list[str] = field(default_factory=list)  # the first 100 of them


@dataclass
class _Shard:
    counter: str
    shard: int
    key: str


@dataclass
class _Delta:
    shard: _Shard
    sid: StreamId
    delta: int
    request_id: str | None
    reason: str | None


class Flusher:
    """Applies sharded counters' delta logs to SQL snapshots, exactly once.

    Args:
        store: the Redis (or ``memory://``) store the counters write to.
        sql_url: an SQLAlchemy URL (see [`redcount.SnapshotStore`][redcount.sql.snapshots.SnapshotStore]), or a SnapshotStore.
        counters: the counters to flush: [`ShardedCounter`][redcount.sharded.ShardedCounter] objects, or names (then
            ``prefix`` and ``shards`` say where their logs are).
        group: the consumer group's name; flushers with the same group share the work.
        consumer: this flusher's name in the group (default: host, pid and a random part).
        batch: entries read per stream and round (default 1000).
        claim_after: seconds an entry may stay pending with another consumer before this one
            claims it (XAUTOCLAIM); a consumer that crashed leaves its entries pending.
        progress: True for a progress bar (tqdm, when installed) or plain lines, on
            ``progress_stream`` (stderr); False (default) for none.
        retain: seconds of applied entries to keep in the logs for windowed reads of them
            (``ShardedCounter.skew``, [`redcount.analysis.log_writes`][redcount.analysis.log_writes]); default 0: each
            log is trimmed to its unapplied entries after every commit.

    Not thread-safe: one thread runs a Flusher (several flushers may run at once, in threads or
    processes, with the same group).
    """

    def __init__(
        self,
        store: Store,
        sql_url: str | SnapshotStore,
        counters: Iterable[CounterSpec],
        *,
        group: str = "redcount-flusher",
        consumer: str | None = None,
        batch: int = 1000,
        claim_after: float = 30.0,
        prefix: str = "redcount",
        shards: int = 16,
        progress: bool = False,
        progress_stream: TextIO | None = None,
        retain: float = 0.0,
    ) -> None:
        if batch < 1 or batch > 100_000:
            raise InvalidInputError(f"batch must be 1..100000 entries, got {batch}")
        if claim_after < 0:
            raise InvalidInputError(f"claim_after must be >= 0 seconds, got {claim_after}")
        if not 0 <= retain <= 366 * 86400:
            raise InvalidInputError(f"retain must be 0..31622400 seconds, got {retain}")
        if not group:
            raise InvalidInputError("group must not be empty")
        self.store = store
        self.snapshots = sql_url if isinstance(sql_url, SnapshotStore) else SnapshotStore(sql_url)
        self._own_snapshots = not isinstance(sql_url, SnapshotStore)
        self.group = group
        self.consumer = consumer or f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.batch = batch
        self.claim_after = claim_after
        self.retain = retain
        self.stats = FlusherStats()
        self._untracked: set[str] = set()  # logs whose trimmed entries cannot be counted (warned once)
        self._shards: dict[str, _Shard] = {}
        self._counters: dict[str, tuple[str, int]] = {}
        self._objects: dict[str, ShardedCounter] = {}
        specs = list(counters)
        if not specs:
            raise InvalidInputError("counters: give at least one ShardedCounter or counter name")
        for spec in specs:
            if isinstance(spec, ShardedCounter):
                c = spec
            else:
                check_name(spec)
                c = ShardedCounter(store, spec, shards=shards, prefix=prefix)
            if len(c.name) > MAX_NAME:
                raise InvalidInputError(f"counter name longer than {MAX_NAME} characters: {c.name[:40]!r}...")
            self._objects[c.name] = c
        self._keys: list[str] = []
        # Every generation's shards (reshard adds generations): from the layout keys, read
        # again at most every second while running, so new shards join without a restart.
        self._last_layouts = 0.0
        self._refresh_layouts()
        self._history = True  # first read our own pending entries (a restart under the same name)
        self._last_claim = 0.0
        self._progress = progress
        self._progress_stream = progress_stream or sys.stderr
        self._bar: Any = None
        self._audit_sql: tuple[str, list[str] | None] | None = None
        self._last_line = 0.0
        track_flusher(self)  # its lag() in redcount.metrics()

    # ---- Redis side -----------------------------------------------------------------------

    def _refresh_layouts(self) -> None:
        """Learn the counters' shard generations; register and start reading new shards."""
        self._last_layouts = time.monotonic()
        objs = list(self._objects.values())
        texts = self.store.execute_many([("GET", c.layout_key) for c in objs])
        added: list[str] = []
        for c, raw in zip(objs, texts):
            have = self._counters.get(c.name, (c.prefix, 0))[1]
            text = as_text(raw) if raw is not None else ""
            layout = c.layout() if text else c.cached_layout
            if layout.total <= have:
                continue
            self.snapshots.ensure_counter(c.name, c.prefix, layout.total)
            self.snapshots.record_layout(c.name, layout_text(layout), layout.version)
            for i in range(have, layout.total):
                key = c.key_of(i, "log")
                self._shards[key] = _Shard(c.name, i, key)
                added.append(key)
            self._counters[c.name] = (c.prefix, layout.total)
        if added:
            self._create_groups(added)
            self._keys.extend(added)

    def _create_groups(self, keys: list[str]) -> None:
        for key in keys:
            try:
                # From the stream's start: entries logged before the first flusher ran count too.
                # ENTRIESREAD 0: the group's read position is known from the start, so entries
                # trimmed before it read them are counted (see the module's doc).
                self.store.execute("XGROUP", "CREATE", key, self.group, "0", "MKSTREAM", "ENTRIESREAD", "0")
            except ReplyError as e:
                if str(e).startswith("BUSYGROUP"):
                    continue
                if "syntax" not in str(e).lower():
                    raise
                # A server before Redis 7.0 (no ENTRIESREAD): trimmed entries are not counted there.
                try:
                    self.store.execute("XGROUP", "CREATE", key, self.group, "0", "MKSTREAM")
                except ReplyError as e2:
                    if not str(e2).startswith("BUSYGROUP"):
                        raise

    def _read(self) -> list[tuple[_Shard, str, Any]]:
        """Every shard's log read by its own XREADGROUP: our pending history first (entries
        this consumer name was given before a restart), then new entries."""
        if self._history:
            out = self._read_ids("0")
            if out:
                return out
            self._history = False
        return self._read_new()

    def _xreadgroup(self, key: str, ids: str) -> tuple[str | bytes | int | float, ...]:
        return ("XREADGROUP", "GROUP", self.group, self.consumer, "COUNT", self.batch, "STREAMS", key, ids)

    def _read_ids(self, ids: str) -> list[tuple[_Shard, str, Any]]:
        # One XREADGROUP per stream, all in one execute_many (one round trip per node): the
        # streams of different shards hash to different slots, so one XREADGROUP naming them
        # all would be refused by a cluster. COUNT applies per stream either way.
        replies = self.store.execute_many([self._xreadgroup(key, ids) for key in self._keys]) if self._keys else []
        out: list[tuple[_Shard, str, Any]] = []
        for reply in replies:
            self._entries_of(reply, out)
        return out

    def _entries_of(self, reply: Any, out: list[tuple[_Shard, str, Any]]) -> list[Any]:
        """The entries of one XREADGROUP reply, appended to ``out``; returns them."""
        got: list[Any] = []
        if not isinstance(reply, list):
            return got
        for stream in reply:
            assert isinstance(stream, list)
            shard = self._shards[as_text(stream[0])]
            entries = stream[1]
            if not isinstance(entries, list):
                continue
            for entry in entries:
                assert isinstance(entry, list)
                out.append((shard, as_text(entry[0]), entry[1]))
                got.append(entry)
        return got

    def _read_new(self) -> list[tuple[_Shard, str, Any]]:
        """New entries of every log, each read in one transaction with the stream's and the
        groups' counters, so that entries trimmed before this group read them are counted
        exactly (see the module's doc)."""
        if not self._keys:
            return []
        cmds: list[tuple[str | bytes | int | float, ...]] = []
        for key in self._keys:
            cmds += [("MULTI",), ("XINFO", "STREAM", key), ("XINFO", "GROUPS", key), self._xreadgroup(key, ">"), ("EXEC",)]
        try:
            replies = self.store.execute_many(cmds)
        except ReplyError:
            # A log that vanished (FLUSHALL, a deleted key) fails its transaction: read as
            # before the transactions, without counting, and let the next round see.
            return self._read_ids(">")
        out: list[tuple[_Shard, str, Any]] = []
        fixes: list[tuple[str | bytes | int | float, ...]] = []
        for i, key in enumerate(self._keys):
            result = replies[5 * i + 4]
            if not isinstance(result, list) or len(result) != 3:
                continue
            info, groups, read = result
            got = self._entries_of(read, out)
            if got:
                fix = self._count_unread_trim(key, info, groups, got)
                if fix is not None:
                    fixes.append(fix)
        if fixes:
            self.store.execute_many(fixes)
        return out

    def _count_unread_trim(self, key: str, info: Any, groups: Any, got: list[Any]) -> tuple[Any, ...] | None:
        """Count the entries trimmed between the group's last-delivered id and the stream's
        first entry before this read crossed them; return the XGROUP SETID that puts the
        group's read counter back on the exact position of the last entry read (or None)."""
        stream = _fields(info)
        mine = next((g for g in (_fields(x) for x in groups or []) if as_text(g.get("name")) == self.group), None)
        first = stream.get("first-entry")
        if mine is None or not isinstance(first, list) or not first:
            return None
        last_delivered = StreamId.parse(as_text(mine["last-delivered-id"]))
        first_id = StreamId.parse(as_text(first[0]))
        if first_id <= last_delivered:
            return None  # the log still holds entries up to the group's position: no gap
        read = mine.get("entries-read")
        if read is None and last_delivered == StreamId(0, 0):
            read = 0  # a group that never read (created without ENTRIESREAD by an earlier build)
        deleted = StreamId.parse(as_text(stream.get("max-deleted-entry-id") or "0-0"))
        why = None
        if "entries-added" not in stream:
            why = "the server has no entries-added counter (Redis before 7.0)"
        elif read is None:
            why = "the group's read position is unknown"
        elif deleted >= first_id:
            why = "an entry was XDELed"
        if why is not None:
            if key not in self._untracked:
                self._untracked.add(key)
                log.warning(
                    "%s: cannot count entries trimmed before the flusher read them (%s); reconcile shows any drift",
                    key,
                    why,
                )
            return None
        assert read is not None
        added = int(stream["entries-added"])
        length = int(stream["length"])
        lost = added - length - int(read)
        if lost <= 0:
            return None
        self.stats.trimmed += lost
        note_trimmed(lost)
        log.warning(
            "%d entries of %s were trimmed from the log (MAXLEN guard, log_maxlen) before they were flushed: "
            "lost to the snapshot; reconcile reports the drift",
            lost,
            key,
        )
        return ("XGROUP", "SETID", key, self.group, as_text(got[-1][0]), "ENTRIESREAD", added - length + len(got))

    def _trim(self, keys: list[str]) -> None:
        """Trim each of ``keys`` up to the oldest entry some consumer group of it still needs
        (see the module's doc): entries every group acknowledged go, nothing else."""
        if not keys:
            return
        infos = self.store.execute_many([("XINFO", "GROUPS", key) for key in keys])
        pending: list[tuple[int, StreamId, tuple[str | bytes | int | float, ...]]] = []
        points: list[StreamId | None] = []
        for i, (key, reply) in enumerate(zip(keys, infos)):
            if not isinstance(reply, list) or not reply:
                points.append(None)
                continue
            point: StreamId | None = None
            for g in (_fields(x) for x in reply):
                after = _next_id(StreamId.parse(as_text(g["last-delivered-id"])))
                point = after if point is None else min(point, after)
                if int(g["pending"]) > 0:
                    pending.append((i, after, ("XPENDING", key, g["name"])))
            points.append(point)
        if pending:
            for (i, after, _), summary in zip(pending, self.store.execute_many([p[2] for p in pending])):
                if isinstance(summary, list) and summary and summary[1] is not None:
                    oldest = StreamId.parse(as_text(summary[1]))
                    point = points[i]
                    points[i] = oldest if point is None else min(point, oldest)
                elif not isinstance(summary, list):
                    points[i] = None  # unreadable: trim nothing this round
        if self.retain > 0:
            keep = StreamId(max(0, int((time.time() - self.retain) * 1000)), 0)
            points = [None if p is None else min(p, keep) for p in points]
        # LIMIT: Redis's default for '~' (10,000 entries a call) could fall behind a batch above
        # that; twice the batch keeps up and still bounds one call's work.
        limit = max(10_000, 2 * self.batch)
        cmds: list[tuple[str | bytes | int | float, ...]] = [
            ("XTRIM", key, "MINID", "~", str(p), "LIMIT", limit)
            for key, p in zip(keys, points)
            if p is not None and p > StreamId(0, 1)
        ]
        if cmds:
            self.store.execute_many(cmds)

    def _claim(self) -> list[tuple[_Shard, str, Any]]:
        """Entries pending with other consumers for ``claim_after`` seconds or more."""
        out: list[tuple[_Shard, str, Any]] = []
        idle_ms = int(self.claim_after * 1000)
        for key in self._keys:
            shard = self._shards[key]
            start = "0-0"
            while True:
                reply = self.store.execute(
                    "XAUTOCLAIM", key, self.group, self.consumer, idle_ms, start, "COUNT", self.batch
                )
                assert isinstance(reply, list)
                nxt = as_text(reply[0])
                entries = reply[1] or []
                assert isinstance(entries, list)
                for entry in entries:
                    assert isinstance(entry, list)
                    out.append((shard, as_text(entry[0]), entry[1]))
                deleted = reply[2] if len(reply) > 2 else []
                if isinstance(deleted, list) and deleted:
                    # Trimmed from the stream (the MAXLEN guard) before anyone applied them:
                    # lost to the snapshot; reconciliation finds the drift.
                    self.stats.trimmed += len(deleted)
                    note_trimmed(len(deleted))
                    log.warning("%d pending entries of %s were trimmed before they were flushed", len(deleted), key)
                if nxt == "0-0" or len(out) >= self.batch * 10:
                    break
                start = nxt
        self.stats.claimed += len(out)
        return out

    def _ack(self, ids: dict[str, list[str]]) -> None:
        cmds: list[tuple[str | bytes | int | float, ...]] = [
            ("XACK", key, self.group, *sids) for key, sids in ids.items() if sids
        ]
        if cmds:
            self.store.execute_many(cmds)

    # ---- parsing --------------------------------------------------------------------------

    def _parse(self, shard: _Shard, sid_text: str, fields: Any) -> _Delta | None:
        if fields is None:
            # A pending entry the stream no longer has (trimmed by the MAXLEN guard before it
            # was applied).
            self.stats.trimmed += 1
            note_trimmed(1)
            log.warning("pending entry %s of %s was trimmed before it was flushed", sid_text, shard.key)
            return None
        # The layout sharded_incr.lua writes (`delta <n> request_id <id>`), checked field by
        # field without building a dict (this is the flusher's hot loop); anything else, such as
        # an adjustment's reason or the longer entries of earlier builds (which repeated the
        # counter and shard of the log's key), takes the general path below.
        if type(fields) is list and len(fields) == 4 and fields[0] == b"delta" and fields[2] == b"request_id":
            ms, dash, seq = sid_text.partition("-")
            raw = fields[3]
            try:
                if dash and isinstance(raw, bytes) and len(raw) <= MAX_NAME:
                    return _Delta(shard, StreamId(int(ms), int(seq)), int(fields[1]), raw.decode() or None, None)
            except (ValueError, UnicodeDecodeError):
                pass  # the general path reports it
        try:
            sid = StreamId.parse(sid_text)
            if not isinstance(fields, list) or len(fields) % 2:
                raise ValueError("fields are not name/value pairs")
            kv = {as_text(fields[i]): as_text(fields[i + 1]) for i in range(0, len(fields), 2)}
            delta = int(kv["delta"])
            if "counter" in kv and kv["counter"] != shard.counter:
                raise ValueError(f"entry names counter {kv['counter']!r}")
            if "shard" in kv and int(kv["shard"]) != shard.shard:
                raise ValueError(f"entry names shard {kv['shard']!r}")
            rid = kv.get("request_id") or None
            if rid is not None and len(rid) > MAX_NAME:
                raise ValueError("request id too long")
            return _Delta(shard, sid, delta, rid, kv.get("reason") or None)
        except (KeyError, ValueError, UnicodeDecodeError, InvalidInputError) as e:
            self.stats.malformed += 1
            if len(self.stats.malformed_ids) < 100:
                self.stats.malformed_ids.append(f"{shard.key} {sid_text}")
            log.warning("skipping malformed delta-log entry %s in %s: %s", sid_text, shard.key, e)
            return None

    # ---- SQL side -------------------------------------------------------------------------

    def _apply(self, deltas: list[_Delta]) -> None:
        """Apply ``deltas`` in one transaction (see the module's doc for why exactly once)."""
        snaps = self.snapshots
        sa = snaps._sa
        t = snaps.t
        for_update = snaps.dialect != "sqlite"  # SQLite: BEGIN IMMEDIATE holds the write lock
        by_counter: dict[str, dict[int, list[_Delta]]] = {}
        for d in deltas:
            by_counter.setdefault(d.shard.counter, {}).setdefault(d.shard.shard, []).append(d)
        now = int(time.time() * 1000)
        applied = 0
        with snaps.engine.begin() as conn:
            # Lock order: the counters' total rows by name, so concurrent flushers never deadlock.
            for name in sorted(by_counter):
                q = sa.select(t.totals.c.counter).where(t.totals.c.counter == name)
                conn.execute(q.with_for_update() if for_update else q)
            audit: list[tuple[Any, ...]] = []
            adjust: list[dict[str, Any]] = []
            for name in sorted(by_counter):
                shards = by_counter[name]
                sc = t.shards.c
                q = sa.select(sc.shard, sc.value, sc.version, sc.wm_ms, sc.wm_seq).where(
                    sc.counter == name, sc.shard.in_(sorted(shards))
                )
                rows = {
                    int(r[0]): (int(r[1]), int(r[2]), StreamId(int(r[3]), int(r[4])))
                    for r in conn.execute(q.with_for_update() if for_update else q)
                }
                newest = None
                for shard_no, items in shards.items():
                    value, version, wm = rows[shard_no]
                    old = [d for d in items if d.sid <= wm]
                    seen: set[StreamId] = set()
                    if old:
                        dc = t.deltas.c
                        lo = min(d.sid for d in old)
                        seen = {
                            StreamId(int(r[0]), int(r[1]))
                            for r in conn.execute(
                                sa.select(dc.stream_ms, dc.stream_seq).where(
                                    dc.counter == name,
                                    dc.shard == shard_no,
                                    dc.stream_ms >= lo.ms,
                                    dc.stream_ms <= wm.ms,
                                )
                            )
                        }
                    fresh: list[_Delta] = []
                    batch_seen: set[StreamId] = set()
                    for d in items:
                        if d.sid in seen or d.sid in batch_seen:
                            self.stats.skipped += 1
                            continue
                        batch_seen.add(d.sid)
                        fresh.append(d)
                    if not fresh:
                        continue
                    top = max(wm, max(d.sid for d in fresh))
                    newest = top if newest is None or top > newest else newest
                    conn.execute(
                        t.shards.update()
                        .where(sc.counter == name, sc.shard == shard_no)
                        .values(
                            value=value + sum(d.delta for d in fresh),
                            version=version + len(fresh),
                            wm_ms=top.ms,
                            wm_seq=top.seq,
                            updated_ms=now,
                        )
                    )
                    for d in fresh:
                        # In _AUDIT_COLUMNS order.
                        audit.append((name, shard_no, d.sid.ms, d.sid.seq, d.delta, d.request_id, d.sid.ms, now))
                        if d.reason is not None:
                            adjust.append(
                                {
                                    "counter": name,
                                    "delta": d.delta,
                                    "reason": d.reason[:MAX_NAME],
                                    "request_id": d.request_id,
                                    "created_ms": d.sid.ms,
                                }
                            )
                    applied += len(fresh)
                if newest is None:
                    continue
                # The aggregate: the total is rebuilt from the shard rows, never incremented, so
                # it cannot drift from them.
                sc = t.shards.c
                total, version = conn.execute(
                    sa.select(sa.func.coalesce(sa.func.sum(sc.value), 0), sa.func.coalesce(sa.func.sum(sc.version), 0))
                    .where(sc.counter == name)
                ).one()
                tc = t.totals.c
                cur = conn.execute(sa.select(tc.wm_ms, tc.wm_seq).where(tc.counter == name)).one()
                top = max(StreamId(int(cur[0]), int(cur[1])), newest)
                conn.execute(
                    t.totals.update()
                    .where(tc.counter == name)
                    .values(value=int(total), version=int(version), wm_ms=top.ms, wm_seq=top.seq, updated_ms=now)
                )
            if audit:
                self._insert_many(conn, audit)
            if adjust:
                conn.execute(t.adjustments.insert(), adjust)
        self.stats.applied += applied

    _AUDIT_COLUMNS = ("counter", "shard", "stream_ms", "stream_seq", "delta", "request_id", "event_ms", "applied_ms")

    def _insert_many(self, conn: Any, rows: list[tuple[Any, ...]]) -> None:
        """The audit rows through the driver's executemany, with the statement compiled once:
        SQLAlchemy's per-row parameter processing costs more than the insert itself here."""
        if self._audit_sql is None:
            compiled = self.snapshots.t.deltas.insert().compile(
                dialect=self.snapshots.engine.dialect, column_keys=list(self._AUDIT_COLUMNS)
            )
            order = list(compiled.positiontup) if compiled.positional and compiled.positiontup else None
            self._audit_sql = (str(compiled), order)
        sql, order = self._audit_sql
        cols = self._AUDIT_COLUMNS
        if self.snapshots.dialect == "postgresql" and self.snapshots.engine.driver == "psycopg":
            # COPY: one stream of rows, inside the same transaction (the same connection).
            raw = conn.connection.driver_connection
            with raw.cursor() as cur:
                with cur.copy(f"COPY redcount_deltas ({', '.join(cols)}) FROM STDIN") as copy:
                    for r in rows:
                        copy.write_row(r)
            return
        if self.snapshots.dialect in ("mysql", "mariadb"):
            # PyMySQL formats %s placeholders itself; one multi-row INSERT per 1,000 rows is
            # one round trip.
            head = f"INSERT INTO redcount_deltas ({', '.join(cols)}) VALUES "
            one = "(" + ", ".join(["%s"] * len(cols)) + ")"
            for i in range(0, len(rows), 1000):
                chunk = rows[i : i + 1000]
                conn.exec_driver_sql(head + ", ".join([one] * len(chunk)), tuple(v for r in chunk for v in r))
            return
        if order is None:
            conn.exec_driver_sql(sql, [dict(zip(cols, r)) for r in rows])
        elif tuple(order) == cols:
            conn.exec_driver_sql(sql, rows)
        else:
            idx = [cols.index(k) for k in order]
            conn.exec_driver_sql(sql, [tuple(r[i] for i in idx) for r in rows])

    # ---- driving --------------------------------------------------------------------------

    def run_once(self) -> int:
        """One round: claim entries idle with crashed consumers (at most every
        ``claim_after / 2`` seconds), read a batch, apply it in one transaction, acknowledge it.
        Returns the number of stream entries handled (0 when there was nothing)."""
        now = time.monotonic()
        if now - self._last_layouts >= 1.0:
            self._refresh_layouts()
        # A round builds about ten objects per entry, none of them in a reference cycle: the
        # cyclic collector, run every few hundred allocations, would only walk them again and
        # again (a third of a round's time at 100,000 entries). It is paused for the round and
        # collects as usual afterwards (cycles SQLAlchemy makes meanwhile are found then).
        paused = gc.isenabled()
        if paused:
            gc.disable()
        try:
            return self._round(now)
        finally:
            if paused:
                gc.enable()

    def _round(self, now: float) -> int:
        entries: list[tuple[_Shard, str, Any]] = []
        if now - self._last_claim >= self.claim_after / 2:
            self._last_claim = now
            entries.extend(self._claim())
        entries.extend(self._read())
        if not entries:
            return 0
        # A claimed entry joins this consumer's own pending list, so the history read that
        # follows a claim may return it again: one copy each.
        unique: dict[tuple[str, str], tuple[_Shard, str, Any]] = {}
        for e in entries:
            unique.setdefault((e[0].key, e[1]), e)
        entries = list(unique.values())
        deltas: list[_Delta] = []
        for shard, sid, fields in entries:
            d = self._parse(shard, sid, fields)
            if d is not None:
                deltas.append(d)
        if deltas:
            try:
                self._apply(deltas)
            except self.snapshots._sa.exc.SQLAlchemyError as e:
                # Nothing was applied and nothing acknowledged: the entries stay pending with
                # this consumer, and the next round reads them again first.
                self._history = True
                raise RedcountError(f"flusher: SQL transaction failed on {self.snapshots.url}: {first_line(e)}") from None
        acks: dict[str, list[str]] = {}
        for shard, sid, _ in entries:
            acks.setdefault(shard.key, []).append(sid)
        self._ack(acks)
        self._trim(list(acks))
        self.stats.batches += 1
        self._report(len(entries))
        return len(entries)

    def drain(self, *, timeout: float | None = None) -> int:
        """Apply everything logged so far (and claimable), then return the entries handled."""
        deadline = None if timeout is None else time.monotonic() + timeout
        total = 0
        self._last_claim = 0.0
        self._last_layouts = 0.0  # shards a reshard added are drained too
        while True:
            n = self.run_once()
            total += n
            if n == 0:
                return total
            if deadline is not None and time.monotonic() >= deadline:
                return total

    def run(self, stop: threading.Event | None = None, *, idle: float = 0.05) -> None:
        """Flush until ``stop`` is set (or forever), waiting ``idle`` seconds when the logs are
        empty. A failed round (database or Redis unreachable) is logged and retried with
        backoff up to 5 s; [`run_once`][redcount.sql.flusher.Flusher.run_once] and [`drain`][redcount.sql.flusher.Flusher.drain] raise instead."""
        stop = stop or threading.Event()
        backoff = idle
        while not stop.is_set():
            try:
                n = self.run_once()
                backoff = idle
            except RedcountError as e:
                # A database or Redis that is down for a while: nothing was acknowledged that
                # was not committed, so waiting and trying again is always safe.
                self._history = True
                log.warning("flusher round failed (retrying in %.1f s): %s", backoff, e)
                stop.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            if n == 0:
                stop.wait(idle)

    @property
    def lag(self) -> Lag:
        """Entries after each shard's SQL watermark, and the age of the oldest (reads Redis and
        SQL: a few round trips). Entries pending with another flusher below a watermark are
        not counted."""
        marks = {}
        for name in self._counters:
            for s in self.snapshots.shard_values(name):
                marks[(name, s.shard)] = s.watermark
        cmds: list[tuple[str | bytes | int | float, ...]] = []
        for key in self._keys:
            sh = self._shards[key]
            cmds.append(("XRANGE", key, f"({marks[(sh.counter, sh.shard)]}", "+", "COUNT", 100_000))
        entries = 0
        oldest: int | None = None
        for reply in self.store.execute_many(cmds):
            if isinstance(reply, list) and reply:
                entries += len(reply)
                first = reply[0]
                assert isinstance(first, list)
                ms = StreamId.parse(as_text(first[0])).ms
                oldest = ms if oldest is None else min(oldest, ms)
        seconds = 0.0 if oldest is None else max(0.0, time.time() - oldest / 1000)
        return Lag(entries, seconds)

    def _report(self, n: int) -> None:
        if not self._progress:
            return
        stream = self._progress_stream
        if stream.isatty():
            if self._bar is None:
                try:
                    # Optional (redcount[progress]); without it, plain lines as off a terminal.
                    tqdm = importlib.import_module("tqdm").tqdm
                    self._bar = tqdm(unit=" entries", file=stream, dynamic_ncols=True)
                except ImportError:
                    self._bar = False
            if self._bar:
                self._bar.update(n)
                return
        now = time.monotonic()
        if now - self._last_line >= 2.0:
            self._last_line = now
            st = self.stats
            # Counts since start, at most one line per 2 s: the last one printed can be well
            # behind the final summary, so each number says what it is and that it is "so far".
            print(
                f"flush: so far {st.applied + st.skipped + st.malformed} entries handled: applied {st.applied}, "
                f"skipped {st.skipped} (already applied), malformed {st.malformed}, claimed {st.claimed}",
                file=stream,
                flush=True,
            )

    def close(self) -> None:
        untrack_flusher(self)
        if self._bar:
            self._bar.close()
        self._bar = None
        if self._own_snapshots:
            self.snapshots.close()

    def __enter__(self) -> Flusher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Flusher(counters={sorted(self._counters)!r}, sql={self.snapshots.url!r}, group={self.group!r})"


def _fields(reply: Any) -> dict[str, Any]:
    """An XINFO reply (a flat name/value list) as a dict."""
    if not isinstance(reply, list):
        return {}
    return {as_text(reply[i]): reply[i + 1] for i in range(0, len(reply) - 1, 2)}


def _next_id(sid: StreamId) -> StreamId:
    """The smallest stream id after ``sid`` (XTRIM MINID has no exclusive form)."""
    return StreamId(sid.ms, sid.seq + 1) if sid.seq < 2**64 - 1 else StreamId(sid.ms + 1, 0)


def counters_from_names(names: Sequence[str]) -> list[str]:
    """Names from the command line, checked."""
    for n in names:
        check_name(n)
    return list(names)
