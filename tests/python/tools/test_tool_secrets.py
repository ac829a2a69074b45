"""The tools never put a password on a command line or in an error message.

``redcount bench`` starts ``redis-benchmark``; its arguments are readable by every local user
(``/proc/<pid>/cmdline``), so the password must travel in the environment. Errors of
``redcount bench`` and ``redcount abuse`` quote URLs; they must show them masked.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import RedisServer, free_port
from redcount.tools.bench.redis_benchmark import benchmark_command, benchmark_target
from redcount.tools.urls import mask_url, redact

PW = "Sekr3t-pw_42"


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "redcount", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        stdin=subprocess.DEVNULL,
        env=env,
    )


def test_mask_url_and_redact() -> None:
    assert mask_url(f"redis://:{PW}@db:6379/0") == "redis://:***@db:6379/0"
    assert mask_url(f"redis://app:{PW}@db/1") == "redis://app:***@db/1"
    assert mask_url(f"unix:///run/r.sock?db=2&password={PW}") == "unix:///run/r.sock?db=2&password=***"
    assert mask_url("redis://db:6379/0") == "redis://db:6379/0"  # nothing to hide
    assert mask_url("redis://app@db/0") == "redis://app@db/0"
    url = f"redis://:{PW}@db/0"
    out = redact(f"cannot reach {url}; auth '{PW}' refused; %-form {PW.replace('-', '%2D')}", url)
    assert PW not in out and "redis://:***@db/0" in out


def test_redis_benchmark_gets_the_password_in_its_environment_only() -> None:
    argv, env = benchmark_command("redis-benchmark", f"redis://app:{PW}@127.0.0.1:7001/3", 1, "k:__rand_int__", 10)
    assert not any(PW in a for a in argv), argv
    assert env["REDISCLI_AUTH"] == PW
    assert argv[argv.index("-h") + 1] == "127.0.0.1" and argv[argv.index("-p") + 1] == "7001"
    assert argv[argv.index("--dbnum") + 1] == "3" and argv[argv.index("--user") + 1] == "app"
    # Percent-encoded passwords are decoded for AUTH, and never appear in any form.
    argv, env = benchmark_target("redis://:p%40ss%3Aword@127.0.0.1:7001/0")
    assert env["REDISCLI_AUTH"] == "p@ss:word" and not any("p%40ss" in a or "p@ss" in a for a in argv)
    # No password in the URL: none inherited from the caller's environment either.
    os.environ["REDISCLI_AUTH"] = "from-the-caller"
    try:
        _, env = benchmark_target("redis://127.0.0.1:7001/0")
    finally:
        del os.environ["REDISCLI_AUTH"]
    assert "REDISCLI_AUTH" not in env


FAKE_BENCHMARK = textwrap.dedent(
    """\
    #!{python}
    # Stands in for redis-benchmark: records its own /proc cmdline and REDISCLI_AUTH.
    import json, os, sys
    with open({log!r}, "a") as f:
        cmdline = open(f"/proc/{{os.getpid()}}/cmdline", "rb").read().decode(errors="replace")
        f.write(json.dumps({{"cmdline": cmdline, "auth": os.environ.get("REDISCLI_AUTH")}}) + "\\n")
    print('"test","rps"')
    print('"' + " ".join(sys.argv[-2:]) + '","50000.00"')
    """
)


@pytest.mark.redis_only
def test_bench_against_a_password_server_keeps_the_password_off_the_command_line(
    tmp_path: Path, redis_factory: Callable[..., RedisServer]
) -> None:
    server = redis_factory(extra_args=["--requirepass", PW], password=PW)
    log = tmp_path / "calls.jsonl"
    fake = tmp_path / "fake-redis-benchmark"
    fake.write_text(FAKE_BENCHMARK.format(python=sys.executable, log=str(log)))
    fake.chmod(0o755)
    url = f"redis://:{PW}@127.0.0.1:{server.port}/0"
    done = run_cli("bench", "--url", url, "--only", "fixed", "--seconds", "0.2", "--redis-benchmark", str(fake))
    assert done.returncode == 0, done.stderr
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(calls) >= 3  # the auth check, then the two redis-benchmark rows
    for call in calls:
        assert PW not in call["cmdline"], call["cmdline"]
        assert call["auth"] == PW
    assert PW not in done.stdout + done.stderr


@pytest.mark.redis_only
def test_a_redis_benchmark_that_cannot_authenticate_is_a_clear_error(
    redis_factory: Callable[..., RedisServer],
) -> None:
    binary = shutil.which("redis-benchmark")
    if binary is None:
        pytest.fail("redis-benchmark not found: apt-get install redis-server. Refusing to skip.")
    server = redis_factory(extra_args=["--requirepass", PW], password=PW)
    url = f"redis://:{PW}@127.0.0.1:{server.port}/0"
    done = run_cli("bench", "--url", url, "--only", "fixed", "--seconds", "0.2")
    assert PW not in done.stdout + done.stderr
    if done.returncode != 0:  # redis-benchmark 7.0 ignores REDISCLI_AUTH; later ones may not
        assert done.returncode == 2
        assert "REDISCLI_AUTH" in done.stderr and "--only sliding" in done.stderr, done.stderr


@pytest.mark.parametrize("tool", ["bench", "abuse"])
@pytest.mark.parametrize(
    "url",
    [
        f"http://:{PW}@127.0.0.1:1/0",  # refused by the tool itself
        f"rediss://user:{PW}@127.0.0.1:1/0",
        f"redis://:{PW}@127.0.0.1:99999/0",  # a bad port
        f"redis://:{PW}@127.0.0.1:1/zero",  # a bad database
        f"unix:///nonexistent/redis.sock?password={PW}",  # refused by the URL parser, which quotes it
        "redis://:{pw}@127.0.0.1:{port}/0",  # nobody listening: a ConnectionError
    ],
)
def test_tool_errors_never_show_the_password(tool: str, url: str) -> None:
    url = url.format(pw=PW, port=free_port())
    args = ["--only", "sliding"] if tool == "bench" else []
    done = run_cli(tool, "--url", url, *args, timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "error:" in done.stderr
    assert PW not in done.stdout + done.stderr, done.stderr
