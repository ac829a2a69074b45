"""The engine (``--only engine``): threads, coroutines and TLS sharing one store, against
``redis-benchmark`` with as many clients and ``limits``' async Redis storage."""

from __future__ import annotations

import os
import statistics
import tempfile
import time
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
    RC_INCR_NO_SPIN,
    RC_INCR_THREADS,
    RC_INCR_THREADS_ONE,
    RC_INCR_THREADS_TC,
    RC_INCR_TLS,
    TASKS,
    THREAD_COUNTS,
    THREADS,
)

QUIET_BUSY = 0.10
"""The machine counts as quiet when, with this process idle, the other processes keep less
than this share of its CPUs busy."""
THREAD_TARGETS = {1: 0.9, THREADS: 0.75, 32: 0.75}
"""Targets on a quiet machine: the default store from n threads against redis-benchmark -c n."""


def _cpu_busy(seconds: float) -> float | None:
    """The share of all CPUs busy over ``seconds`` (from /proc/stat; None where there is none)."""

    def sample() -> tuple[int, int] | None:
        try:
            with open("/proc/stat", encoding="ascii") as f:
                fields = [int(x) for x in f.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0)  # idle + iowait
        return sum(fields[:8]), idle

    a = sample()
    time.sleep(seconds)
    b = sample()
    if a is None or b is None or b[0] <= a[0]:
        return None
    return 1.0 - (b[1] - a[1]) / (b[0] - a[0])


def quiet_check(store: Store) -> list[str]:
    """Whether the machine is quiet enough for the thread rows to mean what they say on an
    idle machine, and the idle round trip (one thread, one PING at a time): the floor under a
    synchronous call. A busy machine is said so, not refused: the rows still compare
    contenders measured in turns under the same conditions."""
    busy = _cpu_busy(0.5)
    rtts = []
    for _ in range(300):
        t0 = time.perf_counter()
        store.execute("PING")
        rtts.append(time.perf_counter() - t0)
    rtt = statistics.median(rtts[50:]) * 1e6
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    seen = "unknown" if busy is None else f"{busy:.0%}"
    state = (
        "quiet"
        if busy is not None and busy < QUIET_BUSY
        else "NOT quiet: other processes are running, so the thread rows are not the idle-machine figures"
    )
    return [
        f"machine check before the engine rows: {state} (CPUs busy while idle here {seen}, load average "
        f"{load:.2f} on {cpus} CPU(s)); idle round trip {rtt:.0f} us (median PING from one thread)"
    ]

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

    notes: list[str] = quiet_check(store)
    counter = FixedWindowCounter(store, "incr", COUNTER_WINDOW, prefix=prefix)
    stack.callback(counter.close)
    limiter = Limiter(store, prefix=f"{prefix}:lim")
    rb_c8 = RB_C8.format(threads=THREADS)
    threads = RC_INCR_THREADS.format(threads=THREADS)
    threads_tc = RC_INCR_THREADS_TC.format(threads=THREADS, cap=1 + THREADS)
    contenders: list[Contender] = []
    thread_ratios: list[RatioSpec] = []
    probed: set[str] = set()
    for n in THREAD_COUNTS:
        rb_n = RB_C8.format(threads=n)
        if rb_n not in have:
            contenders.append(RedisBenchmark(rb_n, bench_bin, url, 1, rb_key, clients=n))
        # The default store (up to 16 thread connections; a lone caller polls before it sleeps).
        default = RC_INCR_THREADS.format(threads=n)
        contenders.append(Threads(default, counter.incr, keys, n))
        # Every caller on the one multiplexed socket (the I/O thread writes and reads for all),
        # and a thread connection for every thread (each waits in its own recv()).
        one = RC_INCR_THREADS_ONE.format(threads=n)
        tc = RC_INCR_THREADS_TC.format(threads=n, cap=1 + n)
        for name, cap in ((one, 1), (tc, 1 + n)):
            shaped = connect(url, max_connections=cap)
            stack.callback(shaped.close)
            shaped_counter = FixedWindowCounter(shaped, "incr", COUNTER_WINDOW, prefix=prefix)
            stack.callback(shaped_counter.close)
            contenders.append(Threads(name, shaped_counter.incr, keys, n))
        probed |= {rb_n, default, one, tc}
        thread_ratios += [
            (f"redcount incr x{n} threads, default store / redis-benchmark -c{n} -P1", default, rb_n,
             THREAD_TARGETS.get(n)),
            (f"redcount incr x{n} threads, one socket / redis-benchmark -c{n} -P1", one, rb_n, None),
            (f"redcount incr x{n} threads, thread connections / redis-benchmark -c{n} -P1", tc, rb_n,
             1.3 if n == THREADS else None),
        ]
        if n == 1:
            # The poll before sleeping, against the same store without it (spin=0).
            still = connect(url, spin=0)
            stack.callback(still.close)
            still_counter = FixedWindowCounter(still, "incr", COUNTER_WINDOW, prefix=prefix)
            stack.callback(still_counter.close)
            contenders.append(Threads(RC_INCR_NO_SPIN, still_counter.incr, keys, 1))
            probed.add(RC_INCR_NO_SPIN)
            thread_ratios.append(("redcount incr x1 thread: default / spin=0", default, RC_INCR_NO_SPIN, None))
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
        *thread_ratios,
        (f"redcount incr x{THREADS} threads, thread connections / x1 thread (Redis)", threads_tc, RC_INCR, 6.0),
        (f"redcount aio hit / limits async hit, x{TASKS} coroutines (Redis)", rc_name, lim_name, 8.0),
        (f"redcount aio hit x{TASKS} coroutines / sync Limiter.hit x1 thread (Redis)", rc_name, RC_HIT_REDIS, 4.0),
        (f"redcount incr x{THREADS} threads, default store / x1 thread (Redis)", threads, RC_INCR, None),
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
    probed |= {rb_c8, threads, threads_tc, RC_INCR, lim_name, rc_name, RC_HIT_REDIS}
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
    across builds, and the CPU budget per call (`cpu_bound`)."""
    single = by_name[RC_INCR]
    return [
        f"single thread, no regression: {RC_INCR} {single.ops_per_sec:,.0f} ops/s "
        "in this run; compare with docs/benchmarks.md's figures on the same machine",
        *cpu_bound(by_name),
    ]
