"""Flusher throughput, and snapshot lag under a steady write rate.

    python -m redcount.tools.bench.flush --url redis://127.0.0.1:6379/0 --sql sqlite:////tmp/b.db --deltas 200000
    python -m redcount.tools.bench.flush --url redis://127.0.0.1:6379/0 --sql sqlite:////tmp/l.db --lag --rate 10000

Throughput: writes ``--deltas`` idempotent increments (request ids, so the audit log has them)
to ``--counters`` sharded counters with ``incr_many``, then times one [`redcount.Flusher`][redcount.sql.flusher.Flusher]
draining them into the SQL database (the write phase is not timed).

Lag (``--lag``, Redis only): a ``redcount flush`` process runs as in production while this
process writes ``--rate`` increments per second for ``--seconds`` (in ``incr_many`` chunks
every 10 ms) and samples the snapshot lag every 100 ms: the age of the oldest delta not yet
in SQL ([`redcount.Flusher.lag`][redcount.sql.flusher.Flusher.lag], 0 when SQL is level with the logs). It prints the
samples' p50, p99 and max; at the end it waits for the flusher to catch up and checks the SQL
totals against Redis. Both figures depend on the machine and the database's durability
settings; they are measurements, not tests.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence

import redcount

from ..servers import die_with_parent
from .harness import percentile


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m redcount.tools.bench.flush")
    p.add_argument("--url", default=None, help="store URL (default memory://)")
    p.add_argument("--sql", required=True, help="SQLAlchemy URL (a fresh database is best)")
    p.add_argument("--deltas", type=int, default=200_000)
    p.add_argument("--counters", type=int, default=4)
    p.add_argument("--shards", type=int, default=16)
    p.add_argument("--batch", type=int, default=2000, help="flusher entries per stream and round")
    p.add_argument("--lag", action="store_true", help="measure the snapshot lag under --rate writes/s instead")
    p.add_argument("--rate", type=int, default=10_000, help="--lag: increments per second (default 10000)")
    p.add_argument("--seconds", type=float, default=20.0, help="--lag: how long to write (default 20)")
    args = p.parse_args(argv)
    if args.lag:
        return _lag(args)

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


def _lag(args: argparse.Namespace) -> int:
    if not args.url or args.url.startswith("memory"):
        print("--lag needs --url redis://...: the flusher runs in its own process", file=sys.stderr)
        return 2
    if args.rate < 100 or args.seconds <= 0:
        print("--rate must be >= 100 and --seconds > 0", file=sys.stderr)
        return 2
    store = redcount.connect(args.url)
    run = uuid.uuid4().hex[:8]
    names = [f"bench:{run}:{i}" for i in range(args.counters)]
    counters = [redcount.ShardedCounter(store, n, shards=args.shards) for n in names]
    argv = [sys.executable, "-m", "redcount", "flush", "--url", args.url, "--sql", args.sql, "--quiet",
            "--shards", str(args.shards), "--batch", str(args.batch)]
    for n in names:
        argv += ["--counter", n]
    flusher = subprocess.Popen(argv, env=dict(os.environ), stdin=subprocess.DEVNULL, preexec_fn=die_with_parent())
    done = threading.Event()
    written = [0]

    def write() -> None:
        per_tick = max(1, args.rate // 100)
        start = time.monotonic()
        i = 0
        while not done.is_set():
            # Paced against the start, so a slow tick is caught up rather than lost.
            due = int((time.monotonic() - start) * args.rate)
            while i < due:
                n = min(per_tick, due - i)
                counters[0].incr_many([(names[(i + k) % len(names)], 1, f"{run}-{i + k}") for k in range(n)])
                i += n
            written[0] = i
            done.wait(0.01)

    try:
        with redcount.Flusher(store, args.sql, counters, group=f"lag-probe-{run}") as probe:
            writer = threading.Thread(target=write, daemon=True)
            t0 = time.monotonic()
            writer.start()
            samples: list[float] = []
            warmup = min(2.0, args.seconds / 4)
            while time.monotonic() - t0 < args.seconds:
                time.sleep(0.1)
                if time.monotonic() - t0 >= warmup:
                    samples.append(probe.lag.seconds)
                if flusher.poll() is not None:
                    print(f"the flusher exited with {flusher.returncode}", file=sys.stderr)
                    return 1
            done.set()
            writer.join()
            elapsed = time.monotonic() - t0
            samples.sort()
            deadline = time.monotonic() + 120
            while probe.lag.entries and time.monotonic() < deadline:
                time.sleep(0.1)
            ok = all(probe.snapshots.total(n)[0] == c.value() for n, c in zip(names, counters))
        print(
            f"wrote {written[0]} increments in {elapsed:.1f} s ({written[0] / elapsed:,.0f}/s) to {args.counters} "
            f"counters x {args.shards} shards; snapshot lag over {len(samples)} samples: "
            f"p50 {percentile(samples, 0.5):.3f} s, p99 {percentile(samples, 0.99):.3f} s, "
            f"max {samples[-1]:.3f} s (target p99 <= 2 s); "
            f"SQL totals {'equal' if ok else 'DIFFER from'} Redis"
        )
        return 0 if ok else 1
    finally:
        flusher.terminate()
        flusher.wait(timeout=30)
        store.close()


if __name__ == "__main__":
    raise SystemExit(main())
