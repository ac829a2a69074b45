"""The threads redcount starts take no asynchronous signal, so that SIGINT (Ctrl-C) and
SIGTERM reach the application's threads: a Python process runs its handlers, and has its
blocking calls interrupted, only in the main thread. Had the kernel picked one of redcount's
threads for a SIGINT, a main thread in ``time.sleep`` would wait out its sleep first."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest
from redcount.tools.servers import RedisServer

pytestmark = pytest.mark.redis_only

# Starts every kind of thread the core has (a server's engine and its timer, the memory
# store's sweeper, the lease table's sweeper and its SIGTERM hand-off, a buffered counter's
# flusher, a retry queue), then prints each thread's blocked-signal mask.
CHILD = textwrap.dedent(
    """
    import os, sys
    import redcount

    store = redcount.connect(sys.argv[1])
    store.execute("PING")
    memory = redcount.connect("memory://")
    limiter = redcount.Limiter(store, prefix="sigmask", lease_ttl=1)
    assert limiter.hit("20/hour", "k", lease=5)
    buffered = redcount.BufferedCounter(redcount.ShardedCounter(store, "sigmask", shards=2), flush_every=0.05)
    buffered.incr()
    dead = redcount.connect(sys.argv[2], connect_timeout=0.2, command_timeout=0.2)
    queued = redcount.FixedWindowCounter(dead, "sigmask", 3600, on_error="queue")
    queued.incr("k")  # fails, and starts the retry queue's thread
    import time

    def mask(tid):
        with open(f"/proc/{me}/task/{tid}/status") as f:
            return int(next(line for line in f if line.startswith("SigBlk:")).split()[1], 16)

    me = os.getpid()
    for tid in sorted(os.listdir(f"/proc/{me}/task")):
        try:
            blocked = mask(tid)
            # glibc starts a thread with every signal blocked and sets the mask its creator
            # gave it a moment later: a thread caught in between is read again.
            for _ in range(500):
                if blocked & (1 << (11 - 1)) == 0:  # SIGSEGV open: the thread's own mask
                    break
                time.sleep(0.01)
                blocked = mask(tid)
        except FileNotFoundError:
            continue  # a short-lived thread that ended meanwhile
        print(int(tid == str(me)), format(blocked, "x"), flush=True)
    os._exit(0)
    """
)


def test_every_thread_redcount_starts_blocks_sigint_and_sigterm(redis_server: RedisServer) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    dead = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    out = subprocess.run(
        [sys.executable, "-c", CHILD, redis_server.url, dead], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    threads = [(line.split()[0] == "1", int(line.split()[1], 16)) for line in out.stdout.splitlines()]
    ours = [mask for main, mask in threads if not main]
    assert len(ours) >= 5, out.stdout  # engine, sweepers, flusher, retry queue, SIGTERM hand-off
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
        bit = 1 << (sig - 1)
        assert all(mask & bit for mask in ours), f"a redcount thread takes {sig.name}: {out.stdout}"
    for sig in (signal.SIGSEGV, signal.SIGBUS, signal.SIGFPE, signal.SIGABRT):
        bit = 1 << (sig - 1)  # a thread's own faults still reach the crash and sanitizer handlers
        assert not any(mask & bit for mask in ours), f"a redcount thread blocks {sig.name}: {out.stdout}"
    main_mask = next(mask for main, mask in threads if main)
    assert not main_mask & (1 << (signal.SIGINT - 1))  # the main thread still takes Ctrl-C
