"""A key's state under a hash tag (``tag=``): hit, test, stats, reset, refund, reserve and
settle (the Limiter's and the Reservation's) all act on exactly the state that
``hit(..., tag=t)`` and ``hit_all(..., tag=t)`` charge, and never on the key's untagged
state or its state under another tag; sync and async, on memory:// and a real Redis."""

from __future__ import annotations

import asyncio

import pytest
import redcount
import redcount.aio as aio
from helpers import all_keys
from redcount.limiter import Strategy

RATE: list[Strategy] = ["fixed-window", "sliding-window", "sliding-window-approx", "token-bucket", "gcra"]


def count(lim: redcount.Limiter, limit: str, key: str, tag: str | None = None) -> int:
    return lim.stats(limit, key, tag=tag)[0].count


@pytest.mark.parametrize("strategy", RATE)
@pytest.mark.usefixtures("away_from_hour_boundary")
def test_hit_with_a_tag_charges_the_state_hit_all_charges(store: redcount.Store, strategy: Strategy) -> None:
    lim = redcount.Limiter(store, strategy, prefix="t")
    assert lim.hit("5/hour", "u", 2, tag="acme")
    assert lim.hit_all([("5/hour", "u")], tag="acme")
    assert count(lim, "5/hour", "u", "acme") == 3
    assert lim.test("5/hour", "u", tag="acme").remaining == 2
    assert count(lim, "5/hour", "u") == 0 and lim.test("5/hour", "u").remaining == 5
    assert count(lim, "5/hour", "u", "other") == 0
    # Every storage key is under the tag.
    keys = [k.decode() for k in all_keys(store)]
    assert keys and all(":@{acme}:" in k for k in keys), keys


@pytest.mark.parametrize("strategy", RATE)
@pytest.mark.usefixtures("away_from_hour_boundary")
def test_refund_with_a_tag_gives_back_to_the_tagged_state(store: redcount.Store, strategy: Strategy) -> None:
    lim = redcount.Limiter(store, strategy)
    for _ in range(3):
        assert lim.hit("3/hour", "u", tag="acme")
        assert lim.hit("3/hour", "u")
    assert not lim.hit("3/hour", "u", tag="acme")
    r = lim.refund("3/hour", "u", 2, tag="acme", request_id="r1")
    assert r.applied and r.units == 2 and r.decision.remaining == 2
    assert lim.refund("3/hour", "u", 2, tag="acme", request_id="r1").duplicate
    assert count(lim, "3/hour", "u", "acme") == 1
    assert count(lim, "3/hour", "u") == 3  # untouched
    # The same request id without the tag is another marker, on the untagged state.
    plain = lim.refund("3/hour", "u", 1, request_id="r1")
    assert plain.applied and plain.units == 1
    assert count(lim, "3/hour", "u") == 2 and count(lim, "3/hour", "u", "acme") == 1
    # Without the tag a refund does not touch the tagged state.
    lim.refund("3/hour", "u", 5)
    assert count(lim, "3/hour", "u", "acme") == 1


@pytest.mark.parametrize("strategy", RATE)
@pytest.mark.usefixtures("away_from_hour_boundary")
def test_reserve_and_settle_with_a_tag(store: redcount.Store, strategy: Strategy) -> None:
    lim = redcount.Limiter(store, strategy)
    assert lim.hit_all([("100/hour", "t"), ("1000/hour", "org")], 10, tag="org")
    r = lim.reserve("100/hour", "t", 40, request_id="call-1", tag="org")
    assert r and r.tag == "org" and r.remaining == 50
    assert count(lim, "100/hour", "t", "org") == 50 and count(lim, "100/hour", "t") == 0
    # Settling without the tag finds no such reservation and changes nothing.
    assert lim.settle("100/hour", "t", request_id="call-1", actual=5).status == "expired"
    assert lim.settle("100/hour", "t", request_id="call-1", actual=5, tag="other").status == "expired"
    assert count(lim, "100/hour", "t", "org") == 50
    s = r.settle(15)  # the reservation keeps to its tag
    assert s.applied and s.units == 25 and s.decision.remaining == 75
    assert count(lim, "100/hour", "t", "org") == 25
    assert lim.settle("100/hour", "t", request_id="call-1", actual=15, tag="org").duplicate
    # From another process: the Limiter's settle with the same tag.
    r2 = lim.reserve("100/hour", "t", 10, request_id="call-2", tag="org")
    assert r2 and count(lim, "100/hour", "t", "org") == 35
    assert lim.settle("100/hour", "t", request_id="call-2", actual=30, tag="org").units == -20
    assert count(lim, "100/hour", "t", "org") == 55
    assert count(lim, "100/hour", "t") == 0


