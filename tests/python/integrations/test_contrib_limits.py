"""redcount.contrib.limits: limits' storage API on redcount stores, against real redis-servers
and the memory store, and real Flask-Limiter and slowapi apps switched to the new schemes.

limits' own storage and strategy tests also run against these schemes: tests/limits_suite.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
import redcount
import redcount.contrib.limits as rcl
from limits import RateLimitItemPerMinute, RateLimitItemPerSecond
from limits.errors import StorageError
from limits.storage import RedisStorage, storage_from_string
from starlette.requests import Request  # module level: FastAPI resolves the endpoint's annotations here
from limits.strategies import FixedWindowRateLimiter, MovingWindowRateLimiter, SlidingWindowCounterRateLimiter

from conftest import RedisServer

STRATEGIES = [FixedWindowRateLimiter, MovingWindowRateLimiter, SlidingWindowCounterRateLimiter]


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis_only)])
def uri(request: pytest.FixtureRequest) -> Iterator[str]:
    if request.param == "memory":
        yield "redcount+memory://"
        return
    server: RedisServer = request.getfixturevalue("redis_server")
    server.command("FLUSHALL")
    yield f"redcount+redis://127.0.0.1:{server.port}/0"


def test_the_import_registers_every_scheme() -> None:
    from limits._storage_scheme import SCHEMES

    for scheme in ["redcount+redis", "redcount+rediss", "redcount+unix", "redcount+memory"]:
        assert SCHEMES[scheme] is rcl.RedcountStorage
        assert SCHEMES["async+" + scheme] is rcl.AsyncRedcountStorage


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.__name__)
def test_each_strategy_admits_exactly_the_limit(uri: str, strategy: type) -> None:
    storage = storage_from_string(uri)
    limiter = strategy(storage)
    item = RateLimitItemPerMinute(5)
    assert [limiter.hit(item, "k") for _ in range(7)] == [True] * 5 + [False] * 2
    assert limiter.get_window_stats(item, "k").remaining == 0
    assert limiter.hit(item, "other")
    limiter.clear(item, "k")
    assert limiter.hit(item, "k")


def test_storage_methods(uri: str) -> None:
    s = storage_from_string(uri)
    assert isinstance(s, rcl.RedcountStorage) and isinstance(s.storage, redcount.Store)
    assert s.incr("a", 30) == 1 and s.incr("a", 30, amount=4) == 5 and s.get("a") == 5
    assert s.get_expiry("a") == pytest.approx(time.time() + 30, abs=1.5)
    assert s.get("missing") == 0 and s.get_expiry("missing") == pytest.approx(time.time(), abs=1)
    assert s.acquire_entry("m", 3, 30, amount=2) and not s.acquire_entry("m", 3, 30, amount=2)
    start, count = s.get_moving_window("m", 3, 30)
    assert count == 2 and start == pytest.approx(time.time(), abs=1)
    assert s.acquire_sliding_window_entry("w", 3, 30, amount=3) and not s.acquire_sliding_window_entry("w", 3, 30)
    prev, prev_ttl, cur, cur_ttl = s.get_sliding_window("w", 30)
    assert (prev, prev_ttl, cur) == (0, 0.0, 3) and cur_ttl == pytest.approx(60, abs=1)
    s.clear_sliding_window("w", 30)
    assert s.get_sliding_window("w", 30) == (0, 0.0, 0, 0.0)
    s.clear("a")
    assert s.get("a") == 0
    assert s.check()
    assert s.reset() == 1  # only "m" is left


def test_key_prefix_and_reset_count_only_own_keys(uri: str) -> None:
    mine = storage_from_string(uri, key_prefix="a*[b]")
    assert mine.incr("x", 60) == 1 and mine.incr("y", 60) == 1
    mine.storage.execute("SET", "a-other:x", "1")  # would match an unescaped glob a*[b]:*
    assert mine.reset() == 2
    assert mine.storage.execute("GET", "a-other:x") == b"1"


def test_wrap_exceptions(uri: str) -> None:
    s = storage_from_string(uri, wrap_exceptions=True)
    s.storage.execute("SET", "LIMITS:text", "not a number")
    with pytest.raises(StorageError) as e:
        s.incr("text", 10)
    assert isinstance(e.value.storage_error, redcount.ReplyError)
    plain = storage_from_string(uri)  # a store of its own on memory://
    plain.storage.execute("SET", "LIMITS:text", "not a number")
    with pytest.raises(redcount.ReplyError):
        plain.incr("text", 10)


def test_a_counter_that_lost_its_ttl_gets_it_back(uri: str) -> None:
    s = storage_from_string(uri)
    s.incr("k", 30)
    s.storage.execute("PERSIST", "LIMITS:k")
    s.incr("k", 30)
    assert 0 < s.storage.execute("TTL", "LIMITS:k") <= 30  # type: ignore[operator]


def test_async_storage(uri: str) -> None:
    async def main() -> None:
        from limits.aio.strategies import MovingWindowRateLimiter as AMoving
        from limits.aio.strategies import SlidingWindowCounterRateLimiter as ASliding

        s = storage_from_string("async+" + uri)
        assert isinstance(s, rcl.AsyncRedcountStorage)
        assert await s.check()
        item = RateLimitItemPerMinute(3)
        for strategy in (AMoving, ASliding):
            limiter = strategy(s)
            results = await asyncio.gather(*(limiter.hit(item, strategy.__name__) for _ in range(10)))
            assert sum(results) == 3
        assert await s.incr("n", 10) == 1 and await s.get("n") == 1
        assert await s.reset() == 3

    asyncio.run(main())


@pytest.mark.redis_only
def test_shares_data_with_limits_own_redis_storage(redis_server: RedisServer) -> None:
    """A fleet moving from redis:// to redcount+redis:// enforces one limit meanwhile."""
    redis_server.command("FLUSHALL")
    ours = storage_from_string(f"redcount+redis://127.0.0.1:{redis_server.port}/0")
    theirs = storage_from_string(f"redis://127.0.0.1:{redis_server.port}/0")
    assert isinstance(theirs, RedisStorage)
    item = RateLimitItemPerMinute(4)
    for strategy in STRATEGIES:
        a, b = strategy(ours), strategy(theirs)
        got = [x.hit(item, strategy.__name__) for x in (a, b, a, b, a, b)]
        assert got == [True] * 4 + [False] * 2, strategy.__name__
        assert a.get_window_stats(item, strategy.__name__).remaining == 0
        assert b.get_window_stats(item, strategy.__name__).remaining == 0


