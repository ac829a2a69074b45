"""Leased limits (Limiter.hit(..., lease=N)), sync and async, on memory:// and a real Redis
server: what a lease charges, local admissions, exactness across threads, limiters and
processes, units given back (ttl, return_leases, store close), window rollover, fork."""

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


def count(lim: redcount.Limiter, limit: str, key: str) -> int:
    return lim.stats(limit, key)[0].count


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis_only)])
def clocked(request: pytest.FixtureRequest) -> Iterator[tuple[redcount.Store, redcount.ManualClock]]:
    """A store whose limiters take the time from a ManualClock: on memory:// the store's
    clock; on Redis the client's (starting now, so that keys' TTLs lie ahead on the server)."""
    # The start of the current minute (plus a little): the windows the tests use end after
    # the server's own clock, which expires their keys.
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


def test_a_lease_charges_its_units_and_admits_locally(clocked: tuple[redcount.Store, redcount.ManualClock]) -> None:
    store, _ = clocked
    lim = redcount.Limiter(store)
    d = lim.hit("100/hour", "hot", lease=10)
    assert d and d.limit == 100
    # min(10, 100 / 2) units charged in the store at once; this hit used one of them.
    assert count(lim, "100/hour", "hot") == 10
    assert lim.leased_units == 9
    assert d.remaining == 90 + 9  # what the store had left, plus what this process holds
    assert 0 < d.reset_after <= 3600
    for i in range(9):
        d = lim.hit("100/hour", "hot", lease=10)
        assert d and d.remaining == 90 + 8 - i
    assert count(lim, "100/hour", "hot") == 10  # no store call for those
    assert lim.leased_units == 0
    assert lim.hit("100/hour", "hot", lease=10)  # the next lease
    assert count(lim, "100/hour", "hot") == 20
    # Leased and plain hits share the key's counter.
    assert lim.hit("100/hour", "hot").remaining == 79


def test_leases_shrink_as_the_window_fills(clocked: tuple[redcount.Store, redcount.ManualClock]) -> None:
    store, _ = clocked
    lim = redcount.Limiter(store)
    grants = []
    admitted = 0
    while True:
        before = count(lim, "10/hour", "k")
        d = lim.hit("10/hour", "k", lease=100)
        if not d:
            break
        admitted += 1
        if count(lim, "10/hour", "k") != before:
            grants.append(count(lim, "10/hour", "k") - before)
    assert grants == [5, 2, 1, 1, 1]  # half of what was left each time, at least the cost
    assert admitted == 10
    assert not d and d.remaining == 0 and 0 < d.retry_after <= 3600 and d.limit == 10
    assert count(lim, "10/hour", "k") == 10


def test_a_lease_is_at_least_the_cost(clocked: tuple[redcount.Store, redcount.ManualClock]) -> None:
    store, _ = clocked
    lim = redcount.Limiter(store)
    assert lim.hit("10/hour", "k", cost=4, lease=1)
    assert count(lim, "10/hour", "k") == 4 and lim.leased_units == 0
    assert lim.hit("10/hour", "k", cost=6, lease=100)  # 6 left: at least the cost
    assert not lim.hit("10/hour", "k", lease=100)
    assert count(lim, "10/hour", "k") == 10


def test_other_holders_cause_bounded_under_admission(clocked: tuple[redcount.Store, redcount.ManualClock]) -> None:
    store, _ = clocked
    a, b = redcount.Limiter(store), redcount.Limiter(store)  # two tables, as two processes
    assert a.hit("100/hour", "k", lease=20)
    assert a.leased_units == 19
    admitted = 0
    while b.hit("100/hour", "k", lease=20):
        admitted += 1
    # b is refused while a holds 19 unused units: never over the limit, under it by what
    # the other holder has not used.
    assert admitted == 100 - 20
    assert count(b, "100/hour", "k") == 100
    assert a.return_leases() == 19
    assert a.leased_units == 0 and count(b, "100/hour", "k") == 81
    while b.hit("100/hour", "k", lease=20):
        admitted += 1
    assert admitted + 1 == 100  # exactly the limit once nobody holds units


@pytest.mark.usefixtures("away_from_hour_boundary")
def test_threads_admit_exactly_the_limit(store: redcount.Store) -> None:
    lim = redcount.Limiter(store)
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
    # Every thread stops only when refused, so no unit is left in the lease.
    assert sum(admitted) == 500
    assert lim.leased_units == 0
    assert count(lim, "500/hour", "hot") == 500


