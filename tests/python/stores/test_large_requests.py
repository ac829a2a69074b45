"""Requests that take more than one write to send, over plain TCP and over TLS, sync and
through redcount.aio: a SET of 16 KB, 1 MB and 16 MB and a ShardedCounter.incr_many of a few
hundred items each complete with exact results well within the command timeout.

A TLS record holds at most 16 KB and a loopback socket buffer a few MB, so these requests
are written in pieces: the synchronous fast path (a lone caller writing an idle connection
itself) must wait for the socket to take the rest before it waits for the reply.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redcount
import redcount.aio
from conftest import REDIS_SERVER, RedisServer, new_server
from redcount.sharded import Increment
from redcount.tools.servers import ServerError, Tls, make_certs

pytestmark = pytest.mark.redis_only

SIZES = [16 * 1024, 1024 * 1024, 16 * 1024 * 1024]
# Short, so a request that hangs fails fast; ample for 16 MB over TLS on a loaded machine.
TIMEOUT = 5.0


Servers = dict[str, tuple[RedisServer, dict[str, Any]]]


@contextlib.contextmanager
def plain_and_tls(certs: Tls, tls_args: Sequence[str] = ()) -> Iterator[Servers]:
    """One plain and one TLS-only redis-server, with the connect() options for each. Each is
    stopped on the way out, also when a later one fails to start (a redis-server built
    without TLS exits at once): the ExitStack holds every server from before its start."""
    with contextlib.ExitStack() as started:
        plain = new_server()
        started.callback(plain.cleanup)
        plain.start()
        tls = RedisServer(REDIS_SERVER, tls=certs, extra_args=tls_args)
        started.callback(tls.cleanup)
        tls.start()
        yield {"plain": (plain, {}), "tls": (tls, {"ssl_ca_certs": certs.ca})}


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    return make_certs(Path(tmp_path_factory.mktemp("large-requests-certs")))


@pytest.fixture(scope="module")
def servers(certs: Tls) -> Iterator[Servers]:
    with plain_and_tls(certs) as both:
        yield both


def test_a_server_that_fails_to_start_leaves_none_running(certs: Tls, monkeypatch: pytest.MonkeyPatch) -> None:
    """The TLS server fails (a directive this redis-server refuses, as one built without TLS
    refuses the tls-* ones): the plain server started before it is stopped, none is left."""
    seen: list[RedisServer] = []
    start = RedisServer.start

    def recording_start(self: RedisServer) -> RedisServer:
        seen.append(self)
        return start(self)

    monkeypatch.setattr(RedisServer, "start", recording_start)
    with pytest.raises(ServerError, match="would not start"):
        with plain_and_tls(certs, tls_args=["--no-such-directive", "yes"]):
            pytest.fail("the TLS server started")
    plain, tls = seen
    assert plain.tls is None and plain.proc is not None and plain.proc.returncode is not None
    assert not plain.running and not tls.running
    assert not plain.dir.exists() and not tls.dir.exists()


@pytest.fixture(params=["plain", "tls"])
def target(request: pytest.FixtureRequest,
           servers: dict[str, tuple[RedisServer, dict[str, Any]]]) -> tuple[str, dict[str, Any]]:
    server, options = servers[request.param]
    return server.url, {"command_timeout": TIMEOUT, "connect_timeout": TIMEOUT, **options}


def value_of(size: int) -> bytes:
    return (b"0123456789abcdef" * (size // 16 + 1))[:size]


@pytest.mark.parametrize("size", SIZES, ids=["16KB", "1MB", "16MB"])
def test_a_large_set_sync(target: tuple[str, dict[str, Any]], size: int) -> None:
    url, options = target
    store = redcount.connect(url, **options)
    try:
        value = value_of(size)
        for i in range(2):  # the second on the connection the first one left idle
            assert store.execute("SET", f"big{i}", value) == "OK"
            assert store.execute("STRLEN", f"big{i}") == size
        assert store.execute("GET", "big1") == value
        assert store.execute("DEL", "big0", "big1") == 2
    finally:
        store.close()


@pytest.mark.parametrize("size", SIZES, ids=["16KB", "1MB", "16MB"])
def test_a_large_set_async(target: tuple[str, dict[str, Any]], size: int) -> None:
    url, options = target
    astore = redcount.aio.connect(url, **options)

    async def run() -> None:
        value = value_of(size)
        assert await asyncio.wait_for(astore.execute("SET", "abig", value), TIMEOUT * 2) == "OK"
        assert await asyncio.wait_for(astore.execute("GET", "abig"), TIMEOUT * 2) == value
        assert await astore.execute("DEL", "abig") == 1

    try:
        asyncio.run(run())
    finally:
        astore.close()


@pytest.mark.parametrize("size", [1024 * 1024], ids=["1MB"])
def test_large_sets_from_several_threads(target: tuple[str, dict[str, Any]], size: int) -> None:
    """Threads that find the connection idle write on it themselves, others queue behind."""
    url, options = target
    store = redcount.connect(url, **options)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            value = value_of(size + t)
            for i in range(3):
                assert store.execute("SET", f"thr{t}:{i}", value) == "OK"
                assert store.execute("STRLEN", f"thr{t}:{i}") == size + t
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    try:
        for th in threads:
            th.start()
        for th in threads:
            th.join(TIMEOUT * 6)
        assert not errors, errors
        assert all(not th.is_alive() for th in threads)
        for t in range(4):
            assert store.execute("STRLEN", f"thr{t}:2") == size + t
    finally:
        store.close()


def items(prefix: str, n: int) -> list[Increment]:
    return [(f"{prefix}{i % 7}", 1 + i % 5, f"{prefix}-req-{i:06d}-" + "r" * 40) for i in range(n)]


def expected(batch: list[Increment]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for name, amount, *_ in batch:
        totals[name] = totals.get(name, 0) + amount
    return totals


@pytest.mark.parametrize("n", [300, 2000])
def test_sharded_incr_many_sync(target: tuple[str, dict[str, Any]], n: int) -> None:
    url, options = target
    store = redcount.connect(url, **options)
    try:
        counter = redcount.ShardedCounter(store, "many", prefix=f"lr{n}s")
        batch = items("s", n)
        assert counter.incr_many(batch) == [True] * n
        assert counter.incr_many(batch) == [False] * n  # the ids were recorded: not twice
        totals = expected(batch)
        assert counter.values(sorted(totals)) == totals
    finally:
        store.close()


@pytest.mark.parametrize("n", [300, 2000])
def test_sharded_incr_many_async(target: tuple[str, dict[str, Any]], n: int) -> None:
    url, options = target
    astore = redcount.aio.connect(url, **options)

    async def run() -> None:
        counter = redcount.aio.ShardedCounter(astore, "many", prefix=f"lr{n}a")
        batch = items("a", n)
        assert await asyncio.wait_for(counter.incr_many(batch), TIMEOUT * 2) == [True] * n
        assert await asyncio.wait_for(counter.incr_many(batch), TIMEOUT * 2) == [False] * n
        totals = expected(batch)
        assert await counter.values(sorted(totals)) == totals

    try:
        asyncio.run(run())
    finally:
        astore.close()
