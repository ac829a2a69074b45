"""The extras bring what their documented set-up needs: resolved through the metadata of the
installed distributions, ``redcount[celery]`` includes the Redis transport's dependencies,
since docs/celery.md runs Celery on a Redis broker (``broker="redis://..."``), and
``redcount[rq]`` and ``redcount[dramatiq]`` bring redis-py, which docs/jobs.md's RQ queue
and Dramatiq ``RedisBroker`` need."""

from __future__ import annotations

import importlib.metadata
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[3]


def extra(name: str) -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["optional-dependencies"][name]]


def resolve(requirements: list[Requirement]) -> set[str]:
    """Every distribution the requirements pull in, following the installed distributions'
    own requirements and extras (environment markers evaluated here)."""
    seen: set[tuple[str, frozenset[str]]] = set()
    names: set[str] = set()
    todo = list(requirements)
    while todo:
        req = todo.pop()
        key = (canonicalize_name(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        names.add(key[0])
        for text in importlib.metadata.requires(req.name) or []:
            sub = Requirement(text)
            if sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in req.extras or {""}):
                todo.append(sub)
    return names


def test_the_celery_extra_brings_the_redis_transport() -> None:
    docs = (ROOT / "docs" / "celery.md").read_text()
    assert "pip install 'redcount[celery]'" in docs and 'broker="redis://' in docs
    brought = resolve(extra("celery"))
    transport = resolve([Requirement("kombu[redis]")])  # what kombu.transport.redis imports
    assert transport <= brought, f"redcount[celery] lacks {sorted(transport - brought)}"


def test_the_rq_and_dramatiq_extras_bring_redis_py() -> None:
    docs = (ROOT / "docs" / "jobs.md").read_text()
    assert "pip install 'redcount[rq]'" in docs and "pip install 'redcount[dramatiq]'" in docs
    assert "RedisBroker(" in docs
    for name in ("rq", "dramatiq"):
        assert "redis" in resolve(extra(name)), f"redcount[{name}] lacks redis-py"
