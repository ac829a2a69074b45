"""Worker processes of RQ and Dramatiq (``rq worker``, ``dramatiq``) as subprocesses.

Each worker runs in a session of its own, so :meth:`QueueWorker.stop` ends it and whatever it
forked (RQ's work horses and scheduler, Dramatiq's worker processes) with one ``killpg``
(SIGTERM, then SIGKILL when it does not exit in time), and it dies with the test process.
Readiness is polled for (a predicate the test gives), never waited for with a fixed sleep.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

import redcount
from redcount.tools.servers import die_with_parent

from helpers import wait_until

HERE = Path(__file__).resolve().parent


def worker_env(extra: dict[str, str]) -> dict[str, str]:
    """The environment of a worker: the redcount this test imported (the source tree with a
    built module, or the installed package) and this folder on PYTHONPATH, plus ``extra``."""
    env = dict(os.environ)
    here_pkg = str(Path(redcount.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join([here_pkg, str(HERE), env.get("PYTHONPATH", "")])
    env.pop("PYTHONWARNINGS", None)
    env.update(extra)
    return env


class QueueWorker:
    """``python -m <module> <args>`` (``rq``'s or ``dramatiq``'s command line) in this folder,
    its output in ``log_path``."""

    def __init__(self, args: Sequence[str], env: dict[str, str], log_path: Path) -> None:
        self.args = list(args)
        self.env = env
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None

    def start(self) -> QueueWorker:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", *self.args], cwd=HERE, env=self.env, stdin=subprocess.DEVNULL,
            stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=die_with_parent(),
        )  # fmt: skip
        return self

    def check_alive(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"worker {self.args} exited with {self.proc.returncode}:\n{self.log()}")
        return True

    def log(self, tail: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-tail:] if self.log_path.exists() else ""

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM to the whole process group; SIGKILL for whatever is left after ``timeout``
        seconds. Idempotent."""
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


def start_all(workers: Sequence[QueueWorker], ready: Callable[[], object], timeout: float = 60.0) -> None:
    """Start ``workers`` and poll until ``ready()`` is truthy (each must stay alive); on any
    failure stop them all."""
    try:
        for w in workers:
            w.start()
        wait_until(lambda: all(w.check_alive() for w in workers) and ready(), timeout, "the workers to be ready")
    except BaseException:
        for w in workers:
            w.stop()
        raise
