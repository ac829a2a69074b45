"""Runs the storage and strategy tests of limits' own test suite against redcount's schemes.

    .venv/bin/python tests/limits_suite/run.py [pytest args]

Fetches the sdist of the installed limits version (``pip download --no-binary :all:``) into
build/limits-suite/ once, puts conftest.py from this directory in place of its docker-based
one, and runs pytest there with pytest.ini from this directory. What is run and what remains
different is in docs/migrating.md ("Switching from Flask-Limiter, slowapi or limits").
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TESTS = [
    "tests/test_storage.py",
    "tests/test_strategy.py",
    "tests/storage/test_redis.py",
    "tests/aio/test_storage.py",
    "tests/aio/test_strategy.py",
    "tests/aio/storage/test_redis.py",
]


def main() -> int:
    version = importlib.metadata.version("limits")
    cache = ROOT / "build" / "limits-suite"
    src = cache / f"limits-{version}"
    if not (src / "tests").is_dir():
        cache.mkdir(parents=True, exist_ok=True)
        sdist = cache / f"limits-{version}.tar.gz"
        if not sdist.exists():
            subprocess.run(
                [sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
                 f"limits=={version}", "-d", str(cache)],
                check=True,
            )
        with tarfile.open(sdist) as tar:
            if hasattr(tarfile, "data_filter"):  # Python 3.11.4+; Debian 12's 3.11.2 has none
                tar.extractall(cache, filter="data")
            else:
                tar.extractall(cache)
    shutil.copy(HERE / "conftest.py", src / "tests" / "conftest.py")
    cmd = [sys.executable, "-m", "pytest", "-c", str(HERE / "pytest.ini"), "--rootdir", str(src),
           "-p", "no:cacheprovider", "-q", *TESTS, *sys.argv[1:]]
    env = {**os.environ, "REDCOUNT_TESTS_PYTHON": str(ROOT / "tests" / "python")}  # the topology fixtures
    return subprocess.run(cmd, cwd=src, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
