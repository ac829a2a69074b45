"""The ``redcount`` command: ``redcount demo``, ``bench``, ``accuracy``, ``abuse``, ``flush``, ``restore``,
``reconcile``, ``reshard`` and ``serve``."""

from __future__ import annotations

import argparse
import math
import os
import sys
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._core import Store
    from ..sql import Flusher

URL_ENV = "REDCOUNT_URL"
"""The operations commands (flush, restore, reconcile, reshard) read the store URL from
``--url`` or, without it, from this environment variable; they have no default."""

_OPS_URL_HELP = (
    "URL of the Redis server that holds the counters (redis://, rediss://, unix://, redis+cluster://); "
    f"default: ${URL_ENV}. Required: memory:// only when named explicitly"
)


def _threshold(text: str) -> float:
    """``--threshold``: a fraction (``0.001``) or a percentage (``0.1%``)."""
    raw = text.strip()
    percent = raw.endswith("%")
    try:
        value = float(raw[:-1].strip() if percent else raw)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a fraction (0.001) or a percentage (0.1%), got {text!r}"
        ) from None
    if percent:
        value /= 100
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite fraction >= 0 (or a percentage), got {text!r}")
    return value

from .. import __version__


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="redcount", description="Counters and rate limiters on Redis or in memory.")
    p.add_argument("--version", action="version", version=f"redcount {__version__}")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="run a simulated workload and show what happened")
    d.add_argument("--url", default=None, help="store URL (default: the embedded memory:// store)")
    d.add_argument("--clients", type=int, default=500, help="simulated clients (default 500)")
    d.add_argument("--hot", type=int, default=3, help="hot clients among them (default 3)")
    d.add_argument("--windows", type=int, default=4, help="windows to run through (default 4)")
    d.add_argument("--window", type=int, default=1, help="window length in whole seconds (default 1)")
    d.add_argument("--per-client", type=int, default=20, help="hits allowed per client and window (default 20)")
    d.add_argument("--threads", type=int, default=4, help="worker threads (default 4)")
    d.add_argument("--rate", type=float, default=4000.0, help="target requests per second in all (default 4000)")
    d.add_argument("--seed", type=int, default=7, help="random seed (default 7)")

    acc = sub.add_parser("accuracy", help="measure how far past its limit each strategy lets a client go")
    acc.add_argument("--limit", type=int, default=100, help="hits allowed per window (default 100)")
    acc.add_argument("--window", type=int, default=60, help="window length in whole seconds (default 60)")
    acc.add_argument("--seed", type=int, default=1, help="seed of the random scenario (default 1)")
    acc.add_argument("--json", default=None, help="also write the figures to this JSON file")

    ab = sub.add_parser("abuse", help="measure the Redis memory one abusive client costs per strategy")
    ab.add_argument("--url", default=None, help="an existing redis:// server or redis+cluster:// cluster (default: start a private one)")
    ab.add_argument("--limits", default="10,100,1000", help="limits per window to try (default 10,100,1000)")
    ab.add_argument("--factor", type=int, default=10, help="requests per window, times the limit (default 10)")
    ab.add_argument("--window", type=int, default=60, help="window length in whole seconds (default 60)")
    ab.add_argument("--redis-server", default="redis-server", help="redis-server binary to start")
    ab.add_argument("--json", default=None, help="also write the figures to this JSON file")

    b = sub.add_parser("bench", help="measure throughput against limits and redis-benchmark")
    b.add_argument("target", nargs="?", choices=["web"], default=None,
                   help="'web': requests per second of Flask and FastAPI apps under wrk (see redcount.tools.bench.web)")
    b.add_argument(
        "--url", default=None,
        help="an existing redis:// server, or a redis+cluster:// cluster (sliding and hot blocks; default: start a private one)",
    )
    b.add_argument("--seconds", type=float, default=2.0, help="seconds per measurement (default 2)")
    b.add_argument("--batch", type=int, default=128, help="incr_many batch size (default 128)")
    b.add_argument("--redis-server", default="redis-server", help="redis-server binary to start")
    b.add_argument("--redis-benchmark", default="redis-benchmark", help="redis-benchmark binary")
    b.add_argument("--json", default=None, help="also write the figures to this JSON file")
    b.add_argument(
        "--only", choices=["all", "fixed", "sliding", "engine", "sharded", "hot", "cluster", "leased"], default="all", help="which measurements"
    )
    b.add_argument(
        "--strategy", choices=["sliding-window", "token-bucket", "gcra"], default=None,
        help="bench --only leased: measure this strategy's leases (threads, refusals, exactness) instead of the default rows",
    )
    b.add_argument("--framework", choices=["all", "flask", "fastapi", "django"], default="all", help="bench web: which apps")
    b.add_argument("--workers", type=int, default=2, help="bench web: server worker processes (default 2)")
    b.add_argument("--connections", type=int, default=32, help="bench web: wrk connections (default 32)")
    b.add_argument("--threads", type=int, default=2, help="bench web: wrk threads (default 2)")
    b.add_argument("--rounds", type=int, default=1, help="bench web: rounds, the median kept (default 1)")
    b.add_argument("--wrk", default="wrk", help="bench web: the wrk binary")

    f = sub.add_parser("flush", help="apply sharded counters' delta logs to SQL snapshots, exactly once")
    f.add_argument("--url", default=None, help=_OPS_URL_HELP)
    f.add_argument("--sql", required=True, help="SQLAlchemy URL of the snapshots (sqlite:///file.db, postgresql+psycopg://...)")
    f.add_argument("--counter", action="append", default=[], metavar="NAME", help="a counter to flush (repeatable)")
    f.add_argument("--shards", type=int, default=16, help="shards of the counters (default 16)")
    f.add_argument("--prefix", default="redcount", help="key prefix of the counters (default redcount)")
    f.add_argument("--group", default="redcount-flusher", help="consumer group (default redcount-flusher)")
    f.add_argument("--consumer", default=None, help="this flusher's consumer name (default host-pid-random)")
    f.add_argument("--batch", type=int, default=1000, help="entries per stream and round (default 1000)")
    f.add_argument("--claim-after", type=float, default=30.0, help="claim entries pending this long elsewhere (s)")
    f.add_argument("--retain", type=float, default=0.0,
                   help="keep applied entries in the logs this long (s) for windowed reads (default 0)")
    f.add_argument("--once", action="store_true", help="drain what is logged now, then exit")
    f.add_argument("--quiet", action="store_true", help="no progress output")

    r = sub.add_parser("restore", help="rebuild a sharded counter's shards from its SQL snapshot and delta logs")
    r.add_argument("--url", default=None, help=_OPS_URL_HELP)
    r.add_argument("--sql", required=True, help="SQLAlchemy URL of the snapshots")
    r.add_argument("--counter", action="append", default=[], metavar="NAME", help="a counter to restore (repeatable)")

    rc = sub.add_parser("reconcile", help="compare sharded counters' live values with their SQL snapshots and logs")
    rc.add_argument("--url", default=None, help=_OPS_URL_HELP)
    rc.add_argument("--sql", required=True, help="SQLAlchemy URL of the snapshots")
    rc.add_argument("--counter", action="append", default=[], metavar="NAME",
                    help="a counter to reconcile (repeatable; default every counter in the database)")
    rc.add_argument("--every", type=float, default=None, metavar="SECONDS", help="run again every SECONDS until stopped")
    rc.add_argument("--threshold", type=_threshold, default=0.001,
                    help="relative drift that fails, as a fraction or a percentage (default 0.001, the same as 0.1%%)")
    rc.add_argument("--repair", action="store_true", help="write the corrections that close the drift (reason 'reconcile')")

    sv = sub.add_parser("serve", help="serve sharded counters over HTTP (needs: pip install 'redcount[serve]')")
    sv.add_argument("--url", default=None, help="store URL (redis://...; default memory://, one process only)")
    sv.add_argument("--sql", default=None, help="SQLAlchemy URL of the flusher's snapshots: enables ?source=snapshot")
    sv.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    sv.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    sv.add_argument("--token-file", default=None, help="file holding the bearer token for /adjust (else adjust is refused)")
    sv.add_argument("--shards", type=int, default=16, help="shards of every counter (default 16)")
    sv.add_argument("--prefix", default="redcount", help="key prefix of the counters (default redcount)")
    sv.add_argument("--idempotency-ttl", type=float, default=86400, help="seconds a request id is remembered (default 86400)")
    sv.add_argument("--max-body", type=int, default=64 * 1024, help="largest request body in bytes (default 65536)")
    sv.add_argument("--max-batch", type=int, default=100, help="most keys in one batch-get (default 100)")
    sv.add_argument("--max-delta", type=int, default=1_000_000_000, help="largest |delta| of one request (default 1e9)")
    sv.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    rs = sub.add_parser("reshard", help="move a sharded counter's writes to a new generation of shards")
    rs.add_argument("--url", default=None, help=_OPS_URL_HELP)
    rs.add_argument("--counter", required=True, metavar="NAME", help="the counter to reshard")
    rs.add_argument("--shards", required=True, type=int, metavar="M", help="the new generation's shard count")
    rs.add_argument("--initial-shards", type=int, default=16, metavar="N",
                    help="the counter's shards= as created (read only before its first reshard; default 16)")
    rs.add_argument("--prefix", default="redcount", help="key prefix of the counter (default redcount)")
    return p


