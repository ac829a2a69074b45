"""``redcount bench``: redcount's throughput against ``limits`` and ``redis-benchmark``.

Every figure comes from one run against one redis-server (a private one on a free loopback
port unless ``--url`` names an existing server), so the ratios compare like with like.

Fixed windows (``--only fixed``; all of them under a limit of 10^9/minute that is never reached):

- redcount ``FixedWindowCounter.incr`` and ``incr_many`` (per key) on Redis;
- the ``limits`` library's ``FixedWindowRateLimiter.hit`` on ``RedisStorage`` and on
  ``MemoryStorage``;
- redcount ``incr`` and ``Limiter.hit`` on the embedded memory store, ``Limiter.hit`` on Redis;
- ``redis-benchmark`` INCR with one client, unpipelined (``-P 1``) and pipelined (``-P N``):
  the floor set by the round trip and by the server itself.

Sliding windows and buckets (``--only sliding``), on Redis and on the embedded memory store:

- redcount ``Limiter("sliding-window").hit`` against ``limits``' ``MovingWindowRateLimiter.hit``
  (both an exact log of the hits in the window);
- redcount ``Limiter("sliding-window-approx").hit`` (``sub_buckets=1``, the classic two-bucket
  estimate) against ``limits``' ``SlidingWindowCounterRateLimiter.hit`` (the same estimate);
- redcount ``Limiter("token-bucket")`` and ``Limiter("gcra")`` ``hit`` on their own (``limits``
  has neither), also shown relative to redcount's sliding window, without a target.

Both sides use the same limit, :data:`SLIDING_LIMIT` ``"100/second"``, and the same key
rotation. A limit that is never reached keeps every hit allowed, as in the fixed-window rows,
but an exact log stores every hit still in its window: under the fixed rows' 10^9/minute a key
would pile up every hit of the run, and each hit would cost more than the last (``limits``'
memory log is a Python list that grows at the front). A per-second window keeps each key's log
at the hits of the last second instead, ``rate / 10,000`` of them with the keys hit in turn
(about 2 on Redis, at most a few dozen in memory), however long the run; 100 per second is then
never reached (it would take a million hits per second), and the buckets, refilled at 100 per
second, never run dry.

The engine (``--only engine``): ``incr`` from 8 threads sharing one store against
``redis-benchmark -c 8 -P 1`` and one thread; ``await redcount.aio.Limiter.hit`` from 1,000
coroutines on one loop (run on the measuring thread) against ``limits``' async Redis storage
(redis-py) with as many coroutines and against one synchronous thread; uvloop if installed; and
``incr`` over ``rediss://`` on a second private, TLS-only server against ``redis://``.

Hot keys (``--only hot``, issue 7 section 6): redcount ``incr`` against ``limits``'
``FixedWindowRateLimiter.hit``, and the exact sliding log against ``MovingWindowRateLimiter.hit``
under ``100000/hour`` (the logs grow through the run; 100,000 is the member strategies' cap),
on Redis and in memory, over 100 keys hit in turn.

Sharded counters (``--only sharded``, issue 9): ``ShardedCounter.incr`` with a fresh request id
per call (so every write is applied and pays the id's ``SET NX``, the ``INCRBY`` and the
``XADD``) from one thread and from 8, against plain redcount ``incr`` and ``redis-benchmark``
INCR with as many clients; ``incr_many`` over 100 counters with request ids, in applied
increments per second from one thread and from 8 threads of one process (target >= 100,000/s
from one process, read on the 8-thread row: one thread leaves the server idle while it builds
its next call); ``BufferedCounter.incr`` calls per second from one
thread (target >= 2,000,000/s); and ``value()`` latency p50/p99 against the shard count (1, 16,
64, 256), idle and while 8 threads write (printed as notes).

Unless said otherwise above, each measurement runs single-threaded for about ``--seconds`` in all, after a short warm-up,
over 10,000 rotating keys under a key prefix unique to the run. The measurements take turns
in slices of about 0.4 s (see :func:`_rounds`), so a change in the machine's state mid-run
hits every contender alike; the two sides of each ratio with a target run back to back. On a
``--url`` server only the run's own keys are written, and they are deleted (SCAN + DEL) at the
end.
"""

from __future__ import annotations

import argparse
import asyncio
import csv
import io
import itertools
import json
import math
import os
import resource
import secrets
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, field
from functools import partial
from types import FrameType
from typing import Any, Generic, NoReturn, TypeVar

from .. import __version__
from ..counters import FixedWindowCounter
from ..limiter import Limiter, Strategy
from ..store import Store, connect
from .urls import mask_url, redact

__all__ = ["run_bench"]

T = TypeVar("T")

N_KEYS = 10_000
BIG_LIMIT = "1000000000/minute"  # never reached: every hit is allowed
COUNTER_WINDOW = 60.0
INSTALL_REDIS = "install it with `apt-get install redis-server` (which also provides redis-benchmark)"
INSTALL_LIMITS = "pip install 'redcount[bench]'"

# Row names, in the order they are measured and printed.
RB_P1 = "redis-benchmark INCR -c1 -P1"
RC_INCR = "redcount incr (Redis)"
LIM_HIT_REDIS = "limits FixedWindow hit (RedisStorage)"
RC_HIT_REDIS = "redcount Limiter.hit (Redis)"
RB_PN = "redis-benchmark INCR -c1 -P{batch}"
RC_MANY = "redcount incr_many x{batch} (Redis, per key)"
RC_INCR_MEM = "redcount incr (memory)"
LIM_HIT_MEM = "limits FixedWindow hit (MemoryStorage)"
RC_HIT_MEM = "redcount Limiter.hit (memory)"

