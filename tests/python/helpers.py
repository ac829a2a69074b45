"""Helpers shared by the test modules (importable from spawned worker processes too, so
this module must not import pytest)."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import redcount

T = TypeVar("T")


def terminate(proc: subprocess.Popen[bytes], timeout: float = 20.0) -> bool:
    """SIGTERM ``proc`` and reap it; True when it exited on its own within ``timeout`` seconds,
    False when it had to be killed."""
    proc.terminate()
    try:
        proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return False


class AppServer:
    """A web server process group on a free loopback port; stopped (and reaped) on exit."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, port: int, log: Path | None = None) -> None:
        self.port = port
        self.log = log or cwd / "server.log"
        self._log_file = self.log.open("wb")
        try:
            self.proc = subprocess.Popen(argv, env=env, cwd=cwd, stdout=self._log_file, stderr=subprocess.STDOUT)
        except BaseException:
            self._log_file.close()
            raise

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def wait_ready(self, workers: int) -> None:
        """Poll /health until every worker has answered (each reports its pid)."""
        import httpx  # only the web tests need it; helpers is imported by spawned workers too

        seen: set[str] = set()
        deadline = time.monotonic() + 60
        with httpx.Client(timeout=2) as c:
            while len(seen) < workers:
                assert self.proc.poll() is None, self.log.read_text()
                assert time.monotonic() < deadline, f"workers seen: {seen}\n{self.log.read_text()}"
                try:
                    seen.add(c.get(self.url + "/health", headers={"Connection": "close"}).text)
                except httpx.TransportError:
                    time.sleep(0.05)

    def stop(self) -> None:
        terminate(self.proc)
        self._log_file.close()


def wait_until(predicate: Callable[[], T], timeout: float = 10.0, what: str = "condition",
               interval: float = 0.005, ignore: tuple[type[BaseException], ...] = ()) -> T:
    """Poll ``predicate`` every ``interval`` seconds until it returns a truthy value, and
    return that value; AssertionError after ``timeout`` seconds (a bounded readiness loop, not
    a fixed sleep), naming ``what`` and the last value or ignored exception seen. Exceptions
    of the types in ``ignore`` count as "not yet"."""
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            got = predicate()
            if got:
                return got
            last = got
        except ignore as e:
            last = e
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what} (last: {last!r})")
        time.sleep(interval)


def tightest_span(decided: list[tuple[float, float]], n: int) -> float:
    """The least upper bound of the time spanned by ``n`` admissions, each known to have
    happened within its ``(before, after)`` interval (the limiter reads its clock inside the
    hit call): under 1 s means ``n`` starts certainly fell within one second. Exact: for each
    admission as the earliest ``before``, the ``n`` smallest ``after`` among those asked no
    earlier."""
    best = float("inf")
    for lo, _ in decided:
        afters = sorted(a for b, a in decided if b >= lo)
        if len(afters) >= n:
            best = min(best, afters[n - 1] - lo)
    return best


def _rx_queued(port: int, column: int) -> bool:
    """True when a loopback TCP socket whose address in /proc/net/tcp's `column` (1: local,
    2: remote) has `port` holds bytes its process has not read."""
    want = f":{port:04X}"
    with open("/proc/net/tcp") as f:
        for line in f.readlines()[1:]:
            parts = line.split()
            if parts[column].endswith(want) and int(parts[4].split(":")[1], 16) > 0:
                return True
    return False


def server_rx_queued(port: int) -> bool:
    """True when a connection to `port` has bytes the server has not read (it is stopped)."""
    return _rx_queued(port, 1)


def reply_waiting_for(port: int) -> bool:
    """True when a client's connection to `port` holds bytes its process has not read."""
    return _rx_queued(port, 2)


def all_keys(store: redcount.Store, pattern: str = "*") -> list[bytes]:
    return sorted(store.execute("KEYS", pattern))


def snapshot(store: redcount.Store) -> dict[bytes, bytes | None]:
    """Every key with its value: compare before/after to prove nothing was stored."""
    return {k: store.execute("GET", k) for k in all_keys(store)}


def sum_keys(store: redcount.Store, pattern: str) -> int:
    """Sum of the counts in every key matching `pattern` (all windows; request-id keys
    left out): exact totals even if a run straddled a window boundary."""
    return sum(int(store.execute("GET", k) or 0) for k in all_keys(store, pattern) if b":rid:" not in k)


def wait_for_fresh_window(store: redcount.Store, window: float, needed: float) -> None:
    """If less than `needed` seconds are left in the current clock-aligned `window` of the
    store's clock, wait for the next one to begin. Tests on the real clock use this so a
    short sequence never straddles a boundary (this waits for a time, not for readiness)."""
    now = store.now()
    left = window - (now % window)
    if left < needed:
        time.sleep(left + 0.002)


def ms(seconds: float) -> int:
    """Seconds as returned by redcount (ms / 1000) back to whole milliseconds."""
    return round(seconds * 1000)


FNV1A64_OFFSET_BASIS = 14695981039346656037  # the published FNV-1a 64-bit parameters
FNV1A64_PRIME = 1099511628211


def fnv1a64(data: bytes) -> int:
    """FNV-1a, 64 bit, as window.h documents for the stagger offset."""
    h = FNV1A64_OFFSET_BASIS
    for c in data:
        h ^= c
        h = (h * FNV1A64_PRIME) & 0xFFFFFFFFFFFFFFFF
    return h


def process_worker(url: str, name: str, prefix: str, mode: str, keys: list[str], n: int,
                   threads: int) -> dict[str, int]:
    """Run in a spawned process: `threads` threads share one store and one counter, each
    doing `n` increments spread over `keys` (amounts 1, 2, 3, ... cycling). Returns what
    this process added per key."""
    store = redcount.connect(url)
    counter = redcount.FixedWindowCounter(store, name, 3600, prefix=prefix, mode=mode)  # type: ignore[arg-type]
    added = {k: 0 for k in keys}
    lock = threading.Lock()
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def run(t: int) -> None:
        mine = {k: 0 for k in keys}
        try:
            start.wait()
            for i in range(n):
                key = keys[(i + t) % len(keys)]
                amount = 1 + (i % 3)
                got = counter.incr(key, amount)
                if got < amount:  # a count can never be below what this call just added
                    raise AssertionError(f"incr({key!r}, {amount}) returned {got}")
                mine[key] += amount
        except BaseException as e:  # noqa: BLE001 - reported to the parent
            errors.append(e)
        with lock:
            for k, v in mine.items():
                added[k] += v

    ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    store.close()
    if errors:
        raise errors[0]
    return added
