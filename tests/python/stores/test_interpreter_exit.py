"""The interpreter exits cleanly while daemon threads are inside redcount calls.

At interpreter exit CPython ends (3.8-3.13) or parks (3.14+) every daemon thread that tries
to take the GIL back. A thread that waits on the network, on the memory store's lock or on an
asyncio completion with the GIL released takes it back when the call returns, possibly after
finalization began: that must neither abort the process ("terminate called without an active
exception", exit status 134) nor hang it. Each case runs a fresh interpreter whose daemon
threads loop on one kind of call while the main thread returns; its exit status must be 0,
in every one of RUNS runs, on the memory store and on a real redis-server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor

import pytest
from conftest import RedisServer

RUNS = int(os.environ.get("REDCOUNT_EXIT_RUNS", "20"))

# The child: `kind` names the call its daemon threads loop on; `url` the store.
CHILD = textwrap.dedent(
    """
    import asyncio, sys, threading
    import redcount, redcount.aio as aio

    kind, url = sys.argv[1], sys.argv[2]
    store = redcount.connect(url)
    started = threading.Semaphore(0)

    def call_forever():
        if kind == "ShardedCounter.incr":
            c = redcount.ShardedCounter(store, "exit-sharded", shards=4)
            call = lambda: c.incr()
        elif kind == "store.ping":
            call = store.ping
        elif kind == "store.execute":
            call = lambda: store.execute("INCR", "exit-execute")
        elif kind == "FixedWindowCounter.incr":
            c = redcount.FixedWindowCounter(store, "exit-fixed", 3600)
            call = lambda: c.incr("k")
        elif kind == "Limiter.hit":
            limiter = redcount.Limiter(store)
            call = lambda: limiter.hit("1000000000/hour", "k")
        elif kind == "awaited":
            astore = aio.AsyncStore(store)
            counter = aio.FixedWindowCounter(astore, "exit-aio", 3600)
            async def forever():
                first = True
                while True:
                    await astore.ping()
                    await counter.incr("k")
                    if first:
                        started.release()
                        first = False
            asyncio.run(forever())
            return
        else:
            raise SystemExit(f"unknown kind {kind}")
        call()
        started.release()
        while True:
            call()

    threads = [threading.Thread(target=call_forever, daemon=True) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        if not started.acquire(timeout=30):
            raise SystemExit("a daemon thread never completed a call")
    # Returning now: finalization begins while the threads are inside calls.
    """
)

KINDS = ["ShardedCounter.incr", "store.ping", "store.execute", "FixedWindowCounter.incr", "Limiter.hit", "awaited"]


def run_child(kind: str, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHILD, kind, url], capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("where", ["memory", "redis"])
def test_exit_with_daemon_threads_inside_calls(kind: str, where: str, redis_server: RedisServer) -> None:
    url = "memory://" if where == "memory" else redis_server.url
    # Two children at a time: each is mostly interpreter start-up, on 2 cores.
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda _: run_child(kind, url), range(RUNS)))
    failures = [(r.returncode, r.stderr[-400:]) for r in results if r.returncode != 0]
    assert not failures, f"{len(failures)} of {RUNS} runs did not exit with status 0; first: {failures[0]}"
