"""``redcount bench``: its arguments, the blocks it runs (``--only``), and the report."""

from __future__ import annotations

import argparse
import math
import os
import secrets
import shutil
import sys
from contextlib import ExitStack
from dataclasses import asdict

from ... import __version__
from ...counters import FixedWindowCounter
from ...store import connect
from ..servers import private_or_existing, sigterm_as_exit
from .engine import engine_block, engine_notes
from .fixed import fixed_block
from .harness import (
    BenchError,
    Contender,
    CpuProbe,
    RatioSpec,
    delete_keys,
    cluster_seed,
    find_server,
    is_cluster_url,
    progress,
    rounds,
    server_version,
)
from .hot import hot_block
from .redis_benchmark import benchmark_target, check_benchmark_auth, check_reachable
from .report import Report, json_ready, print_report, ratio, write_json
from .rows import INSTALL_LIMITS, INSTALL_REDIS, MANY_BIG, N_KEYS, RB_MANY_DEPTH, RB_PN, RC_MANY
from .sharded import sharded_block, sharded_notes
from .sliding import sliding_blocks

__all__ = ["ONLY", "run_bench"]

ONLY = ("all", "fixed", "sliding", "engine", "sharded", "hot", "cluster", "leased")
"""The values of ``--only``: every block, or one of them."""


