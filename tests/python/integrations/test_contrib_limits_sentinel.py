"""redcount.contrib.limits on Redis Sentinel (``redcount+redis+sentinel://``), with the options
limits' own Sentinel storage takes, on a private Sentinel trio over a master and a replica.

limits' own Sentinel tests run against this scheme too: tests/limits_suite.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
import redcount
import redcount.contrib.limits as rcl
from limits import RateLimitItemPerMinute
from limits.aio.strategies import MovingWindowRateLimiter as AsyncMovingWindowRateLimiter
from limits.storage import storage_from_string
from limits.strategies import MovingWindowRateLimiter

from topologies import SentinelGroup


@pytest.fixture(scope="module")
def group(redis_sentinel_factory: Callable[..., SentinelGroup]) -> SentinelGroup:
    return redis_sentinel_factory(replicas=1)


def test_use_replicas_false_is_accepted(group: SentinelGroup) -> None:
    """limits' tests and apps pass ``use_replicas=False`` (every call to the master), which
    is what the storage does anyway."""
    storage = storage_from_string("redcount+" + group.url, use_replicas=False, key_prefix="repl-false")
    assert isinstance(storage, rcl.RedcountStorage)
    limiter = MovingWindowRateLimiter(storage)
    item = RateLimitItemPerMinute(2)
    assert [limiter.hit(item, "k") for _ in range(3)] == [True, True, False]
    assert storage.check()
    storage.storage.close()


def test_use_replicas_false_is_accepted_async(group: SentinelGroup) -> None:
    async def run() -> list[bool]:
        storage = storage_from_string("async+redcount+" + group.url, use_replicas=False, key_prefix="repl-async")
        assert isinstance(storage, rcl.AsyncRedcountStorage)
        limiter = AsyncMovingWindowRateLimiter(storage)
        item = RateLimitItemPerMinute(1)
        return [await limiter.hit(item, "k") for _ in range(2)]

    assert asyncio.run(run()) == [True, False]


def test_use_replicas_true_is_refused_with_the_reason(group: SentinelGroup) -> None:
    with pytest.raises(redcount.InvalidInputError, match=r"use_replicas=True .*replica.* stale"):
        storage_from_string("redcount+" + group.url, use_replicas=True)
    with pytest.raises(redcount.InvalidInputError, match="use_replicas must be True or False, got 'no'"):
        storage_from_string("redcount+" + group.url, use_replicas="no")


def test_use_replicas_is_a_sentinel_option() -> None:
    with pytest.raises(redcount.InvalidInputError, match=r"use_replicas .*redcount\+redis\+sentinel://"):
        storage_from_string("redcount+memory://", use_replicas=False)
