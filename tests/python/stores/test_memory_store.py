"""The embedded memory store under threads and fork: close() from many threads at once,
and forked children that use the parent's store while other threads hammer it. Each case
runs in a fresh interpreter, so a hang or a crash fails the test instead of the session."""

from __future__ import annotations

import subprocess
import sys
import textwrap

def _run_isolated(code: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Runs `code` in a fresh interpreter: a crash or a hang there fails the test instead of
    taking the test session down with it."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)


# Concurrent close() of a memory store (with or without others incrementing) must join the
# sweeper thread once (twice was a hang or a SIGSEGV): it is idempotent and safe from any
# number of threads, and later calls raise ConnectionError (StoreClosed).
def test_concurrent_close_of_a_memory_store_is_safe() -> None:
    done = _run_isolated(
        """
        import threading, redcount
        for round in range(40):
            store = redcount.connect("memory://", sweep_interval=0.001)
            counter = redcount.FixedWindowCounter(store, "c", 60)
            barrier = threading.Barrier(12)
            unexpected = []
            def closer():
                barrier.wait()
                store.close()
            def writer():
                barrier.wait()
                try:
                    for _ in range(300):
                        counter.incr("k")
                except redcount.StoreClosed:
                    pass
                except BaseException as e:
                    unexpected.append(repr(e))
            threads = [threading.Thread(target=closer) for _ in range(8)]
            threads += [threading.Thread(target=writer) for _ in range(4)]
            for t in threads: t.start()
            for t in threads: t.join()
            assert not unexpected, unexpected
            store.close()  # again: idempotent
            try:
                counter.incr("k")
            except redcount.ConnectionError as e:
                assert isinstance(e, redcount.StoreClosed) and not e.maybe_applied
            else:
                raise AssertionError("incr on a closed store did not raise")
        print("ok")
        """
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"


# After fork() the memory store stays usable in the child, even when other
# threads of the parent held its lock at the moment of the fork, and the child gets its own
# sweeper; the parent's store keeps working.
def test_memory_store_is_usable_in_forked_children_while_threads_hammer_it() -> None:
    done = _run_isolated(
        """
        import os, threading, time, redcount
        store = redcount.connect("memory://", sweep_interval=0.005)
        counter = redcount.FixedWindowCounter(store, "c", 3600)
        stop = threading.Event()
        def hammer():
            while not stop.is_set():
                counter.incr("busy")
        threads = [threading.Thread(target=hammer) for _ in range(3)]
        for t in threads: t.start()
        pids = []
        for i in range(16):
            time.sleep(0.002)
            pid = os.fork()
            if pid == 0:
                ok = False
                try:
                    before = counter.get("child")
                    ok = counter.incr("child") == before + 1
                    store.execute("SET", "short", "1", "PX", "20")
                    keys = store.stored_keys()
                    deadline = time.monotonic() + 5
                    while store.stored_keys() >= keys and time.monotonic() < deadline:
                        time.sleep(0.01)  # the child's own sweeper frees the expired key
                    ok = ok and store.stored_keys() < keys
                    store.close()
                finally:
                    os._exit(0 if ok else 3)
            pids.append(pid)
        stop.set()
        for t in threads: t.join()
        codes = []
        for pid in pids:
            deadline = time.monotonic() + 20
            while True:
                got, status = os.waitpid(pid, os.WNOHANG)
                if got:
                    codes.append(os.waitstatus_to_exitcode(status))
                    break
                if time.monotonic() > deadline:
                    os.kill(pid, 9)
                    os.waitpid(pid, 0)
                    codes.append("hung")
                    break
                time.sleep(0.01)
        assert codes == [0] * len(pids), codes
        assert counter.incr("parent") == 1  # the parent's store is untouched
        store.close()
        print("ok")
        """,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"
