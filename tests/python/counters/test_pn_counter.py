"""Multi-region PN-counters: three regions, each on its own store
(three real redis-servers, or three memory stores), updated concurrently and merged in
random order, converge to the exact total."""

from __future__ import annotations

import asyncio
import random
import threading
from collections.abc import Callable, Iterator

import pytest

import redcount
import redcount.aio
from conftest import RedisServer

REGIONS = ("eu", "us", "ap")


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis_only)])
def region_stores(
    request: pytest.FixtureRequest,
) -> Iterator[dict[str, redcount.Store]]:
    """One store per region: separate redis-servers, or separate memory stores."""
    if request.param == "memory":
        stores = {r: redcount.connect() for r in REGIONS}
    else:
        factory: Callable[..., RedisServer] = request.getfixturevalue("redis_factory")
        stores = {r: redcount.connect(factory().url) for r in REGIONS}
    try:
        yield stores
    finally:
        for s in stores.values():
            s.close()


def counters(stores: dict[str, redcount.Store], name: str = "stock") -> dict[str, redcount.PNCounter]:
    return {r: redcount.PNCounter(s, name, r) for r, s in stores.items()}


def test_concurrent_updates_and_random_merges_converge_to_the_exact_total(
    region_stores: dict[str, redcount.Store],
) -> None:
    pn = counters(region_stores)
    writers_per_region, ops_per_writer = 3, 300
    totals: list[int] = []
    totals_lock = threading.Lock()
    writing = threading.Event()
    writing.set()
    errors: list[BaseException] = []

    def writer(region: str, seed: int) -> None:
        rng = random.Random(seed)
        mine = 0
        try:
            # Each thread has its own PNCounter object on the region's store, as separate
            # processes in one region would.
            c = redcount.PNCounter(region_stores[region], "stock", region)
            for _ in range(ops_per_writer):
                amount = rng.randint(1, 1000)
                if rng.random() < 0.45:
                    c.decr(amount)
                    mine -= amount
                else:
                    c.incr(amount)
                    mine += amount
        except BaseException as e:  # reported below: a thread must not fail silently
            errors.append(e)
        with totals_lock:
            totals.append(mine)

    def merger(region: str, seed: int) -> None:
        rng = random.Random(seed)
        others = [r for r in REGIONS if r != region]
        seen: dict[str, tuple[int, int]] = {}
        try:
            while writing.is_set():
                pn[region].merge(region_stores[rng.choice(others)])
                # Every field only grows, whatever merges and writes interleave.
                now = pn[region].components()
                for r, (p, n) in seen.items():
                    assert now[r][0] >= p and now[r][1] >= n, (region, r, seen[r], now[r])
                seen = now
        except BaseException as e:
            errors.append(e)

    writers = [
        threading.Thread(target=writer, args=(r, 100 * i + j))
        for i, r in enumerate(REGIONS)
        for j in range(writers_per_region)
    ]
    mergers = [threading.Thread(target=merger, args=(r, 7 + i)) for i, r in enumerate(REGIONS)]
    for t in writers + mergers:
        t.start()
    for t in writers:
        t.join()
    writing.clear()
    for t in mergers:
        t.join()
    assert not errors, errors
    expected = sum(totals)
    assert len(totals) == len(REGIONS) * writers_per_region

    # Writes have stopped; merges in random order, each region from each other several
    # times. One merge of every ordered pair after the last write already suffices.
    rng = random.Random(42)
    pairs = [(a, b) for a in REGIONS for b in REGIONS if a != b] * 3
    rng.shuffle(pairs)
    for into, source in pairs:
        pn[into].merge(region_stores[source])

    assert {r: pn[r].value() for r in REGIONS} == {r: expected for r in REGIONS}
    components = pn["eu"].components()
    assert set(components) == set(REGIONS)
    assert all(pn[r].components() == components for r in REGIONS)
    # Memory is O(regions): one field per region in each hash, whatever the number of writes.
    for r in REGIONS:
        p_key, n_key = pn[r].storage_keys()
        assert region_stores[r].execute("HLEN", p_key) == len(REGIONS)
        assert region_stores[r].execute("HLEN", n_key) == len(REGIONS)


