"""One decision across several keys (Limiter.hit_all / test_all, sync and async), and
limits whose amount is not part of the key (usage kept when a limit changes), on memory://
and a real Redis server."""

from __future__ import annotations

import asyncio

import pytest
import redcount
import redcount.aio as aio
from helpers import all_keys
from redcount.limiter import Strategy

RATE: list[Strategy] = ["fixed-window", "sliding-window", "sliding-window-approx", "token-bucket", "gcra"]
# Real-clock tests: "3/hour" refuses, and away_from_hour_boundary keeps the fixed windows
# from rolling over under them.
ITEMS = [("1000/day", "org:acme"), ("3/hour", "user:42"), ("10/second", "key:k1")]


@pytest.mark.parametrize("strategy", RATE)
@pytest.mark.usefixtures("away_from_hour_boundary")
def test_all_or_nothing_across_keys(store: redcount.Store, strategy: Strategy) -> None:
    lim = redcount.Limiter(store, strategy)
    for _ in range(3):
        d = lim.hit_all(ITEMS)
        assert d and d.refused_by is None
    before = {k: store.execute("TYPE", k) for k in all_keys(store, "redcount:lim:*")}
    assert len(before) == 3
    no = lim.hit_all(ITEMS)
    assert not no
    assert no.refused_by == ("3/hour", "user:42")
    assert no.limit == 3 and no.remaining == 0
    # The hour's wait; the approximate sliding window also waits, in the next hour, until
    # the previous hour's 3 hits weigh little enough (up to one more hour).
    longest = 7200.0 if strategy == "sliding-window-approx" else 3600.0
    assert 1.0 < no.retry_after <= longest
    # Nothing charged by the refusal: the other keys still show 3.
    assert lim.stats("1000/day", "org:acme")[0].count == 3
    t = lim.test_all(ITEMS)
    assert not t and t.refused_by == ("3/hour", "user:42")
    assert lim.test_all([("1000/day", "org:acme"), ("10/second", "key:k1")])
    assert lim.stats("1000/day", "org:acme")[0].count == 3  # a test charges nothing


@pytest.mark.parametrize("strategy", RATE)
def test_limit_sets_and_the_longest_wait(clock_store: redcount.Store, strategy: Strategy) -> None:
    lim = redcount.Limiter(clock_store, strategy)
    items = [("2/second;5/hour", "a"), ("1/10 seconds", "c"), ("1/minute", "b")]
    assert lim.hit_all(items)
    d = lim.hit_all(items)  # "c" and "b" refuse: the one that frees up last is named
    assert not d and d.refused_by == ("1/minute", "b")
    waits = [lim.test("1/10 seconds", "c").retry_after, lim.test("1/minute", "b").retry_after]
    assert d.retry_after == max(waits) and waits[0] < waits[1]
    assert lim.stats("2/second;5/hour", "a")[0].count == 1


@pytest.mark.parametrize("strategy", RATE)
def test_a_tag_puts_every_key_under_it(store: redcount.Store, strategy: Strategy) -> None:
    lim = redcount.Limiter(store, strategy, prefix="tagged")
    assert lim.hit_all(ITEMS, tag="acme")
    keys = all_keys(store, "tagged:*")
    assert len(keys) == 3 and all(b":@{acme}:{" in k for k in keys), keys
    # Separate from the untagged state of the same keys.
    assert lim.stats("3/hour", "user:42")[0].count == 0


@pytest.mark.parametrize("strategy", RATE)
@pytest.mark.usefixtures("away_from_hour_boundary")
def test_async_twins(store: redcount.Store, strategy: Strategy) -> None:
    async def main() -> None:
        lim = aio.Limiter(store, strategy)
        for _ in range(3):
            assert await lim.hit_all(ITEMS)
        no = await lim.hit_all(ITEMS, cost=1)
        assert not no and no.refused_by == ("3/hour", "user:42")
        assert not await lim.test_all(ITEMS)
        assert (await lim.stats("1000/day", "org:acme"))[0].count == 3
        results = await asyncio.gather(*(lim.hit_all([("20/hour", "shared"), ("1000/day", "o")]) for _ in range(30)))
        assert sum(1 for r in results if r) == 20

    asyncio.run(main())


