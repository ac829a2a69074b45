"""Daemon threads, forks and event-loop lifetimes, together, for a bounded time.

One interpreter keeps daemon threads inside calls of every kind (sync counters, limiters,
sharded counters and raw commands; awaited calls on loops that end while calls are still in
flight) on the memory store and on a real redis-server, and meanwhile forks children that
use the parent's stores, start daemon threads of their own and exit while those are inside
calls. Every child must exit with status 0, the parent too (it returns with its daemon
threads still busy), and the loops that ended must all be freed with their fds.

CI runs it for STRESS_SECONDS (3 s by default); ``REDCOUNT_STRESS_SECONDS=600`` soaks it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

from conftest import RedisServer

STRESS_SECONDS = float(os.environ.get("REDCOUNT_STRESS_SECONDS", "3"))

DRIVER = textwrap.dedent(
    """
    import asyncio, gc, os, random, sys, threading, time, weakref
    import redcount, redcount.aio as aio

    url, seconds = sys.argv[1], float(sys.argv[2])
    stores = [redcount.connect("memory://"), redcount.connect(url)]

    def sync_calls(store):
        sharded = redcount.ShardedCounter(store, "stress-sharded", shards=4)
        counter = redcount.FixedWindowCounter(store, "stress-fixed", 3600)
        limiter = redcount.Limiter(store)
        return [
            lambda: sharded.incr(),
            store.ping,
            lambda: store.execute("INCR", "stress-execute"),
            lambda: counter.incr(random.choice("abc")),
            lambda: limiter.hit("1000000000/hour", "k"),
        ]

    def hammer(store):
        calls = sync_calls(store)
        while True:
            random.choice(calls)()

    loops = []

    def loops_ending_in_flight(store):
        astore = aio.AsyncStore(store)
        counter = aio.FixedWindowCounter(astore, "stress-aio", 3600)
        async def one_run():
            loops.append(weakref.ref(asyncio.get_running_loop()))
            await astore.ping()
            tasks = [asyncio.ensure_future(counter.incr("k")) for _ in range(random.randint(1, 8))]
            await asyncio.sleep(0)
            try:  # often gives up while calls are in flight; asyncio.run cancels the rest
                await asyncio.wait_for(astore.ping(), random.choice([0, 0.0001, 0.01]))
            except asyncio.TimeoutError:
                pass
            tasks[0].cancel()
        while True:
            asyncio.run(one_run())

    def start_daemons():
        for store in stores:
            threading.Thread(target=hammer, args=(store,), daemon=True).start()
            threading.Thread(target=loops_ending_in_flight, args=(store,), daemon=True).start()

    def fd_count():
        return len(os.listdir("/proc/self/fd"))

    start_daemons()
    time.sleep(0.05)
    fds_at_start = fd_count()
    deadline = time.monotonic() + seconds
    children = 0
    while time.monotonic() < deadline:
        pid = os.fork()
        if pid == 0:
            # The child: the parent's stores still work; daemon threads of its own are
            # inside calls when it exits, through the interpreter's normal exit.
            ok = stores[0].ping() and stores[1].ping()
            counter = redcount.FixedWindowCounter(stores[1], "stress-child", 3600)
            ok = ok and counter.incr("k") >= 1
            async def child_calls():
                return await aio.AsyncStore(stores[1]).ping()
            ok = ok and asyncio.run(child_calls())
            start_daemons()
            time.sleep(random.choice([0, 0.001, 0.01]))
            sys.exit(0 if ok else 3)
        got, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        if code != 0:
            print(f"a forked child exited with {code}", flush=True)
            sys.exit(1)
        children += 1
    # The loops that ended are freed, with their fds (one may still be running).
    time.sleep(0.05)
    gc.collect()
    alive = sum(1 for r in loops if r() is not None)
    if alive > 4 or fd_count() > fds_at_start + 12:
        print(f"{alive} of {len(loops)} loops alive, fds {fds_at_start} -> {fd_count()}", flush=True)
        sys.exit(1)
    print(f"ok {children} children, {len(loops)} loops", flush=True)
    # Returning with the daemon threads inside calls.
    """
)


def test_daemon_threads_forks_and_loop_lifetimes(redis_server: RedisServer) -> None:
    done = subprocess.run([sys.executable, "-c", DRIVER, redis_server.url, str(STRESS_SECONDS)],
                          capture_output=True, text=True, timeout=STRESS_SECONDS + 120)
    assert done.returncode == 0, f"exit status {done.returncode}: {done.stdout[-500:]} {done.stderr[-1500:]}"
    assert done.stdout.startswith("ok"), done.stdout
