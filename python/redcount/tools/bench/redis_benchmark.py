"""``redis-benchmark`` as a contender: the floor set by the round trip and by the server
itself, measured with Redis's own C client against the same server."""

from __future__ import annotations

import csv
import io
import os
import socket
import subprocess
import time
import urllib.parse

from ..servers import die_with_parent
from ..urls import mask_url, redact
from .harness import BenchError, Contender
from .rows import N_KEYS

CHECK_TIMEOUT = 10.0
"""Seconds the one-PING password check may take. redis-benchmark 7.0 never exits when it
cannot connect or gets no reply, so every run of it has a timeout, and dies with us."""
RUN_TIMEOUT = 300.0
"""Seconds a measuring run may take at most (a slice is sized to take ``--seconds``)."""
CONNECT_TIMEOUT = 2.0
"""Seconds to wait for a TCP connection to the server before anything runs against it."""


def benchmark_target(url: str) -> tuple[list[str], dict[str, str]]:
    """redis-benchmark's arguments for the server at ``url``, and the environment to run it in.

    The password never goes on the command line (any local user can read a process's
    arguments in /proc/<pid>/cmdline): it goes in ``REDISCLI_AUTH``, the variable the Redis
    command-line tools read it from. A redis-benchmark that ignores it (7.0 does) fails to
    authenticate, and `check_benchmark_auth` says so before anything is measured."""
    u = urllib.parse.urlsplit(url)
    if u.scheme != "redis":
        raise BenchError(f"--url must be a redis:// URL, got {mask_url(url)!r}")
    try:
        port = u.port or 6379
    except ValueError:
        raise BenchError(f"--url has a bad port: {mask_url(url)!r}") from None
    argv = ["-h", u.hostname or "127.0.0.1", "-p", str(port)]
    db = u.path.strip("/")
    if db:
        if not db.isdigit():
            raise BenchError(f"--url must end in a database number (/0), got {mask_url(url)!r}")
        argv += ["--dbnum", db]
    if u.username:
        argv += ["--user", urllib.parse.unquote(u.username)]
    env = dict(os.environ)
    env.pop("REDISCLI_AUTH", None)  # only this URL's password, if any
    if u.password:
        env["REDISCLI_AUTH"] = urllib.parse.unquote(u.password)
    return argv, env


def benchmark_command(
    binary: str, url: str, pipeline: int, key: str, n: int, clients: int = 1
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment of ``redis-benchmark INCR key:__rand_int__`` with ``clients``
    clients."""
    # `INCR <prefix>:rb:__rand_int__` is what `-t incr` sends (it uses `counter:__rand_int__`),
    # but under this run's own prefix, so nothing outside it is touched on a --url server.
    target, env = benchmark_target(url)
    argv = [
        binary,
        *target,
        "-c",
        str(clients),
        "-P",
        str(pipeline),
        "-n",
        str(n),
        "-r",
        str(N_KEYS),
        "--csv",
        "INCR",
        key,
    ]
    return argv, env


def run_redis_benchmark(
    binary: str, url: str, pipeline: int, key: str, n: int, clients: int = 1
) -> tuple[float, float]:
    """Run ``redis-benchmark INCR key:__rand_int__``; (requests/s, seconds)."""
    cmd, env = benchmark_command(binary, url, pipeline, key, n, clients)
    start = time.perf_counter()
    done = _run(cmd, env, url, RUN_TIMEOUT, f"INCR x {n}")
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise BenchError(
            f"redis-benchmark failed (exit {done.returncode}): {redact((done.stderr or done.stdout)[-400:], url)}"
        )
    for row in csv.DictReader(io.StringIO(done.stdout)):
        rps = row.get("rps")
        if rps:
            return float(rps), elapsed
    raise BenchError(f"could not find 'rps' in redis-benchmark's output: {redact(done.stdout[-400:], url)!r}")


def check_reachable(url: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """Raise `BenchError` saying the server is unreachable when nothing accepts a TCP
    connection at ``url``'s host and port within ``timeout`` seconds."""
    u = urllib.parse.urlsplit(url)
    host, port = u.hostname or "127.0.0.1", u.port or 6379
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as e:
        why = e.strerror or str(e) or type(e).__name__
        raise BenchError(f"the Redis server at {mask_url(url)} is unreachable: cannot connect to {host}:{port} ({why})") from None


def _run(cmd: list[str], env: dict[str, str], url: str, timeout: float, what: str) -> subprocess.CompletedProcess[str]:
    """Run redis-benchmark with a timeout (killed at its end) and tied to this process, so
    that it never outlives a bench that is killed or interrupted."""
    try:
        return subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
            env=env,
            timeout=timeout,
            preexec_fn=die_with_parent(),
        )
    except subprocess.TimeoutExpired:
        raise BenchError(
            f"redis-benchmark ({what}) got no answer from {mask_url(url)} within {timeout:g} s and was stopped: "
            "is the server reachable, and answering?"
        ) from None


def check_benchmark_auth(binary: str, url: str) -> None:
    """With a password in ``url``: check that redis-benchmark authenticates from the
    environment (one PING) before anything is measured, and say what to do if not."""
    if not urllib.parse.urlsplit(url).password:
        return
    target, env = benchmark_target(url)
    check_reachable(url)
    done = _run([binary, *target, "-c", "1", "-n", "1", "--csv", "PING"], env, url, CHECK_TIMEOUT, "one PING")
    said = redact((done.stderr or done.stdout).strip()[-300:], url)
    if any(word in done.stdout + done.stderr for word in ("NOAUTH", "WRONGPASS", "AUTH failed")):
        raise BenchError(
            "redis-benchmark did not authenticate with the password from the environment "
            "(REDISCLI_AUTH); this redis-benchmark takes a password only on its command line, where any "
            "local user can read it, and redcount bench does not put it there. Run "
            "`redcount bench --only sliding` against this server (no redis-benchmark rows), or "
            "leave out --url to measure on a private server without a password. "
            f"redis-benchmark said: {said}"
        )
    if done.returncode != 0:
        raise BenchError(f"redis-benchmark could not run against {mask_url(url)} (exit {done.returncode}): {said}")


class RedisBenchmark(Contender):
    """``redis-benchmark`` INCR with ``clients`` clients, each with ``pipeline`` requests in flight."""

    def __init__(self, name: str, binary: str, url: str, pipeline: int, key: str, clients: int = 1) -> None:
        super().__init__(name)
        self.binary, self.url, self.pipeline, self.key = binary, url, pipeline, key
        self.clients = clients
        self.rate = 0.0

    def run_slice(self, seconds: float) -> None:
        if not self.rate:  # a short calibration run sizes -n so that a slice takes `seconds`
            self.rate, _ = run_redis_benchmark(
                self.binary,
                self.url,
                self.pipeline,
                self.key,
                max(1000 * self.clients, self.pipeline * 200),
                self.clients,
            )
        n = max(self.pipeline * self.clients * 10, int(self.rate * seconds))
        n -= n % (self.pipeline * self.clients)
        with self._cpu():
            rps, elapsed = run_redis_benchmark(self.binary, self.url, self.pipeline, self.key, n, self.clients)
        self.rate = rps
        self.ops += n
        self.elapsed += n / rps if rps > 0 else elapsed
        self.turn_rates.append(rps)