def _read_token(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as e:
        raise ValueError(f"cannot read the token file {path}: {e.strerror}") from None
    if not token:
        raise ValueError(f"the token file {path} is empty")
    return token


def _run_serve(args: argparse.Namespace) -> int:
    try:
        import uvicorn

        from ..service import ServiceLimits, create_app
    except ImportError as e:
        missing = e.name or "fastapi"
        print(
            f"redcount serve: error: the HTTP service needs FastAPI and uvicorn ({missing} is not installed): "
            "pip install 'redcount[serve]'",
            file=sys.stderr,
        )
        return 2
    from .. import connect
    from ..errors import RedcountError

    if not 0 < args.port < 65536:
        raise ValueError(f"--port must be 1..65535, got {args.port}")
    token = _read_token(args.token_file) if args.token_file else None
    limits = ServiceLimits(max_body=args.max_body, max_batch=args.max_batch, max_delta=args.max_delta)
    store = connect(args.url)
    try:
        app = create_app(
            store,
            sql_url=args.sql,
            token=token,
            shards=args.shards,
            prefix=args.prefix,
            idempotency_ttl=args.idempotency_ttl,
            limits=limits,
        )
        if token is None:
            print("redcount serve: no --token-file: /adjust is disabled (403)", file=sys.stderr, flush=True)
        try:
            store.ping()
        except RedcountError as e:
            # Serve anyway: requests get 503 until the store is back, as after any outage.
            print(f"redcount serve: warning: the store does not answer yet ({e})", file=sys.stderr, flush=True)
        # One process: the app's counter cache and read caches live in it (and memory:// too).
        server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level))
        server.run()
    finally:
        store.close()
    return 0


