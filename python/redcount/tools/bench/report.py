"""The report of ``redcount bench``: its rows and ratios, the printed table, and the JSON."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from .rows import BIG_LIMIT, HOT_KEYS, HOT_SLIDING_LIMIT, SH_MANY, SLIDING_LIMIT, TASKS, THREADS


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
    server_version: str  # "Redis 7.0.15", "Valkey 9.1.2"
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


def write_json(path: str, data: Any) -> None:
    """Write a report's figures as indented JSON (the ``--json`` option of the commands)."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, ensure_ascii=False)
        f.write("\n")



def ratio(results: dict[str, Result], name: str, num: str, den: str, target: float | None) -> Ratio:
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


def print_report(rep: Report) -> None:
    kind = "private" if rep.private_server else "existing"
    print(
        f"redcount bench: redcount {rep.redcount_version}, limits {rep.limits_version}, "
        f"{rep.server_version} at {rep.server} ({kind})"
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



def json_ready(obj: Any) -> Any:
    """NaN/inf are not JSON: write them as null."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: json_ready(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [json_ready(v) for v in obj]
    return obj