WORKER = """
import sys, redcount
store = redcount.connect(sys.argv[1])
lim = redcount.Limiter(store)
n = 0
while lim.hit("400/hour", "hot", lease=int(sys.argv[2])):
    n += 1
print(n)
"""


@pytest.mark.redis_only
@pytest.mark.usefixtures("away_from_hour_boundary")
def test_processes_admit_exactly_the_limit(redis_store: redcount.Store, redis_server: RedisServer) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER, redis_server.url, "25"], stdout=subprocess.PIPE, env=env)
        for _ in range(4)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sum(int(o) for o in outs) == 400
    assert count(redcount.Limiter(redis_store), "400/hour", "hot") == 400


def test_units_go_back_after_the_lease_ttl(clocked: tuple[redcount.Store, redcount.ManualClock]) -> None:
    store, clock = clocked
    lim = redcount.Limiter(store, lease_ttl=5)
    assert lim.lease_ttl == 5.0
    assert lim.hit("100/hour", "a", lease=10)
    clock.advance(4.9)
    assert lim.hit("100/hour", "a", lease=10)  # still the same lease
    assert count(lim, "100/hour", "a") == 10 and lim.leased_units == 8
    clock.advance(0.2)
    # Past the ttl: the next leased call, of any key, gives a's 8 units back.
    assert lim.hit("100/hour", "b", lease=10)
    assert count(lim, "100/hour", "a") == 2
    assert lim.leased_units == 9  # b's
    # a's next hit takes a fresh lease.
    assert lim.hit("100/hour", "a", lease=10)
    assert count(lim, "100/hour", "a") == 12


def test_an_idle_process_gives_units_back_after_the_ttl(clocked: tuple[redcount.Store, redcount.ManualClock]) -> None:
    store, clock = clocked
    lim = redcount.Limiter(store, lease_ttl=2)
    assert lim.hit("100/hour", "a", lease=10)
    assert count(lim, "100/hour", "a") == 10
    clock.advance(2.5)
    # No further call: the table's sweeper gives the 9 units back (it looks at least once a
    # second, by the store's clock).
    deadline = time.monotonic() + 10
    while count(lim, "100/hour", "a") != 1 and time.monotonic() < deadline:
        time.sleep(0.05)  # polling for the sweeper, not a fixed wait
    assert count(lim, "100/hour", "a") == 1
    assert lim.leased_units == 0


def test_the_same_key_past_its_ttl_gives_back_and_retakes_in_one_call(
    clocked: tuple[redcount.Store, redcount.ManualClock],
) -> None:
    store, clock = clocked
    lim = redcount.Limiter(store, lease_ttl=1)
    assert lim.hit("100/hour", "a", lease=10)
    clock.advance(2)
    assert lim.hit("100/hour", "a", lease=10)
    assert count(lim, "100/hour", "a") == 1 + 10  # 9 given back, 10 taken
    assert lim.leased_units == 9


def test_a_window_rollover_ends_the_lease(clocked: tuple[redcount.Store, redcount.ManualClock]) -> None:
    store, clock = clocked
    lim = redcount.Limiter(store)
    assert lim.hit("10/minute", "k", lease=4)
    assert lim.hit("10/minute", "k", lease=4)
    assert count(lim, "10/minute", "k") == 4 and lim.leased_units == 2
    clock.advance(60)  # the next minute: the old window's units expire with it
    d = lim.hit("10/minute", "k", lease=4)
    assert d and d.reset_after <= 60
    assert count(lim, "10/minute", "k") == 4
    assert lim.leased_units == 3


def test_return_leases_after_the_window_gives_nothing_back(
    clocked: tuple[redcount.Store, redcount.ManualClock],
) -> None:
    store, clock = clocked
    lim = redcount.Limiter(store)
    assert lim.hit("10/minute", "k", lease=4)
    clock.advance(60)
    assert lim.return_leases() == 0
    assert lim.leased_units == 0


