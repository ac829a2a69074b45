"""Escalating penalties (Limiter(penalty=redcount.Penalty(...))) and Limiter.unblock: on
memory:// with a manual clock, and on a real Redis server, sync and async."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
import redcount
import redcount.aio as aio
from helpers import all_keys

PEN = redcount.Penalty(after=3, within=60, block=60, factor=2, max_block=200)


def refuse(lim: redcount.Limiter, n: int, key: str = "k", limit: str = "1/hour") -> list[redcount.Decision]:
    return [lim.hit(limit, key) for _ in range(n)]


@pytest.mark.parametrize("strategy", ["fixed-window", "sliding-window", "token-bucket", "gcra"])
def test_blocks_escalate_and_end(clock_store: redcount.Store, clock: redcount.ManualClock, strategy: str) -> None:
    lim = redcount.Limiter(clock_store, strategy, penalty=PEN)  # type: ignore[arg-type]
    assert lim.hit("1/hour", "k")
    two = refuse(lim, 2)
    assert not any(two) and all(d.retry_after > 60 for d in two)  # the limit's own refusals
    third = lim.hit("1/hour", "k")
    assert not third and third.retry_after == 60.0 and third.remaining == 0 and third.limit == 1
    clock.advance(20)
    during = refuse(lim, 10)  # refused by the block; they do not count
    assert all(not d and d.retry_after == pytest.approx(40.0, abs=0.01) for d in during)
    clock.advance(40.5)
    # The block is over; the limit still refuses, and the count restarted when the block began.
    d = refuse(lim, 2)
    assert not any(d) and all(x.retry_after > 60 for x in d)
    second_block = lim.hit("1/hour", "k")  # within `within` of the last block's end: twice as long
    assert not second_block and second_block.retry_after == 120.0
    clock.advance(121)
    assert lim.hit("1/hour", "k").retry_after > 120  # not blocked
    refuse(lim, 1)
    assert lim.hit("1/hour", "k").retry_after == 200.0  # 240, capped at max_block
    clock.advance(200 + 61)  # past `within` after the block's end: back to `block`
    refuse(lim, 2)
    assert lim.hit("1/hour", "k").retry_after == 60.0


def test_a_blocked_key_is_not_charged_and_test_does_not_count(clock_store: redcount.Store,
                                                              clock: redcount.ManualClock) -> None:
    lim = redcount.Limiter(clock_store, "fixed-window", penalty=redcount.Penalty(after=2, within=60, block=600))
    assert lim.hit("2/minute", "k") and lim.hit("2/minute", "k")
    for _ in range(5):
        assert not lim.test("2/minute", "k")  # tests never count
    assert not lim.hit("2/minute", "k")
    assert lim.hit("2/minute", "k").retry_after == 600.0  # the second refusal starts the block
    clock.advance(120)  # the limit's window is over; the block is not
    blocked = lim.hit("2/minute", "k")
    assert not blocked and blocked.retry_after == 480.0
    assert not lim.test("2/minute", "k")
    assert lim.stats("2/minute", "k")[0].count == 0  # nothing charged during the block
    assert lim.hit("2/minute", "other")  # other keys are not affected


def test_unblock_clears_every_limit_and_penalty_state(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, penalty=redcount.Penalty(after=1, within=60, block=300), prefix="p")
    other = redcount.Limiter(store, "sliding-window", prefix="p")
    assert lim.hit("1/hour", "user:1") and other.hit("5/minute", "user:1") and lim.hit("1/hour", "user:2")
    blocked = lim.hit("1/hour", "user:1")
    assert not blocked and blocked.retry_after == 300.0
    keys = all_keys(store, "p:pen:*")
    assert keys and all(store.execute("PTTL", k) > 0 for k in keys)  # every key expires
    assert lim.unblock("user:1") >= 3  # the block, the escalation, two limits' states
    assert all_keys(store, "p:*{user:1}*") == []
    assert lim.hit("1/hour", "user:1")  # usage and block are gone
    assert not lim.hit("1/hour", "user:2")  # other keys keep theirs
    assert lim.unblock("nobody") == 0
    assert redcount.Limiter(store, prefix="p").unblock("user:2") >= 1  # without a penalty too


def test_unblock_frees_concurrency_slots(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, "concurrency", prefix="c")
    assert lim.acquire(1, "job:1") is not None and lim.acquire(1, "job:1") is None
    assert lim.unblock("job:1") == 1
    assert lim.in_flight("job:1") == 0 and lim.acquire(1, "job:1") is not None


def test_unblock_matches_keys_literally(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, penalty=PEN)
    assert lim.hit("1/hour", "a*") and lim.hit("1/hour", "ab") and lim.hit("1/hour", "}x")
    assert lim.unblock("a*") == 1
    assert not lim.hit("1/hour", "ab")
    assert lim.unblock("}x") == 1 and lim.hit("1/hour", "}x")


def test_refusal_cache_keeps_blocks_and_every_refusal_counts(clock_store: redcount.Store,
                                                            clock: redcount.ManualClock) -> None:
    lim = redcount.Limiter(clock_store, penalty=PEN, refusal_cache=10)
    assert lim.hit("1/hour", "k")
    refuse(lim, 2)  # not cached: each must reach the penalty's count
    assert lim._core._refusal_cache == (0, 0)  # no refusal kept before a block, none answered
    assert lim.hit("1/hour", "k").retry_after == 60.0
    clock_store.close()
    clock.advance(30)
    d = lim.hit("1/hour", "k")  # the block, answered locally
    assert not d and d.retry_after == pytest.approx(30.0, abs=0.01)
    lim._core._forget("k")
    with pytest.raises(redcount.StoreClosed):
        lim.hit("1/hour", "k")


def test_hit_all_counts_the_refusing_key(clock_store: redcount.Store) -> None:
    lim = redcount.Limiter(clock_store, penalty=redcount.Penalty(after=2, within=60, block=90))
    items = [("100/hour", "org"), ("1/hour", "user")]
    assert lim.hit_all(items)
    assert not lim.hit_all(items)
    blocked = lim.hit_all(items)
    assert not blocked and blocked.retry_after == 90.0
    assert not lim.hit("100/hour", "user") and lim.hit("100/hour", "org")  # only "user" is blocked
    assert not lim.test_all([("100/hour", "user")])


@pytest.mark.parametrize(
    "kw",
    [{"after": 0}, {"within": 0}, {"block": -1}, {"factor": 0.5}, {"max_block": 10}, {"block": float("nan")},
     {"after": True}],
)
def test_bad_penalties(kw: dict[str, object]) -> None:
    with pytest.raises(redcount.InvalidInputError, match=next(iter(kw))):
        redcount.Penalty(**kw)  # type: ignore[arg-type]


def test_async_twin(store: redcount.Store) -> None:
    async def main() -> None:
        lim = aio.Limiter(store, penalty=redcount.Penalty(after=2, within=60, block=30))
        assert await lim.hit("1/hour", "k")
        assert not await lim.hit("1/hour", "k")
        blocked = await lim.hit("1/hour", "k")
        assert not blocked and blocked.retry_after == 30.0
        again = await lim.hit("1/hour", "k")
        assert not again and 0 < again.retry_after <= 30.0
        assert not await lim.hit_all([("1/hour", "k")])
        assert not lim.sync.hit("1/hour", "k")  # one state, seen from both twins
        assert await lim.unblock("k") >= 2
        assert await lim.hit("1/hour", "k")

    asyncio.run(main())


def test_the_script_and_its_twin_agree(store: redcount.Store) -> None:
    """penalty.lua on Redis and its native twin on memory://, from the same inputs."""
    from redcount import _core

    keys = ["t:pen:{k}:b", "t:pen:{k}:n", "t:pen:{k}:l"]
    args = ["2", "60000", "1000", "2.0", "3000"]
    assert _core._penalty(store, keys, args) == [0, 0]
    assert _core._penalty(store, keys, args) == [1000, 1]  # the 2nd refusal starts a block
    left, started = _core._penalty(store, keys, args)  # a refusal during the block: not counted
    assert 0 < left <= 1000 and started == 0
    assert store.execute("GET", keys[1]) is None and store.execute("GET", keys[2]) == b"1000"
    assert 1000 < store.execute("PTTL", keys[2]) <= 61000
    store.execute("DEL", keys[0])  # as if the block had ended
    assert _core._penalty(store, keys, args) == [0, 0]
    assert _core._penalty(store, keys, args) == [2000, 1]  # soon after the last: twice as long
    store.execute("DEL", keys[0])
    store.execute("SET", keys[2], "2500")
    _core._penalty(store, keys, args)
    assert _core._penalty(store, keys, args) == [3000, 1]  # capped
    for bad in (["2", "60000", "1000", "0.5", "3000"], ["x", "1", "1", "1", "1"], ["2", "60000", "1000", "2.0"]):
        with pytest.raises(redcount.ReplyError, match="malformed"):
            _core._penalty(store, ["t:pen:{j}:b", "t:pen:{j}:n", "t:pen:{j}:l"], bad)


