"""Reconciliation of sharded counters against their SQL snapshots.

```python
store = redcount.connect("redis://localhost:6379/0")
report = redcount.reconcile(store, "sqlite:///counters.db", "likes:post:987")
report.ok, report.drift, report.relative          # True, 0, 0.0 when all agree
for row in report.rows:                           # one per shard
    print(row.shard, row.live, row.expected, row.drift, row.audit_drift)
redcount.reconcile(store, "sqlite:///counters.db", "likes:post:987", repair=True)
```

or ``redcount reconcile --url redis://... --sql sqlite:///counters.db --counter likes:post:987``.

Per shard, three figures are compared:

- ``live``: the shard's value in Redis (what readers see);
- ``expected``: the SQL snapshot plus the deltas logged after its watermark (not yet flushed);
- ``audited``: the sum of the SQL audit log (``redcount_deltas``) plus the same unflushed
  deltas.

``drift = live - expected``: a write that changed the value without a log entry (a foreign
INCRBY on a shard key), or a log entry deleted or trimmed before it was flushed.
``audit_drift = expected - audited``: the snapshot and its own audit log disagree (a lost or
edited SQL row).

Which side is the truth: the SQL snapshot and its audit log, which every flushed delta
passed through, and the delta log not yet flushed. ``repair=True`` therefore changes the
*live* value by ``-drift`` (a plain INCRBY on the shard key, not through the delta log, so the
snapshot, which never saw the foreign write, is not changed), and, for audit drift, inserts the
missing amount into the audit log as a synthetic row (stream id ``0-<run ms>``, request id
``reconcile:audit:<shard>``) so that it sums to the snapshot again. Each correction is also
recorded in ``redcount_adjustments`` with the reason ``reconcile``, and each run (repair or
not) in ``redcount_reconcile_runs``. A deleted log entry therefore costs its increment: the
audited record is what stays; reconcile reports it so that a human can decide first.

Measurement is not atomic across Redis and SQL: under concurrent writes a shard may show a
transient drift of a write in flight. A repair measures twice and corrects only shards whose
live drift was the same both times (``ShardRow.stable``); run it again for the others.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, replace
from typing import Any

from .._core import Store
from ..errors import InvalidInputError, RedcountError
from ..sharded import ShardedCounter
from ..telemetry import note_reconcile
from ._shared import as_text, check_name, first_line
from .snapshots import SnapshotStore

__all__ = ["ReconcileRun", "Report", "ShardRow", "reconcile", "runs"]

DEFAULT_THRESHOLD = 0.001
"""The default alert threshold: 0.1 % of the counter's expected value."""

REASON = "reconcile"


@dataclass(frozen=True)
class ShardRow:
    """One shard's figures (see the module's doc for their meaning)."""

    shard: int
    live: int
    snapshot: int
    unflushed: int  # sum of the log entries after the snapshot's watermark
    unflushed_entries: int
    audited: int  # sum of the SQL audit rows of this shard, plus ``unflushed``
    expected: int  # snapshot + unflushed
    drift: int  # live - expected
    audit_drift: int  # expected - audited
    correction: int = 0  # what repair added to the live value (signed: -drift)
    audit_correction: int = 0  # what repair added to the audit log (signed: +audit_drift)
    stable: bool = True  # the drift was the same in both measurements (repair only)


@dataclass(frozen=True)
class Report:
    """One reconciliation of one counter. ``relative`` is the sum of every shard's absolute
    drift (live and audit) over ``max(|expected|, 1)``, a fraction (0.001 is 0.1 %); ``ok``
    when it is at most ``threshold`` (a fraction too). Per-shard drifts of opposite signs do
    not cancel in ``abs_drift``.

    Signs: ``drift`` is what the live value has too much (live - expected), ``audit_drift``
    what the audit log has too little (expected - audited); a correction is what repair *added* (``correction = -drift`` to the live
    value, ``audit_correction = +audit_drift`` to the audit log), and [`table`][redcount.sql.reconciliation.Report.table]'s ``fix``
    column shows, per shard and in the total row alike, the signed sum of the two.
    ``corrections`` is the unsigned size of everything written."""

    counter: str
    run_ms: int
    rows: list[ShardRow]
    live: int
    expected: int
    audited: int
    drift: int  # sum of the shards' live drift
    audit_drift: int
    abs_drift: int
    relative: float
    threshold: float
    ok: bool
    repaired: bool
    corrections: int  # size of the corrections written: sum of |correction| + |audit_correction|

    def table(self) -> str:
        """A readable table of the rows and the totals."""
        head = f"{'shard':>5} {'live':>14} {'expected':>14} {'audited':>14} {'drift':>10} {'audit':>8} {'fix':>10}"
        lines = [f"counter {self.counter}", head]
        for r in self.rows:
            fix = r.correction + r.audit_correction
            lines.append(
                f"{r.shard:>5} {r.live:>14} {r.expected:>14} {r.audited:>14} {r.drift:>10} {r.audit_drift:>8} "
                f"{fix if fix else '':>10}{'' if r.stable else '  (moving: not repaired)'}"
            )
        # The total row sums every column with its sign, the fixes too (so a shard's -7 and
        # the total's -7 agree); ``corrections`` is the size of what was written, unsigned.
        net = sum(r.correction + r.audit_correction for r in self.rows)
        lines.append(
            f"{'total':>5} {self.live:>14} {self.expected:>14} {self.audited:>14} {self.drift:>10} "
            f"{self.audit_drift:>8} {net if net else '':>10}"
        )
        verdict = "OK" if self.ok else "DRIFT"
        # ``relative`` and ``threshold`` are fractions (as in runs(), drift_history() and the
        # metrics); the percentage follows in parentheses.
        lines.append(
            f"{verdict}: |drift| {self.abs_drift} of {self.expected}: relative {self.relative:.6g} "
            f"({_percent(self.relative)}), threshold {self.threshold:.6g} ({_percent(self.threshold)})"
            f"{'; repaired' if self.repaired else ''}"
        )
        return "\n".join(lines)


