"""``redcount abuse``: what one abusive client costs in Redis memory, per strategy.

A client sends ``--factor`` (default 10) times its limit, evenly spaced over one whole
window (default: L/minute with L = 10, 100 and 1000, so 100, 1,000 and 10,000 requests).
Each strategy gets its own fresh key; after the last request the key's size is read with
``MEMORY USAGE <key> SAMPLES 0`` (every element counted, not sampled). Rows:

- ``sliding-window`` (exact log): a sorted set of the *admitted* hits only — a refused hit
  stores nothing — so it holds at most L members: O(limit), and independent of how hard the
  client hammers.
- ``sliding-window-approx`` (k = 1 and k = 4): a hash of at most k + 1 sub-bucket counts.
- ``fixed-window``: one integer string; ``token-bucket``: a hash {tokens, ts}; ``gcra``: one
  integer string: O(1).
- ``naive sorted set``: the reference a rate-limit log is often written as: ``ZADD`` every
  request (member = a unique request id, score = its time), ``ZREMRANGEBYSCORE`` to the window,
  ``PEXPIRE``. It stores refused requests too, so it grows with the request count: what an
  attacker sends is what Redis holds.

The requests are simulated, not waited for: the store is opened with a
[`ManualClock`][redcount.store.ManualClock] as its client clock (``clock="client"``, the default), which
steps through the window in a fraction of a second of real time. Redis expires keys on its
own clock, so the simulated time starts one window ahead of the real time and every TTL the
scripts set is at least the time to the next request: no key expires during a run.

The server is a private ``redis-server`` on a free loopback port (started and stopped as
``redcount bench`` does) unless ``--url`` names one; on a ``--url`` server only keys under
a prefix unique to the run are written, and they are deleted at the end.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from .. import __version__
from .accuracy import STRATEGIES, StrategyCase, limit_text
from .bench.harness import BenchError, delete_keys, find_server, scan_keys, server_version
from .bench.report import write_json
from ..limiter import Limiter
from ..store import ManualClock, Store, connect
from .servers import private_or_existing, sigterm_as_exit
from .urls import mask_url

__all__ = [
    "NAIVE",
    "AbuseReport",
    "AbuseRow",
    "measure_abuse",
    "measure_limiter",
    "measure_naive",
    "run_abuse",
]

NAIVE = "naive sorted set (every request)"
DEFAULT_LIMITS = (10, 100, 1000)


@dataclass
class AbuseRow:
    strategy: str
    limit: int
    sent: int
    admitted: int
    keys: int  # keys the strategy holds for the client
    entries: int  # sorted-set members, hash fields, or 1 for a string, summed over the keys
    bytes: int  # MEMORY USAGE ... SAMPLES 0, summed over the keys


@dataclass
class AbuseReport:
    server: str
    private_server: bool
    server_version: str  # "Redis 7.0.15", "Valkey 9.1.2"
    redcount_version: str
    window: int  # seconds
    factor: int
    key_prefix: str
    rows: list[AbuseRow] = field(default_factory=list)


class SimClock:
    """A ManualClock shared by the runs, moved in whole milliseconds."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.ms = round(clock.now() * 1000)

    def to(self, ms: int) -> None:
        if ms < self.ms:
            raise ValueError(f"the simulated clock only moves forward ({ms} < {self.ms})")
        if ms > self.ms:
            self.clock.advance((ms - self.ms) / 1000)  # advance() rounds to the ms: exact
            self.ms = ms

    def next_window(self, window_ms: int) -> int:
        """Move to the start of the next window after the current time; return it."""
        start = (self.ms // window_ms + 1) * window_ms
        self.to(start)
        return start


def open_sim_store(url: str, window: int) -> tuple[Store, SimClock]:
    """A store on ``url`` whose client clock is a ManualClock one window ahead of real time."""
    window_ms = window * 1000
    ahead = (int(time.time() * 1000) // window_ms + 2) * window_ms
    clock = ManualClock(ahead // 1000)
    return connect(url, clock=clock), SimClock(clock)


def _size(store: Store, pattern: str) -> tuple[int, int, int]:
    """(keys, entries, bytes) of every key matching ``pattern``, on every node (SCAN and
    MEMORY USAGE are about one server: a cluster is measured node by node)."""
    n_keys = entries = total = 0
    for node in store.nodes():
        keys = scan_keys(node, pattern)
        n_keys += len(keys)
        for k in keys:
            kind = node.execute("TYPE", k)
            kind = kind.decode() if isinstance(kind, bytes) else kind  # a status reply comes as str
            if kind == "zset":
                n = node.execute("ZCARD", k)
            elif kind == "hash":
                n = node.execute("HLEN", k)
            else:
                n = 1
            entries += n if isinstance(n, int) else 0
            usage = node.execute("MEMORY", "USAGE", k, "SAMPLES", 0)
            total += usage if isinstance(usage, int) else 0
    return n_keys, entries, total


def _request_times(start: int, window_ms: int, sent: int) -> list[int]:
    return [start + i * window_ms // sent for i in range(sent)]


def measure_limiter(
    store: Store, clock: SimClock, case: StrategyCase, limit: int, sent: int, window: int, prefix: str
) -> AbuseRow:
    """``sent`` hits evenly over one window against a fresh key of ``case``; its size after."""
    window_ms = window * 1000
    lim = Limiter(store, case.strategy, prefix=prefix, sub_buckets=case.sub_buckets)
    text = limit_text(limit, window)
    admitted = 0
    for t in _request_times(clock.next_window(window_ms), window_ms, sent):
        clock.to(t)
        admitted += lim.hit(text, "client").allowed
    keys, entries, size = _size(store, f"{prefix}:*")
    return AbuseRow(case.label, limit, sent, admitted, keys, entries, size)


def measure_naive(store: Store, clock: SimClock, limit: int, sent: int, window: int, prefix: str) -> AbuseRow:
    """The naive log: ZADD every request, trim to the window, PEXPIRE; pipelined."""
    window_ms = window * 1000
    key = f"{prefix}:naive:{{client}}"
    rid = secrets.token_hex(8)
    batch: list[tuple[str | bytes | int | float, ...]] = []
    times = _request_times(clock.next_window(window_ms), window_ms, sent)
    for i, t in enumerate(times):
        clock.to(t)
        batch.append(("ZADD", key, t, f"{t}:{rid}{i}"))
        batch.append(("ZREMRANGEBYSCORE", key, "-inf", t - window_ms))
        batch.append(("PEXPIRE", key, window_ms))
        if len(batch) >= 768 or i == len(times) - 1:
            store.execute_many(batch)
            batch = []
    keys, entries, size = _size(store, f"{prefix}:*")
    # Every request is stored; "admitted" is what the limit would have let through.
    return AbuseRow(NAIVE, limit, sent, min(sent, limit), keys, entries, size)


def measure_abuse(
    store: Store,
    clock: SimClock,
    prefix: str,
    limits: Sequence[int] = DEFAULT_LIMITS,
    factor: int = 10,
    window: int = 60,
    strategies: Sequence[StrategyCase] = STRATEGIES,
    naive: bool = True,
) -> list[AbuseRow]:
    """Every strategy (and the naive log) at every limit; each run under its own prefix."""
    rows: list[AbuseRow] = []
    for n, limit in enumerate(limits):
        for m, case in enumerate(strategies):
            p = f"{prefix}:{n}:{m}"
            rows.append(measure_limiter(store, clock, case, limit, factor * limit, window, p))
        if naive:
            rows.append(measure_naive(store, clock, limit, factor * limit, window, f"{prefix}:{n}:n"))
    return rows


def format_markdown(rep: AbuseReport) -> str:
    lines = [
        "| strategy | limit | requests sent | admitted | entries stored | bytes per key |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for r in rep.rows:
        per_key = r.bytes // r.keys if r.keys else 0
        lines.append(
            f"| {r.strategy} | {r.limit}/{rep.window} s | {r.sent:,} | {r.admitted:,} "
            f"| {r.entries:,} | {per_key:,} |"
        )
    lines.append("")
    lines.append(
        f"One client sending {rep.factor}× its limit over one {rep.window} s window; bytes from "
        f"`MEMORY USAGE <key> SAMPLES 0` on {rep.server_version}. For the naive sorted set, "
        f"'admitted' is what the limit would allow; it stores every request."
    )
    return "\n".join(lines)


def _parse_limits(text: str) -> list[int]:
    try:
        out = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--limits must be a comma-separated list of whole numbers, got {text!r}") from None
    if not out or any(not 1 <= x <= 100_000 for x in out):
        raise ValueError(f"--limits must be between 1 and 100000, got {text!r}")
    return out


def run_abuse(args: argparse.Namespace) -> int:
    """Entry point of ``redcount abuse``; returns the exit code."""
    limits = _parse_limits(str(args.limits))
    factor = int(args.factor)
    window = int(args.window)
    if not 1 <= factor <= 1000:
        raise ValueError(f"--factor must be between 1 and 1000, got {args.factor}")
    if window < 1:
        raise ValueError(f"--window must be a whole number of seconds >= 1, got {args.window}")
    if args.url is not None and not str(args.url).startswith(("redis://", "unix://", "redis+cluster://")):
        raise BenchError(
            "redcount abuse measures Redis memory: --url must be a redis://, redis+cluster:// or unix:// URL, "
            f"got {mask_url(str(args.url))!r}"
        )
    server_bin = find_server(args.redis_server) if args.url is None else None
    prefix = f"rcabuse:{os.getpid()}:{secrets.token_hex(4)}"
    with sigterm_as_exit(), private_or_existing(server_bin, args.url) as url:
        store, clock = open_sim_store(url, window)
        try:
            store.ping()
            rep = AbuseReport(
                server=store.url,
                private_server=server_bin is not None,
                server_version=server_version(store),
                redcount_version=__version__,
                window=window,
                factor=factor,
                key_prefix=prefix,
            )
            rep.rows = measure_abuse(store, clock, prefix, limits, factor, window)
            print(format_markdown(rep))
            if args.json:
                write_json(args.json, asdict(rep))
            sys.stdout.flush()
        finally:
            try:
                if server_bin is None:  # our keys on someone's server: take them away
                    delete_keys(store, f"{prefix}:*")
            finally:
                store.close()
    return 0