def _ops_store(args: argparse.Namespace, *, repair: bool = False) -> Store:
    """The store of an operations command (flush, restore, reconcile, reshard): ``--url``, else
    ``$REDCOUNT_URL``; never a default. These commands act on counters that live on a Redis
    server; the in-process store of a command-line process is new and empty, so a default of
    memory:// would "restore" or "reshard" nothing and report success, and a repair would take
    the whole snapshot for drift. memory:// is used only when named, and then a repair (which
    writes corrections into the SQL audit log) is refused."""
    url = args.url if args.url else os.environ.get(URL_ENV, "")
    if not url:
        raise ValueError(
            f"--url is required (or set {URL_ENV}): {args.command} works on the Redis server that holds "
            "the counters (redis://host:6379/0)"
        )
    args.url = url  # what main() redacts from error messages
    from .. import connect

    store = connect(url)
    if store.url.startswith("memory:"):
        if repair:
            store.close()
            raise ValueError(
                f"{args.command} --repair refuses memory://: this process's in-process store holds none of "
                "the counters, so its corrections would be written to the SQL audit log for nothing"
            )
        print(
            f"redcount {args.command}: note: memory:// is this process's own in-process store, empty at "
            "start; what it holds is gone when the command exits",
            file=sys.stderr,
            flush=True,
        )
    return store


def _run_reshard(args: argparse.Namespace) -> int:
    from .. import ShardedCounter

    store = _ops_store(args)
    try:
        c = ShardedCounter(store, args.counter, shards=args.initial_shards, prefix=args.prefix)
        before = c.layout()
        after = c.reshard(args.shards)
        print(
            f"reshard {args.counter}: {before.current.count} -> {after.current.count} shards "
            f"(layout version {after.version}; "
            f"shards {after.current.first}..{after.total - 1} take the writes, "
            f"0..{after.current.first - 1} are frozen and still summed)"
        )
    finally:
        store.close()
    return 0


def _run_reconcile(args: argparse.Namespace) -> int:
    import time

    from .. import SnapshotStore, reconcile

    if args.every is not None and args.every <= 0:
        raise ValueError("--every must be > 0 seconds")
    store = _ops_store(args, repair=args.repair)
    try:
        snaps = SnapshotStore(args.sql, create=False)
    except BaseException:
        store.close()
        raise
    try:
        while True:
            names = args.counter or snaps.counters()
            if not names:
                raise ValueError(f"no counters in {snaps.url}: give --counter NAME")
            ok = True
            for name in names:
                rep = reconcile(store, snaps, name, threshold=args.threshold, repair=args.repair)
                print(rep.table(), flush=True)
                ok = ok and rep.ok
            if args.every is None:
                return 0 if ok else 1
            time.sleep(args.every)
    finally:
        snaps.close()
        store.close()