def _percent(fraction: float) -> str:
    return f"{fraction * 100:.6g} %"


@dataclass(frozen=True)
class ReconcileRun:
    """A recorded run (``redcount_reconcile_runs``). ``relative`` is a fraction (0.001 is
    0.1 %), as in [`Report`][redcount.sql.reconciliation.Report]; ``corrections`` the unsigned size of what a repair wrote."""

    counter: str
    run_ms: int
    drift: int
    abs_drift: int
    relative: float
    ok: bool
    corrections: int
    shards: list[dict[str, Any]]


def _measure(
    store: Store, snaps: SnapshotStore, name: str, counter: ShardedCounter
) -> list[ShardRow]:
    sa = snaps._sa
    t = snaps.t
    # SQL first: a flusher that advances a watermark after this read leaves the entries it
    # applied in the stream, so snapshot + entries after the old watermark stays consistent.
    shards = snaps.shard_values(name)
    dc = t.deltas.c
    with snaps.engine.connect() as conn:
        sums = {
            int(r[0]): int(r[1])
            for r in conn.execute(
                sa.select(dc.shard, sa.func.coalesce(sa.func.sum(dc.delta), 0)).where(dc.counter == name).group_by(dc.shard)
            )
        }
    cmds: list[tuple[str | bytes | int | float, ...]] = []
    for s in shards:
        cmds.append(("XRANGE", counter.key_of(s.shard, "log"), f"({s.watermark}", "+"))
        cmds.append(("GET", counter.key_of(s.shard)))
    replies = store.execute_many(cmds)
    rows = []
    for i, s in enumerate(shards):
        entries, raw = replies[2 * i], replies[2 * i + 1]
        unflushed = 0
        n = 0
        for e in entries if isinstance(entries, list) else []:
            assert isinstance(e, list)
            fields = e[1]
            assert isinstance(fields, list)
            kv = {as_text(fields[j]): as_text(fields[j + 1]) for j in range(0, len(fields) - 1, 2)}
            try:
                unflushed += int(kv["delta"])
                n += 1
            except (KeyError, ValueError):
                pass  # not a delta: the flusher skips it too
        live = 0 if raw is None else int(as_text(raw))
        expected = s.value + unflushed
        audited = sums.get(s.shard, 0) + unflushed
        rows.append(
            ShardRow(s.shard, live, s.value, unflushed, n, audited, expected, live - expected, expected - audited)
        )
    return rows


def reconcile(
    store: Store,
    sql_url: str | SnapshotStore,
    name: str,
    *,
    threshold: float = DEFAULT_THRESHOLD,
    repair: bool = False,
    record: bool = True,
) -> Report:
    """Compare counter ``name``'s live shards with its SQL snapshot and audit log (see the
    module's doc), record the run, and with ``repair=True`` write the corrections that close
    the drift. The counter's prefix and shard count come from the SQL metadata (the flusher
    registered it). Raises InvalidInputError for a counter the database does not know."""
    check_name(name)
    if not isinstance(threshold, (int, float)) or threshold < 0:
        raise InvalidInputError(f"threshold must be a fraction >= 0, got {threshold!r}")
    snaps = sql_url if isinstance(sql_url, SnapshotStore) else SnapshotStore(sql_url)
    try:
        report = _reconcile(store, snaps, name, float(threshold), repair, record)
        note_reconcile(report)  # its drift in redcount.metrics()
        return report
    except snaps._sa.exc.SQLAlchemyError as e:
        raise RedcountError(f"reconcile: SQL failed on {snaps.url}: {first_line(e)}") from None
    finally:
        if snaps is not sql_url:
            snaps.close()


