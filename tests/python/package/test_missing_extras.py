"""Each optional integration, imported without its extra installed, says what to install
(as the SQL, serve, analysis and Prometheus ones do) instead of a bare ModuleNotFoundError."""

from __future__ import annotations

import subprocess
import sys

import pytest

# A child interpreter in which the framework cannot be imported: a meta path finder refuses it.
CHILD = """
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None
sys.meta_path.insert(0, Refuse())
try:
    import {module}
except ImportError as e:
    print(type(e).__name__ + ": " + str(e))
else:
    print("imported")
"""


@pytest.mark.parametrize(
    ("module", "blocked", "extra"),
    [
        ("redcount.flask", {"flask"}, "flask"),
        ("redcount.flask", {"werkzeug"}, "flask"),
        ("redcount.fastapi", {"starlette", "fastapi"}, "fastapi"),
        ("redcount.contrib.limits", {"limits"}, "limits"),
        ("redcount.django", {"django"}, "django"),
        ("redcount.django.drf", {"rest_framework"}, "django-drf"),
        ("redcount.rq", {"rq"}, "rq"),
        ("redcount.dramatiq", {"dramatiq"}, "dramatiq"),
    ],
)
def test_a_missing_extra_says_what_to_pip_install(module: str, blocked: set[str], extra: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", CHILD.format(module=module, blocked=sorted(blocked))],
        capture_output=True, text=True, timeout=60, check=True,
    ).stdout.strip()
    assert out.startswith("ImportError: "), out  # not a bare ModuleNotFoundError
    assert f"pip install 'redcount[{extra}]'" in out and "is missing" in out, out