@pytest.mark.redis_only
def test_closing_the_store_gives_units_back(redis_store: redcount.Store, redis_server: RedisServer) -> None:
    other = redcount.connect(redis_server.url)
    lim = redcount.Limiter(other)
    assert lim.hit("100/hour", "k", lease=10)
    assert count(redcount.Limiter(redis_store), "100/hour", "k") == 10
    other.close()
    assert count(redcount.Limiter(redis_store), "100/hour", "k") == 1


def test_several_limits_lease_together(clocked: tuple[redcount.Store, redcount.ManualClock]) -> None:
    store, _ = clocked
    lim = redcount.Limiter(store)
    d = lim.hit("20/minute;100/hour", "k", lease=50)
    assert d and d.limit == 20  # fewest units left
    assert count(lim, "20/minute;100/hour", "k") == 10  # half of the tighter limit's 20
    assert lim.stats("20/minute;100/hour", "k")[1].count == 10
    admitted = 1
    while lim.hit("20/minute;100/hour", "k", lease=50):
        admitted += 1
    assert admitted == 20


@pytest.mark.usefixtures("away_from_hour_boundary")
def test_async_leases(store: redcount.Store) -> None:
    async def main() -> list[bool]:
        lim = aio.Limiter(store)
        first = await lim.hit("30/hour", "hot", lease=8)
        assert first and lim.sync.leased_units == 7
        rest = await asyncio.gather(*(lim.hit("30/hour", "hot", lease=8) for _ in range(60)))
        return [bool(first)] + [bool(d) for d in rest]

    got = asyncio.run(main())
    assert sum(got) == 30
    assert count(redcount.Limiter(store), "30/hour", "hot") == 30


@pytest.mark.redis_only
def test_a_forked_child_does_not_use_the_parents_units(redis_store: redcount.Store) -> None:
    lim = redcount.Limiter(redis_store)
    assert lim.hit("1000/hour", "k", lease=10)
    assert lim.leased_units == 9
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through the pipe
        try:
            held = lim.leased_units
            ok = bool(lim.hit("1000/hour", "k", lease=10))
            os.write(w, f"{held} {ok} {count(lim, '1000/hour', 'k')}".encode())
        finally:
            os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        held, ok, seen = f.read().split()
    os.waitpid(pid, 0)
    assert held == "0" and ok == "True"
    assert seen == "20"  # the child took its own lease of 10
    assert lim.leased_units == 9  # the parent's units are still the parent's
    assert lim.hit("1000/hour", "k", lease=10)
    assert count(lim, "1000/hour", "k") == 20


@pytest.mark.parametrize("lease", [0, -1, 2**63])
def test_bad_lease_sizes(memory_store: redcount.Store, lease: int) -> None:
    lim = redcount.Limiter(memory_store)
    with pytest.raises((redcount.InvalidInputError, OverflowError), match="lease"):
        lim.hit("10/minute", "k", lease=lease)


def test_bad_input(memory_store: redcount.Store) -> None:
    lim = redcount.Limiter(memory_store)
    with pytest.raises(TypeError):
        lim.hit("10/minute", "k", lease="5")  # type: ignore[arg-type]
    with pytest.raises(redcount.InvalidInputError, match="cost"):
        lim.hit("10/minute", "k", cost=11, lease=5)
    with pytest.raises(redcount.InvalidInputError, match="cost"):
        lim.hit("10/minute", "k", cost=0, lease=5)
    assert lim.hit("10/minute", "k", lease=5)
    with pytest.raises(redcount.InvalidInputError, match="cost"):  # checked before a local admission
        lim.hit("10/minute", "k", cost=0, lease=5)
    with pytest.raises(redcount.InvalidInputError, match="lease_ttl"):
        redcount.Limiter(memory_store, lease_ttl=0)
    for strategy in ("concurrency",):
        other = redcount.Limiter(memory_store, strategy)  # type: ignore[arg-type]
        with pytest.raises(redcount.InvalidInputError, match="fixed-window"):
            other.hit("10/minute", "k", lease=5)
        assert other.hit("10/minute", "k")  # without lease= as before


def test_on_unavailable_passes_lease_through(memory_store: redcount.Store) -> None:
    lim = redcount.Limiter(memory_store, on_unavailable="allow")
    assert lim.hit("10/minute", "k", lease=4)
    assert lim.leased_units == 3


