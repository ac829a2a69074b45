"""Flusher throughput: deltas applied to SQL per second by one flusher.

    python -m redcount.tools.bench_flush --url redis://127.0.0.1:6379/0 --sql sqlite:////tmp/b.db --deltas 200000

Writes ``--deltas`` idempotent increments (request ids, so the audit log has them) to
``--counters`` sharded counters with ``incr_many``, then times one :class:`redcount.Flusher`
draining them into the SQL database (the write phase is not timed). The figure depends on the
machine and the database's durability settings; it is a measurement, not a test.
"""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Sequence

import redcount


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m redcount.tools.bench_flush")
    p.add_argument("--url", default=None, help="store URL (default memory://)")
    p.add_argument("--sql", required=True, help="SQLAlchemy URL (a fresh database is best)")
    p.add_argument("--deltas", type=int, default=200_000)
    p.add_argument("--counters", type=int, default=4)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--batch", type=int, default=2000, help="flusher entries per stream and round")
    args = p.parse_args(argv)

    store = redcount.connect(args.url)
    run = uuid.uuid4().hex[:8]
    names = [f"bench:{run}:{i}" for i in range(args.counters)]
    c = redcount.ShardedCounter(store, names[0], shards=args.shards, log_maxlen=args.deltas + 1000)
    t0 = time.perf_counter()
    chunk = 1000
    for start in range(0, args.deltas, chunk):
        items = [(names[i % len(names)], 1, f"{run}-{i}") for i in range(start, min(args.deltas, start + chunk))]
        c.incr_many(items)
    written = time.perf_counter() - t0
    counters = [
        redcount.ShardedCounter(store, n, shards=args.shards, log_maxlen=args.deltas + 1000) for n in names
    ]
    with redcount.Flusher(store, args.sql, counters, batch=args.batch) as f:
        t0 = time.perf_counter()
        handled = f.drain()
        took = time.perf_counter() - t0
        ok = all(f.snapshots.total(n)[0] == cc.value() for n, cc in zip(names, counters))
    print(
        f"wrote {args.deltas} deltas in {written:.2f} s; flushed {handled} in {took:.2f} s = "
        f"{handled / took:,.0f} deltas/s into {f.snapshots.dialect} (batch {args.batch}, "
        f"{args.counters} counters x {args.shards} shards); totals {'equal' if ok else 'DIFFER from'} Redis"
    )
    store.close()
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
