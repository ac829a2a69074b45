"""Leased limits (``--only leased``): one hot key decided by ``Limiter.hit`` with and without
``lease=``, under 8 threads of one process and under 4 processes, on Redis.

Rates: every caller hits the same key under a limit that is never reached, for about
``--seconds`` per row, and the decisions of all callers add up. CPU per decision is this
side's CPU (every thread, or every worker process) and the redis-server's (INFO cpu), each
divided by the decisions. On a machine with fewer cores than callers the callers take turns:
the figures are decisions per second of the whole machine, not a parallel speed-up.

The approximate sliding window (``strategy="sliding-window-approx"``, whose leases end with
the current sub-bucket) gets the threads rows and their exactness check too.

Refusals: the same 8 threads hit a key whose window is used up (``EXHAUSTED``), with and
without ``lease=``, and with ``lease=`` and a refusal cache; the rows take turns, twice each,
so that a slow moment of a shared machine falls on both. Refusals per second and the server's
script calls per refusal (INFO commandstats): a leased refusal is one round trip at most
(target: the leased rate >= 1.0x the unleased one), with ``refusal_cache`` none until the
window can admit again.

With ``--strategy sliding-window``, ``token-bucket`` or ``gcra``, the rows are that
strategy's: the threads rates (limit ``BIG_APPROX``, never reached), the refusal rows without
and with a lease, and the threads' exactness on ``EXACT`` (a bucket's refill during the run
is allowed for: over-admission is what exceeds the capacity plus the refill).

Exactness: the same callers hammer a fresh key under a limit that runs out, each stopping at
its first refusal. Every unit admitted was charged first, so over-admission must be 0; once
every caller has been refused no lease holds a unit, so the admitted total must be the limit
(under-admission 0). The under-admission while holders still hold units is printed from the
rate rows: units charged in the store and not admitted when the callers stopped (they go
back when the callers close their stores; the store's count then equals the admitted total).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field

from ...limiter import Limiter, Strategy
from ...store import Store, connect
from .harness import CpuProbe

THREADS = 8
PROCESSES = 4
LEASE = 1000  # units per lease in the leased rows
BIG = "1000000000/day"  # the rate rows' limit: never reached
BIG_APPROX = "100000000/hour"  # the same for the approximate sliding window (amount x window <= 2^50)
EXACT = "20000/day"  # the exactness rows' limit: runs out
TARGET = 20.0  # leased / unleased decisions per second
LOG_RATE = "100000/second"  # the exact log's rate rows: its largest amount, over its shortest window
EXHAUSTED = "10/day"  # the refusal rows' limit: used up before they start
REFUSAL_TARGET = 1.0  # leased / unleased refusals per second on an exhausted key
REFUSAL_CACHE = 1000  # the refusal_cache of the cached refusal row
FIXED: Strategy = "fixed-window"
APPROX: Strategy = "sliding-window-approx"  # also leases: threads rows and exactness


@dataclass
class Row:
    name: str
    callers: str
    lease: int | None
    decisions: int = 0
    admitted: int = 0
    seconds: float = 0.0
    cpu_client: float = 0.0
    cpu_server: float = 0.0
    held: int = 0  # units charged and not admitted when the callers stopped
    charged: int = 0  # units the store counted after the callers' stores closed (gave back)
    strategy: str = FIXED
    refusals: bool = False  # a refusal row: every decision is a refusal of an exhausted key
    refusal_cache: int = 0
    store_calls: int = 0  # script calls the server ran for the row (INFO commandstats)

    @property
    def calls_per_decision(self) -> float:
        return self.store_calls / self.decisions if self.decisions else 0.0

    @property
    def rate(self) -> float:
        return self.decisions / self.seconds if self.seconds > 0 else 0.0


@dataclass
class Exactness:
    callers: str
    limit: int
    admitted: int
    charged: int
    strategy: str = FIXED

    @property
    def over(self) -> int:
        return max(0, self.admitted - self.limit)

    @property
    def under(self) -> int:
        return max(0, self.limit - self.admitted)


@dataclass
class LeasedReport:
    seconds: float
    rows: list[Row] = field(default_factory=list)
    exact: list[Exactness] = field(default_factory=list)
    ratios: dict[str, float] = field(default_factory=dict)
    targets: dict[str, float] = field(default_factory=dict)
    strategy: str = ""  # --strategy: the one strategy measured (else the default rows)


def _count(store: Store, limit: str, key: str, prefix: str, strategy: Strategy = FIXED) -> int:
    return Limiter(store, strategy, prefix=prefix).stats(limit, key)[0].count


def _threads(
    url: str, limit: str, key: str, prefix: str, lease: int | None, seconds: float | None, strategy: Strategy = FIXED
) -> tuple[int, int, float, int]:
    """THREADS threads of this process on one limiter: (decisions, admitted, elapsed, units
    held at the end). With ``seconds`` None each thread stops at its first refusal."""
    store = connect(url)
    try:
        lim = Limiter(store, strategy, prefix=prefix)
        lim.hit(limit, key + ":warm", lease=lease)  # connections and scripts
        totals: list[tuple[int, int]] = []
        go = threading.Barrier(THREADS + 1)
        stop_at = [0.0]

        def work() -> None:
            hit = lim.hit
            n = ok = 0
            go.wait()
            deadline = stop_at[0]
            if seconds is None:
                while hit(limit, key, lease=lease) if lease is not None else hit(limit, key):
                    n += 1
                    ok += 1
                n += 1
            elif lease is None:
                while True:
                    for _ in range(64):
                        if hit(limit, key):
                            ok += 1
                    n += 64
                    if time.perf_counter() >= deadline:
                        break
            else:
                while True:
                    for _ in range(64):
                        if hit(limit, key, lease=lease):
                            ok += 1
                    n += 64
                    if time.perf_counter() >= deadline:
                        break
            totals.append((n, ok))

        threads = [threading.Thread(target=work) for _ in range(THREADS)]
        for t in threads:
            t.start()
        start = time.perf_counter()
        stop_at[0] = start + (seconds or 0.0)
        go.wait()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        return sum(n for n, _ in totals), sum(ok for _, ok in totals), elapsed, lim.leased_units
    finally:
        store.close()  # gives back the units its leases still hold


def _scripts_run(store: Store) -> int:
    """Store calls the refusal rows make (INFO commandstats): script calls, and the GETs a
    leased refusal of an exhausted key reads its one limit's count with. No script of these
    rows' refusals runs a GET itself (the fixed-window hit script counts with INCRBY)."""
    info = store.execute("INFO", "commandstats")
    text = info.decode() if isinstance(info, bytes) else str(info)
    calls = 0
    for line in text.splitlines():
        if line.startswith(("cmdstat_evalsha:", "cmdstat_eval:", "cmdstat_get:")):
            calls += int(line.split("calls=")[1].split(",")[0])
    return calls


