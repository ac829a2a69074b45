"""Regression tests for the defects of issue 8 ("Hardening") fixed outside the I/O engine.

Each test names its item and fails on the code before the fix.
"""

from __future__ import annotations

import binascii
import math
import subprocess
import sys
import textwrap
import time

import pytest
import redcount


# Item 14: non-finite clocks and huge numbers are InvalidInputError naming the argument.
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 1e300])
def test_manual_clock_refuses_non_finite_or_huge_start(bad: float) -> None:
    with pytest.raises(redcount.InvalidInputError, match="start"):
        redcount.ManualClock(bad)


@pytest.mark.parametrize("bad", [math.nan, math.inf, 1e300])
def test_manual_clock_set_and_advance_refuse_non_finite(bad: float) -> None:
    clock = redcount.ManualClock(100.0)
    with pytest.raises(redcount.InvalidInputError, match="t"):
        clock.set(bad)
    with pytest.raises(redcount.InvalidInputError, match="seconds"):
        clock.advance(bad)
    assert clock.now() == 100.0  # untouched


def test_manual_clock_advance_cannot_overflow() -> None:
    clock = redcount.ManualClock(8.9e15)
    with pytest.raises(redcount.InvalidInputError, match="range"):
        clock.advance(2e14)
    assert clock.now() == 8.9e15


@pytest.mark.parametrize("window", [10**400, -(10**400), math.nan, math.inf])
def test_huge_or_non_finite_window_is_invalid_input(memory_store: redcount.Store, window: float) -> None:
    with pytest.raises(redcount.InvalidInputError, match="window"):
        redcount.FixedWindowCounter(memory_store, "c", window)
    with pytest.raises(redcount.InvalidInputError, match="window"):
        redcount.SlidingWindowCounter(memory_store, "c", window)


def test_huge_timeout_is_invalid_input() -> None:
    with pytest.raises(redcount.InvalidInputError, match="command_timeout"):
        redcount.connect("redis://127.0.0.1:1", command_timeout=10**400)


# Item 16: a huge limit string is refused before it is parsed, with a short message.
def test_huge_limit_string_is_refused_quickly(memory_store: redcount.Store) -> None:
    limiter = redcount.Limiter(memory_store)
    text = "1/second;" * 900_000  # 8.1 MB
    started = time.perf_counter()
    with pytest.raises(redcount.InvalidInputError) as err:
        limiter.hit(text, "k")
    elapsed = time.perf_counter() - started
    assert len(str(err.value)) < 400
    assert "2048" in str(err.value)
    # Not a speed assertion on redcount: the old code parsed all 900,000 limits first, which
    # took far longer than a scan; this only guards against going back to a full parse.
    assert elapsed < 5.0


# Item 17: a NUL byte in a limit string or a name must not cut the error message.
def test_nul_in_limit_string_keeps_the_reason(memory_store: redcount.Store) -> None:
    limiter = redcount.Limiter(memory_store)
    with pytest.raises(redcount.InvalidInputError) as err:
        limiter.hit("10/min\x00ute", "k")
    message = str(err.value)
    assert "\\x00" in message
    assert "unknown time unit" in message


def test_nul_in_counter_name_keeps_the_reason(memory_store: redcount.Store) -> None:
    with pytest.raises(redcount.InvalidInputError) as err:
        redcount.FixedWindowCounter(memory_store, "a\x00{b}", 60)
    message = str(err.value)
    assert "\\x00" in message
    assert "hash tag" in message


def _run_isolated(code: str, timeout: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Runs `code` in a fresh interpreter: a crash or a hang there fails the test instead of
    taking the test session down with it."""
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)


# Item 1: concurrent close() of a memory store (with or without others incrementing) used
# to join the sweeper thread twice: a hang or SIGSEGV. It must be idempotent and safe from
# any number of threads, and later calls raise ConnectionError (StoreClosed).
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


# Issue 7 §5: after fork() the memory store stays usable in the child, even when other
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


def _slot(key: str) -> int:
    """Redis Cluster's hash slot of `key` (CRC16/XMODEM of its hash tag, if it has one)."""
    start = key.find("{")
    if start >= 0:
        end = key.find("}", start + 1)
        if end > start + 1:
            key = key[start + 1 : end]
    return binascii.crc_hqx(key.encode(), 0) % 16384


# Item 13: a business key starting with '}' made the hash tag empty, so its window, next
# window, request-id and sliding keys fell into different cluster slots (CROSSSLOT).
@pytest.mark.parametrize("key", ["}", "}abc", "}}", "\\}x", "\\", "a}b", "{x}", "plain"])
def test_every_key_of_one_business_key_shares_one_slot(key: str) -> None:
    clock = redcount.ManualClock(1_700_000_000.0)
    store = redcount.connect("memory://", clock=clock)
    counter = redcount.FixedWindowCounter(store, "c", 60)
    sliding = redcount.SlidingWindowCounter(store, "s", 60)
    keys = [counter.storage_key(key)]
    counter.incr(key, request_id="r1")
    clock.advance(60)
    keys.append(counter.storage_key(key))
    keys.append(counter.storage_key(key) + ":rid:r1")  # the request-id key's layout (docs/fixed-windows.md)
    keys.extend(sliding.storage_keys(key))
    assert len({_slot(k) for k in keys}) == 1, keys
    assert counter.incr(key, request_id="r1") == 1 and counter.incr(key, request_id="r1") == 1
    store.close()


def test_escaping_keeps_distinct_business_keys_distinct() -> None:
    store = redcount.connect("memory://")
    counter = redcount.FixedWindowCounter(store, "c", 60)
    names = ["}a", "\\}a", "\\\\}a", "a", "\\a"]
    assert len({counter.storage_key(n) for n in names}) == len(names)
    for i, n in enumerate(names):
        counter.incr(n, i + 1)
    assert [counter.get(n) for n in names] == [1, 2, 3, 4, 5]
    store.close()