@pytest.mark.redis_only
def test_a_store_failure_is_decided_by_on_unavailable(redis_factory: Callable[..., Any]) -> None:
    server = redis_factory()
    store = redcount.connect(server.url, command_timeout=0.5, breaker=False)
    try:
        allow = redcount.Limiter(store, penalty=PEN, on_unavailable="allow")
        deny = redcount.Limiter(store, penalty=PEN, on_unavailable="deny")
        strict = redcount.Limiter(store, penalty=PEN)
        assert allow.hit("1/hour", "k")
        server.stop()
        d = allow.hit("1/hour", "k")
        assert d and d.unavailable
        assert not deny.hit("1/hour", "k") and deny.hit("1/hour", "k").unavailable
        with pytest.raises(redcount.ConnectionError):
            strict.hit("1/hour", "k")

        async def main() -> None:
            a = aio.Limiter.from_sync(allow)
            assert (await a.hit("1/hour", "k")).unavailable

        asyncio.run(main())
    finally:
        store.close()


# The bounds the penalty script accepts (whole ms from 1 to 2^42, factor 1..10^6,
# max_block >= block): a Penalty outside them is refused when it is made, naming the field,
# rather than making every refusal of the limiter raise a script error.
SPAN_MAX = 2**42 / 1000  # seconds


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"factor": 2e6}, "factor"),
        ({"factor": 1e6 + 1}, "factor"),
        ({"within": SPAN_MAX + 0.001}, "within"),
        ({"block": SPAN_MAX + 0.001, "max_block": SPAN_MAX + 0.001}, "block"),
        ({"max_block": SPAN_MAX + 0.001}, "max_block"),
        ({"within": 0.0005}, "within"),
        ({"block": 0.0009}, "block"),
        ({"within": float("inf")}, "within"),
        ({"factor": "2"}, "factor"),
    ],
)
def test_out_of_range_penalties_are_refused_when_made(kw: dict[str, object], field: str) -> None:
    with pytest.raises(redcount.InvalidInputError, match=rf"Penalty\({field}=\)") as e:
        redcount.Penalty(**kw)  # type: ignore[arg-type]
    if isinstance(kw[field], float) and kw[field] != float("inf"):
        assert "between" in str(e.value)  # a number out of range: the message gives the range


