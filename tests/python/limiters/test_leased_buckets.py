"""Leased limits under the buckets (strategy="token-bucket" and "gcra"), on memory:// and a
real Redis server: a lease takes tokens (emission intervals) from the bucket at once, its
held units expire as fast as the bucket refills (so the bucket's level plus every unit held
never exceeds the capacity), and unused units go back: only what has not refilled since the
take (a held unit that refilled is dropped, each one still held is credited in full).
Several limiters (as processes), threads and real subprocesses share one key; none of them
admits past what the bucket allows in any interval."""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from collections.abc import Iterator

import pytest
import redcount
import redcount.aio as aio
from redcount.tools.servers import RedisServer

BUCKETS = ["token-bucket", "gcra"]


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis_only)])
def clocked(request: pytest.FixtureRequest) -> Iterator[tuple[redcount.Store, redcount.ManualClock]]:
    """A store whose limiters take the time from a ManualClock (frozen unless a test moves it)."""
    clock = redcount.ManualClock(time.time() // 60 * 60 + 0.5)
    if request.param == "memory":
        s = redcount.connect(clock=clock)
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        s = redcount.connect(server.url, clock=clock)
        s.execute("FLUSHALL")
    try:
        yield s, clock
    finally:
        s.close()


def left(lim: redcount.Limiter, limit: str, key: str) -> int:
    """What the store has left (a test without a lease)."""
    return lim.test(limit, key).remaining


@pytest.mark.parametrize("strategy", BUCKETS)
def test_a_lease_takes_half_of_the_tokens_left(
    clocked: tuple[redcount.Store, redcount.ManualClock], strategy: str
) -> None:
    store, _ = clocked
    lim = redcount.Limiter(store, strategy)  # type: ignore[arg-type]
    grants = []
    admitted = 0
    while True:
        before = left(lim, "10/minute", "k")
        d = lim.hit("10/minute", "k", lease=100)
        if not d:
            break
        admitted += 1
        if left(lim, "10/minute", "k") != before:
            grants.append(before - left(lim, "10/minute", "k"))
    assert grants == [5, 2, 1, 1, 1]  # half of what is left, at least one
    assert admitted == 10 and lim.leased_units == 0
    assert not d and d.retry_after > 0
    assert not redcount.Limiter(store, strategy).hit("10/minute", "k")  # type: ignore[arg-type]


@pytest.mark.parametrize("strategy", BUCKETS)
def test_held_units_refill_away(clocked: tuple[redcount.Store, redcount.ManualClock], strategy: str) -> None:
    store, clock = clocked
    lim = redcount.Limiter(store, strategy, lease_ttl=3600)  # type: ignore[arg-type]
    assert lim.hit("60/minute", "k", lease=100)  # one token a second; takes 30, admits 1
    assert lim.leased_units == 29 and left(lim, "60/minute", "k") == 30
    clock.advance(10)  # 10 tokens refilled in the store: 10 of the 30 taken are gone
    assert lim.leased_units == 20
    assert left(lim, "60/minute", "k") == 40
    clock.advance(25)  # 35 refilled: of the 30 taken, none is left to admit
    assert lim.leased_units == 0
    d = lim.hit("60/minute", "k", lease=100)  # a new lease from the store
    assert d and lim.leased_units > 0


@pytest.mark.parametrize("strategy", BUCKETS)
def test_giving_back_credits_what_has_not_refilled(
    clocked: tuple[redcount.Store, redcount.ManualClock], strategy: str
) -> None:
    store, clock = clocked
    a = redcount.Limiter(store, strategy, lease_ttl=3600)  # type: ignore[arg-type]
    b = redcount.Limiter(store, strategy)  # type: ignore[arg-type]
    assert a.hit("100/minute", "k", lease=20)  # a holds 19
    admitted = 1
    while b.hit("100/minute", "k", lease=20):
        admitted += 1
    assert admitted == 100 - 19  # a's unused units are refused to b: under-admission only
    assert a.return_leases() == 19
    while b.hit("100/minute", "k", lease=20):
        admitted += 1
    assert admitted == 100  # the capacity exactly: nothing refilled (the clock stands)
    b.return_leases()
    # With time passing: a unit held while the bucket refilled is not credited again.
    clock.advance(60)  # full again
    assert a.hit("100/minute", "k", lease=40)  # takes 40, admits 1, holds 39
    clock.advance(6)  # 10 tokens refilled since the take: 10 of the 40 taken are gone
    assert a.leased_units == 30 and left(a, "100/minute", "k") == 70
    assert a.return_leases() == 30
    # Credited: the 30 units that had not refilled; the 10 that had are not credited again.
    assert left(a, "100/minute", "k") == 100
    clock.advance(6)  # 10 more refill: the bucket is full, nothing past the capacity
    assert left(a, "100/minute", "k") == 100


@pytest.mark.parametrize("strategy", BUCKETS)
def test_async_leases(clocked: tuple[redcount.Store, redcount.ManualClock], strategy: str) -> None:
    store, _ = clocked

    async def main() -> int:
        lim = aio.Limiter.from_sync(redcount.Limiter(store, strategy))  # type: ignore[arg-type]
        n = 0
        while await lim.hit("30/minute", "k", lease=8):
            n += 1
        return n

    assert asyncio.run(main()) == 30


@pytest.mark.parametrize("strategy", BUCKETS)
def test_threads_admit_exactly_the_capacity(
    clocked: tuple[redcount.Store, redcount.ManualClock], strategy: str
) -> None:
    store, _ = clocked  # the clock stands: nothing refills while they run
    lim = redcount.Limiter(store, strategy)  # type: ignore[arg-type]
    admitted: list[int] = []
    go = threading.Barrier(8)

    def worker() -> None:
        n = 0
        go.wait()
        while lim.hit("500/hour", "hot", lease=16):
            n += 1
        admitted.append(n)

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(admitted) == 500
    assert lim.leased_units == 0 and left(lim, "500/hour", "hot") == 0


@pytest.mark.parametrize("strategy", BUCKETS)
def test_units_held_while_the_bucket_refills_are_not_admitted_twice(
    clocked: tuple[redcount.Store, redcount.ManualClock], strategy: str
) -> None:
    store, clock = clocked
    a = redcount.Limiter(store, strategy, lease_ttl=3600)  # type: ignore[arg-type]
    b = redcount.Limiter(store, strategy)  # type: ignore[arg-type]
    assert a.hit("10/minute", "k", lease=100)  # takes 5 of 10 tokens, admits 1, holds 4
    assert a.leased_units == 4
    clock.advance(30)  # 5 tokens refilled: the bucket is full again, a's 4 are gone
    n = 0
    while b.hit("10/minute", "k"):
        n += 1
    assert n == 10  # the burst, at this moment
    assert a.leased_units == 0
    assert not a.hit("10/minute", "k", lease=100)  # not 4 more on top of the burst
    clock.advance(12)  # 2 tokens refilled
    assert a.hit("10/minute", "k", lease=100) and a.hit("10/minute", "k", lease=100)
    assert not a.hit("10/minute", "k", lease=100) and not b.hit("10/minute", "k")


def within_the_bucket(times_ms: list[int], capacity: int, per_ms: float) -> bool:
    """Whether every interval [s, e] of admissions holds at most capacity + (e - s) * rate:
    what a bucket of that capacity refilling at that rate can admit."""
    times_ms = sorted(times_ms)
    for i in range(len(times_ms)):
        for j in range(i, len(times_ms)):
            if j - i + 1 > capacity + (times_ms[j] - times_ms[i]) * per_ms + 1e-9:
                return False
    return True


@pytest.mark.parametrize("strategy", BUCKETS)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_limiters_sharing_a_key_never_admit_past_the_bucket(
    clocked: tuple[redcount.Store, redcount.ManualClock], strategy: str, seed: int
) -> None:
    """Four limiters (four processes' lease tables) and plain hits on one key, a clock that
    moves in random steps (a token refills every second), leases given back at random: in
    any interval, never more admissions than the bucket's capacity plus its refill."""
    store, clock = clocked
    rng = random.Random(seed)
    start = clock.now()
    limiters = [redcount.Limiter(store, strategy, lease_ttl=rng.choice([2, 5, 3600])) for _ in range(4)]  # type: ignore[arg-type]
    plain = redcount.Limiter(store, strategy)  # type: ignore[arg-type]
    admitted: list[int] = []
    for _ in range(300):
        clock.advance(rng.choice([0, 0, 0.1, 0.3, 0.7, 1.0, 2.5, 6.0]))
        now_ms = round((clock.now() - start) * 1000)
        order = [*limiters, plain]
        rng.shuffle(order)
        for lim in order:
            if lim is plain:
                # An eager caller: runs the bucket dry whenever it is its turn, so units a
                # holder kept while the bucket refilled would show as admissions past it.
                if rng.random() < 0.5:
                    while plain.hit("20/20 seconds", "hot"):
                        admitted.append(now_ms)
                continue
            # Holders that take a lease, keep it a while, then use all they hold at once.
            r = rng.random()
            if r < 0.4:
                if lim.hit("20/20 seconds", "hot", lease=rng.choice([4, 8, 100])):
                    admitted.append(now_ms)
            elif r < 0.8:
                while lim.leased_units > 0 and lim.hit("20/20 seconds", "hot", lease=100):
                    admitted.append(now_ms)
            elif r < 0.85:
                lim.return_leases()
    assert len(admitted) > 150  # the bucket was run out again and again
    assert within_the_bucket(admitted, 20, 1 / 1000)


@pytest.mark.parametrize("strategy", BUCKETS)
def test_bad_input(memory_store: redcount.Store, strategy: str) -> None:
    lim = redcount.Limiter(memory_store, strategy)  # type: ignore[arg-type]
    with pytest.raises(redcount.InvalidInputError, match="lease"):
        lim.hit("10/minute", "k", lease=0)
    with pytest.raises(redcount.InvalidInputError, match="lease"):
        lim.test("10/minute", "k", lease=-1)
    with pytest.raises(TypeError):
        lim.hit("10/minute", "k", lease="5")  # type: ignore[arg-type]
    with pytest.raises(redcount.InvalidInputError, match="cost"):
        lim.hit("10/minute", "k", cost=11, lease=5)  # more than the capacity
    with pytest.raises(redcount.InvalidInputError, match="tag"):
        lim.hit("10/minute", "k", lease=5, tag="t")
    assert lim.leased_units == 0 and left(lim, "10/minute", "k") == 10  # nothing charged


# A process that takes a lease of "20/hour" (10 tokens: it admits 1 and holds 9), says how
# many units it holds, then ends as argv[4] says.
HOLDER = textwrap.dedent(
    """
    import sys, time
    import redcount

    url, prefix, strategy, how = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    lim = redcount.Limiter(redcount.connect(url), strategy, prefix=prefix)
    assert lim.hit("20/hour", "k", lease=100)
    print(lim.leased_units, flush=True)
    if how == "sys.exit":
        sys.exit(0)
    if how != "end":
        time.sleep(120)  # until the signal
    """
)


@pytest.mark.redis_only
@pytest.mark.parametrize("strategy", BUCKETS)
@pytest.mark.parametrize(("how", "after"), [("end", 19), ("sys.exit", 19), ("sigterm", 19), ("sigkill", 10)])
def test_a_process_that_ends_gives_its_units_back(
    redis_server: RedisServer, redis_store: redcount.Store, strategy: str, how: str, after: int
) -> None:
    """One token of "20/hour" refills every 3 minutes: what the holder gave back is what the
    others can admit (a SIGKILL loses the 9 it held until they refill)."""
    prefix = f"exit:{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, redis_server.url, prefix, strategy, how], stdout=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None
    assert int(proc.stdout.readline()) == 9
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    elif how == "sigkill":
        proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    lim = redcount.Limiter(redis_store, strategy, prefix=prefix)  # type: ignore[arg-type]
    n = 0
    while lim.hit("20/hour", "k", lease=100):
        n += 1
    assert n == after