@pytest.mark.parametrize(
    ("items", "cost", "tag", "match"),
    [
        ([], 1, None, "at least one"),
        ([("5/minute", "a"), ("5/minute", "")], 1, None, "key"),
        ([("5/minute", "a"), ("2/minute", "b")], 3, None, "exceeds"),
        ([("5/minute", "a")], 0, None, "cost"),
        ([("5/minute", "a")], 1, "a{b", "tag"),
        ([("5/minute", "a"), ("9/60 seconds", "a")], 1, None, "same window"),
        ([("5/minute", "a"), ("5/eon", "b")], 1, None, "eon"),
        ([("5/minute", "a", "extra")], 1, None, "pair"),
    ],
)
def test_bad_input_stores_nothing(store: redcount.Store, items: list[tuple[str, ...]], cost: int, tag: str | None,
                                  match: str) -> None:
    lim = redcount.Limiter(store)
    with pytest.raises(redcount.InvalidInputError, match=match):
        lim.hit_all(items, cost, tag=tag)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=match):
        lim.test_all(items, cost, tag=tag)  # type: ignore[arg-type]
    assert all_keys(store, "*") == []


def test_bad_types(store: redcount.Store) -> None:
    lim = redcount.Limiter(store)
    with pytest.raises(TypeError, match="pairs"):
        lim.hit_all("5/minute")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="pair"):
        lim.hit_all([7])  # type: ignore[list-item]
    with pytest.raises(TypeError):
        lim.hit_all([(5, "k")])  # type: ignore[list-item]
    assert all_keys(store, "*") == []


def test_concurrency_strategy_refuses_clearly(store: redcount.Store) -> None:
    with pytest.raises(redcount.InvalidInputError, match="not available"):
        redcount.Limiter(store, "concurrency").hit_all([("5/minute", "a")])


# ------------------------------------------------------------- limits that change


@pytest.mark.parametrize("strategy", ["fixed-window", "sliding-window", "sliding-window-approx", "token-bucket"])
def test_a_changed_limit_keeps_the_usage(clock_store: redcount.Store, strategy: Strategy) -> None:
    lim = redcount.Limiter(clock_store, strategy)
    for _ in range(3):
        assert lim.hit("5/minute", "user:1")
    # Moved to a bigger plan mid-window: the 3 used stay used.
    d = lim.hit("10/minute", "user:1")
    assert d and d.remaining == 6
    for _ in range(6):
        assert lim.hit("10/minute", "user:1")
    assert not lim.hit("10/minute", "user:1")
    # Back to the small plan: over its limit, refused until the usage drains.
    no = lim.hit("5/minute", "user:1")
    assert not no and no.remaining == 0 and no.retry_after > 0
    assert len(all_keys(clock_store, "redcount:lim:*")) == 1


@pytest.mark.parametrize("strategy", ["token-bucket", "gcra"])
def test_a_bucket_keeps_the_tokens_used_across_a_capacity_change(clock_store: redcount.Store, strategy: Strategy) -> None:
    lim = redcount.Limiter(clock_store, strategy)
    assert lim.hit("10/minute burst 20", "k", cost=15)
    assert lim.stats("10/minute burst 20", "k")[0].remaining == 5
    # A smaller capacity: 15 used of 8 is an empty bucket (clamped at 0, not negative).
    s = lim.stats("10/minute burst 8", "k")[0]
    assert s.remaining == 0
    # A bigger one: 15 used of 40 leaves 25.
    assert lim.stats("10/minute burst 40", "k")[0].remaining == 25


def test_gcra_keeps_its_arrival_time_across_a_rate_change(clock_store: redcount.Store) -> None:
    lim = redcount.Limiter(clock_store, "gcra")
    for _ in range(3):
        assert lim.hit("5/minute", "user:1")  # 3 x 12 s: the arrival time is 36 s ahead
    # At 10/minute (6 s apart, burst 10) those 36 s are 6 emissions: 4 left.
    assert lim.stats("10/minute", "user:1")[0].remaining == 4
    assert len(all_keys(clock_store, "redcount:lim:*")) == 1


def test_keys_no_longer_name_the_amount(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, "sliding-window")
    lim.hit("5/minute", "user:1")
    assert all_keys(store, "redcount:lim:*") == [b"redcount:lim:sw:{user:1}:60000"]


@pytest.mark.parametrize("clock", ["server", "server-offset"])
@pytest.mark.parametrize("strategy", RATE)
@pytest.mark.usefixtures("away_from_hour_boundary")
def test_server_clocks(store: redcount.Store, strategy: Strategy, clock: str) -> None:
    lim = redcount.Limiter(store, strategy, clock=clock)  # type: ignore[arg-type]
    items = [("100/day", "a"), ("2/day", "b")]
    assert [bool(lim.hit_all(items)) for _ in range(3)] == [True, True, False]
    assert lim.stats("100/day", "a")[0].count == 2