def test_a_block_below_its_cap_in_whole_ms_is_refused() -> None:
    # 1.0005 s and 1.0009 s are both 1000 ms as the script gets them: equal is fine...
    redcount.Penalty(block=1.0009, max_block=1.0005)
    # ...below is not.
    with pytest.raises(redcount.InvalidInputError, match=r"Penalty\(max_block=\)"):
        redcount.Penalty(block=2.0, max_block=1.999)


def test_a_penalty_at_the_bounds_blocks_on_both_stores(store: redcount.Store) -> None:
    """The largest settings the constructor accepts are ones the script accepts: a refusal
    counts and starts a block instead of raising a script error."""
    penalty = redcount.Penalty(after=1, within=SPAN_MAX, block=1.0, factor=1e6, max_block=SPAN_MAX)
    lim = redcount.Limiter(store, penalty=penalty)
    assert lim.hit("1/hour", "k")
    refused = lim.hit("1/hour", "k")  # the first refusal starts a 1 s block
    assert not refused
    blocked = lim.hit("1/hour", "k")
    assert not blocked and 0 < blocked.retry_after <= 1.0
    tiny = redcount.Limiter(store, prefix="tiny", penalty=redcount.Penalty(after=1, within=0.001, block=0.001,
                                                                            factor=1, max_block=0.001))
    assert tiny.hit("1/hour", "k")
    assert not tiny.hit("1/hour", "k")
