"""A store's repr has no space (tools that wrap reprs in tables keep it whole), names the URL
and never the password."""

from __future__ import annotations

import redcount
from conftest import RedisServer


def test_memory_store_repr() -> None:
    with redcount.connect() as s:
        assert repr(s) == "<redcount.Store:memory://>"


def test_every_store_class_has_the_same_repr(redis_server: RedisServer) -> None:
    url = f"redis://:s3cret@127.0.0.1:{redis_server.port}/0"
    for store in (
        redcount.connect(url),
        redcount.connect(url, budget=0.5, fallback="memory://"),  # a ResilientStore
        redcount.connect(url, hot_keys=redcount.HotKeys()),  # a HotKeysStore
    ):
        r = repr(store)
        assert r == f"<redcount.Store:redis://127.0.0.1:{redis_server.port}/0>", r
        assert " " not in r and "s3cret" not in r
        store.close()
