"""The refusal cache (Limiter(refusal_cache=N)): refusals the store made, repeated in this
process until their retry_after, never an admission; on memory:// and a real Redis server,
sync and async."""

from __future__ import annotations

import asyncio
import threading

import pytest
import redcount
import redcount.aio as aio
from redcount.policies import RefusalCache


def store_refusals(lim: redcount.Limiter) -> int:
    cache = lim._core._refusal_cache  # (entries, refusals answered from it) of the core's cache
    assert cache is not None
    return cache[1]


@pytest.mark.parametrize("strategy", ["fixed-window", "sliding-window", "token-bucket", "gcra"])
def test_refused_key_is_answered_locally_until_retry_after(clock_store: redcount.Store, clock: redcount.ManualClock,
                                                           strategy: str) -> None:
    lim = redcount.Limiter(clock_store, strategy, refusal_cache=100)  # type: ignore[arg-type]
    assert lim.hit("2/minute", "u") and lim.hit("2/minute", "u")
    first = lim.hit("2/minute", "u")
    assert not first and first.retry_after > 0
    clock_store.close()  # from here on, only a local answer can succeed
    again = lim.hit("2/minute", "u")
    assert not again and again.retry_after == pytest.approx(first.retry_after, abs=0.002)
    assert not again.unavailable and again.limit == first.limit and again.remaining == 0
    assert not lim.test("2/minute", "u")
    assert store_refusals(lim) == 2
    clock.advance(first.retry_after / 2)
    half = lim.hit("2/minute", "u")
    assert not half and half.retry_after == pytest.approx(first.retry_after / 2, abs=0.002)
    with pytest.raises(redcount.StoreClosed):  # a smaller cost or another limit asks the store
        lim.hit("5/minute", "u")
    clock.advance(first.retry_after)
    with pytest.raises(redcount.StoreClosed):  # the refusal has run out: asks the store
        lim.hit("2/minute", "u")


def test_only_a_cost_at_least_as_large_is_refused_locally(clock_store: redcount.Store) -> None:
    lim = redcount.Limiter(clock_store, "token-bucket", refusal_cache=10)
    assert lim.hit("10/minute", "k", 8)
    no = lim.hit("10/minute", "k", 5)
    assert not no
    assert not lim.hit("10/minute", "k", 6)  # from the cache
    assert lim.hit("10/minute", "k", 2)  # a smaller cost goes to the store, which admits it
    assert store_refusals(lim) == 1


def test_never_admits_what_the_store_refuses(store: redcount.Store) -> None:
    cached = redcount.Limiter(store, "sliding-window", refusal_cache=64)
    admitted = {f"k{i}": 0 for i in range(4)}
    for i in range(40):
        key = f"k{i % 4}"
        d = cached.hit("3/hour", key)
        admitted[key] += bool(d)
        assert bool(d) == (admitted[key] <= 3 and d.remaining == 3 - admitted[key]) or not d
    for key, n in admitted.items():
        assert n == 3 and cached.stats("3/hour", key)[0].count == 3
    assert store_refusals(cached) == 4 * 7 - 4  # the first refusal of each key came from the store


def test_reset_and_a_limit_change_drop_the_entry(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, refusal_cache=10)
    assert lim.hit("1/hour", "k") and not lim.hit("1/hour", "k")
    lim.reset("1/hour", "k")
    assert lim.hit("1/hour", "k")  # the store's state and the cached refusal are gone
    assert not lim.hit("1/hour", "k")
    assert lim.hit("5/hour", "k")  # a new limit for the key asks the store (and drops the entry)
    assert lim._core._refusal_cache is not None and lim._core._refusal_cache[0] == 0


def test_bounded_oldest_first() -> None:
    now = [100.0]
    cache = RefusalCache(3, lambda: now[0])
    refused = redcount.Decision._local(False, 1, 0, 10.0, 10.0)
    for k in "abcd":
        cache.put("1/minute", k, 1, refused)
    assert len(cache) == 3 and cache.get("1/minute", "a", 1) is None
    assert cache.get("1/minute", "d", 1) is not None
    now[0] += 11
    cache.put("1/minute", "e", 1, refused)  # expired entries go first
    assert len(cache) == 1
    with pytest.raises(redcount.InvalidInputError, match="refusal_cache"):
        RefusalCache(-1, lambda: 0.0)
    allowed = redcount.Decision._local(True, 1, 1, 0.0, 0.0)
    cache.put("1/minute", "x", 1, allowed)
    cache.put("1/minute", "y", 1, redcount.Decision._without_store(False, 1.0))  # not the store's
    assert cache.get("1/minute", "x", 1) is None and cache.get("1/minute", "y", 1) is None


def test_threads_share_one_cache(memory_store: redcount.Store) -> None:
    lim = redcount.Limiter(memory_store, refusal_cache=8)
    admitted = []

    def worker(n: int) -> None:
        for i in range(200):
            if lim.hit("5/hour", f"k{i % 16}"):
                admitted.append(n)

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(admitted) == 16 * 5  # exactly the limit: the cache never admits
    assert lim._core._refusal_cache is not None and lim._core._refusal_cache[0] <= 8


def test_hit_all_and_async(store: redcount.Store) -> None:
    async def main() -> None:
        lim = aio.Limiter(store, refusal_cache=10)
        items = [("10/hour", "org"), ("1/hour", "user")]
        assert await lim.hit_all(items)
        no = await lim.hit_all(items)
        assert not no and no.refused_by == ("1/hour", "user")
        again = await lim.hit_all(items)  # from the cache
        assert not again and again.retry_after <= no.retry_after
        assert store_refusals(lim.sync) == 1
        assert not await lim.hit("1/hour", "user")
        assert store_refusals(lim.sync) == 2
        await lim.reset("1/hour", "user")
        assert await lim.hit("1/hour", "user")
        assert (await lim.stats("10/hour", "org"))[0].count == 1

    asyncio.run(main())


def test_refund_and_settle_drop_the_cached_refusal(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, refusal_cache=16)
    assert lim.hit("2/hour", "u") and lim.hit("2/hour", "u")
    assert not lim.hit("2/hour", "u") and not lim.hit("2/hour", "u")
    assert store_refusals(lim) == 1  # the second refusal came from the cache
    assert lim.refund("2/hour", "u", 1, request_id="r1")
    assert lim.hit("2/hour", "u")  # the unit given back admits at once, not after the hour
    # A reservation settled below its estimate gives units back: the cache forgets the key too.
    assert lim.reserve("5/hour", "v", 5, request_id="job-1")
    assert not lim.hit("5/hour", "v")
    assert lim.settle("5/hour", "v", request_id="job-1", actual=2)
    assert lim.hit("5/hour", "v")


@pytest.mark.asyncio
async def test_async_refund_drops_the_cached_refusal(store: redcount.Store) -> None:
    lim = aio.Limiter(store, refusal_cache=16)
    assert await lim.hit("1/hour", "u")
    assert not await lim.hit("1/hour", "u") and not await lim.hit("1/hour", "u")
    assert await lim.refund("1/hour", "u")
    assert await lim.hit("1/hour", "u")
