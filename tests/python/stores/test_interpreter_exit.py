"""The interpreter exits cleanly while daemon threads are inside redcount calls.

At interpreter exit CPython ends (3.8-3.13) or parks (3.14+) every daemon thread that tries
to take the GIL back. A thread that waits on the network, on the memory store's lock or on an
asyncio completion with the GIL released takes it back when the call returns, possibly after
finalization began: that must neither abort the process ("terminate called without an active
exception", exit status 134) nor hang it. Each run is a fresh interpreter whose daemon
threads loop on one kind of call while the main thread exits; its exit status must be 0, in
every one of RUNS runs, on the memory store and on a real redis-server. The interpreters are
forked from one that imported redcount once, so that 20 runs of each case take well under a
second; each exits through the interpreter's normal exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import RedisServer

RUNS = int(os.environ.get("REDCOUNT_EXIT_RUNS", "20"))

# Imports redcount once, then forks one child per run: the child starts daemon threads that
# loop on the call named `kind` on a store of its own, waits until each has completed one,
# and raises SystemExit, so that the interpreter's normal exit runs while they are inside
# calls. Prints the children's exit statuses (a child still alive after 30 s is killed and
# counted as "hung").
DRIVER = textwrap.dedent(
    """
    import asyncio, json, os, signal, sys, threading, time
    import redcount, redcount.aio as aio

    kind, url, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    sys.setswitchinterval(0.0005)  # three busy threads hand the GIL to the main thread sooner

    def calls(store):
        if kind == "ShardedCounter.incr":
            c = redcount.ShardedCounter(store, "exit-sharded", shards=4)
            return lambda: c.incr()
        if kind == "store.ping":
            return store.ping
        if kind == "store.execute":
            return lambda: store.execute("INCR", "exit-execute")
        if kind == "FixedWindowCounter.incr":
            c = redcount.FixedWindowCounter(store, "exit-fixed", 3600)
            return lambda: c.incr("k")
        if kind == "Limiter.hit":
            limiter = redcount.Limiter(store)
            return lambda: limiter.hit("1000000000/hour", "k")
        raise SystemExit(f"unknown kind {kind}")

    class NoReaderLoop(asyncio.SelectorEventLoop):
        def add_reader(self, *args, **kwargs):
            raise NotImplementedError  # woken through call_soon_threadsafe instead

    def call_forever(store, started):
        if kind.startswith("awaited"):
            astore = aio.AsyncStore(store)
            counter = aio.FixedWindowCounter(astore, "exit-aio", 3600)
            async def forever():
                await astore.ping()
                started.release()
                while True:
                    await astore.ping()
                    await counter.incr("k")
            loop = NoReaderLoop() if kind == "awaited (no add_reader)" else asyncio.new_event_loop()
            loop.run_until_complete(forever())
            return
        call = calls(store)
        call()
        started.release()
        while True:
            call()

    def child():
        store = redcount.connect(url)
        started = threading.Semaphore(0)
        threads = [threading.Thread(target=call_forever, args=(store, started), daemon=True)
                   for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            if not started.acquire(timeout=20):
                os._exit(5)  # a daemon thread never completed a call

    codes = []
    for _ in range(runs):
        pid = os.fork()
        if pid == 0:
            child()
            sys.exit(0)  # the interpreter's exit, with the daemon threads inside calls
        deadline = time.monotonic() + 30
        while True:
            got, status = os.waitpid(pid, os.WNOHANG)
            if got:
                codes.append(os.waitstatus_to_exitcode(status))
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                codes.append("hung")
                break
            time.sleep(0.002)
    print(json.dumps(codes))
    """
)

KINDS = ["ShardedCounter.incr", "store.ping", "store.execute", "FixedWindowCounter.incr", "Limiter.hit",
         "awaited", "awaited (no add_reader)"]
WHERE = ["memory", "redis"]


@pytest.fixture(scope="module")
def drivers(redis_server: RedisServer) -> dict[tuple[str, str], subprocess.CompletedProcess[str]]:
    """Every case's driver, two at a time (each is mostly interpreter exits, on 2 cores)."""

    def run(case: tuple[str, str]) -> subprocess.CompletedProcess[str]:
        kind, where = case
        url = "memory://" if where == "memory" else redis_server.url
        return subprocess.run([sys.executable, "-c", DRIVER, kind, url, str(RUNS)], capture_output=True,
                              text=True, timeout=RUNS * 30 + 60)

    cases = [(kind, where) for where in WHERE for kind in KINDS]
    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(zip(cases, pool.map(run, cases)))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("where", WHERE)
def test_exit_with_daemon_threads_inside_calls(
        kind: str, where: str, drivers: dict[tuple[str, str], subprocess.CompletedProcess[str]]) -> None:
    done = drivers[kind, where]
    assert done.returncode == 0, done.stderr[-2000:]
    codes = json.loads(done.stdout.strip().splitlines()[-1])
    failed = [c for c in codes if c != 0]
    assert not failed, f"{len(failed)} of {RUNS} runs exited with {failed[:5]}: {done.stderr[-600:]}"
