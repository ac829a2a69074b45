"""Real SQL servers for the snapshot and flusher tests: PostgreSQL and MariaDB from Debian's
binaries, each started once per session on a free loopback port with a throw-away data
directory, and killed at the end. A fixture skips (with the reason) only when the server's
binaries are not installed; tests/run_all.sh installs them, so CI runs these tests.

    def test_x(sql_url): ...      # parametrized: sqlite (always), postgresql, mariadb

Imported by conftest.py, so every fixture here is defined once per session.
"""

from __future__ import annotations

import glob
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from redcount.tools.servers import free_port

READY_TIMEOUT = 60.0  # seconds; initdb and a first start are slow on a loaded machine


def _as_user(user: str) -> list[str]:
    """A command prefix that drops root (the servers refuse to run as root)."""
    if os.geteuid() != 0:
        return []
    return ["runuser", "-u", user, "--"]


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    return Path(found[-1]).parent if found else None


def _chown(path: str, user: str) -> None:
    if os.geteuid() == 0:
        import pwd

        pw = pwd.getpwnam(user)
        os.chown(path, pw.pw_uid, pw.pw_gid)


def _wait(proc: subprocess.Popen[bytes], url: str, what: str, log: Path) -> None:
    import sqlalchemy as sa

    deadline = time.monotonic() + READY_TIMEOUT
    engine = sa.create_engine(url)
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} exited with {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                with engine.connect() as conn:
                    conn.exec_driver_sql("SELECT 1")
                return
            except sa.exc.OperationalError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{what} did not accept connections within {READY_TIMEOUT} s") from None
                time.sleep(0.1)
    finally:
        engine.dispose()


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A PostgreSQL server of our own (trust auth on 127.0.0.1; fsync off: a test database)."""
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("PostgreSQL is not installed (apt-get install postgresql); tests/run_all.sh installs it")
    pytest.importorskip("psycopg", reason="psycopg is not installed (pip install 'redcount[postgres]')")
    user = "postgres"
    tmp = tempfile.mkdtemp(prefix="redcount-pg-")
    _chown(tmp, user)
    data, log = os.path.join(tmp, "data"), Path(tmp) / "log"
    subprocess.run(
        [*_as_user(user), str(bindir / "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "-E", "UTF8",
         "--no-sync", "--no-instructions"],
        check=True, capture_output=True,
    )
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*_as_user(user), str(bindir / "postgres"), "-D", data, "-p", str(port), "-k", tmp,
             "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off", "-c", "full_page_writes=off"],
            stdout=out, stderr=subprocess.STDOUT,
        )
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    try:
        _wait(proc, url, "postgres", log)
        yield url
    finally:
        # Signal the postmaster itself (runuser in between may not pass signals on):
        # SIGQUIT is an immediate shutdown, which a throw-away database can afford.
        try:
            pid = int(Path(data, "postmaster.pid").read_text().split()[0])
            os.kill(pid, signal.SIGQUIT)
        except (OSError, ValueError, IndexError):
            pass
        _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def mariadb_url() -> Iterator[str]:
    """A MariaDB server of our own (grant tables skipped: any user, no password, loopback only)."""
    server = shutil.which("mariadbd") or shutil.which("mysqld", path="/usr/sbin:/usr/bin")
    install = shutil.which("mariadb-install-db") or shutil.which("mysql_install_db")
    if server is None or install is None:
        pytest.skip("MariaDB is not installed (apt-get install mariadb-server); tests/run_all.sh installs it")
    pytest.importorskip("pymysql", reason="PyMySQL is not installed (pip install 'redcount[mysql]')")
    user = "mysql" if os.geteuid() == 0 else os.environ.get("USER", "nobody")
    tmp = tempfile.mkdtemp(prefix="redcount-mariadb-")
    _chown(tmp, user)
    data, log = os.path.join(tmp, "data"), Path(tmp) / "log"
    subprocess.run(
        [install, "--no-defaults", f"--datadir={data}", f"--user={user}", "--auth-root-authentication-method=normal",
         "--skip-test-db"],
        check=True, capture_output=True,
    )
    port = free_port()
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [server, "--no-defaults", f"--datadir={data}", f"--user={user}", f"--port={port}",
             f"--socket={tmp}/mysqld.sock", "--bind-address=127.0.0.1", "--skip-grant-tables",
             f"--pid-file={tmp}/mysqld.pid", "--innodb-flush-log-at-trx-commit=2", "--skip-log-bin"],
            stdout=out, stderr=subprocess.STDOUT,
        )
    base = f"mysql+pymysql://root@127.0.0.1:{port}"
    try:
        _wait(proc, base + "/mysql", "mariadbd", log)
        import sqlalchemy as sa

        engine = sa.create_engine(base + "/mysql")
        with engine.begin() as conn:
            conn.exec_driver_sql("CREATE DATABASE IF NOT EXISTS redcount")
        engine.dispose()
        yield base + "/redcount"
    finally:
        _stop(proc)
        shutil.rmtree(tmp, ignore_errors=True)


def _reset(url: str) -> str:
    """Drop redcount's tables so that a test starts from an empty schema."""
    import sqlalchemy as sa

    engine = sa.create_engine(url)
    with engine.begin() as conn:
        for t in ("redcount_layouts", "redcount_reconcile_runs", "redcount_deltas", "redcount_adjustments", "redcount_totals", "redcount_shard_snapshots",
                  "redcount_counters", "redcount_schema"):
            conn.exec_driver_sql(f"DROP TABLE IF EXISTS {t}")
    engine.dispose()
    return url


@pytest.fixture(params=["sqlite", "postgresql", "mariadb"])
def sql_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """An empty snapshot database on each backend (sqlite always; the servers when installed)."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'snapshots.db'}"
    if request.param == "postgresql":
        return _reset(request.getfixturevalue("postgres_url"))
    return _reset(request.getfixturevalue("mariadb_url"))
