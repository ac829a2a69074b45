"""Leased limits under strategy="sliding-window-approx" (weighted sub-buckets), sync and
async, on memory:// and a real Redis server: a lease charges the current sub-bucket and
ends with it, never admits past the limit across threads, limiters and processes, and gives
unused units back to the sub-bucket it charged."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest
import redcount
import redcount.aio as aio
from redcount.tools.servers import RedisServer

APPROX = "sliding-window-approx"


def count(lim: redcount.Limiter, limit: str, key: str) -> int:
    return lim.stats(limit, key)[0].count


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis_only)])
def clocked(request: pytest.FixtureRequest) -> Iterator[tuple[redcount.Store, redcount.ManualClock]]:
    """A store whose limiters take the time from a ManualClock, at the start of a minute
    (so that the tests' 10 s sub-buckets start there)."""
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


def test_a_lease_charges_the_current_sub_bucket(clocked: tuple[redcount.Store, redcount.ManualClock]) -> None:
    store, _ = clocked
    lim = redcount.Limiter(store, APPROX, sub_buckets=6)  # 10 s sub-buckets of a minute
    d = lim.hit("100/minute", "hot", lease=10)
    assert d and d.limit == 100
    assert count(lim, "100/minute", "hot") == 10 and lim.leased_units == 9
    assert d.remaining == 90 + 9
    assert 0 < d.reset_after <= 10  # until the sub-bucket ends: the lease ends with it
    for _ in range(9):
        assert lim.hit("100/minute", "hot", lease=10)
    assert count(lim, "100/minute", "hot") == 10 and lim.leased_units == 0
    assert lim.test("100/minute", "hot", lease=10).remaining == 90  # no lease held: the store
    assert lim.hit("100/minute", "hot").remaining == 89  # plain hits share the counts


def test_leases_shrink_and_the_limit_is_exact(clocked: tuple[redcount.Store, redcount.ManualClock]) -> None:
    store, _ = clocked
    lim = redcount.Limiter(store, APPROX, sub_buckets=6)
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
    assert grants == [5, 2, 1, 1, 1]
    assert admitted == 10 and count(lim, "10/minute", "k") == 10
    assert not d and d.retry_after > 0


def test_the_lease_ends_with_the_sub_bucket_and_gives_back_to_it(
    clocked: tuple[redcount.Store, redcount.ManualClock],
) -> None:
    store, clock = clocked
    lim = redcount.Limiter(store, APPROX, sub_buckets=6)
    assert lim.hit("100/minute", "a", lease=20)
    assert lim.leased_units == 19 and count(lim, "100/minute", "a") == 20
    clock.advance(10)  # the next sub-bucket: the lease admits nothing more
    # The 19 go back to the sub-bucket they were charged to: the table's sweeper, which looks
    # at least once a second by the store's clock, does it with no further call.
    deadline = time.monotonic() + 10
    while count(lim, "100/minute", "a") != 1 and time.monotonic() < deadline:
        time.sleep(0.05)  # polling for the sweeper, not a fixed wait
    assert count(lim, "100/minute", "a") == 1 and lim.leased_units == 0
    assert lim.test("100/minute", "a", lease=20).remaining == 99  # asked the store
    # The next leased call takes a lease in the new sub-bucket.
    assert lim.hit("100/minute", "a", lease=20)
    assert lim.leased_units == 19
    assert count(lim, "100/minute", "a") == 1 + 20
    assert lim.return_leases() == 19
    assert count(lim, "100/minute", "a") == 2


def test_leased_and_plain_admit_the_same_over_time(clocked: tuple[redcount.Store, redcount.ManualClock]) -> None:
    """One caller that asks until refused, every 4 s for two minutes: the estimate it meets
    is the same with and without leases, so it admits the same number each time."""
    store, clock = clocked
    leased = redcount.Limiter(store, APPROX, sub_buckets=6, prefix="a")
    plain = redcount.Limiter(store, APPROX, sub_buckets=6, prefix="b")
    for _ in range(30):
        n_leased = n_plain = 0
        while leased.hit("50/minute", "k", lease=8):
            n_leased += 1
        while plain.hit("50/minute", "k"):
            n_plain += 1
        assert n_leased == n_plain
        assert leased.leased_units == 0
        clock.advance(4)


def test_two_holders_never_admit_past_the_limit(clocked: tuple[redcount.Store, redcount.ManualClock]) -> None:
    store, _ = clocked
    a = redcount.Limiter(store, APPROX, sub_buckets=6)
    b = redcount.Limiter(store, APPROX, sub_buckets=6)
    assert a.hit("100/minute", "k", lease=20)
    admitted = 1
    while b.hit("100/minute", "k", lease=20):
        admitted += 1
    assert admitted == 100 - 19  # a's unused units are refused to b: under-admission only
    assert a.return_leases() == 19
    while b.hit("100/minute", "k", lease=20):
        admitted += 1
    assert admitted == 100 and count(b, "100/minute", "k") == 100


def test_async_leases(clocked: tuple[redcount.Store, redcount.ManualClock]) -> None:
    store, _ = clocked

    async def main() -> int:
        lim = aio.Limiter.from_sync(redcount.Limiter(store, APPROX, sub_buckets=6))
        n = 0
        while await lim.hit("30/minute", "k", lease=8):
            n += 1
        return n

    assert asyncio.run(main()) == 30


@pytest.mark.usefixtures("away_from_hour_boundary")
def test_threads_admit_exactly_the_limit(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, APPROX)  # one sub-bucket: the hour
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


WORKER = """
import sys, redcount
lim = redcount.Limiter(redcount.connect(sys.argv[1]), "sliding-window-approx")
n = 0
while lim.hit("400/hour", "hot", lease=25):
    n += 1
print(n)
"""


@pytest.mark.redis_only
@pytest.mark.usefixtures("away_from_hour_boundary")
def test_processes_admit_exactly_the_limit(redis_store: redcount.Store, redis_server: RedisServer) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER, redis_server.url], stdout=subprocess.PIPE, env=env)
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sum(int(o) for o in outs) == 400
    assert count(redcount.Limiter(redis_store, APPROX), "400/hour", "hot") == 400


@pytest.mark.redis_only
@pytest.mark.usefixtures("away_from_hour_boundary")
@pytest.mark.parametrize("clock", ["server", "server-offset"])
def test_server_clocks(redis_store: redcount.Store, clock: str) -> None:
    lim = redcount.Limiter(redis_store, APPROX, clock=clock)  # type: ignore[arg-type]
    n = 0
    while lim.hit("40/hour", "k", lease=8):
        n += 1
    assert n == 40 and count(lim, "40/hour", "k") == 40
