"""Shared fixtures: real redis-server processes on free loopback ports, and stores.

Nothing here mocks Redis. ``redis_server`` is one server for the whole session (tests
isolate themselves with FLUSHALL); ``redis_factory`` starts extra servers for tests that
stop, restart or configure them (auth, retry queue). Every server is killed at the end.
If ``redis-server`` is not installed the session fails loudly: CI installs it. The servers
are :class:`redcount.tools.servers.RedisServer`, the helper the bench tools use too.

``REDCOUNT_TEST_REDIS_SERVER`` names another server binary (a path or a name on PATH) for
every server the fixtures start: standalone, Redis Cluster nodes and Sentinels (started as
``<binary> <config> --sentinel``), e.g. the ``valkey-server`` that tests/run_all.sh runs
the Redis-backed suites on once more. Tests whose answer depends on the server name it
(``server_product``). Tests that start a TLS server carry the ``tls`` marker (those using
``topology_certs`` get it here), so that a run on a server built without TLS deselects them
with ``-m "not tls"``.

The tests are grouped by subsystem, one folder each (no ``__init__.py``: a test module's
basename is unique across folders): ``stores/``, ``counters/``, ``limiters/``,
``sharded/``, ``sql/``, ``analysis/``, ``telemetry/``, ``invariants/`` (guarantees over
both stores: parity, TTLs, foreign writes, chaos), ``web/``, ``aio/``, ``integrations/``,
``jobs/`` (Celery in a real prefork worker pool, RQ and Dramatiq in real worker processes, ``throttle``), ``tools/`` and ``package/``
(the package's shape). Helpers shared by several folders live
here and in ``helpers.py`` (importable from spawned processes too) and ``sql_servers.py``.
``django/`` configures Django only when its modules are collected (they import
``redcount_django_fixtures``), so the other folders run without it.
"""

from __future__ import annotations

import os
import re
import signal
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence

import pytest
import redcount
from redcount.tools.servers import READY_TIMEOUT, RedisServer, free_port, resp_command
from fault_proxy import FaultProxy
from sql_servers import mariadb_url, postgres_url, sql_url  # noqa: F401  (real SQL servers for the sql/ tests)
from topologies import *  # noqa: F403  (Redis Cluster, Sentinel, TLS cluster and ring fixtures)

__all__ = ["READY_TIMEOUT", "REDIS_SERVER", "RedisServer", "free_port", "new_server", "resp_command", "server_product"]

REDIS_SERVER = os.environ.get("REDCOUNT_TEST_REDIS_SERVER", "redis-server")


def server_product(exe: str = REDIS_SERVER) -> str:
    """The product and version a server binary states (``--version``): ``"Redis 7.0.15"``,
    ``"Valkey 9.1.2"``. Read from the binary, not from INFO, so that tests of what redcount
    reads from INFO have an answer of their own to compare with."""
    done = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30, check=True)
    m = re.match(r"(\w+) server v=(\S+)", done.stdout)
    assert m is not None, f"{exe} --version: {done.stdout!r}"
    return f"{m.group(1)} {m.group(2)}"


@pytest.hookimpl(tryfirst=True)  # before -m "not tls" deselects
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Every topology with TLS (cluster, Sentinel, ring member) is built on these certificates.
    for item in items:
        if "topology_certs" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.tls)


def new_server(port: int | None = None, extra_args: Sequence[str] = (), password: str | None = None) -> RedisServer:
    """A :class:`~redcount.tools.servers.RedisServer` (not started) from ``REDIS_SERVER``; a
    missing binary fails the session loudly instead of skipping: CI installs it."""
    if shutil.which(REDIS_SERVER) is None:
        pytest.fail(
            f"{REDIS_SERVER!r} not found on PATH: the redcount test suite needs a real redis-server "
            "(apt-get install redis-server). Refusing to skip.",
            pytrace=False,
        )
    return RedisServer(REDIS_SERVER, port=port, extra_args=extra_args, password=password)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = new_server().start()
    try:
        yield server
    finally:
        server.cleanup()


class ServerFactory:
    """Starts extra redis-servers on their own ports; cleanup() kills them all."""

    def __init__(self) -> None:
        self.servers: list[RedisServer] = []

    def __call__(self, extra_args: Sequence[str] = (), password: str | None = None) -> RedisServer:
        server = new_server(extra_args=extra_args, password=password)
        self.servers.append(server)
        return server.start()

    def cleanup(self) -> None:
        for s in self.servers:
            s.cleanup()
        self.servers.clear()


@pytest.fixture(scope="session")
def redis_session_factory() -> Iterator[Callable[..., RedisServer]]:
    """Extra servers that live until the end of the session (e.g. one with a password)."""
    factory = ServerFactory()
    try:
        yield factory
    finally:
        factory.cleanup()


@pytest.fixture
def redis_factory() -> Iterator[Callable[..., RedisServer]]:
    """Extra servers for one test, which may stop, kill and restart them; killed after it."""
    factory = ServerFactory()
    try:
        yield factory
    finally:
        factory.cleanup()


@pytest.fixture
def redis_store(redis_server: RedisServer) -> Iterator[redcount.Store]:
    """A Redis store on the session server, flushed before the test."""
    store = redcount.connect(redis_server.url)
    store.execute("FLUSHALL")
    try:
        yield store
    finally:
        store.close()


@pytest.fixture
def memory_store() -> Iterator[redcount.Store]:
    store = redcount.connect()
    try:
        yield store
    finally:
        store.close()


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis_only)])
def store(request: pytest.FixtureRequest) -> Iterator[redcount.Store]:
    """The same test on the embedded store and on a real redis-server."""
    if request.param == "memory":
        s = redcount.connect()
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        s = redcount.connect(f"redis://127.0.0.1:{server.port}/0")
        s.execute("FLUSHALL")
    try:
        yield s
    finally:
        s.close()


@pytest.fixture
def clock() -> redcount.ManualClock:
    # A start that is not aligned to minutes or hours, so alignment is really computed.
    return redcount.ManualClock(1_700_000_123.456)


@pytest.fixture
def clock_store(clock: redcount.ManualClock) -> Iterator[redcount.Store]:
    """A memory store driven by a ManualClock: windows turn over when the test says so."""
    s = redcount.connect(clock=clock)
    try:
        yield s
    finally:
        s.close()



@pytest.fixture
def away_from_hour_boundary() -> None:
    """Tests on the real clock with hourly windows must not straddle an hour boundary:
    if one is less than 5 s away, wait until it has passed (a wait for a time of day,
    not a readiness sleep; it happens at most once an hour)."""
    left = 3600 - time.time() % 3600
    if left < 5:
        time.sleep(left + 0.05)


@pytest.fixture
def fault_proxy(redis_server: RedisServer) -> Iterator[FaultProxy]:
    """A :class:`fault_proxy.FaultProxy` in front of the session's redis-server, healthy
    until the test tells it to misbehave; stopped after the test."""
    proxy = FaultProxy(redis_server.port).start()
    try:
        yield proxy
    finally:
        proxy.close()


@pytest.fixture
def stopped() -> Iterator[list[RedisServer]]:
    """Servers a test SIGSTOPs; continued at the end whatever happens."""
    servers: list[RedisServer] = []
    yield servers
    for s in servers:
        if s.running:
            os.kill(s.proc.pid, signal.SIGCONT)  # type: ignore[union-attr]