def _reconcile(store: Store, snaps: SnapshotStore, name: str, threshold: float, repair: bool, record: bool) -> Report:
    sa = snaps._sa
    t = snaps.t
    cc = t.counters.c
    with snaps.engine.connect() as conn:
        meta = conn.execute(sa.select(cc.prefix, cc.shards).where(cc.name == name)).first()
    if meta is None:
        raise InvalidInputError(f"no snapshot of counter {name!r} in {snaps.url}: run the flusher first")
    counter = ShardedCounter(store, name, shards=int(meta[1]), prefix=str(meta[0]))
    # Shards a reshard added that no flusher has registered yet are compared too (zero snapshots).
    total = counter.layout().total
    if total > int(meta[1]):
        snaps.ensure_counter(name, str(meta[0]), total)
    run_ms = int(time.time() * 1000)
    rows = _measure(store, snaps, name, counter)
    if repair:
        again = {r.shard: r for r in _measure(store, snaps, name, counter)}
        fixed: list[ShardRow] = []
        live_fix: list[tuple[str | bytes | int | float, ...]] = []
        adjustments: list[dict[str, Any]] = []
        audit_rows: list[dict[str, Any]] = []
        for r in rows:
            stable = again[r.shard].drift == r.drift and again[r.shard].audit_drift == r.audit_drift
            corr = -r.drift if stable and r.drift else 0
            acorr = r.audit_drift if stable and r.audit_drift else 0
            if corr:
                live_fix.append(("INCRBY", counter.key_of(r.shard), corr))
                adjustments.append(
                    {"counter": name, "delta": corr, "reason": REASON,
                     "request_id": f"reconcile:live:{r.shard}", "created_ms": run_ms}
                )
            if acorr:
                audit_rows.append(
                    {"counter": name, "shard": r.shard, "stream_ms": 0, "stream_seq": run_ms, "delta": acorr,
                     "request_id": f"reconcile:audit:{r.shard}", "event_ms": run_ms, "applied_ms": run_ms}
                )
                adjustments.append(
                    {"counter": name, "delta": acorr, "reason": REASON,
                     "request_id": f"reconcile:audit:{r.shard}", "created_ms": run_ms}
                )
            fixed.append(replace(r, correction=corr, audit_correction=acorr, stable=stable))
        rows = fixed
        # SQL first: if Redis then fails, the record says a correction was meant and the next
        # run shows the drift still there (and the audit row made the audit side agree).
        if adjustments:
            with snaps.engine.begin() as conn:
                if audit_rows:
                    conn.execute(t.deltas.insert(), audit_rows)
                conn.execute(t.adjustments.insert(), adjustments)
        if live_fix:
            store.execute_many(live_fix)
    live = sum(r.live for r in rows)
    expected = sum(r.expected for r in rows)
    audited = sum(r.audited for r in rows)
    abs_drift = sum(abs(r.drift) + abs(r.audit_drift) for r in rows)
    relative = abs_drift / max(abs(expected), 1)
    report = Report(
        counter=name,
        run_ms=run_ms,
        rows=rows,
        live=live,
        expected=expected,
        audited=audited,
        drift=sum(r.drift for r in rows),
        audit_drift=sum(r.audit_drift for r in rows),
        abs_drift=abs_drift,
        relative=relative,
        threshold=threshold,
        ok=relative <= threshold,
        repaired=repair,
        corrections=sum(abs(r.correction) + abs(r.audit_correction) for r in rows),
    )
    if record:
        with snaps.engine.begin() as conn:
            conn.execute(
                t.reconcile_runs.insert().values(
                    counter=name,
                    run_ms=run_ms,
                    drift=report.drift,
                    abs_drift=abs_drift,
                    relative=relative,
                    ok=report.ok,
                    corrections=report.corrections,
                    shards_json=json.dumps(
                        [
                            {"shard": r.shard, "drift": r.drift, "audit_drift": r.audit_drift,
                             "correction": r.correction, "audit_correction": r.audit_correction}
                            for r in rows
                            if r.drift or r.audit_drift or r.correction or r.audit_correction
                        ]
                    ),
                )
            )
    return report


def runs(sql_url: str | SnapshotStore, name: str) -> list[ReconcileRun]:
    """The recorded reconciliation runs of ``name``, oldest first (for plotting drift over time)."""
    snaps = sql_url if isinstance(sql_url, SnapshotStore) else SnapshotStore(sql_url)
    try:
        sa = snaps._sa
        c = snaps.t.reconcile_runs.c
        with snaps.engine.connect() as conn:
            return [
                ReconcileRun(str(r[0]), int(r[1]), int(r[2]), int(r[3]), float(r[4]), bool(r[5]), int(r[6]), json.loads(r[7]))
                for r in conn.execute(
                    sa.select(c.counter, c.run_ms, c.drift, c.abs_drift, c.relative, c.ok, c.corrections, c.shards_json)
                    .where(c.counter == name)
                    .order_by(c.id)
                )
            ]
    finally:
        if snaps is not sql_url:
            snaps.close()

