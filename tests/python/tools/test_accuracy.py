"""The documented accuracy bounds of every limiter strategy, asserted.

Deterministic tests drive a ManualClock in whole milliseconds, on the memory store and on
a real redis-server (the `sim` fixture; on Redis the ManualClock is the client's clock,
so the Lua scripts decide; its windows are a minute or more, so that no key can expire on
the server's own clock while the simulated time says it is alive). A few short tests run on
Redis in real time. The bounds (W = window in ms, L = the limit):

- fixed window: at most L per clock-aligned window, so at most 2L in any W-long interval;
  the boundary burst reaches 2L;
- exact sliding log: at most L in any W-long interval [t, t + W);
- approximate sliding window with k sub-buckets of b = W/k ms. The estimate at t (sub-bucket
  cur, offset e = t - start(cur)) is E(t) = (hits in sub-buckets cur-k+1 .. cur)
  + hits(cur-k) * (b - e) / b, and a hit is admitted iff E(t) + 1 <= L. Consequences:
  * any k consecutive whole sub-buckets hold at most L admitted hits (at the last admitted
    hit of the last one, E counted all of them at full weight);
  * an interval [s, s + W) with s at offset e_s > 0 in sub-bucket m covers the A admitted
    hits of sub-bucket m from s on, sub-buckets m+1 .. m+k-1, and sub-bucket m+k up to
    offset e_s - 1. At the last admitted hit in m+k (offset e <= e_s - 1),
    hits(m+1 .. m+k) <= L - hits(m) * (b - e) / b <= L - A * (b - e) / b, so the interval
    holds at most L + A * (e_s - 1) / b < L + A hits (and at most L when e_s = 0);
  * hence at most 2L - 1 (A <= L), and at most L + ceil(L/k) when no sub-bucket holds more
    than L/k admitted hits;
  * |E(t) - exact count in (t - W, t]| <= hits(cur - k): both lie between the full-weight
    part and the full-weight part plus hits(cur - k). stats().count is ceil(E(t)).
- token bucket and GCRA (capacity C, L per W): in any interval [t1, t2] at most
  C + L * (t2 - t1) / W admitted (GCRA rounds its emission interval up to a whole µs, which
  only makes it stricter), and the same decisions as each other when W*1000 is a multiple
  of L (the emission interval is then exact).
"""

from __future__ import annotations

import bisect
import json
import math
import os
import random
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import redcount
from conftest import RedisServer
from helpers import ms
from redcount.tools.accuracy import STRATEGIES, StrategyCase, max_in_window, measure_accuracy

HOUR_MS = 3_600_000
MEMORY_START = 472_222 * HOUR_MS  # 2023-11-14 22:00 UTC: aligned to every window used here
FIXED, SLIDING, APPROX1, APPROX4, TB, GCRA = STRATEGIES