@pytest.mark.redis_only
def test_scripts_flushed_from_the_server_are_reloaded(redis_server: RedisServer) -> None:
    s = storage_from_string(f"redcount+redis://127.0.0.1:{redis_server.port}/0")
    assert s.acquire_entry("k", 5, 60)
    redis_server.command("SCRIPT", "FLUSH")
    assert s.acquire_entry("k", 5, 60)
    assert s.get_moving_window("k", 5, 60)[1] == 2


def test_moving_window_with_a_huge_cost_on_memory() -> None:
    clock = redcount.ManualClock(1_700_000_000.0)
    s = storage_from_string("redcount+memory://", clock=clock)
    assert s.acquire_entry("k", 1_000_000, 2, amount=999_999)
    assert s.get_moving_window("k", 1_000_000, 2) == (1_700_000_000.0, 999_999)
    clock.advance(1)
    assert s.acquire_entry("k", 1_000_000, 2) and not s.acquire_entry("k", 1_000_000, 2)
    clock.advance(1.001)
    assert s.get_moving_window("k", 1_000_000, 2) == (1_700_000_001.0, 1)


def test_bad_options_are_refused_at_start() -> None:
    with pytest.raises(redcount.InvalidInputError, match="unknown option 'decode_responses'"):
        storage_from_string("redcount+memory://", decode_responses=True)
    with pytest.raises(TypeError, match="key_prefix"):
        storage_from_string("redcount+memory://", key_prefix=5)


def test_flask_limiter_app(uri: str) -> None:
    flask = pytest.importorskip("flask")
    from flask_limiter import Limiter
    from flask_limiter.util import get_remote_address

    app = flask.Flask(__name__)
    limiter = Limiter(get_remote_address, app=app, storage_uri=uri, strategy="moving-window", headers_enabled=True)

    @app.route("/")
    @limiter.limit("3/minute")
    def index() -> str:
        return "ok"

    client = app.test_client()
    codes = [client.get("/").status_code for _ in range(5)]
    assert codes == [200, 200, 200, 429, 429]
    assert client.get("/").headers["X-RateLimit-Remaining"] == "0"
    assert isinstance(limiter.storage, rcl.RedcountStorage) and limiter.storage.check()


def test_slowapi_app(uri: str) -> None:
    fastapi = pytest.importorskip("fastapi")
    import httpx
    from slowapi import Limiter, _rate_limit_exceeded_handler
    from slowapi.errors import RateLimitExceeded
    from slowapi.util import get_remote_address

    limiter = Limiter(key_func=get_remote_address, storage_uri=uri, strategy="sliding-window-counter")
    app = fastapi.FastAPI()
    app.state.limiter = limiter
    app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]

    @app.get("/")
    @limiter.limit("2/minute")
    def index(request: Request) -> dict[str, str]:
        return {"ok": "yes"}

    async def main() -> list[int]:
        # httpx over ASGI, no server; starlette's TestClient wants a newer httpx.
        transport = httpx.ASGITransport(app=app, client=("203.0.113.9", 5000))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return [(await client.get("/")).status_code for _ in range(4)]

    assert asyncio.run(main()) == [200, 200, 429, 429]
