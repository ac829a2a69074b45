"""Every Python example of the documentation (docs/*.md and README.md) runs as written.

A fenced ``python`` block is an example when the line before it (blank lines aside) is a
marker comment, the convention docs/development.md describes:

    <!-- run: memory redis -->        run it once per store named (memory://, a real Redis)
    <!-- no-run: why -->              shown, never run (a signature, a fragment)

The marker's comment may carry hidden set-up lines after its first line, and a
``<!-- check ... -->`` comment right after the block may carry hidden assertions; both run in
the example's namespace; a check also sees ``printed`` (the lines the block printed) and
``source`` (the block's code as run, e.g. to run it again as a pytest module). Every
``redis://host:port/db`` URL of the block is pointed at the session's redis-server (one
database per distinct host) or replaced by ``memory://``. Every
python block must carry one of the two markers, so an example cannot silently stop running.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import inspect
import io
import logging
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redcount

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
FILES = sorted((ROOT / "docs").rglob("*.md")) + [ROOT / "README.md"]
STORES = ("memory", "redis")
URL = re.compile(r"redis://([A-Za-z0-9.\-]+)(?::\d+)?/\d+")


@dataclass
class Example:
    path: Path
    line: int  # 1-based line of the opening fence
    stores: tuple[str, ...]
    setup: str
    code: str
    check: str

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def _comment(lines: list[str], i: int) -> tuple[str, str, int]:
    """The HTML comment opening at lines[i]: (first line, the other lines, next index)."""
    text = lines[i].strip()[len("<!--"):]
    body: list[str] = []
    if text.rstrip().endswith("-->"):
        return text.rstrip()[:-3].strip(), "", i + 1
    first = text.strip()
    j = i + 1
    while "-->" not in lines[j]:
        body.append(lines[j])
        j += 1
    tail = lines[j].split("-->")[0]
    if tail.strip():
        body.append(tail)
    return first, textwrap.dedent("\n".join(body)), j + 1


def collect(path: Path) -> tuple[list[Example], list[str]]:
    """The examples of one file, and the problems found (an unmarked python block, a marker
    not followed by one)."""
    lines = path.read_text().splitlines()
    examples: list[Example] = []
    problems: list[str] = []
    marker: tuple[str, str, int] | None = None
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped.startswith("<!-- run:") or stripped.startswith("<!-- no-run:"):
            first, body, nxt = _comment(lines, i)
            marker = (first, body, i + 1)
            i = nxt
            continue
        if stripped.startswith("```python"):
            indent = len(lines[i]) - len(lines[i].lstrip())
            start = i
            j = i + 1
            while lines[j].strip() != "```":
                j += 1
            code = textwrap.dedent("\n".join(l[indent:] if l[:indent].isspace() else l for l in lines[i + 1 : j]))
            i = j + 1
            if marker is None:
                problems.append(f"{path.relative_to(ROOT)}:{start + 1}: python block without a run/no-run marker")
                continue
            first, setup, _ = marker
            marker = None
            if first.startswith("no-run:"):
                continue
            stores = tuple(first[len("run:"):].split())
            bad = [s for s in stores if s not in STORES]
            if not stores or bad:
                problems.append(f"{path.relative_to(ROOT)}:{start + 1}: unknown stores {bad or 'none'}")
                continue
            k = i
            while k < len(lines) and not lines[k].strip():
                k += 1
            check = ""
            if k < len(lines) and lines[k].strip().startswith("<!-- check"):
                _, check, i = _comment(lines, k)
            examples.append(Example(path, start + 1, stores, setup, code, check))
            continue
        if stripped and marker is not None:
            problems.append(f"{path.relative_to(ROOT)}:{marker[2]}: marker not followed by a python block")
            marker = None
        i += 1
    return examples, problems


def all_examples() -> tuple[list[Example], list[str]]:
    examples: list[Example] = []
    problems: list[str] = []
    for f in FILES:
        e, p = collect(f)
        examples += e
        problems += p
    return examples, problems


EXAMPLES, PROBLEMS = all_examples()
CASES = [
    pytest.param(ex, store, id=f"{ex.name}[{store}]", marks=[pytest.mark.redis_only] if store == "redis" else [])
    for ex in EXAMPLES
    for store in ex.stores
]


def test_every_python_block_is_marked() -> None:
    assert not PROBLEMS, "\n".join(PROBLEMS)
    assert len(EXAMPLES) >= 30, [e.name for e in EXAMPLES]


def point_urls(code: str, store: str, redis_url: str | None) -> str:
    hosts: dict[str, int] = {}

    def repl(m: re.Match[str]) -> str:
        db = hosts.setdefault(m.group(1), len(hosts))
        if store == "memory":
            return "memory://"
        assert redis_url is not None
        return redis_url.rsplit("/", 1)[0] + f"/{db}"

    return URL.sub(repl, code)


def run_code(source: str, filename: str, namespace: dict[str, Any]) -> None:
    code = compile(source, filename, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    if code.co_flags & inspect.CO_COROUTINE:
        asyncio.run(eval(code, namespace))  # noqa: S307  (the documentation's own code)
    else:
        exec(code, namespace)  # noqa: S102


@pytest.mark.parametrize(("example", "store"), CASES)
def test_example_runs(example: Example, store: str, request: pytest.FixtureRequest, tmp_path: Path,
                      monkeypatch: pytest.MonkeyPatch) -> None:
    redis_url = None
    if store == "redis":
        server = request.getfixturevalue("redis_server")
        server.command("FLUSHALL")
        redis_url = server.url
    monkeypatch.chdir(tmp_path)  # files an example writes (SQLite databases) go here
    # A module name of its own per example and store: frameworks that register by qualified
    # name (Celery's tasks are shared by every app made later) must not see one name twice.
    module = "docs_example_" + re.sub(r"\W", "_", f"{example.name}_{store}")
    namespace: dict[str, Any] = {"__name__": module, "redis_url": redis_url, "store_kind": store}
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    out = io.StringIO()
    try:
        if example.setup:
            run_code(point_urls(example.setup, store, redis_url), f"{example.name} (set-up)", namespace)
        with contextlib.redirect_stdout(out):
            run_code(point_urls(example.code, store, redis_url), example.name, namespace)
        namespace["printed"] = out.getvalue().splitlines()
        namespace["source"] = point_urls(example.code, store, redis_url)
        if example.check:
            run_code(point_urls(example.check, store, redis_url), f"{example.name} (check)", namespace)
    finally:
        root.handlers[:] = handlers  # an example's logging.basicConfig() is for the reader's app
        root.setLevel(level)
        for value in list(namespace.values()):
            if isinstance(value, (redcount.Store, redcount.ResilientStore)):
                value.close()
