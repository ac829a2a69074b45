"""Writers under a fault, and the accounting of what survived it.

One thread per key (typically one key per master) makes writes at a fixed rate, each with
its own request id, through a client-agnostic callable ``write(key, request_id, amount)``
that returns on acknowledgment and raises on failure. A failed write is retried with the
SAME request id (so a server that deduplicates by id never counts it twice) until it is
acknowledged or ``retry_for`` seconds have passed; the client-side ledger records every
acknowledged increment. After the fault, ``report(final)`` compares the ledger with the
final values read from the servers:

- lost acknowledged increments: acknowledged but absent from the final value;
- double counts: applied more than once.

With only the final values these are lower bounds (a loss and a double count on the same
key cancel out in a sum); pass ``applied`` (how many times each request id was applied, e.g.
from a log the write appends to atomically with the increment) for exact figures.

    def make_writer():                      # called once in each writer thread
        client = redis.RedisCluster(...)
        return lambda key, rid, amount: script(keys=[key, f"{key}:rid:{rid}"], args=[amount])
    with FailoverHarness(make_writer, keys, rate=400) as h:
        h.wait_acked(200)                   # load is flowing
        cluster.kill(master)
        ...
    print(h.report(final_values).summary())
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

WriteFn = Callable[[str, str, int], object]


@dataclass
class Ack:
    request_id: str
    amount: int
    first_try: float  # monotonic time of the first attempt
    acked_at: float
    attempts: int


@dataclass
class Writer:
    """One writer thread's ledger."""

    key: str
    acked: list[Ack] = field(default_factory=list)
    # request ids given up on (never acknowledged): they may or may not have been applied
    abandoned: dict[str, int] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    attempts: int = 0

    def max_gap(self) -> float:
        """Longest time between two consecutive acknowledgments (or from the first attempt to
        the first acknowledgment): the writer's longest unavailability."""
        if not self.acked:
            return float("inf")
        gaps = [self.acked[0].acked_at - self.acked[0].first_try]
        gaps += [b.acked_at - a.acked_at for a, b in zip(self.acked, self.acked[1:], strict=False)]
        return max(gaps)


@dataclass
class KeyReport:
    key: str
    acked: int  # sum of acknowledged amounts
    acked_writes: int
    maybe: int  # sum of amounts of abandoned requests
    final: int
    lost: int
    doubled: int
    exact: bool  # per-request accounting (``applied`` was given) rather than sums
    unaccounted: int  # exact mode: final minus what the applied log explains (should be 0)
    max_gap: float
    errors: dict[str, int]
    retried_writes: int


@dataclass
class Report:
    keys: list[KeyReport]

    @property
    def lost(self) -> int:
        return sum(k.lost for k in self.keys)

    @property
    def doubled(self) -> int:
        return sum(k.doubled for k in self.keys)

    @property
    def acked(self) -> int:
        return sum(k.acked for k in self.keys)

    def summary(self) -> str:
        lines = [f"acknowledged {self.acked}, lost {self.lost}, double counts {self.doubled}"]
        for k in self.keys:
            errs = ", ".join(f"{n} {e}" for e, n in sorted(k.errors.items())) or "none"
            lines.append(
                f"  {k.key}: acked {k.acked} ({k.acked_writes} writes), final {k.final}, lost {k.lost}, "
                f"doubled {k.doubled}, maybe {k.maybe}, {'exact' if k.exact else 'lower bounds'}, "
                f"longest gap {k.max_gap * 1000:.0f} ms, retried writes {k.retried_writes}, errors: {errs}")
        return "\n".join(lines)


