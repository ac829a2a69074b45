"""Allow and deny lists (keys, IPv4 and IPv6 CIDRs) on Limiter and redcount.aio.Limiter:
decided without the store, on memory:// and a real Redis server."""

from __future__ import annotations

import asyncio
import ipaddress

import pytest
import redcount
import redcount.aio as aio
from helpers import all_keys
from redcount.policies import DENIED_RETRY_AFTER, AccessLists

ALLOW = ["user:admin", "10.0.0.0/8", "2001:db8::/32", ipaddress.ip_address("192.0.2.7")]
DENY = ["user:spam", "203.0.113.0/24", "10.9.0.0/16", "2001:db8:bad::/48"]


def test_lookup_by_key_and_cidr() -> None:
    lists = AccessLists(ALLOW, DENY)
    assert lists.lookup("user:admin") is True
    assert lists.lookup(b"user:spam") is False
    assert lists.lookup("user:42") is None
    assert lists.lookup("10.1.2.3") is True
    assert lists.lookup("10.9.2.3") is False  # the longer prefix wins
    assert lists.lookup("ip:10.1.2.3") is True  # "<prefix>:<address>"
    assert lists.lookup("203.0.113.200") is False
    assert lists.lookup("192.0.2.7") is True and lists.lookup("192.0.2.8") is None
    assert lists.lookup("2001:db8::1") is True
    assert lists.lookup("ip:2001:db8:bad::1") is False
    assert lists.lookup("2001:db8:bad:1::/64") is False  # a network the web layer groups clients into
    assert lists.lookup("2001:db9::1") is None
    assert lists.lookup("::ffff:10.1.2.3") is None  # IPv6 never matches an IPv4 entry
    # A tie between allow and deny: deny wins.
    assert AccessLists(allow=["k", "10.0.0.0/8"], deny=["k", "10.0.0.0/8"]).lookup("k") is False
    assert AccessLists(allow=["10.0.0.0/8"], deny=["10.0.0.0/8"]).lookup("10.0.0.1") is False


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ("10.0.0.1/8", "10.0.0.1/8"),
        ("10.0.0.0/33", "10.0.0.0/33"),
        ("2001:db8::/129", "2001:db8::/129"),
        (42, "42"),
        (None, "None"),
        ("", "empty"),
    ],
)
def test_bad_entries_are_named(memory_store: redcount.Store, entry: object, message: str) -> None:
    with pytest.raises(redcount.InvalidInputError, match=message):
        redcount.Limiter(memory_store, allow=[entry])  # type: ignore[list-item]
    with pytest.raises(redcount.InvalidInputError, match="deny"):
        redcount.Limiter(memory_store, deny=["ok", entry])  # type: ignore[list-item]
    with pytest.raises(redcount.InvalidInputError, match="single string"):
        redcount.Limiter(memory_store, allow="10.0.0.0/8")


@pytest.mark.parametrize("strategy", ["fixed-window", "sliding-window", "token-bucket", "gcra"])
def test_lists_decide_without_the_store(store: redcount.Store, strategy: str) -> None:
    lim = redcount.Limiter(store, strategy, allow=ALLOW, deny=DENY)  # type: ignore[arg-type]
    for _ in range(5):
        d = lim.hit("2/minute;10/hour", "10.1.2.3")
        assert d and d.limit == d.remaining == 2 and d.retry_after == 0 and not d.unavailable
    no = lim.hit("2/minute", "203.0.113.9")
    assert not no and no.remaining == 0 and no.retry_after == DENIED_RETRY_AFTER and not no.unavailable
    assert not lim.test("2/minute", "user:spam") and lim.test("2/minute", "user:admin")
    assert all_keys(store, "redcount:lim:*") == []  # nothing stored, no round trip needed
    # Keys on neither list go to the store as before.
    assert lim.hit("2/minute", "user:42") and lim.hit("2/minute", "user:42")
    assert not lim.hit("2/minute", "user:42")
    assert all_keys(store, "redcount:lim:*") != []


def test_no_round_trip_on_a_closed_store(memory_store: redcount.Store) -> None:
    lim = redcount.Limiter(memory_store, allow=["a"], deny=["b"])
    memory_store.close()
    assert lim.hit("1/minute", "a")
    assert not lim.hit("1/minute", "b")
    with pytest.raises(redcount.StoreClosed):
        lim.hit("1/minute", "c")


def test_hit_all_leaves_allowed_keys_out_and_a_denied_key_refuses(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, allow=["org:free"], deny=["key:revoked"])
    assert lim.hit_all([("1/minute", "org:free"), ("1/minute", "user:1")])
    assert lim.hit_all([("1/minute", "org:free"), ("5/minute", "user:2")])
    assert lim.stats("1/minute", "org:free")[0].count == 0  # never charged
    no = lim.hit_all([("1/minute", "org:free"), ("1/minute", "user:1")])
    assert not no and no.refused_by == ("1/minute", "user:1")
    denied = lim.hit_all([("5/minute", "user:3"), ("5/minute", "key:revoked")])
    assert not denied and denied.retry_after == DENIED_RETRY_AFTER
    assert lim.stats("5/minute", "user:3")[0].count == 0  # nothing charged: all or nothing
    assert lim.hit_all([("1/minute", "org:free")]) and lim.test_all([("1/minute", "org:free")])


def test_the_calls_stay_the_cores_with_or_without_lists(memory_store: redcount.Store) -> None:
    # The lists, the cache, a penalty and on_unavailable run in the core: no Python frame in
    # front of it, whatever is configured.
    plain = redcount.Limiter(memory_store)
    assert plain.hit == plain._core.hit
    listed = redcount.Limiter(memory_store, allow=["a"], refusal_cache=10, penalty=redcount.Penalty(),
                              on_unavailable="allow")
    assert listed.hit == listed._core.hit and listed.test == listed._core.test
    assert listed.hit("1/hour", "a") and listed.hit("1/hour", "a")  # allow-listed: never charged


def test_async_twin(store: redcount.Store) -> None:
    async def main() -> None:
        lim = aio.Limiter(store, allow=["10.0.0.0/8"], deny=["2001:db8::/32"])
        for _ in range(3):
            assert await lim.hit("1/minute", "10.0.0.1")
        assert not await lim.hit("1/minute", "2001:db8::5")
        assert not await lim.test("1/minute", "ip:2001:db8::5")
        assert await lim.hit("1/minute", "u") and not await lim.hit("1/minute", "u")
        assert not await lim.hit_all([("1/minute", "10.0.0.1"), ("1/minute", "2001:db8::1")])
        assert await lim.test_all([("1/minute", "10.0.0.1")])
        shared = aio.Limiter.from_sync(lim.sync)
        assert await shared.hit("1/minute", "10.0.0.2")

    asyncio.run(main())


def test_throttle_and_wait_go_through_the_lists(memory_store: redcount.Store) -> None:
    lim = redcount.Limiter(memory_store, allow=["github"], deny=["banned"])

    @lim.throttle("1/hour", key="github", max_wait=0)
    async def allowed() -> str:
        return "ok"

    @lim.throttle("1/hour", key="banned", max_wait=0)
    async def denied() -> str:
        return "never"

    async def main() -> None:
        for _ in range(3):
            assert await allowed() == "ok"  # allow-listed: never waits, never charged
        with pytest.raises(redcount.WaitTimeout):
            await denied()

    asyncio.run(main())
    assert lim.wait("1/hour", "github", max_wait=0)
    with pytest.raises(redcount.WaitTimeout):
        lim.wait("1/hour", "banned", max_wait=0)
