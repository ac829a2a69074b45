"""Shared fixtures: real redis-server processes on free loopback ports, and stores.

Nothing here mocks Redis. ``redis_server`` is one server for the whole session (tests
isolate themselves with FLUSHALL); ``redis_factory`` starts extra servers for tests that
stop, restart or configure them (auth, retry queue). Every server is killed at the end.
If ``redis-server`` is not installed the session fails loudly: CI installs it.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

import pytest
import redcount
from sql_servers import mariadb_url, postgres_url, sql_url  # noqa: F401  (issue 10: real SQL servers)
from topologies import *  # noqa: F403  (Redis Cluster, Sentinel, TLS cluster and ring fixtures)

REDIS_SERVER = os.environ.get("REDCOUNT_TEST_REDIS_SERVER", "redis-server")
READY_TIMEOUT = 10.0  # seconds a server may take to answer PING


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def resp_command(port: int, *args: str | bytes, password: str | None = None, timeout: float = 2.0) -> bytes:
    """Send one command over a raw socket (no client library involved) and return the
    first reply line. Used for readiness checks and server control."""

    def encode(parts: Sequence[str | bytes]) -> bytes:
        out = [b"*%d\r\n" % len(parts)]
        for p in parts:
            b = p.encode() if isinstance(p, str) else p
            out.append(b"$%d\r\n%s\r\n" % (len(b), b))
        return b"".join(out)

    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        payload = b""
        if password is not None:
            payload += encode(["AUTH", password])
        payload += encode(list(args))
        s.sendall(payload)
        data = b""
        want_lines = 2 if password is not None else 1
        while data.count(b"\r\n") < want_lines:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        lines = data.split(b"\r\n")
        return lines[want_lines - 1] if len(lines) >= want_lines else data


class _PortTaken(RuntimeError):
    pass


class RedisServer:
    """One redis-server process on a fixed loopback port; can be stopped, killed and
    restarted on the same port. Persistence is off, so a restart starts empty unless
    :meth:`stop` is asked to ``save`` (SHUTDOWN SAVE writes dump.rdb into this server's
    own directory, which the restart loads)."""

    def __init__(self, port: int | None = None, extra_args: Sequence[str] = (), password: str | None = None):
        exe = shutil.which(REDIS_SERVER)
        if exe is None:
            pytest.fail(
                f"{REDIS_SERVER!r} not found on PATH: the redcount test suite needs a real redis-server "
                "(apt-get install redis-server). Refusing to skip.",
                pytrace=False,
            )
        self.exe = exe
        self.port = port if port is not None else free_port()
        self.extra_args = list(extra_args)
        self.password = password  # for the readiness PING and control commands
        self.dir = Path(tempfile.mkdtemp(prefix=f"redcount-redis-{self.port}-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None
        self._may_change_port = port is None  # until the first successful start

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _cmdline(self) -> list[str]:
        return [
            self.exe,
            "--port", str(self.port),
            "--save", "",
            "--appendonly", "no",
            "--bind", "127.0.0.1",
            "--dir", str(self.dir),
            "--dbfilename", "dump.rdb",
            *self.extra_args,
        ]

    def start(self) -> RedisServer:
        assert not self.running, "already running"
        for attempt in range(3):
            try:
                return self._start_once()
            except _PortTaken:
                # Another process grabbed the free port we picked; only a fresh server may
                # move (a restart must come back on the same port).
                if not self._may_change_port or attempt == 2:
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")

    def _start_once(self) -> RedisServer:
        log_path = self.dir / "redis.log"
        self._log = open(log_path, "ab")  # noqa: SIM115 - closed in _reap
        self.proc = subprocess.Popen(self._cmdline(), stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + READY_TIMEOUT
        last_error: object = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._reap()
                log = log_path.read_text(errors="replace")[-2000:]
                if "Address already in use" in log:
                    raise _PortTaken(log)
                raise RuntimeError(f"redis-server on port {self.port} exited with {self.proc.returncode}:\n{log}")
            try:
                reply = resp_command(self.port, "PING", password=self.password, timeout=0.5)
                if reply == b"+PONG" or reply.startswith(b"-NOAUTH"):
                    self._may_change_port = False
                    return self
                last_error = reply  # e.g. -LOADING while a dump is read
            except OSError as e:
                last_error = e
            time.sleep(0.01)  # poll interval of a bounded readiness loop
        self.kill()
        raise RuntimeError(f"redis-server on port {self.port} not ready after {READY_TIMEOUT}s: {last_error!r}")

    def _wait_port_closed(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    pass
            except OSError:
                return
            time.sleep(0.01)
        raise RuntimeError(f"port {self.port} still accepts connections after the server stopped")

    def _reap(self) -> None:
        if self.proc is not None:
            try:
                self.proc.wait(timeout=READY_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def stop(self, save: bool = False) -> None:
        """Shut down cleanly (SIGTERM, or SHUTDOWN SAVE to keep the data for a restart)."""
        if not self.running:
            return
        assert self.proc is not None
        if save:
            try:
                resp_command(self.port, "SHUTDOWN", "SAVE", password=self.password)
            except OSError:
                pass  # the server closes the connection as it exits
        else:
            self.proc.send_signal(signal.SIGTERM)
        self._reap()
        self._wait_port_closed()

    def kill(self) -> None:
        """SIGKILL: the server vanishes without a word, as in a crash."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
        self._reap()

    def restart(self, save: bool = False) -> None:
        self.stop(save=save)
        self.start()

    def command(self, *args: str) -> bytes:
        return resp_command(self.port, *args, password=self.password)

    def cleanup(self) -> None:
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.cleanup()


class ServerFactory:
    """Starts extra redis-servers on their own ports; cleanup() kills them all."""

    def __init__(self) -> None:
        self.servers: list[RedisServer] = []

    def __call__(self, extra_args: Sequence[str] = (), password: str | None = None) -> RedisServer:
        server = RedisServer(extra_args=extra_args, password=password)
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