@pytest.mark.usefixtures("away_from_hour_boundary")
@pytest.mark.parametrize("foreign", [("SET", "garbage"), ("HSET", "f", "v")])
def test_a_foreign_value_in_the_window_key_starts_it_afresh(store: redcount.Store, foreign: tuple[str, ...]) -> None:
    lim = redcount.Limiter(store)
    assert lim.hit("10/hour", "k")
    (key,) = store.execute("KEYS", "redcount:lim:*")
    store.execute("DEL", key)
    store.execute(foreign[0], key, *foreign[1:])
    assert lim.hit("10/hour", "k", lease=4)
    assert count(lim, "10/hour", "k") == 4
    assert store.execute("PTTL", key) > 0  # held to its window's end like any limiter key


@pytest.mark.usefixtures("away_from_hour_boundary")
def test_giving_back_after_a_reset_never_goes_below_zero(store: redcount.Store) -> None:
    lim = redcount.Limiter(store)
    assert lim.hit("10/hour", "k", lease=4)
    lim.reset("10/hour", "k")
    assert lim.hit("10/hour", "k")  # a plain hit: count 1, while the lease still holds 3
    lim.return_leases()
    assert count(lim, "10/hour", "k") == 0
    (key,) = store.execute("KEYS", "redcount:lim:*")
    store.execute("SET", key, "garbage", "KEEPTTL")
    lim.hit("10/hour", "k2", lease=4)
    lim.return_leases()  # a foreign value is left alone
    assert store.execute("GET", key) == b"garbage" or store.execute("GET", key) == "garbage"


@pytest.mark.asyncio
async def test_a_leased_limit_behind_allow_deny_lists_and_a_penalty(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, allow=["vip"], deny=["10.0.0.0/8"], penalty=redcount.Penalty(after=2, within=60, block=60))
    assert lim.hit("3/hour", "vip", lease=2).remaining == 3  # listed: decided without the store
    assert not lim.hit("3/hour", "10.1.2.3", lease=2)
    assert [bool(lim.hit("3/hour", "u", lease=2)) for _ in range(4)] == [True, True, True, False]
    alim = redcount.aio.Limiter.from_sync(lim)
    assert (await alim.hit("3/hour", "vip", lease=2)).allowed
    assert not await alim.hit("3/hour", "u", lease=2)
    lim.return_leases()


def test_every_way_of_calling_hit_decides_the_same(store: redcount.Store) -> None:
    # hit() reads limit, key, cost and lease= itself and hands other calls to the binding's
    # general argument matching: both must decide, and refuse bad input, alike.
    lim = redcount.Limiter(store)
    assert lim.hit("9/hour", "a").remaining == 8
    assert lim.hit("9/hour", "a", 2).remaining == 6
    assert lim.hit("9/hour", "a", cost=2).remaining == 4
    assert lim.hit(limit="9/hour", key="a").remaining == 3
    assert lim.hit("9/hour", key="a", cost=1).remaining == 2
    assert lim.hit("9/hour", "a", 1, lease=None).remaining == 1
    assert lim.hit("9/hour", "b", cost=1, lease=4) and lim.hit("9/hour", "b", 1, lease=4)
    assert lim.hit("9/hour", "b", lease=4, cost=1)
    for args, kwargs, error in [
        (("9/hour", "a", 0), {}, redcount.InvalidInputError),
        (("9/hour", "a"), {"cost": "1"}, TypeError),
        (("9/hour", "a"), {"lease": 0}, redcount.InvalidInputError),
        (("9/hour", "a"), {"lease": True}, TypeError),
        (("9/hour", 5), {}, TypeError),
        (("9/hour", ""), {"lease": 2}, redcount.InvalidInputError),
        (("9/parsec", "a"), {}, redcount.InvalidInputError),
        (("9/hour",), {}, TypeError),
        (("9/hour", "a"), {"leese": 2}, TypeError),
        (("9/hour", "a", 1), {"cost": 1}, TypeError),
    ]:
        with pytest.raises(error):
            lim.hit(*args, **kwargs)
    assert lim.stats("9/hour", "a")[0].count == 8  # the refused calls changed nothing
    lim.return_leases()