SLIDING_LIMIT = "100/second"  # see the module docstring: never reached, and windows stay small
# {store}: "Redis" or "memory"; {storage}: limits' "RedisStorage" or "MemoryStorage".
RC_SW = "redcount sliding-window hit ({store})"
LIM_MW = "limits MovingWindow hit ({storage})"
RC_SWA = "redcount sliding-window-approx hit ({store})"
LIM_SWC = "limits SlidingWindowCounter hit ({storage})"
RC_TB = "redcount token-bucket hit ({store})"
RC_GCRA = "redcount gcra hit ({store})"
# The engine (--only engine): threads, coroutines and TLS sharing one store.
THREADS = 8
TASKS = 1000
RB_C8 = "redis-benchmark INCR -c{threads} -P1"
RC_INCR_THREADS = "redcount incr x{threads} threads (Redis)"
RC_INCR_THREADS_TC = "redcount incr x{threads} threads (Redis, max_connections={cap})"
LIM_AIO = "limits async FixedWindow hit x{tasks} coroutines (RedisStorage)"
RC_AIO = "redcount aio Limiter.hit x{tasks} coroutines (Redis)"
RC_AIO_UVLOOP = "redcount aio Limiter.hit x{tasks} coroutines (Redis, uvloop)"
RC_INCR_TLS = "redcount incr (Redis over TLS)"
# limits 4+ picks coredis for async+redis:// unless told; issue 7 compares with redis-py's client.
_LIMITS_ASYNC_OPTIONS: dict[str, Any] = {"implementation": "redispy"}
ONLY = ("all", "fixed", "sliding", "engine", "sharded", "hot")
# Hot keys (--only hot, issue 7 section 6): the same contenders over 100 keys hit in turn.
HOT_KEYS = 100
# The issue asks for 1000000/hour, where the log grows; the member strategies cap a limit at
# 100,000 (issue 8 item 5: bounded server work per call), so the largest allowed is used.
HOT_SLIDING_LIMIT = "100000/hour"
HOT = " (100 hot keys)"
# Sharded counters (--only sharded, issue 9).
RC_SH_INCR = "redcount sharded incr, new request id per call (Redis)"
RC_SH_INCR_THREADS = "redcount sharded incr, new request ids x{threads} threads (Redis)"
SH_MANY = 100  # counters (and writes) per incr_many call
RC_SH_MANY = "redcount sharded incr_many x{n} counters, request ids (Redis, per write)"
RC_SH_MANY_THREADS = "redcount sharded incr_many x{n} counters, request ids x{threads} threads (Redis, per write)"
RC_BUF = "redcount BufferedCounter.incr (memory, one thread)"
SH_MANY_TARGET = 100_000.0  # applied increments per second, absolute (issue 9 section 7)
BUF_TARGET = 2_000_000.0  # calls per second, absolute (issue 9 section 3)
SH_LATENCY_SHARDS = (1, 16, 64, 256)


class BenchError(ValueError):
    """A setup problem (missing binary, server that will not start...): cli prints it, exit 2."""


@dataclass
class Result:
    name: str
    ops_per_sec: float
    ops: int
    seconds: float
    falsy: int = 0  # results that were falsy (a denied hit, a 0 count): there should be none
    turn_rates: list[float] = field(default_factory=list)  # ops/s of each turn, in order
    # CPU per op where measured (the engine rows): this process with all its threads and any
    # child (redis-benchmark), and redis-server from its INFO cpu; None elsewhere.
    cpu_client_us: float | None = None
    cpu_server_us: float | None = None


@dataclass
class Ratio:
    name: str
    numerator: str
    denominator: str
    value: float  # the median of the per-turn ratios (turn i of one over turn i of the other)
    target: float | None
    passed: bool | None
    low: float = math.nan  # the lowest and highest per-turn ratio
    high: float = math.nan


@dataclass
class Report:
    server: str
    private_server: bool
    redis_version: str
    redcount_version: str
    limits_version: str
    seconds: float
    batch: int
    keys: int
    key_prefix: str
    only: str = "all"  # --only: which measurements ran
    fixed_limit: str = BIG_LIMIT  # the limit of the fixed-window hits
    sliding_limit: str = SLIDING_LIMIT  # the limit of the sliding-window and bucket hits
    rounds: int = 1
    results: list[Result] = field(default_factory=list)
    ratios: list[Ratio] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # what was skipped and why, summaries
    missed_rates: list[str] = field(default_factory=list)  # absolute rate targets not met (in notes)


def _progress(step: int, total: int, what: str) -> None:
    print(f"[{step}/{total}] {what} ...", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- timing

SLICE = 0.4  # seconds: measurements take turns in slices of about this long (see _rounds)


def _rounds(seconds: float) -> int:
    """How many turns each measurement gets.

    With one client and no pipelining, a round trip on a small box costs 25 us or 55 us
    depending on whether the scheduler puts client and server on the same core, and that
    flips every few seconds with whatever else runs. Taking turns in short slices exposes
    every contender to the same mix, so the ratios hold still even when the figures move.
    """
    return max(1, min(5, round(seconds / SLICE)))


class _CpuProbe:
    """CPU seconds spent so far by this process (every thread, and children that have been
    waited for: redis-benchmark) and by the redis-server behind ``store`` (INFO cpu: its
    user and system time, all its threads)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def client(self) -> float:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + children.ru_utime + children.ru_stime

    def server(self) -> float:
        fields = _info(self.store, "cpu")
        try:
            return float(fields["used_cpu_sys"]) + float(fields["used_cpu_user"])
        except (KeyError, ValueError) as e:
            raise BenchError(f"the server's INFO cpu has no used_cpu_sys/used_cpu_user: {fields!r}") from e


class _Contender:
    """One measurement, run in one or more slices whose figures add up."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ops = 0
        self.elapsed = 0.0
        self.falsy = 0
        self.turn_rates: list[float] = []
        self.probe: _CpuProbe | None = None  # set: CPU is measured around each slice's timed part
        self.cpu_client = 0.0
        self.cpu_server = 0.0

    @contextmanager
    def _cpu(self) -> Iterator[None]:
        """Around the timed part of a slice (not its warm-up): add the CPU it took."""
        probe = self.probe
        if probe is None:
            yield
            return
        c0, s0 = probe.client(), probe.server()
        yield
        c1, s1 = probe.client(), probe.server()
        self.cpu_client += c1 - c0
        self.cpu_server += s1 - s0

    def run_slice(self, seconds: float) -> None:
        raise NotImplementedError

    def result(self) -> Result:
        rate = self.ops / self.elapsed if self.elapsed > 0 else 0.0
        cpu = self.probe is not None and self.ops > 0
        return Result(
            self.name, rate, self.ops, self.elapsed, self.falsy, list(self.turn_rates),
            cpu_client_us=self.cpu_client / self.ops * 1e6 if cpu else None,
            cpu_server_us=self.cpu_server / self.ops * 1e6 if cpu else None,
        )


class _PythonOp(_Contender, Generic[T]):
    """``op(arg)`` called from this thread over ``args``, cycling; ``per_call`` ops per call."""

    def __init__(self, name: str, op: Callable[[T], object], args: Sequence[T], per_call: int = 1) -> None:
        super().__init__(name)
        self.op = op
        self.args = itertools.cycle(args)
        self.per_call = per_call
        self.chunk = 0  # calls between clock reads; set by the first warm-up

    def _loop(self, seconds: float, chunk: int) -> tuple[int, float, int]:
        """Call for about ``seconds``: (calls, elapsed, falsy results). The clock is read once
        per ``chunk`` calls, so the harness costs the same, next to nothing, for everyone."""
        op, it, islice = self.op, self.args, itertools.islice
        calls = 0
        falsy = 0
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            for a in islice(it, chunk):
                if not op(a):
                    falsy += 1
            calls += chunk
            now = time.perf_counter()
            if now >= deadline:
                return calls, now - start, falsy

    def run_slice(self, seconds: float) -> None:
        if not self.chunk:
            # First warm-up: connections, script cache, allocator; and the call rate.
            calls, elapsed, _ = self._loop(min(0.3, max(0.05, seconds / 2)), 1)
            rate = calls / elapsed if elapsed > 0 else 1.0
            self.chunk = max(1, min(10_000, int(rate * 0.002)))  # read the clock about every 2 ms
        else:
            self._loop(min(0.05, seconds / 5), self.chunk)  # caches, after another contender ran
        with self._cpu():
            calls, elapsed, falsy = self._loop(seconds, self.chunk)
        self.ops += calls * self.per_call
        self.elapsed += elapsed
        self.falsy += falsy * self.per_call
        self.turn_rates.append(calls * self.per_call / elapsed if elapsed > 0 else 0.0)


class _Threads(_Contender):
    """``op(arg)`` from ``threads`` threads at once, each cycling over its own share of ``args``;
    the figure is the ops of all threads together over the slice's wall time."""

    CHUNK = 16  # calls between clock reads in each thread

    def __init__(
        self, name: str, op: Callable[[T], object], args: Sequence[T], threads: int, per_call: int = 1
    ) -> None:
        super().__init__(name)
        self.op: Callable[[Any], object] = op
        self.shares = [list(args[i::threads]) or list(args) for i in range(threads)]
        self.warm = False
        self.per_call = per_call  # ops per call (incr_many: writes per call)

    def _run(self, seconds: float) -> tuple[int, float, int]:
        counts = [0] * len(self.shares)
        falsy = [0] * len(self.shares)
        errors: list[BaseException] = []
        go = threading.Barrier(len(self.shares) + 1)
        deadline = 0.0

        def worker(i: int) -> None:
            op, it, islice, chunk = self.op, itertools.cycle(self.shares[i]), itertools.islice, self.CHUNK
            go.wait()
            try:
                n = bad = 0
                while time.perf_counter() < deadline:
                    for a in islice(it, chunk):
                        if not op(a):
                            bad += 1
                    n += chunk
                counts[i], falsy[i] = n, bad
            except BaseException as e:  # reported on the measuring thread
                errors.append(e)

        workers = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(len(self.shares))]
        for w in workers:
            w.start()
        start = time.perf_counter()
        deadline = start + seconds
        go.wait()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - start
        if errors:
            raise errors[0]
        return sum(counts), elapsed, sum(falsy)

    def run_slice(self, seconds: float) -> None:
        self._run(min(0.3, max(0.05, seconds / 2)) if not self.warm else min(0.05, seconds / 5))
        self.warm = True
        with self._cpu():
            calls, elapsed, falsy = self._run(seconds)
        self.ops += calls * self.per_call
        self.elapsed += elapsed
        self.falsy += falsy * self.per_call
        self.turn_rates.append(calls * self.per_call / elapsed if elapsed > 0 else 0.0)


