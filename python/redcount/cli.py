"""The ``redcount`` command: ``redcount demo`` and ``redcount bench``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="redcount", description="Counters and rate limiters on Redis or in memory.")
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

    b = sub.add_parser("bench", help="measure throughput against limits and redis-benchmark")
    b.add_argument("--url", default=None, help="an existing redis:// server (default: start a private one)")
    b.add_argument("--seconds", type=float, default=2.0, help="seconds per measurement (default 2)")
    b.add_argument("--batch", type=int, default=128, help="incr_many batch size (default 128)")
    b.add_argument("--redis-server", default="redis-server", help="redis-server binary to start")
    b.add_argument("--redis-benchmark", default="redis-benchmark", help="redis-benchmark binary")
    b.add_argument("--json", default=None, help="also write the figures to this JSON file")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from .errors import RedcountError

    try:
        if args.command == "demo":
            from .demo import run_demo

            return run_demo(args)
        from .bench import run_bench

        return run_bench(args)
    except (RedcountError, ValueError) as e:
        print(f"redcount {args.command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