def _refusals(
    url: str, key: str, prefix: str, lease: int | None, seconds: float, refusal_cache: int, strategy: Strategy = FIXED
) -> tuple[int, int, float, int]:
    """THREADS threads hitting ``key``, whose ``EXHAUSTED`` window is used up first, for
    ``seconds``: (decisions, admitted, elapsed, script calls the server ran meanwhile)."""
    store = connect(url)
    try:
        lim = Limiter(store, strategy, prefix=prefix, refusal_cache=refusal_cache)
        while lim.hit(EXHAUSTED, key):
            pass
        lim.hit(EXHAUSTED, key, lease=lease)  # connections, scripts; the lease learns the refusal
        totals: list[tuple[int, int]] = []
        go = threading.Barrier(THREADS + 1)
        stop_at = [0.0]

        def work() -> None:
            hit = lim.hit
            n = ok = 0
            go.wait()
            deadline = stop_at[0]
            while True:
                for _ in range(64):
                    if hit(EXHAUSTED, key, lease=lease) if lease is not None else hit(EXHAUSTED, key):
                        ok += 1
                n += 64
                if time.perf_counter() >= deadline:
                    break
            totals.append((n, ok))

        threads = [threading.Thread(target=work) for _ in range(THREADS)]
        for t in threads:
            t.start()
        calls0 = _scripts_run(store)
        start = time.perf_counter()
        stop_at[0] = start + seconds
        go.wait()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
        calls = _scripts_run(store) - calls0
        return sum(n for n, _ in totals), sum(ok for _, ok in totals), elapsed, calls
    finally:
        store.close()


WORKER = "redcount.tools.bench.leased"


