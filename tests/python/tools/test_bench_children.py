"""The child processes ``redcount bench`` starts (redis-benchmark, its private redis-server):
each has a timeout, dies with the bench however the bench ends, and an unreachable or silent
server is reported as such instead of a bench that never returns.

Every process here is run in a session of its own and, should the code under test hang, its
whole group is killed, so that a failing run leaves nothing behind.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import wait_until
from redcount.tools.servers import free_port

pytestmark = pytest.mark.redis_only


def _need(binary: str) -> None:
    if shutil.which(binary) is None:
        pytest.fail(f"{binary!r} not found on PATH: apt-get install redis-server. Refusing to skip.")


def _run_bounded(argv: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in a new session; on timeout kill its whole group and fail the test."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        pytest.fail(f"{argv[3:]} did not return within {timeout} s")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port where the kernel accepts TCP connections and nothing ever answers (a frozen
    server, from a client's point of view)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        yield int(s.getsockname()[1])


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        text = (task / "children").read_text().split()
        found += [int(t) for t in text]
    return found


def _gone(pid: int) -> bool:
    """The process has exited (a zombie not reaped yet by whoever adopted it counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def _kill_if_alive(pid: int) -> None:
    if not _gone(pid):
        os.kill(pid, signal.SIGKILL)


def test_bench_reports_an_unreachable_server_with_a_password() -> None:
    _need("redis-benchmark")
    port = free_port()  # nothing listens there
    done = _run_bounded(
        [sys.executable, "-m", "redcount", "bench", "--url", f"redis://:s3cret@127.0.0.1:{port}/0", "--seconds", "0.2"],
        timeout=60,
    )
    assert done.returncode == 2, done.stderr
    assert "unreachable" in done.stderr and f"127.0.0.1:{port}" in done.stderr, done.stderr
    assert "s3cret" not in done.stderr + done.stdout
    assert "Traceback" not in done.stderr


def test_a_redis_benchmark_that_gets_no_answer_is_stopped_and_reported(silent_server: int) -> None:
    _need("redis-benchmark")
    # The password check's own timeout, made short for the test.
    code = (
        "import redcount.tools.bench.redis_benchmark as rb\n"
        "rb.CHECK_TIMEOUT = 1.0\n"
        "try:\n"
        f"    rb.check_benchmark_auth('redis-benchmark', 'redis://:pw@127.0.0.1:{silent_server}/0')\n"
        "except rb.BenchError as e:\n"
        "    print(e)\n"
    )
    done = _run_bounded([sys.executable, "-c", code, "-", "check"], timeout=60)
    assert done.returncode == 0, done.stderr
    assert "got no answer" in done.stdout and "within 1 s" in done.stdout, done.stdout
    assert "pw@" not in done.stdout


def _start_and_wait_for_child(code: str) -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    children: list[int] = []

    def started() -> bool:
        children[:] = _children(proc.pid)
        return bool(children) or proc.poll() is not None

    wait_until(started, timeout=30, what="the child process was not started")
    assert proc.poll() is None and len(children) == 1, children
    return proc, children[0]


def test_redis_benchmark_dies_with_a_killed_bench(silent_server: int) -> None:
    _need("redis-benchmark")
    # The password check runs redis-benchmark against a server that never answers: it waits
    # (up to its timeout) while the bench is killed from outside, which no cleanup code sees.
    code = (
        "import redcount.tools.bench.redis_benchmark as rb\n"
        f"rb.check_benchmark_auth('redis-benchmark', 'redis://:pw@127.0.0.1:{silent_server}/0')\n"
    )
    proc, child = _start_and_wait_for_child(code)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        wait_until(lambda: _gone(child), timeout=10, what="redis-benchmark outlived the bench that started it")
    finally:
        _kill_if_alive(child)


def test_the_private_redis_server_dies_with_a_killed_bench() -> None:
    _need("redis-server")
    code = (
        "import time\n"
        "from redcount.tools.servers import private_or_existing\n"
        "with private_or_existing('redis-server', None):\n"
        "    time.sleep(120)\n"
    )
    proc, child = _start_and_wait_for_child(code)
    try:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        wait_until(lambda: _gone(child), timeout=10, what="the private redis-server outlived the bench")
    finally:
        _kill_if_alive(child)
