"""The counter service's increment body: no body counts 1 (documented); a JSON ``null`` and
an empty body sent as JSON are refused with a problem response and write nothing, instead of
counting 1 as if no body had been sent."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
import redcount

API = "/api/v1/counters"
JSON = {"Content-Type": "application/json"}


def post(app: Any, path: str, **kwargs: Any) -> httpx.Response:
    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://svc") as c:
            return await c.post(path, **kwargs)

    return asyncio.run(run())


@pytest.mark.parametrize(
    ("kwargs", "status", "error", "detail"),
    [
        pytest.param({"content": b"null", "headers": JSON}, 422, "invalid_body", "got null", id="null"),
        pytest.param({"content": b" null\n", "headers": JSON}, 422, "invalid_body", "got null", id="null-spaced"),
        pytest.param({"content": b"", "headers": JSON}, 400, "invalid_json", "empty", id="empty-as-json"),
        pytest.param(
            {"content": b"", "headers": {"Content-Type": "application/json; charset=utf-8"}},
            400, "invalid_json", "empty", id="empty-as-json-charset",
        ),
    ],
)
def test_null_or_empty_json_body_is_refused_and_writes_nothing(
    kwargs: dict[str, Any], status: int, error: str, detail: str
) -> None:
    from redcount.service import create_app

    with redcount.connect() as store:
        app = create_app(store)
        r = post(app, f"{API}/k/increment", **kwargs)
        assert r.status_code == status, r.text
        assert r.headers["content-type"].startswith("application/problem+json")
        assert r.json()["error"] == error and detail in r.json()["detail"], r.json()
        assert redcount.ShardedCounter(store, "k").value() == 0


def test_no_body_and_an_empty_object_still_count_one() -> None:
    from redcount.service import create_app

    with redcount.connect() as store:
        app = create_app(store)
        assert post(app, f"{API}/k/increment").status_code == 200
        assert post(app, f"{API}/k/increment", content=b"", headers={"Content-Type": "text/plain"}).status_code == 200
        assert post(app, f"{API}/k/increment", json={}).status_code == 200
        assert post(app, f"{API}/k/increment", json={"delta": 3}).status_code == 200
        assert redcount.ShardedCounter(store, "k").value() == 6