def _processes(
    url: str, limit: str, key: str, prefix: str, lease: int | None, seconds: float | None
) -> tuple[int, int, float, float, int]:
    """PROCESSES worker processes: (decisions, admitted, elapsed, their CPU seconds, units
    held at the end)."""
    start_at = time.time() + 1.5  # every worker imports, connects and warms up first
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", WORKER, url, limit, key, prefix, str(lease or 0), str(seconds or 0), str(start_at)],
            stdout=subprocess.PIPE,
            env=env,
        )
        for _ in range(PROCESSES)
    ]
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=(seconds or 0) + 120)
        if p.returncode != 0:
            raise RuntimeError(f"a leased-bench worker failed with exit code {p.returncode}")
        outs.append(json.loads(out))
    elapsed = max(o["elapsed"] for o in outs)
    return (
        sum(o["decisions"] for o in outs),
        sum(o["admitted"] for o in outs),
        elapsed,
        sum(o["cpu"] for o in outs),
        sum(o["held"] for o in outs),
    )


def _worker(argv: list[str]) -> None:
    url, limit, key, prefix, lease_s, seconds_s, start_s = argv
    lease = int(lease_s) or None
    seconds = float(seconds_s) or None
    store = connect(url)
    lim = Limiter(store, prefix=prefix)
    lim.hit(limit, key + ":warm", lease=lease)
    hit = lim.hit
    time.sleep(max(0.0, float(start_s) - time.time()))
    cpu0 = time.process_time()
    start = time.perf_counter()
    n = ok = 0
    if seconds is None:
        while hit(limit, key, lease=lease) if lease is not None else hit(limit, key):
            n += 1
            ok += 1
        n += 1
    else:
        deadline = start + seconds
        while True:
            for _ in range(64):
                if (hit(limit, key, lease=lease) if lease is not None else hit(limit, key)):
                    ok += 1
            n += 64
            if time.perf_counter() >= deadline:
                break
    elapsed = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    held = lim.leased_units
    store.close()  # gives back the units its leases still hold
    print(json.dumps({"decisions": n, "admitted": ok, "elapsed": elapsed, "cpu": cpu, "held": held}))


def run_leased(url: str, prefix: str, seconds: float) -> LeasedReport:
    """Every row and the exactness checks against the server at ``url``."""
    rep = LeasedReport(seconds=seconds)
    store = connect(url)
    probe = CpuProbe(store)
    try:
        for callers in ("threads", "processes"):
            for lease in (None, LEASE):
                label = f"{THREADS} threads" if callers == "threads" else f"{PROCESSES} processes"
                name = f"hit hot key, {label}, " + ("no lease" if lease is None else f"lease={lease}")
                key = f"hot:{callers}:{lease or 0}"
                row = Row(name, callers, lease)
                print(f"[leased] {name} ...", file=sys.stderr, flush=True)
                c0, s0 = probe.client(), probe.server()
                if callers == "threads":
                    row.decisions, row.admitted, row.seconds, row.held = _threads(url, BIG, key, prefix, lease, seconds)
                    row.cpu_client = probe.client() - c0
                else:
                    row.decisions, row.admitted, row.seconds, row.cpu_client, row.held = _processes(
                        url, BIG, key, prefix, lease, seconds
                    )
                row.cpu_server = probe.server() - s0
                row.charged = _count(store, BIG, key, prefix)
                rep.rows.append(row)
        # Refusals of an exhausted key: the rows take turns (twice each) and add up.
        kinds: list[tuple[int | None, int]] = [(None, 0), (LEASE, 0), (LEASE, REFUSAL_CACHE)]
        refusal_rows = {
            kind: Row(
                f"refuse exhausted key, {THREADS} threads, "
                + ("no lease" if kind[0] is None else f"lease={kind[0]}")
                + (f", refusal_cache={kind[1]}" if kind[1] else ""),
                "threads",
                kind[0],
                refusals=True,
                refusal_cache=kind[1],
            )
            for kind in kinds
        }
        for turn in range(2):
            for kind in kinds:
                row = refusal_rows[kind]
                if turn == 0:
                    print(f"[leased] {row.name} ...", file=sys.stderr, flush=True)
                c0, s0 = probe.client(), probe.server()
                key = f"exhausted:{kind[0] or 0}:{kind[1]}:{turn}"
                n, ok, el, calls = _refusals(url, key, prefix, kind[0], seconds / 2, kind[1])
                row.decisions += n
                row.admitted += ok
                row.seconds += el
                row.store_calls += calls
                row.cpu_client += probe.client() - c0
                row.cpu_server += probe.server() - s0
        rep.rows.extend(refusal_rows[kind] for kind in kinds)
        for callers in ("threads", "processes"):
            key = f"exact:{callers}"
            print(f"[leased] exactness, {callers} ...", file=sys.stderr, flush=True)
            if callers == "threads":
                _, admitted, _, _ = _threads(url, EXACT, key, prefix, LEASE, None)
            else:
                _, admitted, _, _, _ = _processes(url, EXACT, key, prefix, LEASE, None)
            rep.exact.append(Exactness(callers, int(EXACT.split("/")[0]), admitted, _count(store, EXACT, key, prefix)))
        for lease in (None, LEASE):
            name = f"hit hot key, {THREADS} threads, " + ("no lease" if lease is None else f"lease={lease}") + ", approx"
            key = f"hot:approx:{lease or 0}"
            row = Row(name, "threads", lease, strategy=APPROX)
            print(f"[leased] {name} ...", file=sys.stderr, flush=True)
            c0, s0 = probe.client(), probe.server()
            row.decisions, row.admitted, row.seconds, row.held = _threads(
                url, BIG_APPROX, key, prefix, lease, seconds, APPROX
            )
            row.cpu_client = probe.client() - c0
            row.cpu_server = probe.server() - s0
            row.charged = _count(store, BIG_APPROX, key, prefix, APPROX)
            rep.rows.append(row)
        print("[leased] exactness, threads, approx ...", file=sys.stderr, flush=True)
        _, admitted, _, _ = _threads(url, EXACT, "exact:approx", prefix, LEASE, None, APPROX)
        rep.exact.append(
            Exactness(
                "threads", int(EXACT.split("/")[0]), admitted, _count(store, EXACT, "exact:approx", prefix, APPROX), APPROX
            )
        )
        by = {(r.callers, r.strategy, r.lease is not None): r for r in rep.rows if not r.refusals}
        for callers, strategy, label in (
            ("threads", FIXED, "threads"), ("processes", FIXED, "processes"), ("threads", APPROX, "threads, approx")
        ):
            plain, leased = by[(callers, strategy, False)], by[(callers, strategy, True)]
            rep.ratios[label] = leased.rate / plain.rate if plain.rate > 0 else 0.0
            rep.targets[label] = TARGET
        plain, leased = refusal_rows[(None, 0)], refusal_rows[(LEASE, 0)]
        rep.ratios["refusals, threads"] = leased.rate / plain.rate if plain.rate > 0 else 0.0
        rep.targets["refusals, threads"] = REFUSAL_TARGET
    finally:
        store.close()
    return rep