class _AsyncHits(_Contender):
    """``await hit(key)`` from ``tasks`` coroutines at once on one event loop, run on the
    measuring thread; the figure is the calls completed during the slice. The loop lives as
    long as the contender: clients bound to a loop (redis-py's pool) keep their connections."""

    def __init__(
        self,
        name: str,
        hit: Callable[[str], Awaitable[object]],
        keys: Sequence[str],
        tasks: int,
        uvloop: bool = False,
        cleanup: Callable[[], Awaitable[object]] | None = None,
    ) -> None:
        super().__init__(name)
        self.cleanup = cleanup  # run on the loop before it closes (connections bound to it)
        self.hit, self.keys, self.tasks = hit, keys, tasks
        self.loop: asyncio.AbstractEventLoop | None = None
        self.uvloop = uvloop

    def _event_loop(self) -> asyncio.AbstractEventLoop:
        if self.loop is None:
            if self.uvloop:
                import uvloop  # type: ignore[import-not-found,unused-ignore]

                self.loop = uvloop.new_event_loop()
            else:
                self.loop = asyncio.new_event_loop()
        return self.loop

    async def _turn(self, seconds: float) -> tuple[int, float, int]:
        done = [0, 0]  # calls completed, falsy results
        stop = False
        hit, keys, n_keys = self.hit, self.keys, len(self.keys)

        async def worker(i: int) -> None:
            j = i
            while not stop:
                if not await hit(keys[j % n_keys]):
                    done[1] += 1
                done[0] += 1
                j += self.tasks

        workers = [asyncio.ensure_future(worker(i)) for i in range(self.tasks)]
        start = time.perf_counter()
        await asyncio.sleep(seconds)
        calls, falsy, elapsed = done[0], done[1], time.perf_counter() - start
        stop = True
        await asyncio.gather(*workers)  # the calls in flight finish, uncounted
        return calls, elapsed, falsy

    def run_slice(self, seconds: float) -> None:
        loop = self._event_loop()
        loop.run_until_complete(self._turn(min(0.3, max(0.05, seconds / 2)) if not self.ops else min(0.05, seconds / 5)))
        with self._cpu():
            calls, elapsed, falsy = loop.run_until_complete(self._turn(seconds))
        self.ops += calls
        self.elapsed += elapsed
        self.falsy += falsy
        self.turn_rates.append(calls / elapsed if elapsed > 0 else 0.0)

    def close(self) -> None:
        if self.loop is not None:
            try:
                if self.cleanup is not None:
                    self.loop.run_until_complete(self.cleanup())
            finally:
                self.loop.close()
            self.loop = None


class _Tight(_Contender):
    """``op(1)`` in a tight loop on this thread, its result ignored (a call that returns
    None, such as ``BufferedCounter.incr``)."""

    def __init__(self, name: str, op: Callable[[int], object]) -> None:
        super().__init__(name)
        self.op = op

    def _loop(self, seconds: float) -> tuple[int, float]:
        op, chunk = self.op, range(2_000)
        calls = 0
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            for _ in chunk:
                op(1)
            calls += 2_000
            now = time.perf_counter()
            if now >= deadline:
                return calls, now - start

    def run_slice(self, seconds: float) -> None:
        self._loop(min(0.05, seconds / 5))
        calls, elapsed = self._loop(seconds)
        self.ops += calls
        self.elapsed += elapsed
        self.turn_rates.append(calls / elapsed if elapsed > 0 else 0.0)


# --------------------------------------------------------------------------- redis-server


def _server_binary(name: str) -> str:
    """The redis-server to start for a private server, or a BenchError saying what to do."""
    found = shutil.which(name)
    if found is None:
        raise BenchError(
            f"redis-server not found (looked for {name!r}); {INSTALL_REDIS}, "
            f"pass --redis-server PATH, or point --url at a running server"
        )
    return found


