"""Private redis-server processes on free loopback ports: the one helper that ``redcount bench``
(and its web and abuse siblings) and the test suite's fixtures start servers with.

```python
with RedisServer() as server:                     # plain TCP on 127.0.0.1, a free port
    store = redcount.connect(server.url)
    server.stop(save=True); server.start()        # back on the same port, data kept
    server.kill()                                 # SIGKILL, as in a crash

tls = make_certs(tmp)                             # a throw-away CA and server certificate
with RedisServer(tls=tls) as server:              # TLS only: server.url is rediss://
    redcount.connect(server.url, ssl_ca_certs=tls.ca)
```

Readiness is a PING answered (over TLS when the server speaks only TLS), polled with a
bounded deadline, never a fixed sleep. Persistence is off and each server has a directory of
its own (its log, and the dump that ``stop(save=True)`` writes for the next start). A server
whose free port was taken by another process before it bound it starts again on another
port, unless it has run already: a restart comes back on the same port.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import BinaryIO, NoReturn

__all__ = [
    "READY_TIMEOUT",
    "RedisServer",
    "ServerError",
    "Tls",
    "die_with_parent",
    "free_port",
    "make_certs",
    "private_or_existing",
    "resp_command",
    "server_binary",
    "sigterm_as_exit",
    "stop_process",
]

READY_TIMEOUT = 10.0
"""Seconds a server may take to answer PING after it was started (or to free its port)."""
INSTALL_REDIS = "apt-get install redis-server"


class ServerError(ValueError):
    """A server binary is missing or a server would not start; the message says what to do.
    (A ValueError, so the ``redcount`` command prints it and exits with 2.)"""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def server_binary(name: str = "redis-server", advice: str = INSTALL_REDIS) -> str:
    """The path of the ``name`` executable, or a `ServerError` that ends with ``advice``."""
    found = shutil.which(name)
    if found is None:
        raise ServerError(f"redis-server not found (looked for {name!r}); {advice}")
    return found


_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` for `subprocess` that has the kernel SIGKILL the child when its
    parent ends, however it ends (SIGKILL included, which no ``finally`` or ``with`` block
    sees): Linux's ``prctl(PR_SET_PDEATHSIG, SIGKILL)``. None elsewhere (no such call).

    The signal comes when the *thread* that started the child ends, so start children that
    must live longer than a worker thread from the main thread. ``prctl`` is looked up here,
    before the fork: the child only calls it (no import, no lookup between fork and exec)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()
    kill = int(signal.SIGKILL)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, kill, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl ran: no signal would come
            os.kill(os.getpid(), kill)

    return preexec


def stop_process(proc: subprocess.Popen[bytes], timeout: float = 5.0) -> None:
    """SIGTERM ``proc`` and reap it; SIGKILL if it is still there after ``timeout`` seconds."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """Turn SIGTERM into SystemExit while the block runs, so that the ``with`` blocks of the
    servers it started stop them on the way out (a server started with ``new_session=True``
    is not in our process group: a signal to the group does not reach it)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_term(signum: int, frame: FrameType | None) -> NoReturn:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def resp_command(port: int, *args: str | bytes, password: str | None = None, timeout: float = 2.0) -> bytes:
    """Send one command to the plain-TCP server on ``port`` of 127.0.0.1 over a raw socket (no
    client library involved) and return the first line of its reply: for readiness checks and
    server control."""

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


@dataclass(frozen=True)
class Tls:
    """A TLS-only server's files: its certificate and key, the CA it trusts for client
    certificates, and whether it asks for one (``auth_clients``: ``"no"``, ``"optional"`` or
    ``"yes"``). ``client_cert``/``client_key``: what the readiness PING presents, for a server
    that requires a client certificate."""

    cert: str
    key: str
    ca: str
    auth_clients: str = "no"
    client_cert: str | None = None
    client_key: str | None = None


def make_certs(directory: str | Path) -> Tls:
    """A throw-away CA and a server certificate for 127.0.0.1 and localhost (EC P-256, valid
    two days) in ``directory``, made with the ``openssl`` CLI; a `ServerError` if it is
    missing or fails."""
    openssl = shutil.which("openssl")
    if openssl is None:
        raise ServerError("openssl not found (apt-get install openssl)")

    def path(name: str) -> str:
        return os.path.join(directory, name)

    ext = path("server.ext")
    with open(ext, "w", encoding="ascii") as f:
        f.write("basicConstraints=CA:FALSE\nsubjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
    steps = [
        ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path("ca.key")],
        ["req", "-x509", "-new", "-key", path("ca.key"), "-sha256", "-days", "2", "-subj", "/CN=redcount bench CA",
         "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
         "-out", path("ca.pem")],
        ["genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", path("server.key")],
        ["req", "-new", "-key", path("server.key"), "-subj", "/CN=localhost", "-out", path("server.csr")],
        ["x509", "-req", "-in", path("server.csr"), "-CA", path("ca.pem"), "-CAkey", path("ca.key"),
         "-CAcreateserial", "-sha256", "-days", "2", "-extfile", ext, "-out", path("server.pem")],
    ]  # fmt: skip
    for step in steps:
        done = subprocess.run([openssl, *step], stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False,
                              timeout=60, preexec_fn=die_with_parent())
        if done.returncode != 0:
            raise ServerError(f"openssl {step[0]} failed (exit {done.returncode}): {done.stderr[-300:]}")
    return Tls(cert=path("server.pem"), key=path("server.key"), ca=path("ca.pem"))


class _PortTaken(ServerError):
    pass