def test_merge_is_idempotent_commutative_and_associative(region_stores: dict[str, redcount.Store]) -> None:
    pn = counters(region_stores)
    pn["eu"].incr(10)
    pn["eu"].decr(4)
    pn["us"].incr(7)
    pn["ap"].decr(30)
    before = pn["eu"].components()
    assert pn["eu"].merge(region_stores["us"]) == 1  # us's P; its N is 0, nothing to raise
    assert pn["eu"].merge(region_stores["us"]) == 0
    assert pn["eu"].merge(pn["us"]) == 0  # from a counter object: the same state
    assert pn["eu"].components() == {**before, "us": (7, 0)}
    # (eu <- us) <- ap and ap <- (us <- eu) end in the same state.
    pn["eu"].merge(region_stores["ap"])
    pn["us"].merge(region_stores["eu"])
    pn["ap"].merge(region_stores["us"])
    assert pn["eu"].components() == pn["ap"].components() == {"eu": (10, 4), "us": (7, 0), "ap": (0, 30)}
    assert pn["eu"].value() == pn["ap"].value() == 10 - 4 + 7 - 30
    # A stale copy of a region never lowers it.
    assert pn["eu"].merge_components({"eu": (1, 1), "us": (0, 0)}) == 0
    assert pn["eu"].value() == -17


def test_bad_input_is_refused_and_writes_nothing(region_stores: dict[str, redcount.Store]) -> None:
    store = region_stores["eu"]
    c = redcount.PNCounter(store, "stock", "eu")
    c.incr(5)
    for bad in (0, -1, 2**53, 2**64):
        with pytest.raises(redcount.InvalidInputError):
            c.incr(bad)
        with pytest.raises(redcount.InvalidInputError):
            c.decr(bad)
    for wrong_type in (1.5, "3", True, None):
        with pytest.raises(TypeError):
            c.incr(wrong_type)  # type: ignore[arg-type]
    for region in ("", "a{b", "x}"):
        with pytest.raises(redcount.InvalidInputError):
            redcount.PNCounter(store, "stock", region)
    with pytest.raises(redcount.InvalidInputError):
        c.merge_components({"us": (3, 0), "ap": (-1, 0)})
    with pytest.raises(redcount.InvalidInputError):
        c.merge_components({"us": (3, 0), "a{p}": (1, 0)})
    with pytest.raises(redcount.InvalidInputError):
        c.merge(redcount.PNCounter(region_stores["us"], "other", "us"))
    assert c.components() == {"eu": (5, 0)}
    assert c.value() == 5


def test_a_foreign_value_in_a_hash_stops_the_merge_before_any_write(store: redcount.Store) -> None:
    c = redcount.PNCounter(store, "stock", "eu")
    c.incr(3)
    _, n_key = c.storage_keys()
    store.execute("HSET", n_key, "zz", "not-a-number")
    with pytest.raises(redcount.ReplyError):
        c.merge_components({"eu": (9, 0), "zz": (0, 1)})
    with pytest.raises(redcount.ProtocolError):
        c.value()
    p_key, _ = c.storage_keys()
    assert store.execute("HGET", p_key, "eu") == b"3"


def test_keys_and_totals_past_two_to_the_53(store: redcount.Store) -> None:
    c = redcount.PNCounter(store, "stock", "eu", prefix="app")
    assert c.storage_keys() == ("app:pn:{stock}:p", "app:pn:{stock}:n")
    big = 2**62 + 1
    assert c.merge_components({"far": (big, 0)}) == 1
    assert c.merge_components({"far": (big - 1, 0)}) == 0
    assert c.value() == big
    assert repr(c).startswith("PNCounter(name='stock', region='eu'")


def test_async_twin(region_stores: dict[str, redcount.Store]) -> None:
    async def main() -> None:
        eu = redcount.aio.PNCounter(region_stores["eu"], "stock", "eu")
        us = redcount.aio.PNCounter(redcount.aio.AsyncStore(region_stores["us"]), "stock", "us")
        assert await eu.incr(5) == 5
        assert await eu.decr(2) == 2
        assert await us.incr(10) == 10
        assert await eu.merge(region_stores["us"]) == 1
        assert await us.merge(eu) == 2
        assert await eu.value() == await us.value() == 13
        assert await eu.components() == await us.components() == {"eu": (5, 2), "us": (10, 0)}
        with pytest.raises(redcount.InvalidInputError):
            await eu.incr(0)

    asyncio.run(main())


@pytest.mark.redis_only
def test_a_memory_region_and_a_redis_region_merge_alike(
    memory_store: redcount.Store, redis_store: redcount.Store
) -> None:
    mem = redcount.PNCounter(memory_store, "stock", "mem")
    red = redcount.PNCounter(redis_store, "stock", "red")
    big = 2**53 - 1  # the largest single amount; two of them pass 2**53
    mem.incr(big)
    mem.incr(big)
    mem.decr(3)
    red.incr(11)
    red.decr(big)
    assert mem.merge(redis_store) == 2
    assert red.merge(memory_store) == 2
    assert mem.components() == red.components() == {"mem": (2 * big, 3), "red": (11, big)}
    assert mem.value() == red.value() == 2 * big - 3 + 11 - big
