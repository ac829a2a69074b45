"""FastAPI route limits declared without ``name=`` are named after their route (as Flask
names them after the view), so two routes with the same limit advertise two policies that a
client can tell apart, not one name for two separate counts."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import redcount
import redcount.aio
from fastapi import Depends, FastAPI
from redcount.fastapi import RateLimiter, RateLimitMiddleware


def get(app: Any, *paths: str) -> list[httpx.Response]:
    async def main() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app, client=("198.51.100.7", 40000))
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as c:
            return [await c.get(p) for p in paths]

    return asyncio.run(main())


def test_two_routes_with_the_same_limit_have_their_own_policy_names() -> None:
    rl = RateLimiter(redcount.aio.Limiter(redcount.connect()), default="1000/minute")
    app = FastAPI()
    app.add_middleware(RateLimitMiddleware, ratelimiter=rl)

    @app.get("/search", dependencies=[Depends(rl.limit("5/minute"))])
    async def search() -> dict[str, str]:
        return {}

    @app.get("/export", dependencies=[Depends(rl.limit("5/minute"))])
    def export() -> dict[str, str]:
        return {}

    @app.get("/multi", dependencies=[Depends(rl.limit("5/second;100/hour"))])
    async def multi() -> dict[str, str]:
        return {}

    @app.get("/named", dependencies=[Depends(rl.limit("5/minute", name="mine"))])
    async def named() -> dict[str, str]:
        return {}

    @app.get("/dynamic", dependencies=[Depends(rl.limit(lambda req: "7/minute"))])
    async def dynamic() -> dict[str, str]:
        return {}

    s, e, s2, m, n, d = get(app, "/search", "/export", "/search", "/multi", "/named", "/dynamic")
    assert s.headers["ratelimit-policy"] == '"default";q=1000;w=60, "search";q=5;w=60'
    assert e.headers["ratelimit-policy"] == '"default";q=1000;w=60, "export";q=5;w=60'
    assert s.headers["ratelimit"].startswith('"search";r=4;') and e.headers["ratelimit"].startswith('"export";r=4;')
    assert s2.headers["ratelimit"].startswith('"search";r=3;')  # separate counts, as the names say
    assert m.headers["ratelimit-policy"] == '"default";q=1000;w=60, "multi-1s";q=5;w=1, "multi-3600s";q=100;w=3600'
    assert n.headers["ratelimit-policy"] == '"default";q=1000;w=60, "mine";q=5;w=60'
    assert d.headers["ratelimit-policy"] == '"default";q=1000;w=60, "dynamic";q=7;w=60'
