"""``redcount accuracy``: how far past its limit each strategy lets a client go, measured.

Every strategy (fixed window, the exact sliding log, the approximate sliding window with
1 and with 4 sub-buckets, token bucket, GCRA) faces the same traffic scenarios on the
embedded memory store driven by a [`ManualClock`][redcount.store.ManualClock], so a run is exact,
deterministic and takes well under a second. For every admitted hit the time is recorded;
the figure reported is the most admitted hits in **any** interval one window long
(``[t, t + window)``, slid over every admitted time, so it is exact), as a multiple of the
limit: ``"2.00× (200)"`` means 200 hits, twice the limit of 100, got through within one
window length somewhere in the run. The total admitted out of the total sent is reported
alongside.

Time is in whole milliseconds. Scenario times are offsets from a start that is aligned to
the window (and so to every sub-bucket), with limit ``L`` and window ``W``:

1. **2-window burst** — the classic boundary attack: 2×L requests in the last millisecond
   of a window (``W - 1``), then 2×L in the first millisecond of the next (``W``). A fixed
   window admits L of each, 2×L within 2 ms; everything else admits L in all.
2. **steady 10× overload** — requests at 10× the limit rate, evenly spaced
   (``i·W / (10·L)``), for 3 windows.
3. **adversarial for approx** — the worst case of the weighted estimate: 2×L requests in the
   last millisecond of a window, which is also the end of a sub-bucket for every ``k``
   (the estimate then holds them at full weight for ``k - 1`` further sub-buckets and at a
   weight falling linearly to 0 over the k-th), then paced requests at 8× the limit rate
   for two windows, dense enough to take every hit the falling weight frees up. With L
   hits in the oldest, partially counted sub-bucket, the window-length interval that
   starts at the burst holds L + about L·(b-2)/b hits (b = sub-bucket length in ms): just
   under 2×L, for k = 1 and k = 4 alike.
4. **random Poisson at 2×** — a Poisson process at twice the limit rate (exponential gaps of
   mean ``W / (2·L)``) for 5 windows, from a fixed seed (``--seed``).

What to expect, and why:

- **fixed-window** admits up to L per clock-aligned window, so up to 2×L in a window
  length that straddles a boundary (scenarios 1 and 3).
- **sliding-window** (the exact log) never admits more than L in any window length: that is
  its contract, and every column shows at most 1.00×.
- **sliding-window-approx** admits at most L + (the hits in the oldest, partially counted
  sub-bucket) in a window length, i.e. at most 2×L - 1, reached by scenario 3; when no
  sub-bucket holds more than L/k admitted hits it stays within L + ceil(L/k). More
  sub-buckets only help when the traffic spreads over them.
- **token-bucket** and **gcra** with ``"L/W"`` hold L tokens and refill L per W: a full
  bucket spent at once followed by a window's worth of refill is up to about 2×L in one
  window length (burst + refill). That is their documented behaviour, not a defect: they
  bound the *rate* (at most ``capacity + L·T/W`` in any interval of length T), not the
  count per window. Scenarios 2 and 3 show it.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

from .bench.report import write_json
from ..limiter import Limiter, Strategy
from ..store import ManualClock, connect

__all__ = [
    "STRATEGIES",
    "AccuracyReport",
    "Cell",
    "Scenario",
    "StrategyCase",
    "format_markdown",
    "limit_text",
    "max_in_window",
    "measure_accuracy",
    "replay",
    "run_accuracy",
    "scenarios",
]

START_MS = 1_700_000_000_000  # the simulated epoch, before alignment to the window
MAX_LIMIT = 100_000  # scenario sizes grow with the limit: 4×L to 30×L requests each


@dataclass(frozen=True)
class StrategyCase:
    """One row of the table: a strategy and its sub-bucket count."""

    label: str
    strategy: Strategy
    sub_buckets: int = 1


STRATEGIES: tuple[StrategyCase, ...] = (
    StrategyCase("fixed-window", "fixed-window"),
    StrategyCase("sliding-window (exact log)", "sliding-window"),
    StrategyCase("sliding-window-approx, k=1", "sliding-window-approx", 1),
    StrategyCase("sliding-window-approx, k=4", "sliding-window-approx", 4),
    StrategyCase("token-bucket", "token-bucket"),
    StrategyCase("gcra", "gcra"),
)


@dataclass(frozen=True)
class Scenario:
    """A traffic pattern: request times in ms from a window-aligned start, sorted."""

    name: str
    description: str
    times: tuple[int, ...]


@dataclass
class Cell:
    """One strategy under one scenario."""

    strategy: str
    scenario: str
    limit: int
    sent: int
    admitted: int
    max_in_window: int  # most admitted hits in any interval of one window length
    multiple: float = 0.0  # max_in_window / limit

    def __post_init__(self) -> None:
        self.multiple = self.max_in_window / self.limit


@dataclass
class AccuracyReport:
    limit: int
    window: int  # seconds
    seed: int
    limit_text: str
    scenarios: list[dict[str, object]] = field(default_factory=list)  # name, description, sent
    cells: list[Cell] = field(default_factory=list)

    def cell(self, strategy: str, scenario: str) -> Cell:
        for c in self.cells:
            if c.strategy == strategy and c.scenario == scenario:
                return c
        raise KeyError((strategy, scenario))


def limit_text(limit: int, window: int) -> str:
    """The limit string for ``limit`` hits per ``window`` whole seconds."""
    return f"{limit}/{window} seconds"


# --------------------------------------------------------------------------- scenarios


def boundary_burst(limit: int, window_ms: int) -> Scenario:
    times = (window_ms - 1,) * (2 * limit) + (window_ms,) * (2 * limit)
    return Scenario(
        "2-window burst",
        f"2×L requests in the last ms of a window, 2×L in the first ms of the next ({len(times)} in all)",
        times,
    )


def steady_overload(limit: int, window_ms: int, factor: int = 10, windows: int = 3) -> Scenario:
    n = factor * limit * windows
    times = tuple(i * window_ms // (factor * limit) for i in range(n))
    return Scenario(
        f"steady {factor}× overload",
        f"{factor}× the limit rate, evenly spaced, for {windows} windows ({n} requests)",
        times,
    )


def approx_adversary(limit: int, window_ms: int, pace: int = 8, windows: int = 2) -> Scenario:
    burst = (window_ms - 1,) * (2 * limit)
    n = pace * limit * windows
    paced = tuple(window_ms + i * window_ms // (pace * limit) for i in range(n))
    return Scenario(
        "adversarial for approx",
        f"2×L in the last ms of a window (the end of a sub-bucket for any k), then {pace}× the limit "
        f"rate for {windows} windows ({len(burst) + n} requests)",
        burst + paced,
    )


def poisson(limit: int, window_ms: int, seed: int, factor: int = 2, windows: int = 5) -> Scenario:
    rng = random.Random(seed)
    mean_gap = window_ms / (factor * limit)
    end = windows * window_ms
    out: list[int] = []
    t = rng.expovariate(1.0 / mean_gap)
    while t < end:
        out.append(int(t))
        t += rng.expovariate(1.0 / mean_gap)
    return Scenario(
        f"random Poisson at {factor}×",
        f"a Poisson process at {factor}× the limit rate for {windows} windows, seed {seed} "
        f"({len(out)} requests)",
        tuple(out),
    )


def scenarios(limit: int, window_ms: int, seed: int = 1) -> list[Scenario]:
    """The four scenarios of the module docstring, in order."""
    return [
        boundary_burst(limit, window_ms),
        steady_overload(limit, window_ms),
        approx_adversary(limit, window_ms),
        poisson(limit, window_ms, seed),
    ]


# --------------------------------------------------------------------------- measuring


def aligned_start(window_ms: int) -> int:
    """The first multiple of ``window_ms`` at or after `START_MS` (whole seconds)."""
    return -(-START_MS // window_ms) * window_ms


def replay(
    case: StrategyCase, limit: str, window_ms: int, times: Sequence[int], *, key: str = "client"
) -> list[int]:
    """Send ``times`` (ms from a window-aligned start, sorted) through a fresh limiter on a
    fresh memory store with a ManualClock; return the times of the admitted hits."""
    start = aligned_start(window_ms)
    clock = ManualClock(start // 1000)
    store = connect(clock=clock)
    admitted: list[int] = []
    try:
        lim = Limiter(store, case.strategy, sub_buckets=case.sub_buckets)
        now = 0
        for t in times:
            if t < now:
                raise ValueError(f"request times must be sorted, got {t} after {now}")
            if t > now:
                clock.advance((t - now) / 1000)  # advance() rounds to the ms: exact
                now = t
            if lim.hit(limit, key).allowed:
                admitted.append(t)
        if round(clock.now() * 1000) != start + now:  # the clock went where we sent it
            raise AssertionError(f"ManualClock at {clock.now()!r}, expected {(start + now) / 1000}")
    finally:
        store.close()
    return admitted


def max_in_window(times: Sequence[int], window_ms: int) -> int:
    """The most of ``times`` (sorted, in ms) in any interval ``[t, t + window_ms)``."""
    best = 0
    j = 0
    for i, t in enumerate(times):
        j = max(j, i)
        while j < len(times) and times[j] < t + window_ms:
            j += 1
        best = max(best, j - i)
    return best


def measure_accuracy(
    limit: int = 100,
    window: int = 60,
    seed: int = 1,
    strategies: Sequence[StrategyCase] = STRATEGIES,
) -> AccuracyReport:
    """Run every scenario against every strategy; see the module docstring."""
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"--limit must be between 1 and {MAX_LIMIT}, got {limit}")
    if window < 1:
        raise ValueError(f"--window must be a whole number of seconds >= 1, got {window}")
    window_ms = window * 1000
    text = limit_text(limit, window)
    rep = AccuracyReport(limit=limit, window=window, seed=seed, limit_text=text)
    plan = scenarios(limit, window_ms, seed)
    rep.scenarios = [{"name": s.name, "description": s.description, "sent": len(s.times)} for s in plan]
    for case in strategies:
        for sc in plan:
            admitted = replay(case, text, window_ms, sc.times)
            rep.cells.append(
                Cell(
                    case.label,
                    sc.name,
                    limit,
                    len(sc.times),
                    len(admitted),
                    max_in_window(admitted, window_ms),
                )
            )
    return rep


# --------------------------------------------------------------------------- output


def format_markdown(rep: AccuracyReport) -> str:
    """The report as a Markdown table (one row per strategy, one column per scenario)."""
    names = [str(s["name"]) for s in rep.scenarios]
    head = ["strategy"] + [f"{s['name']} ({s['sent']} sent)" for s in rep.scenarios]
    lines = ["| " + " | ".join(head) + " |", "|" + "|".join(["---"] + [":---:"] * len(names)) + "|"]
    labels: list[str] = []
    for c in rep.cells:
        if c.strategy not in labels:
            labels.append(c.strategy)
    for label in labels:
        row = [label]
        for name in names:
            c = rep.cell(label, name)
            row.append(f"{c.multiple:.2f}× ({c.max_in_window}), {c.admitted} admitted")
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines.append(
        f"Limit `{rep.limit_text}`, memory store with a ManualClock. Each cell: the most admitted hits "
        f"in any {rep.window} s interval, as a multiple of the limit {rep.limit} (the count), then the "
        f"total admitted over the whole scenario."
    )
    lines.append("")
    for s in rep.scenarios:
        lines.append(f"- **{s['name']}**: {s['description']}.")
    return "\n".join(lines)


def run_accuracy(args: argparse.Namespace) -> int:
    """Entry point of ``redcount accuracy``; returns the exit code."""
    rep = measure_accuracy(int(args.limit), int(args.window), int(args.seed))
    print(format_markdown(rep))
    if args.json:
        write_json(args.json, asdict(rep))
    sys.stdout.flush()
    return 0
