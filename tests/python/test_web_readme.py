"""The README's Flask and FastAPI sections are copy-paste code: run them as written (with the
Redis URL pointed at the test server) and send them requests."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import RedisServer

README = Path(__file__).resolve().parents[2] / "README.md"

pytestmark = pytest.mark.redis_only


def section_code(title: str) -> str:
    text = README.read_text()
    start = text.index(f"### {title}\n")
    block = re.search(r"```python\n(.*?)```", text[start:], re.S)
    assert block is not None
    return block.group(1)


def run_block(title: str, redis_server: RedisServer) -> dict[str, Any]:
    code = section_code(title).replace("redis://cache:6379/0", redis_server.url)
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(code, f"README {title}", "exec"), namespace)
    return namespace


def test_flask_section(redis_server: RedisServer) -> None:
    ns = run_block("Flask", redis_server)
    app = ns["app"]
    app.extensions["redcount"].limiter.store.execute("FLUSHALL")
    c = app.test_client()
    assert c.get("/search").status_code == 200
    assert c.post("/export?pages=2", headers={"X-API-Key": "k1"}).status_code == 200
    assert c.get("/reports/daily").status_code == 200
    assert c.get("/admin/stats").status_code == 200
    assert [c.get("/health").status_code for _ in range(3)] == [200] * 3
    r = c.get("/search")
    assert r.headers["RateLimit-Policy"].startswith('"search-60s";q=10;w=60')


def test_fastapi_section(redis_server: RedisServer) -> None:
    ns = run_block("FastAPI and Starlette", redis_server)
    ns["store"].execute("FLUSHALL")

    async def main() -> None:
        transport = httpx.ASGITransport(app=ns["app"])
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            r = await c.get("/search")
            assert r.status_code == 200
            assert r.headers["ratelimit-policy"] == '"default";q=1000;w=60, "search";q=5;w=1'
            assert (await c.get("/reports/daily")).status_code == 200

    asyncio.run(main())
    ns["store"].close()
