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

Each measurement runs single-threaded for about ``--seconds`` in all, after a short warm-up,
over 10,000 rotating keys under a key prefix unique to the run. The measurements take turns
in slices of about 0.4 s (see :func:`_rounds`), so a change in the machine's state mid-run
hits every contender alike; the two sides of each ratio with a target run back to back. On a
``--url`` server only the run's own keys are written, and they are deleted (SCAN + DEL) at the
end.
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import json
import math
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
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
ONLY = ("all", "fixed", "sliding")


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


class _Contender:
    """One measurement, run in one or more slices whose figures add up."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ops = 0
        self.elapsed = 0.0
        self.falsy = 0
        self.turn_rates: list[float] = []

    def run_slice(self, seconds: float) -> None:
        raise NotImplementedError

    def result(self) -> Result:
        rate = self.ops / self.elapsed if self.elapsed > 0 else 0.0
        return Result(self.name, rate, self.ops, self.elapsed, self.falsy, list(self.turn_rates))


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
        calls, elapsed, falsy = self._loop(seconds, self.chunk)
        self.ops += calls * self.per_call
        self.elapsed += elapsed
        self.falsy += falsy * self.per_call
        self.turn_rates.append(calls * self.per_call / elapsed if elapsed > 0 else 0.0)


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


def _pings(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(64).startswith(b"+PONG")
    except OSError:
        return False


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
def _private_server(binary: str) -> Iterator[str]:
    """Start redis-server on a free loopback port; yield its URL; stop it on the way out."""
    with tempfile.TemporaryDirectory(prefix="redcount-bench-") as tmp:
        log_path = os.path.join(tmp, "redis.log")
        for _attempt in range(3):  # another process may grab the free port first
            port = _free_port()
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    [
                        binary,
                        "--port",
                        str(port),
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
                while proc.poll() is None and not _pings("127.0.0.1", port):
                    if time.monotonic() > deadline:
                        raise BenchError(f"{binary} on port {port} did not answer PING within 10 s")
                    time.sleep(0.005)  # polling interval, not a fixed wait
                if proc.poll() is None:
                    yield f"redis://127.0.0.1:{port}/0"
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
    binary: str, url: str, pipeline: int, key: str, n: int
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of ``redis-benchmark INCR key:__rand_int__`` with one client."""
    # `INCR <prefix>:rb:__rand_int__` is what `-t incr` sends (it uses `counter:__rand_int__`),
    # but under this run's own prefix, so nothing outside it is touched on a --url server.
    target, env = _benchmark_target(url)
    argv = [
        binary,
        *target,
        "-c",
        "1",
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


def _redis_benchmark(binary: str, url: str, pipeline: int, key: str, n: int) -> tuple[float, float]:
    """Run ``redis-benchmark INCR key:__rand_int__`` with one client; (requests/s, seconds)."""
    cmd, env = _benchmark_command(binary, url, pipeline, key, n)
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
    """``redis-benchmark`` INCR with one client and ``pipeline`` requests in flight."""

    def __init__(self, name: str, binary: str, url: str, pipeline: int, key: str) -> None:
        super().__init__(name)
        self.binary, self.url, self.pipeline, self.key = binary, url, pipeline, key
        self.rate = 0.0

    def run_slice(self, seconds: float) -> None:
        if not self.rate:  # a short calibration run sizes -n so that a slice takes `seconds`
            self.rate, _ = _redis_benchmark(
                self.binary, self.url, self.pipeline, self.key, max(1000, self.pipeline * 200)
            )
        n = max(self.pipeline * 10, int(self.rate * seconds))
        n -= n % self.pipeline
        rps, elapsed = _redis_benchmark(self.binary, self.url, self.pipeline, self.key, n)
        self.rate = rps
        self.ops += n
        self.elapsed += n / rps if rps > 0 else elapsed
        self.turn_rates.append(rps)


# --------------------------------------------------------------------------- store helpers


def _redis_version(store: Store) -> str:
    info = store.execute("INFO", "server")
    text = info.decode() if isinstance(info, bytes) else str(info)
    for line in text.splitlines():
        if line.startswith("redis_version:"):
            return line.split(":", 1)[1].strip()
    return "?"


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
    print("limits: " + ", ".join(limits_used))
    print()
    w = max(len(r.name) for r in rep.results)
    print(f"{'measurement':<{w}}  {'ops/s':>12}  {'us/op':>8}")
    print(f"{'-' * w}  {'-' * 12}  {'-' * 8}")
    for r in rep.results:
        us = 1e6 / r.ops_per_sec if r.ops_per_sec > 0 else math.inf
        extra = f"  ({r.falsy} falsy results!)" if r.falsy else ""
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
    if missed:
        print(f"{len(missed)} of {sum(q.target is not None for q in rep.ratios)} targets missed")
    else:
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

    bench_bin = ""  # only the fixed-window measurements run redis-benchmark
    if fixed:
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
        if fixed:
            _check_benchmark_auth(bench_bin, args.url)

    prefix = f"rcbench:{os.getpid()}:{secrets.token_hex(4)}"
    rb_key = f"{prefix}:rb:__rand_int__"
    n_keys = max(N_KEYS, batch)  # a batch never repeats a key
    keys = [f"user:{i}" for i in range(n_keys)]
    batches = [{keys[(j * batch + i) % n_keys]: 1 for i in range(batch)} for j in range(-(-n_keys // batch))]
    item = limits.parse(BIG_LIMIT)
    sliding_item = limits.parse(SLIDING_LIMIT)

    with _sigterm_as_exit(), _private_server(server_bin) if server_bin else _existing(args.url) as url:
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
            rep.ratios = [_ratio(by_name, *spec) for spec in ratios]
            _print_report(rep)
            if args.json:
                write_json(args.json, _json_ready(asdict(rep)))
        finally:
            try:
                if server_bin is None:  # our keys on someone's server: take them away
                    _delete_keys(store, f"{prefix}:*")
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
