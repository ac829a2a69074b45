"""``redcount --version``: the installed distribution's version, the same as
``redcount.__version__`` (one source: python/redcount/_version.py, which pyproject.toml reads
for the distribution's metadata)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest
import redcount
from redcount.tools.cli import main


def test_version_attribute_is_the_distributions() -> None:
    assert redcount.__version__ == importlib.metadata.version("redcount")


def test_cli_prints_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out.strip() == f"redcount {redcount.__version__}"


def test_python_dash_m_redcount_version() -> None:
    out = subprocess.run([sys.executable, "-m", "redcount", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"redcount {importlib.metadata.version('redcount')}"
