"""A pooled connection that failed mid-pipeline must never serve the next caller."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import redcount
from conftest import RedisServer

pytestmark = pytest.mark.redis_only


@pytest.fixture
def no_script_load_user(redis_server: RedisServer) -> Iterator[str]:
    """An ACL user that may run EVALSHA but not SCRIPT LOAD."""
    admin = redcount.connect(redis_server.url)
    admin.execute("ACL", "SETUSER", "noload", "on", ">pw", "~*", "+@all", "-script")
    try:
        yield f"redis://noload:pw@127.0.0.1:{redis_server.port}/0"
    finally:
        admin.execute("ACL", "DELUSER", "noload")
        admin.close()


def test_failed_script_reload_does_not_leave_replies_on_the_connection(
    redis_server: RedisServer, no_script_load_user: str
) -> None:
    admin = redcount.connect(redis_server.url)
    admin.execute("FLUSHALL")
    admin.execute("SCRIPT", "FLUSH")
    # One connection, so a poisoned one would be reused by the very next call.
    store = redcount.connect(no_script_load_user, max_connections=1)
    counter = redcount.FixedWindowCounter(store, "hyg", 3600)
    with pytest.raises(redcount.ScriptError, match="could not load script"):
        counter.incr("k")  # EVALSHA -> NOSCRIPT -> SCRIPT LOAD refused by the ACL
    assert counter.get("k") == 0  # read on a fresh connection: nothing stale, nothing counted
    assert store.execute("PING") == "PONG"
    admin.execute("SET", "plain", "v")
    assert store.execute("GET", "plain") == b"v"
    store.close()
    admin.close()


def test_raw_evalsha_of_an_unknown_script_is_a_reply_error(redis_store: redcount.Store) -> None:
    with pytest.raises(redcount.ReplyError, match="NOSCRIPT"):
        redis_store.execute("EVALSHA", "0" * 40, 0)
    assert redis_store.execute("PING") == "PONG"


def test_a_restart_does_not_cost_the_next_command(redis_factory: Callable[..., RedisServer]) -> None:
    """A pooled connection idle for over a second is checked before use (a peek, nothing
    sent), so after a server restart the next command goes out on a fresh connection."""
    server = redis_factory()
    store = redcount.connect(server.url, max_connections=1)
    counter = redcount.FixedWindowCounter(store, "restart", 3600)
    assert counter.incr("k") == 1
    server.stop()
    server.start()
    time.sleep(1.2)  # the documented idle threshold is 1 s; this is not a readiness wait
    assert counter.incr("k") == 1  # the restarted server is empty; no error on the stale socket
    store.close()
