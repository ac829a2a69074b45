"""redcount.contrib.limits on a Redis Cluster (``redcount+redis+cluster://``): limits' storage API,
and real Flask-Limiter and slowapi apps, on the shared 3-master + 3-replica cluster the fixtures
start. Limits are enforced exactly for keys on every master; reset and check reach every master.

limits' own cluster tests run against this scheme too: tests/limits_suite.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redcount
import redcount.contrib.limits as rcl
from limits import RateLimitItem, RateLimitItemPerMinute
from limits.storage import RedisClusterStorage, storage_from_string
from limits.strategies import FixedWindowRateLimiter, MovingWindowRateLimiter, SlidingWindowCounterRateLimiter
from starlette.requests import Request  # module level: FastAPI resolves the endpoint's annotations here

from topologies import Cluster, key_slot

STRATEGIES = [FixedWindowRateLimiter, MovingWindowRateLimiter, SlidingWindowCounterRateLimiter]


@pytest.fixture
def uri(redis_cluster: Cluster) -> Iterator[str]:
    yield "redcount+" + redis_cluster.url


def storage_key(strategy: type, item: RateLimitItem, ident: str) -> str:
    """Where limits' strategies keep ``ident``'s count under the default prefix."""
    key = item.key_for(ident)
    return f"LIMITS:{{{key}}}" if strategy is SlidingWindowCounterRateLimiter else f"LIMITS:{key}"


def on_every_master(cluster: Cluster, key_of: Callable[[int], str], per_master: int = 2) -> list[int]:
    """Numbers ``i`` such that the keys ``key_of(i)`` fall on each master, ``per_master`` each."""
    owners = [(lo, hi, m.port) for m in cluster.masters() for lo, hi in cluster.slots_of(m)]
    found: dict[int, list[int]] = {m.port: [] for m in cluster.masters()}
    i = 0
    while any(len(v) < per_master for v in found.values()):
        slot = key_slot(key_of(i))
        port = next(p for lo, hi, p in owners if lo <= slot <= hi)
        if len(found[port]) < per_master:
            found[port].append(i)
        i += 1
    return [i for numbers in found.values() for i in numbers]


def idents_on_every_master(
    cluster: Cluster, strategy: type, item: RateLimitItem, per_master: int = 2
) -> list[str]:
    """Identifiers whose keys fall on each master, ``per_master`` of them for each."""
    numbers = on_every_master(cluster, lambda i: storage_key(strategy, item, f"client-{i}"), per_master)
    return [f"client-{i}" for i in numbers]


def limits_keys_per_master(cluster: Cluster) -> dict[int, int]:
    return {m.port: len(m.call("KEYS", "LIMITS:*")) for m in cluster.masters()}


def test_the_import_registers_the_cluster_schemes() -> None:
    from limits._storage_scheme import SCHEMES

    for scheme in ["redcount+redis+cluster", "redcount+rediss+cluster"]:
        assert SCHEMES[scheme] is rcl.RedcountStorage
        assert SCHEMES["async+" + scheme] is rcl.AsyncRedcountStorage


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda s: s.__name__)
def test_each_strategy_admits_exactly_the_limit_on_every_master(
    redis_cluster: Cluster, uri: str, strategy: type
) -> None:
    storage = storage_from_string(uri)
    assert isinstance(storage, rcl.RedcountStorage) and len(storage.storage.nodes()) == 3
    limiter = strategy(storage)
    item = RateLimitItemPerMinute(5)
    idents = idents_on_every_master(redis_cluster, strategy, item)
    for ident in idents:
        assert [limiter.hit(item, ident) for _ in range(7)] == [True] * 5 + [False] * 2, ident
        assert limiter.get_window_stats(item, ident).remaining == 0
    assert all(n > 0 for n in limits_keys_per_master(redis_cluster).values())
    limiter.clear(item, idents[0])
    assert limiter.hit(item, idents[0]) and not limiter.hit(item, idents[1])


def test_reset_clears_every_master_and_only_the_prefix(redis_cluster: Cluster, uri: str) -> None:
    storage = storage_from_string(uri)
    # One item per strategy: the fixed and moving windows of one item would share a key.
    limiters = [(s(storage), RateLimitItemPerMinute(3 + i)) for i, s in enumerate(STRATEGIES)]
    hit = 0
    for limiter, item in limiters:
        for ident in idents_on_every_master(redis_cluster, type(limiter), item):
            assert limiter.hit(item, ident)
            hit += 1
    foreign = {m.port: redis_cluster.key_on(m, "other") for m in redis_cluster.masters()}
    for port, key in foreign.items():
        redis_cluster.node_by_port(port).call("SET", key, "1")
    per_master = limits_keys_per_master(redis_cluster)
    assert all(n > 0 for n in per_master.values())
    # The sliding window counter's first hit creates one key (the current window).
    assert storage.reset() == sum(per_master.values()) == hit
    assert limits_keys_per_master(redis_cluster) == {port: 0 for port in per_master}
    for port, key in foreign.items():
        assert redis_cluster.node_by_port(port).call("GET", key) == "1"
    assert storage.check()
    assert all(limiter.hit(item, "client-0") for limiter, item in limiters)


def test_storage_methods_on_a_cluster(uri: str) -> None:
    s = storage_from_string(uri)
    assert s.incr("a", 30) == 1 and s.incr("a", 30, amount=4) == 5 and s.get("a") == 5
    assert s.acquire_entry("m", 3, 30, amount=2) and not s.acquire_entry("m", 3, 30, amount=2)
    assert s.get_moving_window("m", 3, 30)[1] == 2
    assert s.acquire_sliding_window_entry("w", 3, 30, amount=3)
    assert not s.acquire_sliding_window_entry("w", 3, 30)
    assert s.get_sliding_window("w", 30)[2] == 3
    s.clear_sliding_window("w", 30)
    assert s.get_sliding_window("w", 30) == (0, 0.0, 0, 0.0)
    s.clear("a")
    assert s.get("a") == 0
    assert s.reset() == 1  # only "m" is left


def test_shares_data_with_limits_own_cluster_storage(redis_cluster: Cluster, uri: str) -> None:
    """A fleet moving from redis+cluster:// to redcount+redis+cluster:// enforces one limit meanwhile."""
    ours = storage_from_string(uri)
    theirs = storage_from_string(f"redis+cluster://{redis_cluster.nodes[0].addr}/")
    assert isinstance(theirs, RedisClusterStorage)
    try:
        for i, strategy in enumerate(STRATEGIES):
            a, b = strategy(ours), strategy(theirs)
            item = RateLimitItemPerMinute(4 + i)  # the fixed and moving windows would share keys
            for ident in idents_on_every_master(redis_cluster, strategy, item, per_master=1):
                got = [x.hit(item, ident) for x in ((a, b) * 4)[: 6 + i]]
                assert got == [True] * (4 + i) + [False] * 2, (strategy.__name__, ident)
                assert a.get_window_stats(item, ident).remaining == 0
                assert b.get_window_stats(item, ident).remaining == 0
    finally:
        theirs.storage.close()