def _run_restore(args: argparse.Namespace) -> int:
    from .. import restore

    if not args.counter:
        raise ValueError("give at least one --counter NAME")
    store = _ops_store(args)
    try:
        for name in args.counter:
            rep = restore(store, args.sql, name)
            line = (
                f"restore {name}: {rep.total} = snapshot {rep.from_snapshot} + {rep.from_log} "
                f"from {rep.log_entries} log entries"
            )
            if rep.lost_streams:
                line += (
                    f"; the delta logs of shards {rep.lost_streams} were lost: deltas written after "
                    f"{rep.missing_since} ms (epoch) that were not flushed may be missing"
                )
            print(line)
    finally:
        store.close()
    return 0


def _run_flush(args: argparse.Namespace) -> int:
    from .. import Flusher

    if not args.counter:
        raise ValueError("give at least one --counter NAME")
    store = _ops_store(args)
    try:
        return _flush(args, store, Flusher)
    finally:
        store.close()


def _flush(args: argparse.Namespace, store: Store, flusher_class: type[Flusher]) -> int:
    import signal

    stop = threading.Event()
    # SIGTERM ends the loop after the batch in flight. The handler is put back afterwards, so
    # that a caller running this in-process (and processes it forks later, which inherit
    # handlers) keeps its own: a leftover handler that only sets an Event makes SIGTERM, and
    # so multiprocessing's Pool.terminate(), do nothing.
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        return _flush_until(args, store, flusher_class, stop)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _flush_until(args: argparse.Namespace, store: Store, flusher_class: type[Flusher],
                 stop: threading.Event) -> int:
    with flusher_class(
        store,
        args.sql,
        args.counter,
        prefix=args.prefix,
        shards=args.shards,
        group=args.group,
        consumer=args.consumer,
        batch=args.batch,
        claim_after=args.claim_after,
        progress=not args.quiet,
        retain=args.retain,
    ) as flusher:
        if not args.quiet:
            print(f"flush: started as {flusher.consumer}", file=sys.stderr, flush=True)
        if args.once:
            n = flusher.drain()
        else:
            try:
                flusher.run(stop)
            except KeyboardInterrupt:
                pass
            n = flusher.stats.applied + flusher.stats.skipped + flusher.stats.malformed
        st = flusher.stats
        lag = flusher.lag
        if not args.quiet:
            print(
                f"flush: done: {n} entries handled in all: applied {st.applied}, skipped {st.skipped} (already applied), "
                f"malformed {st.malformed}, claimed {st.claimed}, trimmed {st.trimmed}; "
                f"lag {lag.entries} entries, {lag.seconds:.1f} s",
                file=sys.stderr,
            )
        for bad in st.malformed_ids:
            print(f"flush: skipped malformed entry {bad}", file=sys.stderr)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from ..errors import RedcountError
    from .urls import redact

    try:
        if args.command == "demo":
            from .demo import run_demo

            return run_demo(args)
        if args.command == "accuracy":
            from .accuracy import run_accuracy

            return run_accuracy(args)
        if args.command == "abuse":
            from .abuse import run_abuse

            return run_abuse(args)
        if args.command == "flush":
            return _run_flush(args)
        if args.command == "restore":
            return _run_restore(args)
        if args.command == "reconcile":
            return _run_reconcile(args)
        if args.command == "serve":
            return _run_serve(args)
        if args.command == "reshard":
            return _run_reshard(args)
        if getattr(args, "target", None) == "web":
            from .bench.web import run_bench_web

            return run_bench_web(args)
        from .bench import run_bench

        return run_bench(args)
    except (RedcountError, ValueError) as e:
        # An error may quote the URL (or a part of it): never print its password.
        print(f"redcount {args.command}: error: {redact(str(e), getattr(args, 'url', None))}", file=sys.stderr)
        return 2
    except ImportError as e:
        # A missing optional dependency (SQLAlchemy for flush, restore and reconcile...): its
        # message says what to pip install; one line, not a traceback.
        message = str(e).strip().splitlines()[0] if str(e).strip() else f"cannot import {e.name}"
        print(f"redcount {args.command}: error: {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
