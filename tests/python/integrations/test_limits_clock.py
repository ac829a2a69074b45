"""The ``limits`` storages read the clock on every call, as limits' own storages do, so that
a clock patched after the storage was made (``mock.patch("time.time")``, time-machine,
freezegun, hiro: how apps test their limits) moves their windows; ``clock=`` still wins.

Moving windows are the strategy whose hit times come from the client's clock (fixed and
sliding window counters expire by the store's TTLs); ``get_expiry`` adds the TTL to it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from unittest import mock

import pytest
import redcount
import redcount.contrib.limits  # noqa: F401 - registers the schemes
import time_machine
from conftest import RedisServer
from limits import parse
from limits.storage import storage_from_string
from limits.aio import strategies as aio_strategies
from limits.strategies import MovingWindowRateLimiter


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis_only)])
def uri(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "memory":
        yield "redcount+memory://"
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    store = redcount.connect(server.url)
    store.execute("FLUSHALL")
    store.close()
    yield "redcount+" + server.url


LIMIT = parse("2/minute")


def exhaust(limiter: MovingWindowRateLimiter, key: str) -> None:
    assert limiter.hit(LIMIT, key) and limiter.hit(LIMIT, key)
    assert not limiter.hit(LIMIT, key)


def test_mock_patch_of_time_time_moves_the_window(uri: str) -> None:
    limiter = MovingWindowRateLimiter(storage_from_string(uri))
    exhaust(limiter, "k")
    later = time.time() + 61
    with mock.patch("time.time", return_value=later):
        assert limiter.hit(LIMIT, "k")  # a minute later: the window has moved on
        reset, remaining = limiter.get_window_stats(LIMIT, "k")
        assert remaining == 1 and reset == pytest.approx(later + 60, abs=1)
        assert limiter.storage.get_expiry("nothing") == pytest.approx(later, abs=1)


def test_time_machine_travel_moves_the_window(uri: str) -> None:
    limiter = MovingWindowRateLimiter(storage_from_string(uri))
    exhaust(limiter, "k")
    with time_machine.travel(time.time() + 61, tick=False) as traveller:
        assert limiter.hit(LIMIT, "k") and limiter.hit(LIMIT, "k")
        assert not limiter.hit(LIMIT, "k")
        traveller.shift(61)
        assert limiter.hit(LIMIT, "k")


def test_async_storage_reads_the_patched_clock(uri: str) -> None:
    async def main() -> None:
        limiter = aio_strategies.MovingWindowRateLimiter(storage_from_string("async+" + uri))
        assert await limiter.hit(LIMIT, "k") and await limiter.hit(LIMIT, "k")
        assert not await limiter.hit(LIMIT, "k")
        with mock.patch("time.time", return_value=time.time() + 61):
            assert await limiter.hit(LIMIT, "k")

    asyncio.run(main())


def test_the_clock_option_still_wins_over_time_time() -> None:
    clock = redcount.ManualClock(1_700_000_000.0)
    limiter = MovingWindowRateLimiter(storage_from_string("redcount+memory://", clock=clock))
    exhaust(limiter, "k")
    with mock.patch("time.time", return_value=time.time() + 3600):
        assert not limiter.hit(LIMIT, "k")  # the ManualClock has not moved
        clock.advance(61)
        assert limiter.hit(LIMIT, "k")