def test_scripts_flushed_from_every_master_are_reloaded(redis_cluster: Cluster, uri: str) -> None:
    s = storage_from_string(uri)
    item = RateLimitItemPerMinute(5)
    limiter = MovingWindowRateLimiter(s)
    idents = idents_on_every_master(redis_cluster, MovingWindowRateLimiter, item, per_master=1)
    assert all(limiter.hit(item, i) for i in idents)
    for m in redis_cluster.masters():
        m.call("SCRIPT", "FLUSH")
    assert all(limiter.hit(item, i) for i in idents)
    assert all(limiter.get_window_stats(item, i).remaining == 3 for i in idents)
    assert s.reset() == len(idents)


def test_async_storage_on_a_cluster(redis_cluster: Cluster, uri: str) -> None:
    from limits.aio.strategies import FixedWindowRateLimiter as AFixed
    from limits.aio.strategies import MovingWindowRateLimiter as AMoving
    from limits.aio.strategies import SlidingWindowCounterRateLimiter as ASliding

    pairs = [(AFixed, FixedWindowRateLimiter), (AMoving, MovingWindowRateLimiter),
             (ASliding, SlidingWindowCounterRateLimiter)]  # fmt: skip

    async def main() -> None:
        s = storage_from_string("async+" + uri)
        assert isinstance(s, rcl.AsyncRedcountStorage)
        assert await s.check()
        hits = 0
        for i, (astrategy, strategy) in enumerate(pairs):
            limiter = astrategy(s)
            item = RateLimitItemPerMinute(3 + i)
            for ident in idents_on_every_master(redis_cluster, strategy, item):
                results = await asyncio.gather(*(limiter.hit(item, ident) for _ in range(10)))
                assert sum(results) == 3 + i, (strategy.__name__, ident)
                hits += 1
        per_master = limits_keys_per_master(redis_cluster)
        assert all(n > 0 for n in per_master.values())
        assert await s.reset() == sum(per_master.values()) == hits
        assert limits_keys_per_master(redis_cluster) == {port: 0 for port in per_master}

    asyncio.run(main())