def test_test_answers_from_the_lease_without_taking_one(clocked: tuple[redcount.Store, redcount.ManualClock]) -> None:
    store, _ = clocked
    lim = redcount.Limiter(store)
    # No lease held: the store answers, and no lease is taken.
    d = lim.test("100/hour", "k", lease=10)
    assert d and d.remaining == 100  # a test reports what is left now
    assert lim.leased_units == 0 and count(lim, "100/hour", "k") == 0
    assert lim.hit("100/hour", "k", lease=10)
    assert lim.leased_units == 9 and count(lim, "100/hour", "k") == 10
    # Held units answer it locally, as the next hit would decide, and nothing is taken:
    # remaining is what the store had left plus what this process holds.
    d = lim.test("100/hour", "k", lease=10)
    assert d and d.remaining == 90 + 9 and d.limit == 100 and 0 < d.reset_after <= 3600
    assert lim.leased_units == 9
    d = lim.test("100/hour", "k", cost=9, lease=10)
    assert d and d.remaining == 99
    # A cost past what is held asks the store (which has 90 left), still without a lease.
    d = lim.test("100/hour", "k", cost=10, lease=10)
    assert d and d.remaining == 90
    assert lim.leased_units == 9 and count(lim, "100/hour", "k") == 10
    # The store refuses what it has not left, while the lease still covers what it holds.
    other = redcount.Limiter(store)
    while other.hit("100/hour", "k"):
        pass
    assert lim.test("100/hour", "k", cost=9, lease=10)
    assert not lim.test("100/hour", "k", cost=10, lease=10)
    assert lim.leased_units == 9


def test_test_with_lease_async(clocked: tuple[redcount.Store, redcount.ManualClock]) -> None:
    store, _ = clocked

    async def main() -> None:
        lim = aio.Limiter(store)
        d = await lim.test("100/hour", "k", lease=10)
        assert d and d.remaining == 100 and lim.sync.leased_units == 0
        assert await lim.hit("100/hour", "k", lease=10)
        d = await lim.test("100/hour", "k", lease=10)
        assert d and d.remaining == 99 and lim.sync.leased_units == 9
        d = await lim.test("100/hour", "k", cost=10, lease=10)
        assert d and d.remaining == 90
        with pytest.raises(redcount.InvalidInputError, match="lease"):
            await lim.test("100/hour", "k", lease=0)

    asyncio.run(main())


def test_test_with_lease_checks_its_input(memory_store: redcount.Store) -> None:
    lim = redcount.Limiter(memory_store)
    with pytest.raises(redcount.InvalidInputError, match="lease"):
        lim.test("10/minute", "k", lease=0)
    with pytest.raises(redcount.InvalidInputError, match="cost"):
        lim.test("10/minute", "k", cost=11, lease=5)
    other = redcount.Limiter(memory_store, "concurrency")
    with pytest.raises(redcount.InvalidInputError, match="fixed-window"):
        other.test("10/minute", "k", lease=5)


@pytest.mark.parametrize(
    ("strategy", "why"),
    [
        ("concurrency", "counts requests in flight"),
    ],
)
def test_strategies_that_cannot_lease_say_why(memory_store: redcount.Store, strategy: str, why: str) -> None:
    lim = redcount.Limiter(memory_store, strategy)  # type: ignore[arg-type]
    for call in (lim.hit, lim.test):
        with pytest.raises(redcount.InvalidInputError, match=why):
            call("10/minute", "k", lease=5)
    assert lim.leased_units == 0
    assert lim.stats("10/minute", "k")[0].count == 0  # nothing charged

    async def main() -> None:
        alim = aio.Limiter.from_sync(lim)
        with pytest.raises(redcount.InvalidInputError, match=why):
            await alim.hit("10/minute", "k", lease=5)

    asyncio.run(main())


def test_hit_all_refuses_lease(memory_store: redcount.Store) -> None:
    items = [("10/minute", "a"), ("10/minute", "b")]
    for lim in (redcount.Limiter(memory_store), redcount.Limiter(memory_store, allow=["x"])):
        with pytest.raises(redcount.InvalidInputError, match="all or nothing"):
            lim.hit_all(items, lease=5)
        assert lim.hit_all(items)  # without lease= as before

        async def main(sync: redcount.Limiter) -> None:
            alim = aio.Limiter.from_sync(sync)
            with pytest.raises(redcount.InvalidInputError, match="all or nothing"):
                await alim.hit_all(items, lease=5)

        asyncio.run(main(lim))
    assert redcount.Limiter(memory_store).stats("10/minute", "a")[0].count == 2