def run_leased_strategy(url: str, prefix: str, seconds: float, strategy: Strategy) -> LeasedReport:
    """``--strategy``: the threads rates, the refusal rows and the threads' exactness of one
    leasing strategy (the exact log, the buckets) against the server at ``url``."""
    rep = LeasedReport(seconds=seconds, strategy=strategy)
    store = connect(url)
    probe = CpuProbe(store)
    short = strategy
    # The log keeps one entry per hit in the window, so its amounts stop at 100,000: leased
    # threads can run into that limit within the second (their refusals count as decisions).
    rate_limit = LOG_RATE if strategy == "sliding-window" else BIG_APPROX
    try:
        rows: dict[int | None, Row] = {}
        for lease in (None, LEASE):
            name = f"hit hot key, {THREADS} threads, " + ("no lease" if lease is None else f"lease={lease}") + f", {short}"
            row = Row(name, "threads", lease, strategy=strategy)
            print(f"[leased] {name} ...", file=sys.stderr, flush=True)
            c0, s0 = probe.client(), probe.server()
            row.decisions, row.admitted, row.seconds, row.held = _threads(
                url, rate_limit, f"hot:{short}:{lease or 0}", prefix, lease, seconds, strategy
            )
            row.cpu_client = probe.client() - c0
            row.cpu_server = probe.server() - s0
            row.charged = row.admitted  # (a bucket has no count to read back)
            rows[lease] = row
            rep.rows.append(row)
        refusal_rows = {
            lease: Row(
                f"refuse exhausted key, {THREADS} threads, " + ("no lease" if lease is None else f"lease={lease}")
                + f", {short}",
                "threads",
                lease,
                strategy=strategy,
                refusals=True,
            )
            for lease in (None, LEASE)
        }
        for turn in range(2):
            for lease, row in refusal_rows.items():
                if turn == 0:
                    print(f"[leased] {row.name} ...", file=sys.stderr, flush=True)
                c0, s0 = probe.client(), probe.server()
                n, ok, el, calls = _refusals(
                    url, f"exhausted:{short}:{lease or 0}:{turn}", prefix, lease, seconds / 2, 0, strategy
                )
                row.decisions += n
                row.admitted += ok
                row.seconds += el
                row.store_calls += calls
                row.cpu_client += probe.client() - c0
                row.cpu_server += probe.server() - s0
        rep.rows.extend(refusal_rows.values())
        print(f"[leased] exactness, threads, {short} ...", file=sys.stderr, flush=True)
        amount, _, period = EXACT.partition("/")
        period_s = {"day": 86400.0}[period]
        t0 = time.time()
        _, admitted, _, _ = _threads(url, EXACT, f"exact:{short}", prefix, LEASE, None, strategy)
        refill = int((time.time() - t0 + 1) * int(amount) / period_s)  # what the bucket refilled meanwhile (and 1 s)
        rep.exact.append(Exactness("threads", int(amount) + refill, admitted, admitted, strategy))
        plain, leased = rows[None], rows[LEASE]
        rep.ratios[f"threads, {short}"] = leased.rate / plain.rate if plain.rate > 0 else 0.0
        rep.targets[f"threads, {short}"] = TARGET
        plain, leased = refusal_rows[None], refusal_rows[LEASE]
        rep.ratios[f"refusals, threads, {short}"] = leased.rate / plain.rate if plain.rate > 0 else 0.0
        rep.targets[f"refusals, threads, {short}"] = REFUSAL_TARGET
    finally:
        store.close()
    return rep