def test_check_asks_every_master(redis_cluster_factory: Callable[..., Cluster]) -> None:
    cluster = redis_cluster_factory(masters=3, replicas=0)
    s = storage_from_string("redcount+" + cluster.url, command_timeout=1.0, connect_timeout=0.5)
    assert s.check()
    cluster.kill(cluster.masters()[-1])
    assert not s.check()  # a PING to any one node would still be answered


@pytest.mark.parametrize("strategy", ["fixed-window", "moving-window"])
def test_flask_limiter_app_on_a_cluster(redis_cluster: Cluster, uri: str, strategy: str) -> None:
    flask = pytest.importorskip("flask")
    from flask_limiter import Limiter
    from flask_limiter.util import get_remote_address

    app = flask.Flask(__name__)
    limiter = Limiter(get_remote_address, app=app, storage_uri=uri, strategy=strategy, headers_enabled=True)

    @app.route("/")
    @limiter.limit("3/minute")
    def index() -> str:
        return "ok"

    client = app.test_client()
    # Flask-Limiter's key for a client: LIMITER/<address>/<endpoint>/<limit>
    addrs = [f"198.51.100.{i}" for i in on_every_master(
        redis_cluster, lambda i: f"LIMITS:LIMITER/198.51.100.{i}/index/3/1/minute", per_master=4)]
    for addr in addrs:
        codes = [client.get("/", environ_base={"REMOTE_ADDR": addr}).status_code for _ in range(5)]
        assert codes == [200, 200, 200, 429, 429], addr
    assert all(n > 0 for n in limits_keys_per_master(redis_cluster).values())
    assert isinstance(limiter.storage, rcl.RedcountStorage) and limiter.storage.check()
    limiter.reset()
    assert set(limits_keys_per_master(redis_cluster).values()) == {0}
    assert all(client.get("/", environ_base={"REMOTE_ADDR": a}).status_code == 200 for a in addrs)


@pytest.mark.parametrize("strategy", ["fixed-window", "moving-window", "sliding-window-counter"])
def test_slowapi_app_on_a_cluster(redis_cluster: Cluster, uri: str, strategy: str) -> None:
    fastapi = pytest.importorskip("fastapi")
    import httpx
    from slowapi import Limiter, _rate_limit_exceeded_handler
    from slowapi.errors import RateLimitExceeded
    from slowapi.util import get_remote_address

    limiter = Limiter(key_func=get_remote_address, storage_uri=uri, strategy=strategy)
    app = fastapi.FastAPI()
    app.state.limiter = limiter
    app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)  # type: ignore[arg-type]

    @app.get("/")
    @limiter.limit("2/minute")
    def index(request: Request) -> dict[str, str]:
        return {"ok": "yes"}

    # slowapi's key for a client: LIMITER/<address>/<module.function>/<limit>
    def key_of(i: int) -> str:
        key = f"LIMITER/203.0.113.{i}/{index.__module__}.index/2/1/minute"
        return f"LIMITS:{{{key}}}" if strategy == "sliding-window-counter" else f"LIMITS:{key}"

    addrs = [f"203.0.113.{i}" for i in on_every_master(redis_cluster, key_of, per_master=4)]

    async def codes(addr: str) -> list[int]:
        # httpx over ASGI, no server; starlette's TestClient wants a newer httpx.
        transport = httpx.ASGITransport(app=app, client=(addr, 5000))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return [(await client.get("/")).status_code for _ in range(4)]

    for addr in addrs:
        assert asyncio.run(codes(addr)) == [200, 200, 429, 429], addr
    assert all(n > 0 for n in limits_keys_per_master(redis_cluster).values())
    limiter.reset()
    assert set(limits_keys_per_master(redis_cluster).values()) == {0}


def test_tls_cluster_scheme(redis_tls_cluster: Cluster, topology_certs: Path) -> None:
    uri = "redcount+" + redis_tls_cluster.url
    assert uri.startswith("redcount+rediss+cluster://")
    s = storage_from_string(uri, ssl_ca_certs=str(topology_certs / "ca.pem"),
                            ssl_certfile=str(topology_certs / "client.pem"),
                            ssl_keyfile=str(topology_certs / "client.key"))  # fmt: skip
    assert isinstance(s.storage, redcount.Store) and s.check()
    limiter = MovingWindowRateLimiter(s)
    item = RateLimitItemPerMinute(2)
    idents = idents_on_every_master(redis_tls_cluster, MovingWindowRateLimiter, item, per_master=1)
    for ident in idents:
        assert [limiter.hit(item, ident) for _ in range(3)] == [True, True, False]
    assert s.reset() == len(idents)
