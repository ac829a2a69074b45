"""Penalties and unblock on a real Redis Cluster (the shared ``redis_cluster`` fixture):
a key's limit and penalty state shares its hash tag, so one slot holds all of it, and
``unblock`` finds it on whichever master owns that slot; sync and :mod:`redcount.aio`."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redcount
import redcount.aio as aio
from topologies import Cluster

PENALTY = redcount.Penalty(after=2, within=60, block=60)


@pytest.fixture
def store(redis_cluster: Cluster) -> Iterator[redcount.Store]:
    s = redcount.connect(redis_cluster.url)
    yield s
    s.close()


def state_keys(store: redcount.Store, key: str) -> list[str]:
    return sorted(k for n in store.nodes() for k in n.execute("KEYS", f"*{{{key}}}*"))


def test_a_blocked_key_is_unblocked_on_whichever_master_holds_it(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, penalty=PENALTY)
    keys = [f"client-{i}" for i in range(6)]  # spread over the masters' slots
    for key in keys:
        assert lim.hit("1/hour", key)
        for _ in range(3):
            assert not lim.hit("1/hour", key)
        blocked = lim.hit("1/hour", key)
        assert not blocked and blocked.retry_after > 30  # the block, not the hour's window
        assert state_keys(store, key)
    for key in keys:
        assert lim.unblock(key) >= 2
        assert state_keys(store, key) == []
        assert lim.hit("1/hour", key)


@pytest.mark.asyncio
async def test_async_unblock_on_a_cluster(store: redcount.Store) -> None:
    lim = aio.Limiter(store, penalty=PENALTY)
    for key in ("a", "b", "c"):
        await lim.hit("1/hour", key)
        for _ in range(3):
            await lim.hit("1/hour", key)
        assert not await lim.hit("1/hour", key)
        assert await lim.unblock(key) >= 2
        assert state_keys(store, key) == []
        assert await lim.hit("1/hour", key)


def test_unblock_finds_tagged_states_in_other_slots(store: redcount.Store) -> None:
    lim = redcount.Limiter(store)
    # The key's untagged state in its own slot, and states under two tags elsewhere.
    assert lim.hit("5/hour", "user:9")
    assert lim.hit_all([("5/hour", "user:9"), ("9/day", "org:1")], tag="org:1")
    assert lim.hit_all([("5/hour", "user:9")], tag="shard-7")
    assert len(state_keys(store, "user:9")) == 3
    assert lim.unblock("user:9") == 3
    assert state_keys(store, "user:9") == []
    assert lim.stats("9/day", "org:1")[0].count == 0  # untagged org:1 was never charged