def write_json(path: str, data: Any) -> None:
    """Write a report's figures as indented JSON (the ``--json`` option of the commands)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pings(host: str, port: int, tls: ssl.SSLContext | None = None) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5) as raw:
            s = tls.wrap_socket(raw, server_hostname=host) if tls is not None else raw
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:  # ssl.SSLError included: the server may not be listening yet
        return False


@dataclass
class _Certs:
    ca: str
    cert: str
    key: str


def _make_certs(directory: str) -> _Certs:
    """A throw-away CA and a server certificate for 127.0.0.1/localhost (EC P-256), made with
    the ``openssl`` CLI; a BenchError if it is missing or fails."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise BenchError("openssl not found (apt-get install openssl)")

    def path(name: str) -> str:
        return os.path.join(directory, name)

    ext = path("server.ext")
    with open(ext, "w", encoding="ascii") as f:
        f.write("basicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    steps = [
        ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path("ca.key")],
        ["req", "-x509", "-new", "-key", path("ca.key"), "-sha256", "-days", "2", "-subj", "/CN=redcount bench CA",
         "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
         "-out", path("ca.pem")],
        ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path("server.key")],
        ["req", "-new", "-key", path("server.key"), "-subj", "/CN=localhost", "-out", path("server.csr")],
        ["x509", "-req", "-in", path("server.csr"), "-CA", path("ca.pem"), "-CAkey", path("ca.key"),
         "-CAcreateserial", "-sha256", "-days", "2", "-extfile", ext, "-out", path("server.pem")],
    ]  # fmt: skip
    for step in steps:
        done = subprocess.run([openssl, *step], stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise BenchError(f"openssl {step[0]} failed (exit {done.returncode}): {done.stderr[-300:]}")
    return _Certs(ca=path("ca.pem"), cert=path("server.pem"), key=path("server.key"))


@contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """Turn SIGTERM into SystemExit while we run, so the private server is stopped on the way
    out (it runs in its own session: a signal to our process group does not reach it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum: int, frame: FrameType | None) -> NoReturn:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


@contextmanager
def _private_server(binary: str, certs: _Certs | None = None) -> Iterator[str]:
    """Start redis-server on a free loopback port; yield its URL; stop it on the way out.

    With ``certs`` it listens only for TLS (``rediss://``), and does not ask for client
    certificates."""
    tls_ctx: ssl.SSLContext | None = None
    if certs is not None:
        tls_ctx = ssl.create_default_context(cafile=certs.ca)
    with tempfile.TemporaryDirectory(prefix="redcount-bench-") as tmp:
        log_path = os.path.join(tmp, "redis.log")
        for _attempt in range(3):  # another process may grab the free port first
            port = _free_port()
            listen = ["--port", str(port)]
            if certs is not None:
                listen = ["--port", "0", "--tls-port", str(port), "--tls-cert-file", certs.cert]
                listen += ["--tls-key-file", certs.key, "--tls-ca-cert-file", certs.ca, "--tls-auth-clients", "no"]
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    [
                        binary,
                        *listen,
                        "--bind",
                        "127.0.0.1",
                        "--save",
                        "",
                        "--appendonly",
                        "no",
                        "--dir",
                        tmp,
                        "--daemonize",
                        "no",
                    ],
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # Ctrl-C is ours to handle; we stop it below
                )
            try:
                deadline = time.monotonic() + 10.0
                while proc.poll() is None and not _pings("127.0.0.1", port, tls_ctx):
                    if time.monotonic() > deadline:
                        raise BenchError(f"{binary} on port {port} did not answer PING within 10 s")
                    time.sleep(0.005)  # polling interval, not a fixed wait
                if proc.poll() is None:
                    yield f"{'rediss' if certs else 'redis'}://127.0.0.1:{port}/0"
                    return
            finally:
                _stop(proc)
        with open(log_path, errors="replace") as f:
            tail = f.read()[-600:]
        raise BenchError(f"{binary} would not start (exit code {proc.returncode}):\n{tail}")


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# --------------------------------------------------------------------------- redis-benchmark


def _benchmark_target(url: str) -> tuple[list[str], dict[str, str]]:
    """redis-benchmark's arguments for the server at ``url``, and the environment to run it in.

    The password never goes on the command line (any local user can read a process's
    arguments in /proc/<pid>/cmdline): it goes in ``REDISCLI_AUTH``, the variable the Redis
    command-line tools read it from. A redis-benchmark that ignores it (7.0 does) fails to
    authenticate, and :func:`_check_benchmark_auth` says so before anything is measured."""
    u = urllib.parse.urlsplit(url)
    if u.scheme != "redis":
        raise BenchError(f"--url must be a redis:// URL, got {mask_url(url)!r}")
    try:
        port = u.port or 6379
    except ValueError:
        raise BenchError(f"--url has a bad port: {mask_url(url)!r}") from None
    argv = ["-h", u.hostname or "127.0.0.1", "-p", str(port)]
    db = u.path.strip("/")
    if db:
        if not db.isdigit():
            raise BenchError(f"--url must end in a database number (/0), got {mask_url(url)!r}")
        argv += ["--dbnum", db]
    if u.username:
        argv += ["--user", urllib.parse.unquote(u.username)]
    env = dict(os.environ)
    env.pop("REDISCLI_AUTH", None)  # only this URL's password, if any
    if u.password:
        env["REDISCLI_AUTH"] = urllib.parse.unquote(u.password)
    return argv, env


def _benchmark_command(
    binary: str, url: str, pipeline: int, key: str, n: int, clients: int = 1
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of ``redis-benchmark INCR key:__rand_int__`` with ``clients``
    clients."""
    # `INCR <prefix>:rb:__rand_int__` is what `-t incr` sends (it uses `counter:__rand_int__`),
    # but under this run's own prefix, so nothing outside it is touched on a --url server.
    target, env = _benchmark_target(url)
    argv = [
        binary,
        *target,
        "-c",
        str(clients),
        "-P",
        str(pipeline),
        "-n",
        str(n),
        "-r",
        str(N_KEYS),
        "--csv",
        "INCR",
        key,
    ]
    return argv, env


def _redis_benchmark(
    binary: str, url: str, pipeline: int, key: str, n: int, clients: int = 1
) -> tuple[float, float]:
    """Run ``redis-benchmark INCR key:__rand_int__``; (requests/s, seconds)."""
    cmd, env = _benchmark_command(binary, url, pipeline, key, n, clients)
    start = time.perf_counter()
    done = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False, env=env)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise BenchError(
            f"redis-benchmark failed (exit {done.returncode}): {redact((done.stderr or done.stdout)[-400:], url)}"
        )
    for row in csv.DictReader(io.StringIO(done.stdout)):
        rps = row.get("rps")
        if rps:
            return float(rps), elapsed
    raise BenchError(f"could not find 'rps' in redis-benchmark's output: {redact(done.stdout[-400:], url)!r}")


def _check_benchmark_auth(binary: str, url: str) -> None:
    """With a password in ``url``: check that redis-benchmark authenticates from the
    environment (one PING) before anything is measured, and say what to do if not."""
    if not urllib.parse.urlsplit(url).password:
        return
    target, env = _benchmark_target(url)
    done = subprocess.run(
        [binary, *target, "-c", "1", "-n", "1", "--csv", "PING"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    said = redact((done.stderr or done.stdout).strip()[-300:], url)
    if any(word in done.stdout + done.stderr for word in ("NOAUTH", "WRONGPASS", "AUTH failed")):
        raise BenchError(
            "redis-benchmark did not authenticate with the password from the environment "
            "(REDISCLI_AUTH); this redis-benchmark takes a password only on its command line, where any "
            "local user can read it, and redcount bench does not put it there. Run "
            "`redcount bench --only sliding` against this server (no redis-benchmark rows), or "
            "leave out --url to measure on a private server without a password. "
            f"redis-benchmark said: {said}"
        )
    if done.returncode != 0:
        raise BenchError(f"redis-benchmark could not run against {mask_url(url)} (exit {done.returncode}): {said}")


class _RedisBenchmark(_Contender):
    """``redis-benchmark`` INCR with ``clients`` clients, each with ``pipeline`` requests in flight."""

    def __init__(self, name: str, binary: str, url: str, pipeline: int, key: str, clients: int = 1) -> None:
        super().__init__(name)
        self.binary, self.url, self.pipeline, self.key = binary, url, pipeline, key
        self.clients = clients
        self.rate = 0.0

    def run_slice(self, seconds: float) -> None:
        if not self.rate:  # a short calibration run sizes -n so that a slice takes `seconds`
            self.rate, _ = _redis_benchmark(
                self.binary,
                self.url,
                self.pipeline,
                self.key,
                max(1000 * self.clients, self.pipeline * 200),
                self.clients,
            )
        n = max(self.pipeline * self.clients * 10, int(self.rate * seconds))
        n -= n % (self.pipeline * self.clients)
        with self._cpu():
            rps, elapsed = _redis_benchmark(self.binary, self.url, self.pipeline, self.key, n, self.clients)
        self.rate = rps
        self.ops += n
        self.elapsed += n / rps if rps > 0 else elapsed
        self.turn_rates.append(rps)


# --------------------------------------------------------------------------- store helpers


def _info(store: Store, section: str) -> dict[str, str]:
    """One section of INFO as its ``field: value`` pairs."""
    info = store.execute("INFO", section)
    text = info.decode() if isinstance(info, bytes) else str(info)
    return {k: v.strip() for k, v in (line.split(":", 1) for line in text.splitlines() if ":" in line)}


def _redis_version(store: Store) -> str:
    return _info(store, "server").get("redis_version", "?")


def _delete_keys(store: Store, pattern: str) -> int:
    """SCAN + DEL every key matching ``pattern``; returns how many were deleted."""
    deleted = 0
    cursor: str | bytes = "0"
    while True:
        reply = store.execute("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
        if not isinstance(reply, list) or len(reply) != 2:
            raise BenchError(f"unexpected SCAN reply: {reply!r}")
        next_cursor, keys = reply
        if keys and isinstance(keys, list):
            n = store.execute("DEL", *[k for k in keys if isinstance(k, bytes)])
            deleted += n if isinstance(n, int) else 0
        if not isinstance(next_cursor, bytes) or next_cursor == b"0":
            return deleted
        cursor = next_cursor


# --------------------------------------------------------------------------- ratios and output


def _ratio(results: dict[str, Result], name: str, num: str, den: str, target: float | None) -> Ratio:
    """The median of per-turn ratios: turn i of both ran back to back, so each per-turn ratio
    compares the two under the same machine conditions (scheduler placement flips every few
    seconds on a small box, and would skew a ratio of whole-run totals)."""
    a, b = results[num], results[den]
    per_turn = [x / y for x, y in zip(a.turn_rates, b.turn_rates) if y > 0]
    if per_turn and len(a.turn_rates) == len(b.turn_rates):
        value, low, high = statistics.median(per_turn), min(per_turn), max(per_turn)
    else:
        value = a.ops_per_sec / b.ops_per_sec if b.ops_per_sec > 0 else math.nan
        low = high = value
    passed = None if target is None else (not math.isnan(value) and value >= target)
    return Ratio(name, num, den, value, target, passed, low, high)


def _print_report(rep: Report) -> None:
    kind = "private" if rep.private_server else "existing"
    print(
        f"redcount bench: redcount {rep.redcount_version}, limits {rep.limits_version}, "
        f"redis-server {rep.redis_version} at {rep.server} ({kind})"
    )
    turns = f" in {rep.rounds} turns" if rep.rounds > 1 else ""
    print(
        f"one Python thread, {rep.keys:,} rotating keys, ~{rep.seconds:g} s per measurement{turns}, "
        f"key prefix {rep.key_prefix!r}"
    )
    limits_used = []
    if rep.only in ("all", "fixed"):
        limits_used.append(f"fixed windows {rep.fixed_limit!r}")
    if rep.only in ("all", "sliding"):
        limits_used.append(f"sliding windows and buckets {rep.sliding_limit!r} (never reached)")
    if rep.only in ("all", "engine"):
        limits_used.append(f"engine {BIG_LIMIT!r} ({THREADS} threads, {TASKS} coroutines, TLS)")
    if rep.only in ("all", "hot"):
        limits_used.append(f"hot keys: fixed {BIG_LIMIT!r}, sliding {HOT_SLIDING_LIMIT!r} over {HOT_KEYS} keys")
    if rep.only in ("all", "sharded"):
        limits_used.append(f"sharded counters (16 shards, {THREADS} threads, incr_many x{SH_MANY})")
    print("limits: " + ", ".join(limits_used))
    print()
    w = max(len(r.name) for r in rep.results)
    cpu = any(r.cpu_client_us is not None for r in rep.results)
    print(f"{'measurement':<{w}}  {'ops/s':>12}  {'us/op':>8}" + ("  cpu us/op: client + server" if cpu else ""))
    print(f"{'-' * w}  {'-' * 12}  {'-' * 8}" + ("  " + "-" * 27 if cpu else ""))
    for r in rep.results:
        us = 1e6 / r.ops_per_sec if r.ops_per_sec > 0 else math.inf
        extra = f"  ({r.falsy} falsy results!)" if r.falsy else ""
        if r.cpu_client_us is not None and r.cpu_server_us is not None:
            c, sv = r.cpu_client_us, r.cpu_server_us
            extra = f"  {c + sv:>9.2f} = {c:5.2f} + {sv:5.2f}" + extra
        print(f"{r.name:<{w}}  {r.ops_per_sec:>12,.0f}  {us:>8.2f}{extra}")
    print()
    w = max(len(r.name) for r in rep.ratios)
    print(f"{'ratio (median of turns)':<{w}}  {'value':>7}  {'target':>8}  result  {'turns min-max':>13}")
    print(f"{'-' * w}  {'-' * 7}  {'-' * 8}  ------  {'-' * 13}")
    for q in rep.ratios:
        target = f">= {q.target:g}" if q.target is not None else "-"
        verdict = "-" if q.passed is None else ("PASS" if q.passed else "MISS")
        print(f"{q.name:<{w}}  {q.value:>7.3f}  {target:>8}  {verdict:<6}  {q.low:>6.3f}-{q.high:<6.3f}")
    missed = [q for q in rep.ratios if q.passed is False]
    print()
    for note in rep.notes:
        print(f"note: {note}")
    if rep.notes:
        print()
    if missed:
        print(f"{len(missed)} of {sum(q.target is not None for q in rep.ratios)} ratio targets missed")
    if rep.missed_rates:
        print(f"rate targets not met: {', '.join(rep.missed_rates)}")
    if not missed and not rep.missed_rates:
        print("all targets met")


# --------------------------------------------------------------------------- sliding windows

# (ratio name, numerator row, denominator row, target or None)
_RatioSpec = tuple[str, str, str, "float | None"]


def _sliding_block(
    store: Store,
    where: str,
    storage: str,
    prefix: str,
    keys: Sequence[str],
    moving_window_hit: Callable[[str], object],
    sliding_counter_hit: Callable[[str], object],
    target: float,
) -> tuple[list[_Contender], list[_RatioSpec]]:
    """The sliding-window and bucket contenders on one store, and their ratios.

    redcount's exact log and two-bucket estimate each run right before their ``limits``
    twin, so that each per-turn ratio compares two slices taken back to back."""

    def hit(strategy: Strategy) -> Callable[[str], object]:
        return partial(Limiter(store, strategy, prefix=prefix).hit, SLIDING_LIMIT)

    sw, mw = RC_SW.format(store=where), LIM_MW.format(storage=storage)
    swa, swc = RC_SWA.format(store=where), LIM_SWC.format(storage=storage)
    tb, gcra = RC_TB.format(store=where), RC_GCRA.format(store=where)
    contenders: list[_Contender] = [
        _PythonOp(sw, hit("sliding-window"), keys),
        _PythonOp(mw, moving_window_hit, keys),
        _PythonOp(swa, hit("sliding-window-approx"), keys),
        _PythonOp(swc, sliding_counter_hit, keys),
        _PythonOp(tb, hit("token-bucket"), keys),
        _PythonOp(gcra, hit("gcra"), keys),
    ]
    ratios: list[_RatioSpec] = [
        (f"redcount sliding-window / limits MovingWindow ({where})", sw, mw, target),
        (f"redcount sliding-window-approx / limits SlidingWindowCounter ({where})", swa, swc, target),
        (f"redcount token-bucket / redcount sliding-window ({where})", tb, sw, None),
        (f"redcount gcra / redcount sliding-window ({where})", gcra, sw, None),
    ]
    return contenders, ratios


# --------------------------------------------------------------------------- the engine


async def _aclose_limits(storage: object) -> None:
    """Close the redis-py client inside limits' async storage on its own loop (else its
    connections are torn down by the garbage collector after the loop is gone)."""
    client = getattr(getattr(storage, "bridge", None), "storage", None)
    aclose = getattr(client, "aclose", None)
    if aclose is not None:
        await aclose()


def _engine_block(
    stack: ExitStack,
    store: Store,
    url: str,
    prefix: str,
    keys: Sequence[str],
    bench_bin: str,
    rb_key: str,
    server_bin: str | None,
    have: set[str],
) -> tuple[list[_Contender], list[_RatioSpec], list[str], set[str]]:
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
    contenders: list[_Contender] = [
        _RedisBenchmark(rb_c8, bench_bin, url, 1, rb_key, clients=THREADS),
        _Threads(threads, counter.incr, keys, THREADS),
        _Threads(threads_tc, tc_counter.incr, keys, THREADS),
    ]
    if RC_INCR not in have:
        contenders.append(_PythonOp(RC_INCR, counter.incr, keys))

    # asyncio: limits' async Redis storage (redis-py) against redcount.aio on the same server.
    from .. import aio

    item = limits.parse(BIG_LIMIT)
    storage = limits.storage.storage_from_string(
        f"async+{url}", key_prefix=f"{prefix}:limits-aio", **_LIMITS_ASYNC_OPTIONS
    )
    lim_aio = limits.aio.strategies.FixedWindowRateLimiter(storage)
    rc_aio = aio.Limiter(store, "fixed-window", prefix=f"{prefix}:lim")
    lim_name, rc_name = LIM_AIO.format(tasks=TASKS), RC_AIO.format(tasks=TASKS)
    lim_loop = _AsyncHits(lim_name, partial(lim_aio.hit, item), keys, TASKS, cleanup=partial(_aclose_limits, storage))
    rc_loop = _AsyncHits(rc_name, partial(rc_aio.hit, BIG_LIMIT), keys, TASKS)
    stack.callback(lim_loop.close)
    stack.callback(rc_loop.close)
    contenders += [lim_loop, rc_loop]
    if RC_HIT_REDIS not in have:
        contenders.append(_PythonOp(RC_HIT_REDIS, partial(limiter.hit, BIG_LIMIT), keys))
    ratios: list[_RatioSpec] = [
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
        uv_loop = _AsyncHits(uv_name, partial(rc_aio.hit, BIG_LIMIT), keys, TASKS, uvloop=True)
        stack.callback(uv_loop.close)
        contenders.append(uv_loop)
        ratios.append(("redcount aio hit: uvloop / asyncio's default loop", uv_name, rc_name, None))

    # TLS: a second private server that speaks only TLS, with throw-away certificates.
    if server_bin is None:
        notes.append("no TLS row: it needs a private server (leave out --url)")
    else:
        try:
            certs = _make_certs(stack.enter_context(tempfile.TemporaryDirectory(prefix="redcount-bench-tls-")))
            tls_url = stack.enter_context(_private_server(server_bin, certs))
        except BenchError as e:
            notes.append(f"no TLS row: {e}")
        else:
            tls_store = connect(tls_url, ssl_ca_certs=certs.ca)
            stack.callback(tls_store.close)
            tls_counter = FixedWindowCounter(tls_store, "incr", COUNTER_WINDOW, prefix=prefix)
            stack.callback(tls_counter.close)
            contenders.append(_PythonOp(RC_INCR_TLS, tls_counter.incr, keys))
            ratios.append(("redcount incr rediss:// / redis:// (one thread)", RC_INCR_TLS, RC_INCR, None))
    probed = {rb_c8, threads, threads_tc, RC_INCR, lim_name, rc_name, RC_HIT_REDIS}
    return contenders, ratios, notes, probed


def _cpu_bound(by_name: dict[str, Result]) -> list[str]:
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


# --------------------------------------------------------------------------- sharded counters


def _sharded_block(
    stack: ExitStack,
    store: Store,
    url: str,
    prefix: str,
    keys: Sequence[str],
    bench_bin: str,
    rb_key: str,
    have: set[str],
) -> tuple[list[_Contender], list[_RatioSpec]]:
    """The sharded-counter contenders and their ratios; ``have`` names rows already planned
    (the plain ``incr`` and redis-benchmark rows of the other groups serve here too)."""
    from ..sharded import BufferedCounter, ShardedCounter

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
    contenders: list[_Contender] = []
    if RB_P1 not in have:
        contenders.append(_RedisBenchmark(RB_P1, bench_bin, url, 1, rb_key))
    if RC_INCR not in have:
        contenders.append(_PythonOp(RC_INCR, plain.incr, keys))
    contenders.append(_PythonOp(RC_SH_INCR, incr_new_id, keys))
    if rb_c8 not in have:
        contenders.append(_RedisBenchmark(rb_c8, bench_bin, url, 1, rb_key, clients=THREADS))
    if plain_threads not in have:
        contenders.append(_Threads(plain_threads, plain.incr, keys, THREADS))
    contenders += [
        _Threads(sh_threads, incr_new_id, keys, THREADS),
        _PythonOp(sh_many, incr_many_new_ids, keys[:100], per_call=SH_MANY),
        _Threads(sh_many_threads, incr_many_new_ids, keys[:100], THREADS, per_call=SH_MANY),
        _Tight(RC_BUF, buffered.incr),
    ]
    ratios: list[_RatioSpec] = [
        ("sharded incr with request ids / plain incr (Redis, 1 thread)", RC_SH_INCR, RC_INCR, None),
        ("sharded incr with request ids / redis-benchmark -c1 -P1", RC_SH_INCR, RB_P1, None),
        (f"sharded incr with request ids x{THREADS} / plain incr x{THREADS} threads", sh_threads, plain_threads, None),
        (f"sharded incr with request ids x{THREADS} / redis-benchmark -c{THREADS} -P1", sh_threads, rb_c8, None),
    ]
    return contenders, ratios


def _percentile(sorted_values: Sequence[float], q: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def _value_latency(store: Store, prefix: str, seconds: float) -> list[str]:
    """``value()`` latency p50/p99 per shard count, idle and while 8 threads write; as notes."""
    from ..sharded import ShardedCounter

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
            figures.append(f"p50 {_percentile(lat, 0.5):,.0f} us, p99 {_percentile(lat, 0.99):,.0f} us")
        notes.append(
            f"sharded value() with {shards} shards: {figures[0]} idle; {figures[1]} "
            f"while {THREADS} threads write ({calls} calls each)"
        )
    return notes


# --------------------------------------------------------------------------- main


def run_bench(args: argparse.Namespace) -> int:
    """Entry point of ``redcount bench``; returns the exit code."""
    try:
        import limits
        import limits.storage
        import limits.strategies
        import redis  # noqa: F401 - limits' RedisStorage needs it
    except ImportError as e:
        print(
            f"redcount bench: error: the comparison needs the `limits` library with Redis support "
            f"({e}); {INSTALL_LIMITS}",
            file=sys.stderr,
        )
        return 2

    seconds = float(args.seconds)
    batch = int(args.batch)
    only = str(getattr(args, "only", "all"))
    if not seconds > 0 or not math.isfinite(seconds):
        raise ValueError(f"--seconds must be > 0, got {args.seconds}")
    if batch < 1:
        raise ValueError(f"--batch must be >= 1, got {args.batch}")
    if only not in ONLY:
        raise ValueError(f"--only must be one of {', '.join(ONLY)}, got {only!r}")
    fixed, sliding = only in ("all", "fixed"), only in ("all", "sliding")
    engine = only in ("all", "engine")
    sharded = only in ("all", "sharded")
    hot = only in ("all", "hot")

    bench_bin = ""  # only the fixed-window and engine measurements run redis-benchmark
    if fixed or engine or sharded:
        found = shutil.which(args.redis_benchmark)
        if found is None:
            raise BenchError(
                f"redis-benchmark not found (looked for {args.redis_benchmark!r}); {INSTALL_REDIS}, "
                f"or pass --redis-benchmark PATH"
            )
        bench_bin = found
    server_bin = _server_binary(args.redis_server) if args.url is None else None
    if args.url is not None:
        _benchmark_target(args.url)  # refuse what redis-benchmark and limits cannot use, up front
        if fixed or engine or sharded:
            _check_benchmark_auth(bench_bin, args.url)

    prefix = f"rcbench:{os.getpid()}:{secrets.token_hex(4)}"
    rb_key = f"{prefix}:rb:__rand_int__"
    n_keys = max(N_KEYS, batch)  # a batch never repeats a key
    keys = [f"user:{i}" for i in range(n_keys)]
    batches = [{keys[(j * batch + i) % n_keys]: 1 for i in range(batch)} for j in range(-(-n_keys // batch))]
    item = limits.parse(BIG_LIMIT)
    sliding_item = limits.parse(SLIDING_LIMIT)

    with (
        _sigterm_as_exit(),
        _private_server(server_bin) if server_bin else _existing(args.url) as url,
        ExitStack() as engine_resources,
    ):
        store = connect(url)
        mem = connect()
        mem_sliding = connect()  # its own, so that its figures do not depend on --only
        try:
            store.ping()
            rep = Report(
                server=store.url,
                private_server=server_bin is not None,
                redis_version=_redis_version(store),
                redcount_version=__version__,
                limits_version=str(getattr(limits, "__version__", "?")),
                seconds=seconds,
                batch=batch,
                keys=n_keys,
                key_prefix=prefix,
                only=only,
            )
            plan: list[_Contender] = []
            ratios: list[_RatioSpec] = []
            counters: list[FixedWindowCounter] = []
            if fixed:
                counter = FixedWindowCounter(store, "incr", COUNTER_WINDOW, prefix=prefix)
                limiter = Limiter(store, prefix=f"{prefix}:lim")
                mem_counter = FixedWindowCounter(mem, "incr", COUNTER_WINDOW, prefix=prefix)
                mem_limiter = Limiter(mem, prefix=f"{prefix}:lim")
                counters += [counter, mem_counter]
                lim_redis = limits.strategies.FixedWindowRateLimiter(
                    limits.storage.RedisStorage(url, key_prefix=f"{prefix}:limits")
                )
                lim_mem = limits.strategies.FixedWindowRateLimiter(limits.storage.MemoryStorage())
                plan += [
                    _RedisBenchmark(RB_P1, bench_bin, url, 1, rb_key),
                    _PythonOp(RC_INCR, counter.incr, keys),
                    _PythonOp(LIM_HIT_REDIS, partial(lim_redis.hit, item), keys),
                    _PythonOp(RC_HIT_REDIS, partial(limiter.hit, BIG_LIMIT), keys),
                    _RedisBenchmark(RB_PN.format(batch=batch), bench_bin, url, batch, rb_key),
                    _PythonOp(RC_MANY.format(batch=batch), counter.incr_many, batches, per_call=batch),
                    _PythonOp(RC_INCR_MEM, mem_counter.incr, keys),
                    _PythonOp(LIM_HIT_MEM, partial(lim_mem.hit, item), keys),
                    _PythonOp(RC_HIT_MEM, partial(mem_limiter.hit, BIG_LIMIT), keys),
                ]
                ratios += [
                    ("redcount incr (Redis) / limits hit (Redis)", RC_INCR, LIM_HIT_REDIS, 1.6),
                    ("redcount incr (Redis) / redis-benchmark -c1 -P1", RC_INCR, RB_P1, 0.8),
                    (
                        f"redcount incr_many / redis-benchmark -c1 -P{batch}",
                        RC_MANY.format(batch=batch),
                        RB_PN.format(batch=batch),
                        0.4,
                    ),
                    ("redcount incr (memory) / limits hit (memory)", RC_INCR_MEM, LIM_HIT_MEM, 3.0),
                    ("redcount Limiter.hit / limits hit (Redis)", RC_HIT_REDIS, LIM_HIT_REDIS, None),
                    ("redcount Limiter.hit / limits hit (memory)", RC_HIT_MEM, LIM_HIT_MEM, None),
                ]
            if sliding:
                # One limits storage per limiter, like the fixed-window one above: in memory
                # each brings its own expiry timer thread, which would otherwise sweep the
                # other's keys too.
                for where, storage, rc_store, mw, swc, target in [
                    (
                        "Redis",
                        "RedisStorage",
                        store,
                        limits.storage.RedisStorage(url, key_prefix=f"{prefix}:limits-mw"),
                        limits.storage.RedisStorage(url, key_prefix=f"{prefix}:limits-swc"),
                        1.6,
                    ),
                    (
                        "memory",
                        "MemoryStorage",
                        mem_sliding,
                        limits.storage.MemoryStorage(),
                        limits.storage.MemoryStorage(),
                        5.0,
                    ),
                ]:
                    more, more_ratios = _sliding_block(
                        rc_store,
                        where,
                        storage,
                        f"{prefix}:lim",
                        keys,
                        partial(limits.strategies.MovingWindowRateLimiter(mw).hit, sliding_item),
                        partial(limits.strategies.SlidingWindowCounterRateLimiter(swc).hit, sliding_item),
                        target,
                    )
                    plan += more
                    ratios += more_ratios

            if hot:
                hot_keys = keys[:HOT_KEYS]
                hot_item = limits.parse(HOT_SLIDING_LIMIT)
                mem_hot = connect()
                engine_resources.callback(mem_hot.close)
                for where, storage, rc_store, fixed_storage, mw_storage, incr_target, sw_target in [
                    (
                        "Redis",
                        "RedisStorage",
                        store,
                        limits.storage.RedisStorage(url, key_prefix=f"{prefix}:limits-hot-fw"),
                        limits.storage.RedisStorage(url, key_prefix=f"{prefix}:limits-hot-mw"),
                        1.6,
                        1.6,
                    ),
                    (
                        "memory",
                        "MemoryStorage",
                        mem_hot,
                        limits.storage.MemoryStorage(),
                        limits.storage.MemoryStorage(),
                        3.0,
                        5.0,
                    ),
                ]:
                    hot_counter = FixedWindowCounter(rc_store, "hot", COUNTER_WINDOW, prefix=prefix)
                    counters.append(hot_counter)
                    log = Limiter(rc_store, "sliding-window", prefix=f"{prefix}:hotlim")
                    names = (
                        (RC_INCR_MEM if where == "memory" else RC_INCR) + HOT,
                        (LIM_HIT_MEM if where == "memory" else LIM_HIT_REDIS) + HOT,
                        RC_SW.format(store=where) + HOT,
                        LIM_MW.format(storage=storage) + HOT,
                    )
                    plan += [
                        _PythonOp(names[0], hot_counter.incr, hot_keys),
                        _PythonOp(
                            names[1],
                            partial(limits.strategies.FixedWindowRateLimiter(fixed_storage).hit, item),
                            hot_keys,
                        ),
                        _PythonOp(names[2], partial(log.hit, HOT_SLIDING_LIMIT), hot_keys),
                        _PythonOp(
                            names[3],
                            partial(limits.strategies.MovingWindowRateLimiter(mw_storage).hit, hot_item),
                            hot_keys,
                        ),
                    ]
                    ratios += [
                        (f"redcount incr / limits hit ({where}, 100 hot keys)", names[0], names[1], incr_target),
                        (
                            f"redcount sliding-window / limits MovingWindow ({where}, 100 hot keys)",
                            names[2],
                            names[3],
                            sw_target,
                        ),
                    ]

            if engine:
                more, more_ratios, notes, probed = _engine_block(
                    engine_resources, store, url, prefix, keys, bench_bin, rb_key, server_bin, {c.name for c in plan}
                )
                plan += more
                ratios += more_ratios
                rep.notes += notes
                probe = _CpuProbe(store)
                for measured in plan:
                    if measured.name in probed:
                        measured.probe = probe

            if sharded:
                more, more_ratios = _sharded_block(
                    engine_resources, store, url, prefix, keys, bench_bin, rb_key, {c.name for c in plan}
                )
                plan += more
                ratios += more_ratios

            rounds = _rounds(seconds)
            step = 0
            for r in range(1, rounds + 1):
                for contender in plan:
                    step += 1
                    turn = f" (turn {r}/{rounds})" if rounds > 1 else ""
                    _progress(step, rounds * len(plan), contender.name + turn)
                    contender.run_slice(seconds / rounds)
            rep.results = [c.result() for c in plan]
            rep.rounds = rounds
            for c in counters:
                c.close()

            by_name = {r.name: r for r in rep.results}
            if engine:
                single = by_name[RC_INCR]
                rep.notes.append(
                    f"single thread, no regression (issue 7 section 2): {RC_INCR} {single.ops_per_sec:,.0f} ops/s "
                    "in this run; compare with docs/benchmarks.md's figures on the same machine"
                )
                rep.notes += _cpu_bound(by_name)
            if sharded:
                many = by_name[RC_SH_MANY_THREADS.format(n=SH_MANY, threads=THREADS)]
                one = by_name[RC_SH_MANY.format(n=SH_MANY)]
                buf = by_name[RC_BUF]
                rep.notes.append(f"incr_many from one thread: {one.ops_per_sec:,.0f} applied increments/s")
                for what, row, target, unit in (
                    (f"incr_many, one process ({THREADS} threads)", many, SH_MANY_TARGET, "applied increments/s"),
                    ("BufferedCounter.incr", buf, BUF_TARGET, "calls/s"),
                ):
                    verdict = "met" if row.ops_per_sec >= target else "not met"  # not PASS/MISS: ratios only
                    if verdict == "not met":
                        rep.missed_rates.append(what)
                    rep.notes.append(f"{what}: {row.ops_per_sec:,.0f} {unit} (target >= {target:,.0f}): {verdict}")
                rep.notes += _value_latency(store, prefix, seconds)
            rep.ratios = [_ratio(by_name, *spec) for spec in ratios]
            _print_report(rep)
            if args.json:
                write_json(args.json, _json_ready(asdict(rep)))
        finally:
            try:
                engine_resources.close()  # the engine's loops, counters and TLS server, before the store
                if server_bin is None:  # our keys on someone's server: take them away
                    _delete_keys(store, f"{prefix}:*")
                    _delete_keys(store, f"{{{prefix}:*")  # sharded counters' keys start with their tag
            finally:
                store.close()
                mem.close()
                mem_sliding.close()
    return 0


@contextmanager
def _existing(url: str) -> Iterator[str]:
    yield url


def _json_ready(obj: Any) -> Any:
    """NaN/inf are not JSON: write them as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_ready(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_json_ready(v) for v in obj]
    return obj