class RedisServer:
    """One redis-server process on a loopback port; it can be stopped, killed and restarted
    on the same port.

    ``binary``: a name looked up on PATH, or a path. ``port``: None for a free one.
    ``extra_args``: more redis-server options. ``password``: what the readiness PING and
    `command` authenticate with (set the server's own with ``extra_args``). ``tls``:
    listen only for TLS with these files (`url` is then ``rediss://``).
    ``new_session``: start the server in a session of its own, so that Ctrl-C in a terminal
    does not reach it and the owner stops it (the tools do, on their way out).
    ``die_with_owner``: the kernel kills the server when the thread that started it ends, even
    by SIGKILL (see `die_with_parent`; Linux), so a killed tool leaves no server behind.

    ``with RedisServer() as s:`` starts it and, at the end, stops it and removes its
    directory. Not thread-safe.
    """

    def __init__(
        self,
        binary: str = "redis-server",
        *,
        port: int | None = None,
        extra_args: Sequence[str] = (),
        password: str | None = None,
        tls: Tls | None = None,
        new_session: bool = False,
        die_with_owner: bool = False,
    ) -> None:
        self.exe = server_binary(binary)
        self.port = port if port is not None else free_port()
        self.extra_args = list(extra_args)
        self.password = password
        self.tls = tls
        self.new_session = new_session
        self.die_with_owner = die_with_owner
        self.dir = Path(tempfile.mkdtemp(prefix=f"redcount-redis-{self.port}-"))
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None
        self._may_change_port = port is None  # until the first successful start

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:<port>/0`` (``rediss://`` for a TLS server)."""
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}/0"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log(self, tail: int = 2000) -> str:
        """The last ``tail`` characters of the server's output."""
        path = self.dir / "redis.log"
        return path.read_text(errors="replace")[-tail:] if path.exists() else ""

    def _cmdline(self) -> list[str]:
        if self.tls is None:
            listen = ["--port", str(self.port)]
        else:
            t = self.tls
            listen = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", t.cert,
                      "--tls-key-file", t.key, "--tls-ca-cert-file", t.ca, "--tls-auth-clients", t.auth_clients]
        return [
            self.exe,
            *listen,
            "--bind", "127.0.0.1",
            "--save", "",
            "--appendonly", "no",
            "--daemonize", "no",
            "--dir", str(self.dir),
            "--dbfilename", "dump.rdb",
            *self.extra_args,
        ]  # fmt: skip

    def start(self) -> RedisServer:
        """Start the server and wait until it answers PING; returns ``self``."""
        assert not self.running, "already running"
        for attempt in range(3):
            try:
                return self._start_once()
            except _PortTaken:
                # Another process took the free port we picked; only a server that has not
                # run yet may move (a restart must come back on the same port).
                if not self._may_change_port or attempt == 2:
                    raise
                self.port = free_port()
        raise AssertionError("unreachable")

    def _start_once(self) -> RedisServer:
        self._log = open(self.dir / "redis.log", "ab")  # noqa: SIM115 - closed in _reap
        self.proc = subprocess.Popen(
            self._cmdline(),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=self.new_session,
            preexec_fn=die_with_parent() if self.die_with_owner else None,
        )
        deadline = time.monotonic() + READY_TIMEOUT
        last_error: object = None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._reap()
                log = self.log()
                if "Address already in use" in log:
                    raise _PortTaken(log)
                raise ServerError(
                    f"{self.exe} on port {self.port} would not start (exit code {self.proc.returncode}):\n{log}"
                )
            try:
                ready, last_error = self._ping()
                if ready:
                    self._may_change_port = False
                    return self
            except OSError as e:  # ssl.SSLError included: it may not be listening yet
                last_error = e
            time.sleep(0.005)  # poll interval of a bounded readiness loop, not a fixed wait
        self.kill()
        raise ServerError(
            f"{self.exe} on port {self.port} did not answer PING within {READY_TIMEOUT:g} s: {last_error!r}"
        )

    def _ping(self) -> tuple[bool, object]:
        if self.tls is None:
            reply = resp_command(self.port, "PING", password=self.password, timeout=0.5)
            return reply == b"+PONG" or reply.startswith(b"-NOAUTH"), reply  # else e.g. -LOADING
        # The stdlib's TLS without verification: a server with an expired certificate, or
        # one for another name, must pass readiness too. (Imported here: the rest of the module
        # and the plain servers work where Python has no ssl module.)
        import ssl

        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        if self.tls.client_cert is not None:
            ctx.load_cert_chain(self.tls.client_cert, self.tls.client_key)
        with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as raw:
            with ctx.wrap_socket(raw, server_hostname="localhost") as s:
                s.sendall(b"PING\r\n")
                reply = s.recv(64)
                return reply.startswith(b"+PONG"), reply

    def _wait_port_closed(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    pass
            except OSError:
                return
            time.sleep(0.01)
        raise ServerError(f"port {self.port} still accepts connections after the server stopped")

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
                self.command("SHUTDOWN", "SAVE")
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
        """One command over a raw socket (plain-TCP servers): the first line of the reply."""
        return resp_command(self.port, *args, password=self.password)

    def cleanup(self) -> None:
        """Kill the server and remove its directory."""
        self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if self.proc is not None:
                stop_process(self.proc)
            self._reap()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


@contextmanager
def private_or_existing(binary: str | None, url: str | None) -> Iterator[str]:
    """The URL a tool runs against: with ``binary``, a private server's, started for the
    block in a session of its own and stopped at its end; else ``url``, an existing server's."""
    if binary is None:
        if url is None:
            raise ServerError("either a redis-server binary or the URL of a running server is needed")
        yield url
        return
    with RedisServer(binary, new_session=True, die_with_owner=True) as server:
        yield server.url
