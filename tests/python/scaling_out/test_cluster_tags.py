"""A key's state under a hash tag on a real Redis Cluster: hit, stats, reset, refund,
reserve and settle with ``tag=`` act on the state hit_all(..., tag=) charged, in the tag's
slot (the request id's record with it), and never on the untagged state."""

from __future__ import annotations

import asyncio
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


def keys_of(store: redcount.Store, prefix: str) -> list[str]:
    return [k.decode() for n in store.nodes() for k in n.execute("KEYS", f"{prefix}:*")]


@pytest.mark.parametrize("strategy", RATE)
def test_tagged_state_in_one_slot(store: redcount.Store, strategy: Strategy) -> None:
    lim = redcount.Limiter(store, strategy, prefix="tg")
    items = [("100/day", "user:1"), ("1000/day", "org:9")]
    assert lim.hit_all(items, 10, tag="org:9")
    assert lim.hit("100/day", "user:1", 5, tag="org:9")
    assert lim.stats("100/day", "user:1", tag="org:9")[0].count == 15
    r = lim.refund("100/day", "user:1", 3, request_id="r1", tag="org:9")
    assert r.applied and r.units == 3
    res = lim.reserve("1000/day", "org:9", 100, request_id="c1", tag="org:9")
    assert res and res.tag == "org:9"
    assert lim.settle("1000/day", "org:9", request_id="c1", actual=1).status == "expired"  # untagged: none
    assert res.settle(40).units == 60
    assert lim.stats("100/day", "user:1", tag="org:9")[0].count == 12
    assert lim.stats("1000/day", "org:9", tag="org:9")[0].count == 50
    assert lim.stats("100/day", "user:1")[0].count == 0
    # The states, the refund's marker and the reservation's record share the tag's slot.
    found = keys_of(store, "tg")
    assert len(found) >= 4 and len({key_slot(k) for k in found}) == 1, found
    lim.reset("100/day", "user:1", tag="org:9")
    assert lim.stats("100/day", "user:1", tag="org:9")[0].count == 0
    assert lim.stats("1000/day", "org:9", tag="org:9")[0].count == 50


def test_async_tagged_state_on_a_cluster(store: redcount.Store) -> None:
    async def main() -> None:
        lim = aio.Limiter(store, "gcra", prefix="tga")
        assert await lim.hit_all([("10/day", "a"), ("10/day", "b")], 4, tag="t")
        r = await lim.reserve("10/day", "a", 4, request_id="x", tag="t")
        assert r and (await r.settle(1)).units == 3
        assert (await lim.refund("10/day", "b", 2, tag="t")).units == 2
        assert [s.count for s in await lim.stats("10/day", "a", tag="t")] == [5]
        assert [s.count for s in await lim.stats("10/day", "b", tag="t")] == [2]
        await lim.reset("10/day", "a", tag="t")
        assert [s.count for s in await lim.stats("10/day", "a", tag="t")] == [0]

    asyncio.run(main())
