"""Limiter.hit_all on a real Redis Cluster: keys in different slots are decided by
charge-then-release in one pipelined batch (never past any limit), keys under one tag by
one script call; and how often, under contention, a caller is refused by units that
another caller gives back a moment later."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
import redcount
import redcount.aio as aio
from redcount.limiter import Strategy
from topologies import Cluster, key_slot

RATE: list[Strategy] = ["fixed-window", "sliding-window", "sliding-window-approx", "token-bucket", "gcra"]


@pytest.fixture
def store(redis_cluster: Cluster) -> Iterator[redcount.Store]:
    s = redcount.connect(redis_cluster.url)
    yield s
    s.close()


def spread_keys(n: int) -> list[str]:
    """n business keys whose limiter keys land in n different slots."""
    out: list[str] = []
    slots: set[int] = set()
    i = 0
    while len(out) < n:
        k = f"k{i}"
        i += 1
        if key_slot(k) not in slots:
            slots.add(key_slot(k))
            out.append(k)
    return out


@pytest.mark.parametrize("strategy", RATE)
def test_cross_slot_is_all_or_nothing(store: redcount.Store, strategy: Strategy) -> None:
    lim = redcount.Limiter(store, strategy)
    a, b, c = spread_keys(3)
    items = [("1000/day", a), ("3/day", b), ("50/day", c)]
    for _ in range(3):
        assert lim.hit_all(items)
    no = lim.hit_all(items)
    assert not no and no.refused_by == ("3/day", b)
    # The other slots' charges were given back.
    assert lim.stats("1000/day", a)[0].count == 3
    assert lim.stats("50/day", c)[0].count == 3
    assert not lim.test_all(items)
    assert lim.test_all([("1000/day", a), ("50/day", c)])


@pytest.mark.parametrize("strategy", ["fixed-window", "gcra"])
def test_a_tag_decides_in_one_slot(store: redcount.Store, strategy: Strategy) -> None:
    lim = redcount.Limiter(store, strategy, prefix="tagged")
    a, b, c = spread_keys(3)
    items = [("1000/day", a), ("3/day", b), ("50/day", c)]
    for _ in range(3):
        assert lim.hit_all(items, tag="acme")
    assert not lim.hit_all(items, tag="acme")
    keys = [k for n in store.nodes() for k in n.execute("KEYS", "tagged:*")]
    assert len(keys) == 3 and len({key_slot(k.decode()) for k in keys}) == 1
    assert lim.stats("1000/day", a)[0].count == 0  # the untagged state is apart


def test_async_cross_slot(store: redcount.Store) -> None:
    a, b = spread_keys(2)

    async def main() -> list[bool]:
        lim = aio.Limiter(store)
        return [bool(await lim.hit_all([("5/day", a), ("2/day", b)])) for _ in range(4)]

    assert asyncio.run(main()) == [True, True, False, False]
    assert redcount.Limiter(store).stats("5/day", a)[0].count == 2


def test_contention_never_admits_past_a_limit_and_counts_spurious_refusals(store: redcount.Store) -> None:
    """8 threads hammer a shared org limit plus a per-thread user limit that soon refuses.
    A refused call charged the org limit in its own slot and gives it back a moment later;
    another thread that saw that charge may be refused by the org limit although the units
    come back. Measured here and printed (the docs quote it); asserted only that no limit
    is ever exceeded and that spurious refusals stay a minority."""
    lim = redcount.Limiter(store)
    org_limit = 160  # exactly the users' 8 x 20: the org limit refuses only units in flight
    users = spread_keys(9)
    org = users.pop()
    admitted = [0] * 8
    refused_by_org = [0] * 8
    barrier = threading.Barrier(8)

    def worker(i: int) -> None:
        barrier.wait()
        for _ in range(60):
            d = lim.hit_all([(f"{org_limit}/day", org), ("20/day", users[i])])
            if d:
                admitted[i] += 1
            elif d.refused_by is not None and d.refused_by[1] == org:
                refused_by_org[i] += 1

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    total = sum(admitted)
    org_count = lim.stats(f"{org_limit}/day", org)[0].count
    # Every admission was charged once to the org and once to its user; every refusal gave back.
    assert org_count == total
    assert all(lim.stats("20/day", u)[0].count == admitted[i] for i, u in enumerate(users[:8]))
    assert all(a <= 20 for a in admitted) and total <= org_limit
    # While a user is under 20, the org's real count is under 160: a refusal named after
    # the org saw units of refused calls that were given back a moment later. (Once every
    # user is at 20, both refuse and the user limit, the later one of equal waits, is named.)
    spurious = sum(refused_by_org)
    calls = 8 * 60
    print(f"\ncross-slot contention, 8 threads x 60 calls: {total} admitted, {calls - total} refused, "
          f"{spurious} of them ({100 * spurious / calls:.1f}% of calls) by units given back a moment later")
    assert spurious < calls // 4
