"""The ``redcount`` command, run as a real subprocess with the venv's interpreter."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import redcount
from conftest import RedisServer, free_port

WINDOW_LINE = re.compile(
    r"^window (\d\d:\d\d:\d\d\.\d{3})-(\d\d:\d\d:\d\d\.\d{3}): +(\d+) requests from +(\d+) clients, "
    r"allowed +(\d+), denied +(\d+); hot: (.*); key TTLs (.*)$"
)


def run(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONWARNINGS="error")
    return subprocess.run(list(args), capture_output=True, text=True, timeout=timeout, env=env, check=False,
                          stdin=subprocess.DEVNULL)


def redcount_script() -> str:
    script = Path(sys.executable).parent / "redcount"
    assert script.exists(), f"the redcount console script is not installed next to {sys.executable}"
    return str(script)


def check_demo_output(proc: subprocess.CompletedProcess[str], windows: int) -> list[re.Match[str]]:
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception" not in proc.stderr, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("redcount demo on ")
    found = [m for m in (WINDOW_LINE.match(line) for line in lines) if m]
    assert len(found) == windows, proc.stdout
    for m in found:
        requests, clients, allowed, denied = (int(m.group(i)) for i in (3, 4, 5, 6))
        assert requests > 0, m.group(0)  # the workers really ran in every window
        assert 0 < clients <= 500
        assert allowed > 0, m.group(0)
        assert allowed + denied == requests
        assert denied > 0, m.group(0)  # the hot clients went over their limit
    assert any(line.startswith("retry queue: ") for line in lines)
    return found


@pytest.mark.slow
def test_demo_on_memory() -> None:
    proc = run(sys.executable, "-m", "redcount", "demo", "--windows", "2", "--window", "1", "--clients", "100")
    for m in check_demo_output(proc, 2):
        # The limiter's promise, read back from the store: at most 20 per client and window.
        assert int(m.group(5)) <= 100 * 20, m.group(0)
    assert "on memory://" in proc.stdout
    assert "the embedded store holds 0 keys" in proc.stdout


@pytest.mark.redis_only
@pytest.mark.slow
def test_demo_on_redis(redis_server: RedisServer) -> None:
    store = redcount.connect(redis_server.url)
    store.execute("FLUSHALL")
    proc = run(redcount_script(), "demo", "--url", redis_server.url, "--windows", "2", "--window", "1",
               "--clients", "50", "--rate", "1500")
    for m in check_demo_output(proc, 2):
        assert int(m.group(5)) <= 50 * 20, m.group(0)
    assert f"on {redis_server.url}" in proc.stdout
    # What the demo left in Redis all carries a TTL.
    keys = store.execute("KEYS", "*")
    assert keys, "the demo wrote nothing to Redis"
    for key in keys:
        assert store.execute("PTTL", key) != -1, key
    store.close()


def test_demo_bad_arguments() -> None:
    proc = run(sys.executable, "-m", "redcount", "demo", "--clients", "0")
    assert proc.returncode == 2
    assert "error: need clients >= 1" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_demo_bad_url() -> None:
    proc = run(sys.executable, "-m", "redcount", "demo", "--url", "foo://x")
    assert proc.returncode == 2
    assert "invalid store URL" in proc.stderr and "Traceback" not in proc.stderr


def test_demo_unreachable_server() -> None:
    proc = run(sys.executable, "-m", "redcount", "demo", "--url", f"redis://127.0.0.1:{free_port()}/0")
    assert proc.returncode == 2
    assert "refused" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [(["--per-client", "0"], "--per-client must be >= 1"), (["--window", "0"], "--window must be a whole number")],
)
def test_demo_bad_numbers_are_clean_errors(flags: list[str], message: str) -> None:
    proc = run(sys.executable, "-m", "redcount", "demo", "--windows", "1", *flags)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr


def test_no_command_prints_usage() -> None:
    proc = run(sys.executable, "-m", "redcount")
    assert proc.returncode == 2
    assert "usage: redcount" in proc.stderr
    proc = run(redcount_script(), "--help")
    assert proc.returncode == 0
    assert "demo" in proc.stdout and "bench" in proc.stdout