def run_bench(args: argparse.Namespace) -> int:
    """Entry point of ``redcount bench``; returns the exit code."""
    try:
        import limits
        import limits.storage
        import limits.strategies
        import redis  # noqa: F401 - limits' RedisStorage needs it
    except ImportError as e:
        print(
            f"redcount bench: error: the comparison needs the `limits` library with Redis support "
            f"({e}); {INSTALL_LIMITS}",
            file=sys.stderr,
        )
        return 2

    seconds = float(args.seconds)
    batch = int(args.batch)
    only = str(getattr(args, "only", "all"))
    if not seconds > 0 or not math.isfinite(seconds):
        raise ValueError(f"--seconds must be > 0, got {args.seconds}")
    if batch < 1:
        raise ValueError(f"--batch must be >= 1, got {args.batch}")
    if only not in ONLY:
        raise ValueError(f"--only must be one of {', '.join(ONLY)}, got {only!r}")
    if only == "cluster":
        return _run_cluster(args, seconds)
    if only == "leased":
        return _run_leased(args, seconds)
    fixed, sliding = only in ("all", "fixed"), only in ("all", "sliding")
    engine = only in ("all", "engine")
    sharded = only in ("all", "sharded")
    hot = only in ("all", "hot")
    cluster = args.url is not None and is_cluster_url(str(args.url))
    if cluster:
        # The fixed, engine and sharded blocks compare against redis-benchmark on one server;
        # on a Redis Cluster the blocks that compare with limits (its cluster storage) run.
        if only in ("fixed", "engine", "sharded"):
            raise BenchError(
                f"--only {only} compares against redis-benchmark on one server; on a Redis Cluster "
                "(redis+cluster://) run --only sliding, --only hot or --only cluster (per-node CPU and projected "
                "scaling), or point --url at one node (redis://)"
            )
        fixed = engine = sharded = False

    bench_bin = ""  # only the fixed-window, engine and sharded measurements run redis-benchmark
    if fixed or engine or sharded:
        found = shutil.which(args.redis_benchmark)
        if found is None:
            raise BenchError(
                f"redis-benchmark not found (looked for {args.redis_benchmark!r}); {INSTALL_REDIS}, "
                f"or pass --redis-benchmark PATH"
            )
        bench_bin = found
    server_bin = find_server(args.redis_server) if args.url is None else None
    if args.url is not None and cluster:
        check_reachable(cluster_seed(str(args.url)))
    elif args.url is not None:
        benchmark_target(args.url)  # refuse what redis-benchmark and limits cannot use, up front
        check_reachable(args.url)  # an unreachable server is said so, before any child runs
        if fixed or engine or sharded:
            check_benchmark_auth(bench_bin, args.url)

    prefix = f"rcbench:{os.getpid()}:{secrets.token_hex(4)}"
    rb_key = f"{prefix}:rb:__rand_int__"
    n_keys = max(N_KEYS, batch)  # a batch never repeats a key
    keys = [f"user:{i}" for i in range(n_keys)]
    batches = [{keys[(j * batch + i) % n_keys]: 1 for i in range(batch)} for j in range(-(-n_keys // batch))]

    with (
        sigterm_as_exit(),
        private_or_existing(server_bin, args.url) as url,
        ExitStack() as engine_resources,
    ):
        store = connect(url)
        mem = connect()
        mem_sliding = connect()  # its own, so that its figures do not depend on --only
        try:
            store.ping()
            rep = Report(
                server=store.url,
                private_server=server_bin is not None,
                server_version=server_version(store),
                redcount_version=__version__,
                limits_version=str(getattr(limits, "__version__", "?")),
                seconds=seconds,
                batch=batch,
                keys=n_keys,
                key_prefix=prefix,
                only=only,
            )
            if cluster:
                rep.notes.append(
                    "Redis Cluster: the sliding and hot blocks only (the fixed, engine and sharded blocks "
                    "compare against redis-benchmark on one server); limits runs on its own cluster storage"
                )
            plan: list[Contender] = []
            ratios: list[RatioSpec] = []
            counters: list[FixedWindowCounter] = []
            if fixed:
                more, more_ratios, more_counters = fixed_block(
                    store, mem, url, prefix, keys, batches, batch, bench_bin, rb_key
                )
                plan += more
                ratios += more_ratios
                counters += more_counters
                batch_probe = CpuProbe(store)  # CPU per key of the large batch and its reference
                for measured in more:
                    if measured.name in (RC_MANY.format(batch=MANY_BIG), RB_PN.format(batch=RB_MANY_DEPTH)):
                        measured.probe = batch_probe
            if sliding:
                more, more_ratios = sliding_blocks(store, mem_sliding, url, prefix, keys)
                plan += more
                ratios += more_ratios
            if hot:
                more, more_ratios, more_counters = hot_block(engine_resources, store, url, prefix, keys)
                plan += more
                ratios += more_ratios
                counters += more_counters
            if engine:
                more, more_ratios, notes, probed = engine_block(
                    engine_resources, store, url, prefix, keys, bench_bin, rb_key, server_bin, {c.name for c in plan}
                )
                plan += more
                ratios += more_ratios
                rep.notes += notes
                probe = CpuProbe(store)
                for measured in plan:
                    if measured.name in probed:
                        measured.probe = probe
            if sharded:
                more, more_ratios = sharded_block(
                    engine_resources, store, url, prefix, keys, bench_bin, rb_key, {c.name for c in plan}
                )
                plan += more
                ratios += more_ratios

            turns = rounds(seconds)
            step = 0
            for r in range(1, turns + 1):
                for contender in plan:
                    step += 1
                    turn = f" (turn {r}/{turns})" if turns > 1 else ""
                    progress(step, turns * len(plan), contender.name + turn)
                    contender.run_slice(seconds / turns)
            rep.results = [c.result() for c in plan]
            rep.rounds = turns
            for c in counters:
                c.close()

            by_name = {r.name: r for r in rep.results}
            if engine:
                rep.notes += engine_notes(by_name)
            if sharded:
                notes, missed = sharded_notes(by_name, store, prefix, seconds)
                rep.notes += notes
                rep.missed_rates += missed
            rep.ratios = [ratio(by_name, *spec) for spec in ratios]
            print_report(rep)
            if args.json:
                write_json(args.json, json_ready(asdict(rep)))
        finally:
            try:
                engine_resources.close()  # the engine's loops, counters and TLS server, before the store
                if server_bin is None:  # our keys on someone's server: take them away
                    delete_keys(store, f"{prefix}:*")
                    delete_keys(store, f"{{{prefix}:*")  # sharded counters' keys start with their tag
            finally:
                store.close()
                mem.close()
                mem_sliding.close()
    return 0


def _run_leased(args: argparse.Namespace, seconds: float) -> int:
    """``--only leased``: a hot key with and without ``lease=`` (see leased.py)."""
    import json

    from .leased import leased_json, leased_lines, run_leased, run_leased_strategy

    server_bin = find_server(args.redis_server) if args.url is None else None
    if args.url is not None:
        check_reachable(args.url)
    prefix = f"rcbench:{os.getpid()}:{secrets.token_hex(4)}"
    with sigterm_as_exit(), private_or_existing(server_bin, args.url) as url:
        try:
            strategy = getattr(args, "strategy", None)
            rep = run_leased(url, prefix, seconds) if strategy is None else run_leased_strategy(url, prefix, seconds, strategy)
        finally:
            if server_bin is None:
                store = connect(url)
                try:
                    delete_keys(store, f"{prefix}:*")
                finally:
                    store.close()
        for line in leased_lines(rep):
            print(line)
        if args.json:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump({"only": "leased", **leased_json(rep)}, f, indent=2)
    return 0


def _run_cluster(args: argparse.Namespace, seconds: float) -> int:
    """``--only cluster``: the cluster at ``--url`` against a private server, in one run."""
    import json

    from .cluster import cluster_block, cluster_json, cluster_lines, delete_run_keys, per_node_block, per_node_lines

    url = args.url
    if url is None or "+cluster://" not in str(url):
        raise BenchError("--only cluster needs --url redis+cluster://host:port[,host:port...] (a running cluster)")
    server_bin = find_server(args.redis_server)
    prefix = f"rcbench:{os.getpid()}:{secrets.token_hex(4)}"
    keys = [f"user:{i}" for i in range(N_KEYS)]
    with sigterm_as_exit(), private_or_existing(server_bin, None) as single_url:
        cluster, single = connect(url), connect(single_url)
        try:
            cluster.ping()
            workloads = cluster_block(cluster, single, prefix, keys, seconds)
            alone = per_node_block(cluster, single, prefix, keys, seconds)
            for line in cluster_lines(workloads) + per_node_lines(alone, workloads[0].cluster.busiest):
                print(line)
            if args.json:
                per_node = [
                    {"address": a.address, "server_us": a.node.server_us, "single_server_us": a.single.server_us,
                     "calls": a.node.calls, "command_usec_per_call": a.node_usec / a.node.calls if a.node.calls else 0.0,
                     "single_command_usec_per_call": a.single_usec / a.single.calls if a.single.calls else 0.0}
                    for a in alone
                ]
                with open(args.json, "w", encoding="utf-8") as f:
                    json.dump({"only": "cluster", "seconds": seconds, "workloads": cluster_json(workloads),
                               "per_node": per_node}, f, indent=2)
        finally:
            try:
                delete_run_keys(cluster, prefix)
            finally:
                cluster.close()
                single.close()
    return 0
