"""Leased limits under the exact sliding log (strategy="sliding-window"), on memory:// and a
real Redis server: a lease adds its units' entries stamped with its end (a tenth of the
window after the take), admits from them until then, and gives unused ones back by removing
them; the log lives until its newest entry leaves the window. Several limiters (as
processes), threads and real subprocesses share one key; in no window of the limit's length
are more hits admitted than the limit."""

from __future__ import annotations

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
from redcount.tools.servers import RedisServer

LOG = "sliding-window"


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


def count(lim: redcount.Limiter, limit: str, key: str) -> int:
    return lim.stats(limit, key)[0].count


def test_a_lease_adds_its_entries_and_shrinks(clocked: tuple[redcount.Store, redcount.ManualClock]) -> None:
    store, _ = clocked
    lim = redcount.Limiter(store, LOG)
    grants = []
    admitted = 0
    while True:
        before = count(lim, "10/minute", "k")
        d = lim.hit("10/minute", "k", lease=100)
        if not d:
            break
        admitted += 1
        if count(lim, "10/minute", "k") != before:
            grants.append(count(lim, "10/minute", "k") - before)
    assert grants == [5, 2, 1, 1, 1]  # half of what is left, at least one
    assert admitted == 10 and lim.leased_units == 0
    assert not d and d.retry_after > 0
    assert not redcount.Limiter(store, LOG).hit("10/minute", "k")


def test_unused_entries_go_back(clocked: tuple[redcount.Store, redcount.ManualClock]) -> None:
    store, _ = clocked
    a = redcount.Limiter(store, LOG, lease_ttl=3600)
    b = redcount.Limiter(store, LOG)
    assert a.hit("100/minute", "k", lease=20)  # a holds 19
    admitted = 1
    while b.hit("100/minute", "k", lease=20):
        admitted += 1
    assert admitted == 100 - 19  # a's unused units are refused to b: under-admission only
    assert a.return_leases() == 19
    assert count(b, "100/minute", "k") == 100 - 19
    while b.hit("100/minute", "k", lease=20):
        admitted += 1
    assert admitted == 100 and count(b, "100/minute", "k") == 100


def test_the_lease_ends_a_tenth_of_the_window_after_the_take(
    clocked: tuple[redcount.Store, redcount.ManualClock],
) -> None:
    store, clock = clocked
    lim = redcount.Limiter(store, LOG, lease_ttl=3600)
    d = lim.hit("60/minute", "k", lease=10)
    assert d and lim.leased_units == 9
    assert 0 < d.reset_after <= 66  # the entries, stamped 6 s ahead, leave the window then
    clock.advance(5.9)
    assert lim.hit("60/minute", "k", lease=10) and lim.leased_units == 8  # still from the lease
    clock.advance(0.2)  # past its end: its 8 go back with the next take
    assert lim.hit("60/minute", "k", lease=10)
    assert count(lim, "60/minute", "k") == 2 + 10


def test_a_later_hit_keeps_the_lease_entries(clocked: tuple[redcount.Store, redcount.ManualClock]) -> None:
    store, clock = clocked
    a = redcount.Limiter(store, LOG, lease_ttl=3600)
    plain = redcount.Limiter(store, LOG)
    assert a.hit("60/minute", "k", lease=10)  # entries stamped 6 s ahead
    clock.advance(1)
    assert plain.hit("60/minute", "k")  # would have set the log's expiry to one minute from now
    clock.advance(60.5)  # that minute has passed; the lease's entries are still in the window
    assert count(plain, "60/minute", "k") == 10


