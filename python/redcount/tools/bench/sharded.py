"""Sharded counters (``--only sharded``): ``ShardedCounter.incr`` with a request id per call,
``incr_many`` over many counters, ``BufferedCounter.incr``, and ``value()`` latency against
the shard count."""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack

from ...counters import FixedWindowCounter
from ...sharded import BufferedCounter, ShardedCounter
from ...store import Store, connect
from .harness import Contender, PythonOp, RatioSpec, Threads, Tight, percentile
from .redis_benchmark import RedisBenchmark
from .report import Result
from .rows import (
    BUF_TARGET,
    COUNTER_WINDOW,
    RB_C8,
    RB_P1,
    RC_BUF,
    RC_INCR,
    RC_INCR_THREADS,
    RC_SH_INCR,
    RC_SH_INCR_THREADS,
    RC_SH_MANY,
    RC_SH_MANY_THREADS,
    SH_LATENCY_SHARDS,
    SH_MANY,
    SH_MANY_TARGET,
    THREADS,
)


def sharded_block(
    stack: ExitStack,
    store: Store,
    url: str,
    prefix: str,
    keys: Sequence[str],
    bench_bin: str,
    rb_key: str,
    have: set[str],
) -> tuple[list[Contender], list[RatioSpec]]:
    """The sharded-counter contenders and their ratios; ``have`` names rows already planned
    (the plain ``incr`` and redis-benchmark rows of the other groups serve here too)."""
    fresh = itertools.count()  # next() is atomic under the GIL: every call gets its own id
    sharded = ShardedCounter(store, "sh", shards=16, prefix=prefix)
    stack.callback(sharded.close)

    def incr_new_id(_key: str) -> bool:
        return sharded.incr(request_id=f"b{next(fresh)}")

    names = [f"sh{i}" for i in range(SH_MANY)]

    def incr_many_new_ids(_key: str) -> bool:
        j = next(fresh)
        return all(sharded.incr_many([(n, 1, f"m{j}:{i}") for i, n in enumerate(names)]))

    mem = connect()
    stack.callback(mem.close)
    buffered = BufferedCounter(ShardedCounter(mem, "buf", prefix=prefix))
    stack.callback(buffered.close)

    plain = FixedWindowCounter(store, "incr", COUNTER_WINDOW, prefix=prefix)
    stack.callback(plain.close)
    rb_c8 = RB_C8.format(threads=THREADS)
    plain_threads = RC_INCR_THREADS.format(threads=THREADS)
    sh_threads = RC_SH_INCR_THREADS.format(threads=THREADS)
    sh_many = RC_SH_MANY.format(n=SH_MANY)
    sh_many_threads = RC_SH_MANY_THREADS.format(n=SH_MANY, threads=THREADS)
    contenders: list[Contender] = []
    if RB_P1 not in have:
        contenders.append(RedisBenchmark(RB_P1, bench_bin, url, 1, rb_key))
    if RC_INCR not in have:
        contenders.append(PythonOp(RC_INCR, plain.incr, keys))
    contenders.append(PythonOp(RC_SH_INCR, incr_new_id, keys))
    if rb_c8 not in have:
        contenders.append(RedisBenchmark(rb_c8, bench_bin, url, 1, rb_key, clients=THREADS))
    if plain_threads not in have:
        contenders.append(Threads(plain_threads, plain.incr, keys, THREADS))
    contenders += [
        Threads(sh_threads, incr_new_id, keys, THREADS),
        PythonOp(sh_many, incr_many_new_ids, keys[:100], per_call=SH_MANY),
        Threads(sh_many_threads, incr_many_new_ids, keys[:100], THREADS, per_call=SH_MANY),
        Tight(RC_BUF, buffered.incr),
    ]
    ratios: list[RatioSpec] = [
        ("sharded incr with request ids / plain incr (Redis, 1 thread)", RC_SH_INCR, RC_INCR, None),
        ("sharded incr with request ids / redis-benchmark -c1 -P1", RC_SH_INCR, RB_P1, None),
        (f"sharded incr with request ids x{THREADS} / plain incr x{THREADS} threads", sh_threads, plain_threads, None),
        (f"sharded incr with request ids x{THREADS} / redis-benchmark -c{THREADS} -P1", sh_threads, rb_c8, None),
    ]
    return contenders, ratios


def value_latency(store: Store, prefix: str, seconds: float) -> list[str]:
    """``value()`` latency p50/p99 per shard count, idle and while 8 threads write; as notes."""
    notes = []
    calls = max(200, int(seconds * 400))
    for shards in SH_LATENCY_SHARDS:
        counter = ShardedCounter(store, f"lat{shards}", shards=shards, prefix=prefix)
        for i in range(shards):
            counter.incr(1, request_id=f"seed{i}")
        figures = []
        for busy in (False, True):
            stop = threading.Event()
            writer = ShardedCounter(store, f"lat-w{shards}", shards=shards, prefix=prefix)

            def write(w: ShardedCounter = writer) -> None:
                while not stop.is_set():
                    w.incr()

            writers = [threading.Thread(target=write, daemon=True) for _ in range(THREADS if busy else 0)]
            for t in writers:
                t.start()
            lat = []
            for _ in range(calls):
                t0 = time.perf_counter()
                counter.value()
                lat.append((time.perf_counter() - t0) * 1e6)
            stop.set()
            for t in writers:
                t.join()
            lat.sort()
            figures.append(f"p50 {percentile(lat, 0.5):,.0f} us, p99 {percentile(lat, 0.99):,.0f} us")
        notes.append(
            f"sharded value() with {shards} shards: {figures[0]} idle; {figures[1]} "
            f"while {THREADS} threads write ({calls} calls each)"
        )
    return notes



def sharded_notes(by_name: dict[str, Result], store: Store, prefix: str, seconds: float) -> tuple[list[str], list[str]]:
    """The sharded block's notes (the absolute rate targets, met or not, and ``value()``
    latency, measured now) and the rate targets missed."""
    notes: list[str] = []
    missed: list[str] = []
    many = by_name[RC_SH_MANY_THREADS.format(n=SH_MANY, threads=THREADS)]
    one = by_name[RC_SH_MANY.format(n=SH_MANY)]
    buf = by_name[RC_BUF]
    notes.append(f"incr_many from one thread: {one.ops_per_sec:,.0f} applied increments/s")
    for what, row, target, unit in (
        (f"incr_many, one process ({THREADS} threads)", many, SH_MANY_TARGET, "applied increments/s"),
        ("BufferedCounter.incr", buf, BUF_TARGET, "calls/s"),
    ):
        verdict = "met" if row.ops_per_sec >= target else "not met"  # not PASS/MISS: ratios only
        if verdict == "not met":
            missed.append(what)
        notes.append(f"{what}: {row.ops_per_sec:,.0f} {unit} (target >= {target:,.0f}): {verdict}")
    notes += value_latency(store, prefix, seconds)
    return notes, missed