@pytest.mark.parametrize("strategy", RATE)
@pytest.mark.usefixtures("away_from_hour_boundary")
def test_reset_with_a_tag_forgets_only_the_tagged_state(store: redcount.Store, strategy: Strategy) -> None:
    lim = redcount.Limiter(store, strategy)
    assert lim.hit("5/hour", "u", 2, tag="acme")
    assert lim.hit("5/hour", "u", 3)
    assert lim.hit("5/hour", "u", 1, tag="other")
    lim.reset("5/hour", "u", tag="acme")
    assert count(lim, "5/hour", "u", "acme") == 0
    assert count(lim, "5/hour", "u") == 3 and count(lim, "5/hour", "u", "other") == 1
    lim.reset("5/hour", "u")
    assert count(lim, "5/hour", "u") == 0 and count(lim, "5/hour", "u", "other") == 1


def test_tag_errors(store: redcount.Store) -> None:
    lim = redcount.Limiter(store)
    for call in (
        lambda: lim.hit("5/hour", "u", tag="a{b"),
        lambda: lim.stats("5/hour", "u", tag="a}b"),
        lambda: lim.reset("5/hour", "u", tag="{"),
        lambda: lim.refund("5/hour", "u", tag="x}"),
        lambda: lim.reserve("5/hour", "u", 1, tag="{x"),
        lambda: lim.settle("5/hour", "u", request_id="r", actual=1, tag="}"),
    ):
        with pytest.raises(redcount.InvalidInputError, match="tag"):
            call()
    with pytest.raises(redcount.InvalidInputError, match="lease= and tag="):
        lim.hit("5/hour", "u", lease=2, tag="a")
    cc = redcount.Limiter(store, "concurrency")
    with pytest.raises(redcount.InvalidInputError, match="tag= is not available"):
        cc.hit("2/minute", "u", tag="a")
    assert all_keys(store) == []


@pytest.mark.usefixtures("away_from_hour_boundary")
def test_a_refusal_cache_keeps_tagged_and_untagged_states_apart(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, refusal_cache=100)
    for _ in range(2):
        assert lim.hit("2/hour", "u", tag="acme")
    assert not lim.hit("2/hour", "u", tag="acme")  # cached for the tagged state only
    assert lim.hit("2/hour", "u")
    assert lim.refund("2/hour", "u", tag="acme").units == 1  # drops the tagged entry
    assert lim.hit("2/hour", "u", tag="acme")
    assert not lim.hit("2/hour", "u", tag="acme")
    lim.reset("2/hour", "u", tag="acme")
    assert lim.hit("2/hour", "u", tag="acme")
    # hit_all under a tag files its refusals apart too.
    assert lim.hit_all([("2/hour", "v")], 2, tag="acme")
    assert not lim.hit_all([("2/hour", "v")], tag="acme")
    assert lim.hit("2/hour", "v") and lim.hit_all([("2/hour", "v")])
    assert not lim.hit_all([("2/hour", "v")], tag="acme")


@pytest.mark.parametrize("strategy", RATE)
def test_async_tagged_state(store: redcount.Store, strategy: Strategy) -> None:
    async def main() -> None:
        lim = aio.Limiter(store, strategy)
        assert await lim.hit("5/day", "a", 3, tag="g")
        assert (await lim.test("5/day", "a", tag="g")).remaining == 2
        assert (await lim.stats("5/day", "a", tag="g"))[0].count == 3
        assert (await lim.stats("5/day", "a"))[0].count == 0
        r = await lim.refund("5/day", "a", 1, request_id="x", tag="g")
        assert r.applied and r.units == 1
        res = await lim.reserve("5/day", "a", 3, request_id="y", tag="g")
        assert res and res.tag == "g" and res.remaining == 0
        assert (await lim.settle("5/day", "a", request_id="y", actual=1)).status == "expired"
        s = await res.settle(1)
        assert s.applied and s.units == 2 and s.decision.remaining == 2
        assert (await lim.stats("5/day", "a", tag="g"))[0].count == 3
        await lim.reset("5/day", "a", tag="g")
        assert (await lim.stats("5/day", "a", tag="g"))[0].count == 0

    asyncio.run(main())