def _short(strategy: str) -> str:
    names: dict[str, str] = {FIXED: "", APPROX: ", approx"}
    return names.get(strategy, ", " + strategy)


def leased_lines(rep: LeasedReport) -> list[str]:
    """The report, as printed."""
    limits = (
        f"limit {BIG} ({BIG_APPROX} approx; rates)"
        if not rep.strategy
        else f"strategy {rep.strategy}, limit {LOG_RATE if rep.strategy == 'sliding-window' else BIG_APPROX} "
        f"(rates), {EXHAUSTED} (refusals)"
    )
    lines = [
        f"Leased limits: one hot key, {limits} and {EXACT} (exactness), {os.cpu_count()} CPU cores",
        f"{'row':<64} {'decisions/s':>12} {'client us/dec':>14} {'server us/dec':>14} {'held at stop':>13}",
    ]
    for r in rep.rows:
        per = 1e6 / r.decisions if r.decisions else 0.0
        lines.append(
            f"{r.name:<64} {r.rate:>12,.0f} {r.cpu_client * per:>14.2f} {r.cpu_server * per:>14.2f} {r.held:>13,}"
        )
        if r.refusals:
            lines.append(f"  {r.calls_per_decision:.3f} store calls per refusal, {r.admitted:,} admitted")
        elif r.admitted != r.decisions:
            lines.append(f"  {r.admitted:,} admitted ({r.admitted / r.seconds if r.seconds else 0:,.0f}/s), the rest refused")
        elif r.charged != r.admitted:
            lines.append(f"  store counted {r.charged:,} after the callers closed, admitted {r.admitted:,}")
    for callers, x in rep.ratios.items():
        target = rep.targets[callers]
        verdict = "meets" if x >= target else "misses"
        what = "refusals of an exhausted key" if callers.startswith("refusals") else "decisions"
        callers_only = callers.removeprefix("refusals, ")
        lines.append(
            f"leased / unleased {what} per second, {callers_only}: {x:.2f}x ({verdict} the {target:g}x target)"
        )
    for e in rep.exact:
        lines.append(
            f"exactness, {e.callers}{_short(e.strategy)}: admitted {e.admitted:,} of {e.limit:,} (store counted {e.charged:,}); "
            f"over-admission {e.over}, under-admission {e.under}"
        )
    lines.append(
        "held at stop: units charged and not admitted when the callers stopped (under-admission while "
        "they are held; they go back when the store closes). On fewer cores than callers the callers take "
        "turns: rates are the machine's, not a parallel speed-up."
    )
    return lines


def leased_json(rep: LeasedReport) -> dict[str, object]:
    out = asdict(rep)
    for r, row in zip(out["rows"], rep.rows):
        r["rate"] = row.rate
        r["calls_per_decision"] = row.calls_per_decision
    for e, ex in zip(out["exact"], rep.exact):
        e["over"], e["under"] = ex.over, ex.under
    return out


if __name__ == "__main__":
    _worker(sys.argv[1:])
