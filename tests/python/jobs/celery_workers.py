"""A real Celery worker pool (``celery -A jobs_app worker --pool=prefork``) as a subprocess.

The worker runs in a session of its own, so :meth:`CeleryWorker.stop` can always end the main
process and every pool process with one ``killpg`` (SIGTERM first, SIGKILL when it does not
exit in time). Readiness: the app's ``worker_ready`` handler records itself in Redis; the
worker is polled for it, never waited for with a fixed sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import BinaryIO

import redcount
from redcount.tools.servers import die_with_parent

from helpers import wait_until

HERE = Path(__file__).resolve().parent


class CeleryWorker:
    """``celery -A jobs_app worker --pool=prefork -c <concurrency>`` on the redis-server at
    ``base`` (``redis://127.0.0.1:PORT``); its log goes to ``log_path``."""

    def __init__(
        self, base: str, log_path: Path, concurrency: int = 2, extra_args: tuple[str, ...] = ()
    ) -> None:
        self.base = base
        self.log_path = log_path
        self.concurrency = concurrency
        self.extra_args = extra_args  # more options of `celery worker`, e.g. --max-tasks-per-child
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None

    def start(self, data: redcount.Store, timeout: float = 60.0) -> CeleryWorker:
        env = dict(os.environ)
        env["JOBS_REDIS"] = self.base
        # The redcount this test imported (the source tree with a built module, or the installed
        # package), not whatever sits in the checkout.
        here_pkg = str(Path(redcount.__file__).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join([here_pkg, str(HERE), env.get("PYTHONPATH", "")])
        env.pop("PYTHONWARNINGS", None)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        cmd = [
            sys.executable, "-m", "celery", "-A", "jobs_app", "worker",
            "--pool=prefork", "-c", str(self.concurrency), "--loglevel=INFO",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
            "-n", f"jobs-{os.getpid()}@%h", *self.extra_args,
        ]  # fmt: skip
        self.proc = subprocess.Popen(
            cmd, cwd=HERE, env=env, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
            start_new_session=True, preexec_fn=die_with_parent(),
        )  # fmt: skip
        try:
            wait_until(lambda: self._check_alive() and data.execute("LLEN", "jobs:ready"), timeout,
                       "the celery worker to be ready")  # fmt: skip
        except BaseException:
            self.stop()
            raise
        return self

    def _check_alive(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"celery worker exited with {self.proc.returncode}:\n{self.log()}")
        return True

    def log(self, tail: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:] if self.log_path.exists() else ""

    def pool_pids(self) -> list[int]:
        """The pids of the pool processes (the worker's children)."""
        assert self.proc is not None
        path = Path(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children")
        return [int(p) for p in path.read_text().split()]

    def stop(self, timeout: float = 10.0) -> None:
        """Warm shutdown (SIGTERM) of the whole process group; SIGKILL for whatever is left
        after ``timeout`` seconds. Idempotent."""
        proc = self.proc
        if proc is not None:
            pgid = proc.pid  # the leader of its own session
            try:
                os.killpg(pgid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                pass
            # Pool processes the main process did not reap, or a main process that hung.
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                try:
                    os.killpg(pgid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.01)
            self.proc = None
        if self._log is not None:
            self._log.close()
            self._log = None
