"""The harness of ``redcount bench``: contenders that take turns in short slices, the CPU
probe, and the store helpers the tools share (INFO fields, deleting a run's keys).

Each measurement is a `Contender`; the run gives every contender `rounds` turns
of about `SLICE` seconds in a fixed order, so a change in the machine's state mid-run
hits every contender alike and the two sides of a ratio run back to back.
"""

from __future__ import annotations

import asyncio
import itertools
import resource
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Generic, TypeVar

from ...store import Store
from ..servers import server_binary
from .report import Result
from .rows import INSTALL_REDIS

T = TypeVar("T")

# (ratio name, numerator row, denominator row, target or None)
RatioSpec = tuple[str, str, str, "float | None"]


class BenchError(ValueError):
    """A setup problem (missing binary, server that will not start...): cli prints it, exit 2."""



def find_server(name: str) -> str:
    """The redis-server binary to start a private server from, or an error saying what to do."""
    return server_binary(name, f"{INSTALL_REDIS}, pass --redis-server PATH, or point --url at a running server")


def progress(step: int, total: int, what: str) -> None:
    print(f"[{step}/{total}] {what} ...", file=sys.stderr, flush=True)



SLICE = 0.4  # seconds: measurements take turns in slices of about this long (see rounds)


def rounds(seconds: float) -> int:
    """How many turns each measurement gets.

    With one client and no pipelining, a round trip on a small box costs 25 us or 55 us
    depending on whether the scheduler puts client and server on the same core, and that
    flips every few seconds with whatever else runs. Taking turns in short slices exposes
    every contender to the same mix, so the ratios hold still even when the figures move.
    """
    return max(1, min(5, round(seconds / SLICE)))


class CpuProbe:
    """CPU seconds spent so far by this process (every thread, and children that have been
    waited for: redis-benchmark) and by the redis-server behind ``store`` (INFO cpu: its
    user and system time, all its threads)."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def client(self) -> float:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return time.process_time() + children.ru_utime + children.ru_stime

    def server(self) -> float:
        fields = info(self.store, "cpu")
        try:
            return float(fields["used_cpu_sys"]) + float(fields["used_cpu_user"])
        except (KeyError, ValueError) as e:
            raise BenchError(f"the server's INFO cpu has no used_cpu_sys/used_cpu_user: {fields!r}") from e


class Contender:
    """One measurement, run in one or more slices whose figures add up."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.ops = 0
        self.elapsed = 0.0
        self.falsy = 0
        self.turn_rates: list[float] = []
        self.probe: CpuProbe | None = None  # set: CPU is measured around each slice's timed part
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


class PythonOp(Contender, Generic[T]):
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


class Threads(Contender):
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


class AsyncHits(Contender):
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


class Tight(Contender):
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



def info(store: Store, section: str) -> dict[str, str]:
    """One section of INFO as its ``field: value`` pairs, from the store's first node (the
    server itself; on a Redis Cluster, one master: INFO is about one node)."""
    info = store.nodes()[0].execute("INFO", section)
    text = info.decode() if isinstance(info, bytes) else str(info)
    return {k: v.strip() for k, v in (line.split(":", 1) for line in text.splitlines() if ":" in line)}


_SERVER_NAMES = {"redis": "Redis", "valkey": "Valkey"}
"""How INFO's ``server_name`` is written in reports (Valkey names itself there; Redis does not)."""


def server_version(store: Store) -> str:
    """The server's product and version as a report names it: ``"Redis 7.0.15"``, ``"Valkey 9.1.2"``.

    Valkey answers ``redis_version:7.2.4`` (the Redis version it stays compatible with, for
    clients that branch on it) and gives its own name and version in ``server_name`` and
    ``valkey_version``; a server without ``server_name`` is Redis."""
    fields = info(store, "server")
    name = fields.get("server_name", "redis")
    version = fields.get(f"{name}_version") or fields.get("redis_version", "?")
    return f"{_SERVER_NAMES.get(name, name)} {version}"


def scan_keys(node: Store, pattern: str) -> list[bytes]:
    """Every key of one node matching ``pattern``, by SCAN (a node of [`Store.nodes`][redcount.store.Store.nodes]:
    SCAN is about one server, so a cluster is scanned node by node)."""
    keys: list[bytes] = []
    cursor: str | bytes = "0"
    while True:
        reply = node.execute("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
        if not isinstance(reply, list) or len(reply) != 2:
            raise BenchError(f"unexpected SCAN reply: {reply!r}")
        next_cursor, found = reply
        if isinstance(found, list):
            keys.extend(k for k in found if isinstance(k, bytes))
        if not isinstance(next_cursor, bytes) or next_cursor == b"0":
            return keys
        cursor = next_cursor


def delete_keys(store: Store, pattern: str) -> int:
    """SCAN + DEL every key matching ``pattern`` on every node of ``store``; returns how many
    were deleted. One DEL per key (in one batch per SCAN page): keys of one page may lie in
    different hash slots, which a cluster node refuses in one DEL."""
    deleted = 0
    for node in store.nodes():
        keys = scan_keys(node, pattern)
        for i in range(0, len(keys), 1000):
            replies = node.execute_many([("DEL", k) for k in keys[i : i + 1000]])
            deleted += sum(n for n in replies if isinstance(n, int))
    return deleted


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://``, ``rediss+cluster://``)."""
    return url.split("://", 1)[0].lower().endswith("+cluster")


def cluster_seed(url: str) -> str:
    """The first seed node of a cluster URL as a ``redis://`` URL (for a reachability check)."""
    scheme, rest = url.split("://", 1)
    userinfo, _, hosts = rest.rpartition("@")
    first = hosts.split("/", 1)[0].split("?", 1)[0].split(",")[0]
    plain = "rediss" if scheme.lower().startswith("rediss") else "redis"
    return f"{plain}://{userinfo + '@' if userinfo else ''}{first}"


def limits_redis_storage(url: str, key_prefix: str) -> Any:
    """The limits storage for the Redis at ``url``: limits' own cluster storage for a
    cluster URL (the same scheme), its single-server storage otherwise."""
    import limits.storage

    if is_cluster_url(url):
        return limits.storage.RedisClusterStorage(url, key_prefix=key_prefix)
    return limits.storage.RedisStorage(url, key_prefix=key_prefix)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``sorted_values``, by rank."""
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]