def in_every_window(times_ms: list[int], amount: int, window_ms: int) -> int:
    """The most admissions in any window (e - window, e]."""
    times_ms = sorted(times_ms)
    most, lo = 0, 0
    for hi, t in enumerate(times_ms):
        while times_ms[lo] <= t - window_ms:
            lo += 1
        most = max(most, hi - lo + 1)
    return most


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_limiters_sharing_a_key_never_admit_past_the_limit_in_any_window(
    clocked: tuple[redcount.Store, redcount.ManualClock], seed: int
) -> None:
    """Four limiters (four processes' lease tables) that take leases and use them slowly,
    and an eager caller that runs the log out whenever it is its turn, with a clock that
    moves in random steps across many windows: no window holds more than the limit."""
    store, clock = clocked
    rng = random.Random(seed)
    start = clock.now()
    limiters = [redcount.Limiter(store, LOG, lease_ttl=rng.choice([0.5, 2, 3600])) for _ in range(4)]
    plain = redcount.Limiter(store, LOG)
    admitted: list[int] = []
    for _ in range(300):
        clock.advance(rng.choice([0, 0, 0.1, 0.3, 0.7, 1.0, 2.5, 6.0]))
        now_ms = round((clock.now() - start) * 1000)
        order = [*limiters, plain]
        rng.shuffle(order)
        for lim in order:
            if lim is plain:
                if rng.random() < 0.5:
                    while plain.hit("20/10 seconds", "hot"):
                        admitted.append(now_ms)
                continue
            r = rng.random()
            if r < 0.4:
                if lim.hit("20/10 seconds", "hot", lease=rng.choice([4, 8, 100])):
                    admitted.append(now_ms)
            elif r < 0.8:
                while lim.leased_units > 0 and lim.hit("20/10 seconds", "hot", lease=100):
                    admitted.append(now_ms)
            elif r < 0.85:
                lim.return_leases()
    assert len(admitted) > 150  # the log was run out again and again
    assert in_every_window(admitted, 20, 10_000) <= 20


def test_threads_admit_exactly_the_limit(clocked: tuple[redcount.Store, redcount.ManualClock]) -> None:
    store, _ = clocked  # the clock stands: nothing leaves the window while they run
    lim = redcount.Limiter(store, LOG)
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
    assert lim.leased_units == 0 and count(lim, "500/hour", "hot") == 500


def test_bad_input(memory_store: redcount.Store) -> None:
    lim = redcount.Limiter(memory_store, LOG)
    with pytest.raises(redcount.InvalidInputError, match="lease"):
        lim.hit("10/minute", "k", lease=0)
    with pytest.raises(redcount.InvalidInputError, match="lease"):
        lim.test("10/minute", "k", lease=-1)
    with pytest.raises(TypeError):
        lim.hit("10/minute", "k", lease="5")  # type: ignore[arg-type]
    with pytest.raises(redcount.InvalidInputError, match="cost"):
        lim.hit("10/minute", "k", cost=11, lease=5)
    with pytest.raises(redcount.InvalidInputError, match="tag"):
        lim.hit("10/minute", "k", lease=5, tag="t")
    assert lim.leased_units == 0 and count(lim, "10/minute", "k") == 0  # nothing charged


# A process that takes a lease of "20/hour" (10 units: it admits 1 and holds 9), says how
# many units it holds, then ends as argv[3] says.
HOLDER = textwrap.dedent(
    """
    import sys, time
    import redcount

    url, prefix, how = sys.argv[1], sys.argv[2], sys.argv[3]
    lim = redcount.Limiter(redcount.connect(url), "sliding-window", prefix=prefix)
    assert lim.hit("20/hour", "k", lease=100)
    print(lim.leased_units, flush=True)
    if how == "sys.exit":
        sys.exit(0)
    if how != "end":
        time.sleep(120)  # until the signal
    """
)


@pytest.mark.redis_only
@pytest.mark.parametrize(("how", "after"), [("end", 19), ("sys.exit", 19), ("sigterm", 19), ("sigkill", 10)])
def test_a_process_that_ends_gives_its_units_back(
    redis_server: RedisServer, redis_store: redcount.Store, how: str, after: int
) -> None:
    prefix = f"exit:{uuid.uuid4().hex[:8]}"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, redis_server.url, prefix, how], stdout=subprocess.PIPE, env=env)
    assert proc.stdout is not None
    assert int(proc.stdout.readline()) == 9
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    elif how == "sigkill":
        proc.send_signal(signal.SIGKILL)
    proc.communicate(timeout=60)
    lim = redcount.Limiter(redis_store, LOG, prefix=prefix)
    n = 0
    while lim.hit("20/hour", "k", lease=100):
        n += 1
    assert n == after