class FailoverHarness:
    """``len(keys)`` writer threads, ``rate`` writes/s each, ``amount`` per write. Use as a
    context manager (``stop()`` on exit) or call ``start()``/``stop()``. Thread-safe reads of
    progress through ``acked_count()``; the ledgers are final once ``stop()`` returns."""

    def __init__(self, make_writer: Callable[[], WriteFn], keys: Sequence[str], *, rate: float = 400.0,
                 amount: int = 1, retry_for: float = 20.0, backoff: tuple[float, float] = (0.005, 0.2),
                 id_prefix: str = "") -> None:
        self.make_writer = make_writer
        self.keys = list(keys)
        self.rate = rate
        self.amount = amount
        self.retry_for = retry_for
        self.backoff = backoff
        self.id_prefix = id_prefix or f"{time.monotonic_ns():x}"
        self.writers = [Writer(k) for k in self.keys]
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._failures: list[BaseException] = []

    def start(self) -> FailoverHarness:
        for i, w in enumerate(self.writers):
            t = threading.Thread(target=self._run, args=(i, w), name=f"writer-{w.key}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self, timeout: float | None = None) -> None:
        """Stop issuing new writes; a write being retried finishes (acknowledged, or abandoned
        after ``retry_for``). Raises if a writer thread itself failed."""
        self._stop.set()
        for t in self._threads:
            t.join(timeout if timeout is not None else self.retry_for + 10)
        if any(t.is_alive() for t in self._threads):
            raise RuntimeError("a writer thread did not finish")
        if self._failures:
            raise self._failures[0]

    def __enter__(self) -> FailoverHarness:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def acked_count(self) -> int:
        return sum(len(w.acked) for w in self.writers)

    def wait_acked(self, n: int, timeout: float = 30.0, each: bool = False) -> None:
        """Until ``n`` more writes than now are acknowledged across all writers (``each``: by
        every writer, e.g. to know that the writer of a failed master's key is served again)."""
        targets = [len(w.acked) + n for w in self.writers]
        total = self.acked_count() + n

        def done() -> bool:
            if each:
                return all(len(w.acked) >= t for w, t in zip(self.writers, targets, strict=True))
            return self.acked_count() >= total

        deadline = time.monotonic() + timeout
        while not done():
            if self._failures:
                raise self._failures[0]
            if time.monotonic() > deadline:
                raise TimeoutError(f"fewer than {n} writes acknowledged{' by each writer' if each else ''} "
                                   f"in {timeout}s")
            time.sleep(0.01)  # polling the writers' progress

    def _run(self, index: int, w: Writer) -> None:
        try:
            write = self.make_writer()
            period = 1.0 / self.rate
            next_at = time.monotonic()
            seq = 0
            while not self._stop.is_set():
                now = time.monotonic()
                if next_at > now:
                    time.sleep(next_at - now)  # pacing to the configured rate
                next_at = max(next_at + period, time.monotonic() - 0.05)  # no catch-up burst
                rid = f"{self.id_prefix}-{index}-{seq}"
                seq += 1
                self._one(write, w, rid)
        except BaseException as e:  # surfaced by stop()
            self._failures.append(e)

    def _one(self, write: WriteFn, w: Writer, rid: str) -> None:
        first = time.monotonic()
        attempts = 0
        delay = self.backoff[0]
        while True:
            attempts += 1
            w.attempts += 1
            try:
                write(w.key, rid, self.amount)
            except Exception as e:  # noqa: BLE001 - every failure is recorded and retried
                w.errors[type(e).__name__] += 1
                if time.monotonic() - first > self.retry_for:
                    w.abandoned[rid] = self.amount
                    return
                time.sleep(delay)  # retry backoff
                delay = min(delay * 2, self.backoff[1])
                continue
            w.acked.append(Ack(rid, self.amount, first, time.monotonic(), attempts))
            return

    def report(self, final: Mapping[str, int],
               applied: Mapping[str, Mapping[str, int]] | None = None) -> Report:
        """Compare the ledgers with the servers' final value of each key. ``applied``, when
        given, maps each key to {request id: times applied}."""
        out = []
        for w in self.writers:
            acked = sum(a.amount for a in w.acked)
            maybe = sum(w.abandoned.values())
            value = int(final.get(w.key, 0))
            amounts = {a.request_id: a.amount for a in w.acked} | w.abandoned
            if applied is not None:
                times = applied.get(w.key, {})
                lost = sum(a.amount for a in w.acked if times.get(a.request_id, 0) == 0)
                doubled = sum((n - 1) * amounts.get(rid, self.amount) for rid, n in times.items() if n > 1)
                explained = sum(n * amounts.get(rid, self.amount) for rid, n in times.items())
                unaccounted = value - explained
                exact = True
            else:
                lost = max(0, acked - value)
                doubled = max(0, value - acked - maybe)
                unaccounted = 0
                exact = False
            out.append(KeyReport(
                key=w.key, acked=acked, acked_writes=len(w.acked), maybe=maybe, final=value, lost=lost,
                doubled=doubled, exact=exact, unaccounted=unaccounted, max_gap=w.max_gap(),
                errors=dict(w.errors), retried_writes=sum(1 for a in w.acked if a.attempts > 1)))
        return Report(out)