@dataclass
class Sim:
    """A store whose (client) clock is a ManualClock, moved in whole milliseconds.
    Times are ms relative to `start`, which is aligned to the hour (so to every window)."""

    kind: str
    store: redcount.Store
    clock: redcount.ManualClock
    start: int
    now: int = 0

    def __post_init__(self) -> None:
        assert self.start % HOUR_MS == 0 and round(self.clock.now() * 1000) == self.start

    @classmethod
    def memory(cls) -> Sim:
        clock = redcount.ManualClock(MEMORY_START // 1000)
        return cls("memory", redcount.connect(clock=clock), clock, MEMORY_START)

    def to(self, t: int) -> None:
        assert t >= self.now, (t, self.now)
        if t > self.now:
            self.clock.advance((t - self.now) / 1000)
            self.now = t
        assert round(self.clock.now() * 1000) == self.start + t

    def limiter(self, case: StrategyCase) -> redcount.Limiter:
        return redcount.Limiter(self.store, case.strategy, sub_buckets=case.sub_buckets)

    def approx(self, k: int) -> redcount.Limiter:
        return redcount.Limiter(self.store, "sliding-window-approx", sub_buckets=k)


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis_only)])
def sim(request: pytest.FixtureRequest) -> Iterator[Sim]:
    if request.param == "memory":
        start = MEMORY_START
        clock = redcount.ManualClock(start // 1000)
        store = redcount.connect(clock=clock)
    else:
        # Ahead of the real time: the fixed window's PEXPIREAT deadlines (client time) must
        # lie in the server's future.
        server: RedisServer = request.getfixturevalue("redis_server")
        start = (int(time.time() * 1000) // HOUR_MS + 2) * HOUR_MS
        clock = redcount.ManualClock(start // 1000)
        store = redcount.connect(server.url, clock=clock)
        store.execute("FLUSHALL")
    try:
        yield Sim(str(request.param), store, clock, start)
    finally:
        store.close()


def seeds(sim: Sim, memory: int, redis: int) -> range:
    """Many seeds on memory, fewer on Redis (a round trip per hit)."""
    return range(memory if sim.kind == "memory" else redis)


def drive(sim: Sim, lim: redcount.Limiter, limit: str, key: str, times: Sequence[int]) -> list[int]:
    """Hit at each time (ms, sorted, relative); return the admitted times."""
    out = []
    for t in times:
        sim.to(max(t, sim.now))
        if lim.hit(limit, key).allowed:
            out.append(sim.now)
    return out


def random_traffic(rng: random.Random, limit: int, window_ms: int, windows: int, t0: int = 0) -> list[int]:
    """Poisson traffic whose rate changes now and then (from half to 20× the limit rate),
    with bursts of up to 2L in one ms and jumps to the last or first ms of a sub-bucket."""
    out: list[int] = []

    def gap() -> float:
        return window_ms / (limit * rng.choice([0.5, 1, 1.5, 2, 4, 20]))

    mean = gap()
    t = t0
    end = t0 + windows * window_ms
    while t < end:
        r = rng.random()
        if r < 0.04:
            out.extend([t] * rng.randint(1, 2 * limit))
        elif r < 0.10:
            b = window_ms // rng.choice([1, 2, 4])
            t = max(t, (t // b + 1) * b - rng.choice([0, 1]))
            out.append(t)
        else:
            out.append(t)
        if rng.random() < 0.03:
            mean = gap()
        t += int(rng.expovariate(1.0 / mean))
    return out


def window_counts(admitted: Sequence[int], window_ms: int) -> Counter[int]:
    return Counter(t // window_ms for t in admitted)


# ----------------------------------------------------------------------- fixed window


def test_fixed_window_boundary_burst_reaches_twice_the_limit(sim: Sim) -> None:
    lim = sim.limiter(FIXED)
    W, L = 60_000, 10
    admitted = drive(sim, lim, "10/minute", "k", [W - 1] * (2 * L) + [W] * (2 * L))
    assert admitted == [W - 1] * L + [W] * L
    assert max_in_window(admitted, W) == 2 * L  # over the limit: the documented 2×


@pytest.mark.parametrize("L", [1, 3, 10, 25])
def test_fixed_window_at_most_twice_the_limit(sim: Sim, L: int) -> None:
    W = 60_000
    lim = sim.limiter(FIXED)
    worst = 0
    for seed in seeds(sim, 30, 4):
        rng = random.Random(seed)
        key = f"fw:{L}:{seed}"
        admitted = drive(sim, lim, f"{L}/minute", key, random_traffic(rng, L, W, 4, sim.now))
        assert max(window_counts(admitted, W).values(), default=0) <= L  # per aligned window
        m = max_in_window(admitted, W)
        assert m <= 2 * L
        worst = max(worst, m)
        cur = sim.now // W
        assert lim.stats(f"{L}/minute", key)[0].count == sum(1 for t in admitted if t // W == cur)
    assert worst > L  # the random traffic does cross boundaries with bursts


# ----------------------------------------------------------------------- exact sliding log


@pytest.mark.parametrize("L", [1, 3, 10, 25])
def test_sliding_log_never_more_than_the_limit(sim: Sim, L: int) -> None:
    W = 60_000
    lim = sim.limiter(SLIDING)
    reached = 0
    for seed in seeds(sim, 30, 4):
        rng = random.Random(1000 + seed)
        key = f"sw:{L}:{seed}"
        admitted: list[int] = []
        for t in random_traffic(rng, L, W, 4, sim.now):
            sim.to(max(t, sim.now))
            d = lim.hit(f"{L}/minute", key)
            if d.allowed:
                admitted.append(sim.now)
            if rng.random() < 0.2:  # stats() is the exact count of (now - W, now]
                exact = len(admitted) - bisect.bisect_right(admitted, sim.now - W)
                assert lim.stats(f"{L}/minute", key)[0].count == exact
        m = max_in_window(admitted, W)
        assert m <= L
        reached = max(reached, m)
        if sim.kind == "redis":
            assert sim.store.execute("ZCARD", f"redcount:lim:sw:{{{key}}}:{W}") <= L
    assert reached == L


@pytest.mark.redis_only
def test_sliding_log_in_real_time_on_redis(redis_store: redcount.Store) -> None:
    """Real clock, 1-second window: the scores of the admitted hits (read back from the
    sorted set right after each admission) never hold more than 5 in any 1000 ms."""
    lim = redcount.Limiter(redis_store, "sliding-window")
    zkey = "redcount:lim:sw:{rt}:1000"
    rng = random.Random(5)
    scores: list[int] = []
    sent = 0
    deadline = time.monotonic() + 1.6
    while time.monotonic() < deadline:
        sent += 1
        if lim.hit("5/second", "rt").allowed:
            newest = redis_store.execute("ZRANGE", zkey, -1, -1, "WITHSCORES")
            assert isinstance(newest, list) and len(newest) == 2
            scores.append(int(newest[1]))  # type: ignore[arg-type]
        card = redis_store.execute("ZCARD", zkey)
        assert isinstance(card, int) and card <= 5
        time.sleep(rng.choice([0.0, 0.0, 0.002, 0.01, 0.03]))
    assert sent > 20 and len(scores) > 5  # the run spans more than one window's worth
    assert max_in_window(sorted(scores), 1000) <= 5


# ----------------------------------------------------------------------- approximate window


def approx_check(admitted: Sequence[int], L: int, W: int, k: int) -> int:
    """Asserts the interval bounds of the module docstring; returns the worst interval."""
    b = W // k
    worst = 0
    j = 0
    for i, s in enumerate(admitted):
        if i > 0 and admitted[i - 1] == s:
            continue  # the interval [s, s + W) starts with the first hit at s
        j = max(j, i)
        while j < len(admitted) and admitted[j] < s + W:
            j += 1
        count = j - i
        worst = max(worst, count)
        e_s = s % b
        if e_s == 0:
            assert count <= L, (s, count)
        else:
            a = bisect.bisect_left(admitted, s - e_s + b) - i  # admitted in [s, end of s's sub-bucket)
            assert count * b <= L * b + a * (e_s - 1), (s, count, a, e_s)
        assert count <= 2 * L - 1 or L == 0
    per_bucket = Counter(t // b for t in admitted)
    if max(per_bucket.values(), default=0) * k <= L:
        assert worst <= L + math.ceil(L / k)
    return worst


def approx_estimate_check(
    sim: Sim,
    lim: redcount.Limiter,
    limit: str,
    key: str,
    admitted: Sequence[int],
    per: Counter[int],
    W: int,
    k: int,
) -> None:
    """stats().count is ceil(E(now)), and |E - exact| <= hits of the oldest sub-bucket.
    `per`: admitted hits per sub-bucket index."""
    b = W // k
    t = sim.now
    cur = t // b
    e = t - cur * b
    full = sum(per[i] for i in range(cur - k + 1, cur + 1))
    old = per[cur - k]
    scaled = full * b + old * (b - e)
    est = lim.stats(limit, key)[0].count
    assert est == -(-scaled // b), (t, full, old, e)
    exact = len(admitted) - bisect.bisect_right(admitted, t - W)
    assert abs(est - exact) <= old, (t, est, exact, old)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 6])
@pytest.mark.parametrize("L", [1, 4, 10, 25])
def test_approx_bounds_random(sim: Sim, k: int, L: int) -> None:
    W = 60_000
    lim = sim.approx(k)
    limit = f"{L}/minute"
    worst = 0
    for seed in seeds(sim, 15, 1):
        rng = random.Random(2000 + seed)
        key = f"swa:{k}:{L}:{seed}"
        admitted: list[int] = []
        per: Counter[int] = Counter()
        for t in random_traffic(rng, L, W, 4, sim.now):
            sim.to(max(t, sim.now))
            if lim.hit(limit, key).allowed:
                admitted.append(sim.now)
                per[sim.now // (W // k)] += 1
            if rng.random() < 0.25:
                approx_estimate_check(sim, lim, limit, key, admitted, per, W, k)
        worst = max(worst, approx_check(admitted, L, W, k))
    assert worst >= L  # the traffic did fill windows


@pytest.mark.parametrize("k", [1, 2, 4, 5, 10])
def test_approx_bounds_short_windows_on_memory(k: int) -> None:
    """1-second windows: sub-buckets of 100 to 1000 ms, closer to the ms granularity."""
    W, L = 1000, 50
    s = Sim.memory()
    lim = s.approx(k)
    for seed in range(15):
        rng = random.Random(3000 + seed)
        key = f"short:{k}:{seed}"
        admitted: list[int] = []
        per: Counter[int] = Counter()
        for t in random_traffic(rng, L, W, 6, s.now):
            s.to(max(t, s.now))
            if lim.hit(f"{L}/second", key).allowed:
                admitted.append(s.now)
                per[s.now // (W // k)] += 1
            if rng.random() < 0.1:
                approx_estimate_check(s, lim, f"{L}/second", key, admitted, per, W, k)
        approx_check(admitted, L, W, k)
    s.store.close()


@pytest.mark.parametrize("k", [1, 4])
def test_approx_adversary_reaches_two_l_minus_one(sim: Sim, k: int) -> None:
    """The worst case is attained: L hits in the last ms of a sub-bucket (here also of a
    window), then paced requests harvest what the falling weight frees: 2L - 1."""
    W, L = 60_000, 20
    b = W // k
    lim = sim.approx(k)
    times = [W - 1] * (2 * L) + [W + i * b // (4 * L) for i in range(8 * L * k)]
    admitted = drive(sim, lim, f"{L}/minute", "adv", times)
    assert approx_check(admitted, L, W, k) == 2 * L - 1
    assert max_in_window(admitted, W) == 2 * L - 1


def test_approx_even_traffic_stays_within_l_plus_l_over_k(sim: Sim) -> None:
    """Traffic spread so no sub-bucket gets more than L/k: within L + ceil(L/k)."""
    W, L, k = 60_000, 20, 4
    b = W // k
    lim = sim.approx(k)
    # 5 requests (= L/k) at the end of each sub-bucket, for 12 sub-buckets.
    times = [m * b + b - 1 - j for m in range(12) for j in (4, 3, 2, 1, 0)]
    admitted = drive(sim, lim, f"{L}/minute", "even", times)
    assert max(Counter(t // b for t in admitted).values()) * k <= L
    assert approx_check(admitted, L, W, k) <= L + math.ceil(L / k)


# ----------------------------------------------------------------------- token bucket, GCRA


def bucket_bound_holds(admitted: Sequence[int], capacity: int, amount: int, W: int) -> None:
    """For all i <= j: (j - i + 1) * W <= capacity * W + amount * (t_j - t_i), in O(n):
    with G_i = i*W - amount*t_i, that is G_j - min(G_i, i <= j) <= (capacity - 1) * W."""
    low = None
    for j, t in enumerate(admitted):
        g = j * W - amount * t
        low = g if low is None else min(low, g)
        assert g - low <= (capacity - 1) * W, (j, t)


BUCKET_LIMITS = [  # (text, amount, capacity, window_ms); window_ms * 1000 % amount == 0
    ("8/minute burst 20", 8, 20, 60_000),
    ("60/minute", 60, 60, 60_000),
    ("50/hour burst 5", 50, 5, HOUR_MS),
    ("20/minute burst 1", 20, 1, 60_000),
]


@pytest.mark.parametrize("case", [TB, GCRA], ids=["token-bucket", "gcra"])
@pytest.mark.parametrize(("text", "amount", "capacity", "W"), BUCKET_LIMITS)
def test_bucket_burst_and_rate(
    sim: Sim, case: StrategyCase, text: str, amount: int, capacity: int, W: int
) -> None:
    lim = sim.limiter(case)
    # A burst of exactly the capacity from a fresh key, then nothing.
    assert all(lim.hit(text, "burst").allowed for _ in range(capacity))
    assert not lim.hit(text, "burst").allowed
    # Random traffic: never more than capacity + rate * T in any interval of length T.
    for seed in seeds(sim, 12, 2):
        rng = random.Random(4000 + seed)
        admitted = drive(sim, lim, text, f"rand:{seed}", random_traffic(rng, amount, W, 3, sim.now))
        bucket_bound_holds(admitted, capacity, amount, W)
    # Steady overload (a request every W / (10 * amount)) for 3 windows: the long-run
    # admitted rate is the nominal one, within one hit.
    t0 = sim.now + 1
    times = [t0 + i * W // (10 * amount) for i in range(30 * amount)]
    admitted = drive(sim, lim, text, "steady", times)
    bucket_bound_holds(admitted, capacity, amount, W)
    expected = capacity + amount * (times[-1] - t0) / W
    assert expected - 1 <= len(admitted) <= expected


def same_bucket_decisions(sim: Sim, text: str, amount: int, W: int) -> None:
    tb, gcra = sim.limiter(TB), sim.limiter(GCRA)
    hits = 0
    for seed in seeds(sim, 10, 2):
        rng = random.Random(5000 + seed)
        for t in random_traffic(rng, amount, W, 3, sim.now):
            sim.to(max(t, sim.now))
            key = f"x:{seed}"
            a, b = tb.hit(text, key), gcra.hit(text, key)
            fields_a = (a.allowed, a.limit, a.remaining, ms(a.reset_after), ms(a.retry_after))
            fields_b = (b.allowed, b.limit, b.remaining, ms(b.reset_after), ms(b.retry_after))
            assert fields_a == fields_b, (sim.now, text)
            hits += 1
    assert hits > 50


@pytest.mark.parametrize(("text", "amount", "capacity", "W"), BUCKET_LIMITS)
def test_token_bucket_and_gcra_decide_alike(sim: Sim, text: str, amount: int, capacity: int, W: int) -> None:
    same_bucket_decisions(sim, text, amount, W)


@pytest.mark.parametrize(
    ("text", "amount", "W"),
    [
        ("8/second burst 20", 8, 1000),
        ("1000/minute burst 10", 1000, 60_000),
        ("5/second", 5, 1000),
        ("250/second burst 3", 250, 1000),
    ],
)
def test_token_bucket_and_gcra_decide_alike_fast_rates(text: str, amount: int, W: int) -> None:
    """Memory only: on Redis, TTLs this short (W / amount) would run on the server's clock."""
    s = Sim.memory()
    try:
        same_bucket_decisions(s, text, amount, W)
    finally:
        s.store.close()


# ----------------------------------------------------------------------- remaining, retry_after, reset_after


ALL = [FIXED, SLIDING, APPROX1, APPROX4, TB, GCRA]
IDS = [c.label for c in ALL]


@pytest.mark.parametrize("case", ALL, ids=IDS)
@pytest.mark.parametrize("limit", ["4/minute", "10/minute", "3/minute;7/hour"])
def test_decision_fields_are_exact(sim: Sim, case: StrategyCase, limit: str) -> None:
    """At checkpoints in random traffic:
    - remaining: exactly that many more hits at the same instant are admitted, not one more;
    - retry_after r of a denial: still denied at r - 1 ms (and then retry_after is 1 ms),
      admitted at exactly r;
    - reset_after R (one limit): the key is still in use at R - 1 ms and back to its
      empty/full state (count 0) at R."""
    checked = check_decision_fields(sim, sim.limiter(case), limit, 6, 60_000, range(10))
    assert checked["retry"] >= 5 and checked["remaining"] >= 2
    if ";" not in limit:
        assert checked["reset"] >= 2


def check_decision_fields(
    sim: Sim, lim: redcount.Limiter, limit: str, rate: int, W: int, seeds: Sequence[int]
) -> Counter[str]:
    """The checks of test_decision_fields_are_exact over random traffic at about `rate`
    per `W` ms; returns how many checkpoints of each kind ran."""
    single = ";" not in limit
    checked: Counter[str] = Counter()
    for seed in seeds:
        rng = random.Random(6000 + seed)
        key = f"f:{seed}"
        for t in random_traffic(rng, rate, W, 4, sim.now):
            if t < sim.now:
                continue  # a checkpoint moved the clock past it
            sim.to(t)
            d = lim.hit(limit, key)
            if d.allowed:
                assert d.retry_after == 0
                assert d.remaining == min(s.remaining for s in lim.stats(limit, key))
                roll = rng.random()
                if roll < 0.3:
                    for _ in range(d.remaining):
                        assert lim.hit(limit, key).allowed
                    d = lim.hit(limit, key)
                    assert not d.allowed
                    checked["remaining"] += 1
                elif roll < 0.55 and single:
                    st = lim.stats(limit, key)[0]
                    big_r = ms(d.reset_after)
                    assert ms(st.reset_after) == big_r and st.count > 0 and big_r >= 1
                    t0 = sim.now
                    sim.to(t0 + big_r - 1)
                    assert lim.stats(limit, key)[0].count > 0, (lim.strategy, t0, big_r)
                    sim.to(t0 + big_r)
                    st = lim.stats(limit, key)[0]
                    assert st.count == 0, (lim.strategy, t0, big_r)
                    assert st.remaining == (st.limit.burst or st.limit.amount)
                    checked["reset"] += 1
                    continue
                else:
                    continue
            # Denied.
            assert d.remaining == 0
            r = ms(d.retry_after)
            assert r >= 1
            t0 = sim.now
            if r > 1:
                sim.to(t0 + r - 1)
                assert not lim.test(limit, key).allowed, (lim.strategy, t0, r)
                d2 = lim.hit(limit, key)
                assert not d2.allowed, (lim.strategy, t0, r)
                assert ms(d2.retry_after) == 1
            sim.to(t0 + r)
            assert lim.test(limit, key).allowed, (lim.strategy, t0, r)
            assert lim.hit(limit, key).allowed, (lim.strategy, t0, r)
            checked["retry"] += 1
    return checked


@pytest.mark.redis_only
def test_sleeping_retry_after_is_admitted_on_redis_in_real_time(redis_server: RedisServer) -> None:
    """Real clock, one thread per strategy: hammer a 5/second limit until denied, sleep
    retry_after, retry: admitted. Twice each. Sleeping longer than asked (scheduling) can
    only help: every strategy's allowance grows with time while nothing is charged."""
    store = redcount.connect(redis_server.url)
    store.execute("FLUSHALL")
    errors: dict[str, str] = {}
    done: dict[str, int] = {}

    def client(case: StrategyCase) -> None:
        try:
            lim = redcount.Limiter(store, case.strategy, sub_buckets=case.sub_buckets)
            for round_ in range(2):
                for _ in range(100):
                    d = lim.hit("5/second", "sleepy")
                    if not d.allowed:
                        break
                else:
                    raise AssertionError("never denied")
                assert d.retry_after > 0
                time.sleep(d.retry_after)
                again = lim.hit("5/second", "sleepy")
                assert again.allowed, f"round {round_}: denied after sleeping retry_after={d.retry_after}"
                done[case.label] = done.get(case.label, 0) + 1
        except (AssertionError, redcount.RedcountError) as e:  # reported by the main thread
            errors[case.label] = repr(e)

    threads = [threading.Thread(target=client, args=(c,)) for c in ALL]
    for th in threads:
        th.start()
    for th in threads:
        th.join(30)
    store.close()
    assert errors == {}
    assert done == {c.label: 2 for c in ALL}


# ----------------------------------------------------------------------- multi-limit


@pytest.mark.parametrize("case", ALL, ids=IDS)
def test_multi_limit_all_or_nothing(sim: Sim, case: StrategyCase) -> None:
    """ "2/minute;5/hour": a hit denied by either limit charges neither (stats unchanged);
    an admitted one charges both. Both kinds of denial occur."""
    lim = sim.limiter(case)
    both, parts = "2/minute;5/hour", ["2/minute", "5/hour"]
    rng = random.Random(7)
    denied_by: Counter[int] = Counter()
    allowed = 0
    for _ in range(400):
        sim.to(sim.now + rng.choice([0, 0, 1, 700, 5_000, 20_000, 60_000, 400_000]))
        before = [(s.count, s.remaining, ms(s.reset_after)) for s in lim.stats(both, "m")]
        alone = [lim.test(p, "m").allowed for p in parts]
        d = lim.hit(both, "m")
        after = [(s.count, s.remaining, ms(s.reset_after)) for s in lim.stats(both, "m")]
        assert d.allowed == all(alone)
        if d.allowed:
            allowed += 1
            assert [a[0] for a in after] == [b[0] + 1 for b in before]
        else:
            assert after == before
            if alone.count(True) == 1:
                denied_by[alone.index(False)] += 1
    assert allowed > 10
    assert denied_by[0] > 0 and denied_by[1] > 0


# ----------------------------------------------------------------------- the table and the CLI


def test_accuracy_table_figures() -> None:
    rep = measure_accuracy(limit=100, window=60)
    L = 100
    cell = rep.cell
    burst, steady, adv, rnd = (str(s["name"]) for s in rep.scenarios)
    assert cell(FIXED.label, burst).max_in_window == 2 * L
    assert cell(FIXED.label, adv).max_in_window == 2 * L
    for sc in (burst, steady, adv, rnd):
        assert cell(SLIDING.label, sc).max_in_window <= L
        for c in (APPROX1, APPROX4):
            assert cell(c.label, sc).max_in_window <= 2 * L - 1
        for c in (TB, GCRA):  # capacity + refill over W - 1 ms
            assert cell(c.label, sc).max_in_window <= L + (L * (60_000 - 1)) // 60_000
        for c in ALL:
            x = cell(c.label, sc)
            assert 0 < x.admitted <= x.sent
    assert cell(APPROX1.label, adv).max_in_window == 2 * L - 1
    assert cell(APPROX4.label, adv).max_in_window == 2 * L - 1
    assert cell(TB.label, steady).max_in_window > L  # burst + refill, documented
    # Same traffic, same decisions: token bucket and GCRA agree cell for cell (6e7 % 100 == 0).
    for sc in (burst, steady, adv, rnd):
        a, b = cell(TB.label, sc), cell(GCRA.label, sc)
        assert (a.admitted, a.max_in_window) == (b.admitted, b.max_in_window)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONWARNINGS="error")
    return subprocess.run(
        [sys.executable, "-m", "redcount", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
        stdin=subprocess.DEVNULL,
    )


def test_cli_accuracy(tmp_path: Path) -> None:
    out = tmp_path / "acc.json"
    proc = run_cli("accuracy", "--limit", "10", "--window", "1", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("| strategy | 2-window burst (40 sent) |")
    rows = [line for line in lines[2:] if line.startswith("| ")]
    assert [r.split(" | ")[0][2:] for r in rows] == [c.label for c in STRATEGIES]
    assert rows[0].split(" | ")[1] == "2.00× (20), 20 admitted"  # fixed window, boundary burst
    data = json.loads(out.read_text(encoding="utf-8"))
    assert data["limit"] == 10 and data["window"] == 1 and len(data["cells"]) == 6 * 4
    assert all(c["max_in_window"] <= 10 for c in data["cells"] if c["strategy"] == SLIDING.label)


def test_cli_accuracy_bad_arguments() -> None:
    proc = run_cli("accuracy", "--limit", "0")
    assert proc.returncode == 2
    assert "redcount accuracy: error: --limit must be between 1 and" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_cli("accuracy", "--window", "0")
    assert proc.returncode == 2 and "--window" in proc.stderr
