"""What ``import redcount`` costs: none of the optional extras (pandas, SQLAlchemy, Flask,
FastAPI, prometheus_client, ...) is imported until the feature that needs it is used, nor
``importlib.metadata`` (the version is a constant), and the package and its asyncio, Flask and
FastAPI modules import where Python has no ``ssl`` module (TLS is the core's own, on the
OpenSSL the extension links; the wheel test proves it with the system's OpenSSL hidden)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

EXTRAS = {"pandas", "numpy", "matplotlib", "sqlalchemy", "psycopg", "pymysql", "flask", "werkzeug", "fastapi",
          "starlette", "uvicorn", "prometheus_client", "tqdm", "limits", "redis", "django", "rest_framework",
          "celery", "kombu", "billiard", "rq", "dramatiq"}

LOADED = """
import json, sys
import {module}
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} | {{m for m in sys.modules if m.startswith("importlib.")}})))
"""


def loaded_by(module: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", LOADED.format(module=module)], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return set(json.loads(out))


@pytest.mark.parametrize("module", ["redcount", "redcount.aio", "redcount.tools.cli", "redcount.jobs"])
def test_import_loads_no_optional_extra(module: str) -> None:
    loaded = loaded_by(module)
    assert loaded & EXTRAS == set(), sorted(loaded & EXTRAS)
    assert "importlib.metadata" not in loaded


@pytest.mark.parametrize(("module", "its_framework"), [("redcount.flask", {"flask", "werkzeug"}),
                                                        ("redcount.fastapi", {"starlette", "fastapi"}),
                                                        ("redcount.django", {"django"}),
                                                        # kombu.utils.json imports django.utils when Django is installed
                                                        ("redcount.celery", {"celery", "kombu", "billiard", "django"}),
                                                        ("redcount.rq", {"rq", "redis"}),
                                                        ("redcount.dramatiq", {"dramatiq"})])
def test_a_framework_module_loads_its_framework_only(module: str, its_framework: set[str]) -> None:
    loaded = loaded_by(module)
    assert loaded & (EXTRAS - its_framework) == set(), sorted(loaded & EXTRAS)


WITHOUT_SSL = """
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name in ("ssl", "_ssl"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Refuse())
import redcount, redcount.aio, redcount.tools.cli
store = redcount.connect("memory://")
print(redcount.FixedWindowCounter(store, "c", window=60).incr("k"), "ssl" in sys.modules)
"""


def test_redcount_imports_and_runs_without_pythons_ssl_module() -> None:
    done = subprocess.run([sys.executable, "-c", WITHOUT_SSL], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["1", "False"]
