"""The engine (``--only engine``): threads, coroutines and TLS sharing one store, against
``redis-benchmark`` with as many clients and ``limits``' async Redis storage."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Sequence
from contextlib import ExitStack
from functools import partial
from typing import Any

from ...counters import FixedWindowCounter
from ...limiter import Limiter
from ...store import Store, connect
from ..servers import RedisServer, ServerError, make_certs
from .harness import AsyncHits, Contender, PythonOp, RatioSpec, Threads
from .redis_benchmark import RedisBenchmark
from .report import Result
from .rows import (
    BIG_LIMIT,
    COUNTER_WINDOW,
    LIM_AIO,
    RB_C8,
    RC_AIO,
    RC_AIO_UVLOOP,
    RC_HIT_REDIS,
    RC_INCR,
    RC_INCR_THREADS,
    RC_INCR_THREADS_TC,
    RC_INCR_TLS,
    TASKS,
    THREADS,
)

# limits 4+ picks coredis for async+redis:// unless told; the comparison is with redis-py's
# asyncio client.
LIMITS_ASYNC_OPTIONS: dict[str, Any] = {"implementation": "redispy"}


async def _aclose_limits(storage: object) -> None:
    """Close the redis-py client inside limits' async storage on its own loop (else its
    connections are torn down by the garbage collector after the loop is gone)."""
    client = getattr(getattr(storage, "bridge", None), "storage", None)
    aclose = getattr(client, "aclose", None)
    if aclose is not None:
        await aclose()


def engine_block(
    stack: ExitStack,
    store: Store,
    url: str,
    prefix: str,
    keys: Sequence[str],
    bench_bin: str,
    rb_key: str,
    server_bin: str | None,
    have: set[str],
) -> tuple[list[Contender], list[RatioSpec], list[str], set[str]]:
    """The engine's contenders (threads, coroutines, TLS), their ratios and notes, and the
    rows whose CPU per op is measured (those on ``store``'s server).

    ``have`` names the rows already planned (the fixed-window block's single-thread rows,
    which serve as denominators here too); resources to release go on ``stack``."""
    import limits
    import limits.aio.strategies
    import limits.storage

    notes: list[str] = []
    counter = FixedWindowCounter(store, "incr", COUNTER_WINDOW, prefix=prefix)
    stack.callback(counter.close)
    limiter = Limiter(store, prefix=f"{prefix}:lim")
    rb_c8 = RB_C8.format(threads=THREADS)
    threads = RC_INCR_THREADS.format(threads=THREADS)
    # The same store shape with thread connections allowed: each blocking caller that finds
    # the multiplexed connection busy may borrow a socket of its own (see connect()).
    tc_store = connect(url, max_connections=1 + THREADS)
    stack.callback(tc_store.close)
    tc_counter = FixedWindowCounter(tc_store, "incr", COUNTER_WINDOW, prefix=prefix)
    stack.callback(tc_counter.close)
    threads_tc = RC_INCR_THREADS_TC.format(threads=THREADS, cap=1 + THREADS)
    contenders: list[Contender] = [
        RedisBenchmark(rb_c8, bench_bin, url, 1, rb_key, clients=THREADS),
        Threads(threads, counter.incr, keys, THREADS),
        Threads(threads_tc, tc_counter.incr, keys, THREADS),
    ]
    if RC_INCR not in have:
        contenders.append(PythonOp(RC_INCR, counter.incr, keys))

    # asyncio: limits' async Redis storage (redis-py) against redcount.aio on the same server.
    from ... import aio

    item = limits.parse(BIG_LIMIT)
    storage = limits.storage.storage_from_string(
        f"async+{url}", key_prefix=f"{prefix}:limits-aio", **LIMITS_ASYNC_OPTIONS
    )
    lim_aio = limits.aio.strategies.FixedWindowRateLimiter(storage)
    rc_aio = aio.Limiter(store, "fixed-window", prefix=f"{prefix}:lim")
    lim_name, rc_name = LIM_AIO.format(tasks=TASKS), RC_AIO.format(tasks=TASKS)
    lim_loop = AsyncHits(lim_name, partial(lim_aio.hit, item), keys, TASKS, cleanup=partial(_aclose_limits, storage))
    rc_loop = AsyncHits(rc_name, partial(rc_aio.hit, BIG_LIMIT), keys, TASKS)
    stack.callback(lim_loop.close)
    stack.callback(rc_loop.close)
    contenders += [lim_loop, rc_loop]
    if RC_HIT_REDIS not in have:
        contenders.append(PythonOp(RC_HIT_REDIS, partial(limiter.hit, BIG_LIMIT), keys))
    ratios: list[RatioSpec] = [
        (f"redcount incr x{THREADS} threads, thread connections / redis-benchmark -c{THREADS} -P1", threads_tc, rb_c8, 1.3),
        (f"redcount incr x{THREADS} threads, thread connections / x1 thread (Redis)", threads_tc, RC_INCR, 6.0),
        (f"redcount aio hit / limits async hit, x{TASKS} coroutines (Redis)", rc_name, lim_name, 8.0),
        (f"redcount aio hit x{TASKS} coroutines / sync Limiter.hit x1 thread (Redis)", rc_name, RC_HIT_REDIS, 4.0),
        (f"redcount incr x{THREADS} threads, one socket / redis-benchmark -c{THREADS} -P1", threads, rb_c8, None),
        (f"redcount incr x{THREADS} threads, one socket / x1 thread (Redis)", threads, RC_INCR, None),
    ]
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]  # noqa: F401 - optional
    except ImportError:
        notes.append("uvloop is not installed: no uvloop row (pip install uvloop)")
    else:
        uv_name = RC_AIO_UVLOOP.format(tasks=TASKS)
        uv_loop = AsyncHits(uv_name, partial(rc_aio.hit, BIG_LIMIT), keys, TASKS, uvloop=True)
        stack.callback(uv_loop.close)
        contenders.append(uv_loop)
        ratios.append(("redcount aio hit: uvloop / asyncio's default loop", uv_name, rc_name, None))

    # TLS: a second private server that speaks only TLS, with throw-away certificates.
    if server_bin is None:
        notes.append("no TLS row: it needs a private server (leave out --url)")
    else:
        try:
            certs = make_certs(stack.enter_context(tempfile.TemporaryDirectory(prefix="redcount-bench-tls-")))
            tls_url = stack.enter_context(RedisServer(server_bin, tls=certs, new_session=True, die_with_owner=True)).url
        except ServerError as e:
            notes.append(f"no TLS row: {e}")
        else:
            tls_store = connect(tls_url, ssl_ca_certs=certs.ca)
            stack.callback(tls_store.close)
            tls_counter = FixedWindowCounter(tls_store, "incr", COUNTER_WINDOW, prefix=prefix)
            stack.callback(tls_counter.close)
            contenders.append(PythonOp(RC_INCR_TLS, tls_counter.incr, keys))
            ratios.append(("redcount incr rediss:// / redis:// (one thread)", RC_INCR_TLS, RC_INCR, None))
    probed = {rb_c8, threads, threads_tc, RC_INCR, lim_name, rc_name, RC_HIT_REDIS}
    return contenders, ratios, notes, probed


def cpu_bound(by_name: dict[str, Result]) -> list[str]:
    """What the 8-thread targets ask of each call's CPU, against what a call costs here.

    Calls that wait for their reply one at a time cost CPU on both sides (the client's
    syscalls and wake-ups, the server's); at a given rate, this machine's CPUs leave so many
    microseconds for each. The note sets that budget next to the measured cost of a call
    from one thread and of redis-benchmark's C client at the same concurrency."""
    single, rb = by_name.get(RC_INCR), by_name.get(RB_C8.format(threads=THREADS))
    tc = by_name.get(RC_INCR_THREADS_TC.format(threads=THREADS, cap=1 + THREADS))
    rows = [r for r in (single, rb, tc) if r is not None]
    if single is None or rb is None or any(r.cpu_client_us is None or r.cpu_server_us is None for r in rows):
        return []
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)

    def cost(r: Result) -> str:
        c, sv = r.cpu_client_us or 0.0, r.cpu_server_us or 0.0
        return f"{r.name} {c + sv:.1f} us ({c:.1f} client + {sv:.1f} server)"

    notes = ["CPU per call, measured: " + "; ".join(cost(r) for r in rows)]
    for what, rate in (("6x one thread", 6 * single.ops_per_sec), ("1.3x redis-benchmark", 1.3 * rb.ops_per_sec)):
        if rate > 0:
            notes.append(
                f"at {what} ({rate:,.0f} calls/s) this machine's {cpus} CPU(s) leave {cpus / rate * 1e6:.1f} us "
                "of CPU per call, client and server together"
            )
    return notes



def engine_notes(by_name: dict[str, Result]) -> list[str]:
    """The engine block's notes on the measured rows: the single-thread figure to compare
    across builds, and the CPU budget per call (:func:`cpu_bound`)."""
    single = by_name[RC_INCR]
    return [
        f"single thread, no regression: {RC_INCR} {single.ops_per_sec:,.0f} ops/s "
        "in this run; compare with docs/benchmarks.md's figures on the same machine",
        *cpu_bound(by_name),
    ]
