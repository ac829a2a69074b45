"""A penalty's block check inside the decision's own script call (one round trip per call,
atomic with the decision), and the per-call ``penalty=`` of hit / hit_all: on memory:// and
on a real Redis server, sync and async."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redcount
import redcount.aio as aio
from conftest import RedisServer

PEN = redcount.Penalty(after=2, within=60, block=60)
RATE = ["fixed-window", "sliding-window", "sliding-window-approx", "token-bucket", "gcra"]


def block(store: redcount.Store, key: str, seconds: float = 30.0, prefix: str = "redcount:lim") -> None:
    """A block of ``key`` as another process's penalty starts it."""
    store.execute("SET", f"{prefix}:pen:{{{key}}}:b", "1", "PX", int(seconds * 1000))


@pytest.fixture
def admin(redis_server: RedisServer) -> Iterator[redcount.Store]:
    s = redcount.connect(redis_server.url)
    try:
        yield s
    finally:
        s.close()


def server_counts(admin: redcount.Store) -> dict[str, int]:
    """Calls per command and the server's read events (one per round trip of a client that
    waits for each reply) since the last CONFIG RESETSTAT."""
    out: dict[str, int] = {}
    for line in admin.execute("INFO", "all").decode().splitlines():  # type: ignore[union-attr]
        if line.startswith("cmdstat_"):
            name, rest = line[len("cmdstat_"):].split(":", 1)
            out[name] = int(rest.split(",", 1)[0].split("=", 1)[1])
        elif line.startswith("total_reads_processed:"):
            out["reads"] = int(line.split(":", 1)[1])
    return out


@pytest.mark.redis_only
@pytest.mark.parametrize("strategy", RATE)
def test_one_round_trip_per_call_with_a_penalty(redis_store: redcount.Store, admin: redcount.Store,
                                                strategy: str) -> None:
    lim = redcount.Limiter(redis_store, strategy, penalty=PEN)  # type: ignore[arg-type]
    assert lim.hit("100/minute", "warm")  # the scripts are loaded, the connection is up
    n = 20
    admin.execute("CONFIG", "RESETSTAT")
    for _ in range(n):
        assert lim.hit("100/minute", "k")
    for _ in range(n):
        assert lim.test("100/minute", "k")
    for _ in range(n):
        assert lim.hit_all([("100/minute", "a"), ("100/minute", "b")])
    c = server_counts(admin)
    # One read event per call (plus this INFO's own): one round trip each. With the block
    # check as a PTTL of its own before each decision, it was two per call (6n + 1).
    assert c["reads"] <= 3 * n + 3
    scripted_tests = 0 if strategy == "fixed-window" else n  # fixed-window's test reads with GET
    assert c.get("evalsha", 0) == n + scripted_tests + n


@pytest.mark.parametrize("strategy", RATE)
def test_a_blocked_key_is_refused_by_every_call_and_charged_nothing(store: redcount.Store,
                                                                     strategy: str) -> None:
    lim = redcount.Limiter(store, strategy, penalty=PEN)  # type: ignore[arg-type]
    assert lim.hit("10/hour", "k")
    block(store, "k", 30)  # another process's penalty blocks the key between two calls
    for d in (lim.hit("10/hour", "k"), lim.test("10/hour", "k"),
              lim.hit_all([("10/hour", "other"), ("10/hour", "k")]),
              lim.test_all([("10/hour", "other"), ("10/hour", "k")])):
        assert not d and 29 < d.retry_after <= 30 and d.remaining == 0 and d.limit == 10
    assert lim.stats("10/hour", "k")[0].count == 1  # nothing charged during the block
    assert lim.stats("10/hour", "other")[0].count == 0  # all or nothing
    assert lim.hit("10/hour", "other")
    store.execute("DEL", "redcount:lim:pen:{k}:b")  # the block ends (or unblock)
    assert lim.hit("10/hour", "k") and lim.test("10/hour", "k")
    assert lim.hit_all([("10/hour", "other"), ("10/hour", "k")])


def test_the_block_is_checked_atomically_with_each_limit_set(store: redcount.Store) -> None:
    # Several limits, a cost, keys with braces: the gate key follows the limits' keys.
    lim = redcount.Limiter(store, "sliding-window", penalty=PEN)
    assert lim.hit("5/minute;10/hour", "{user}:1", 2)
    block(store, "{user}:1", 5)
    d = lim.hit("5/minute;10/hour", "{user}:1", 2)
    assert not d and 4 < d.retry_after <= 5
    assert [s.count for s in lim.stats("5/minute;10/hour", "{user}:1")] == [2, 2]


def test_without_a_penalty_a_block_is_ignored(store: redcount.Store) -> None:
    block(store, "k", 30)
    assert redcount.Limiter(store).hit("10/hour", "k")


def test_per_call_penalty(store: redcount.Store) -> None:
    # A sliding log: a refusal's own wait is ~an hour whatever the time of day.
    lim = redcount.Limiter(store, "sliding-window")  # no penalty of its own
    assert lim.hit("1/hour", "k", penalty=PEN)
    assert not lim.hit("1/hour", "k", penalty=PEN)
    blocked = lim.hit("1/hour", "k", penalty=PEN)  # the second refusal starts the block
    assert not blocked and blocked.retry_after == 60.0
    assert lim.hit("1/hour", "k").retry_after > 60  # this call has no penalty: the limit's own wait
    assert lim.hit("1/hour", "k", penalty=PEN).retry_after <= 60.0
    d = lim.hit_all([("5/hour", "k"), ("5/hour", "j")], penalty=PEN)
    assert not d and d.retry_after <= 60.0
    assert lim.hit_all([("5/hour", "k"), ("5/hour", "j")])  # no penalty: the limits allow it
    for bad in ("PEN", True, 1, {"after": 2}):
        with pytest.raises(TypeError, match="penalty must be a redcount.Penalty"):
            lim.hit("1/hour", "k", penalty=bad)  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="penalty must be a redcount.Penalty"):
            lim.hit_all([("1/hour", "k")], penalty=bad)  # type: ignore[arg-type]


def test_per_call_penalty_overrides_or_disables_the_limiters(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, "sliding-window", penalty=PEN, refusal_cache=100)
    assert lim.hit("1/hour", "k")
    strict = redcount.Penalty(after=1, within=60, block=600)
    d = lim.hit("1/hour", "k", penalty=strict)  # the first refusal blocks, for 600 s
    assert not d and d.retry_after == 600.0
    assert lim.hit("1/hour", "k").retry_after == pytest.approx(600.0, abs=0.5)  # one block per key
    free = lim.hit("1/hour", "k", penalty=False)  # no penalty for this call: the limit decides
    assert not free and 600 < free.retry_after <= 3600
    assert lim.hit_all([("5/hour", "k")], penalty=False)


def test_per_call_penalty_async(store: redcount.Store) -> None:
    async def main() -> None:
        plain = aio.Limiter(store, "sliding-window")
        assert await plain.hit("1/hour", "k", penalty=PEN)
        assert not await plain.hit("1/hour", "k", penalty=PEN)
        assert (await plain.hit("1/hour", "k", penalty=PEN)).retry_after == 60.0
        assert (await plain.hit("1/hour", "k")).retry_after > 60
        assert not await plain.hit_all([("5/hour", "k")], penalty=PEN)
        assert await plain.hit_all([("5/hour", "k")], penalty=False)
        with pytest.raises(TypeError):
            await plain.hit("1/hour", "k", penalty="no")  # type: ignore[arg-type]

        lim = aio.Limiter(store, "token-bucket", penalty=PEN)
        assert await lim.hit("10/hour", "a")
        block(store, "a", 20)
        for d in (await lim.hit("10/hour", "a"), await lim.test("10/hour", "a"),
                  await lim.hit_all([("10/hour", "a"), ("10/hour", "b")]),
                  await lim.test_all([("10/hour", "b"), ("10/hour", "a")])):
            assert not d and 19 < d.retry_after <= 20
        assert await lim.hit("10/hour", "a", penalty=False)
        assert await lim.hit("10/hour", "b")

    asyncio.run(main())


def test_a_leased_async_hit_counts_refusals_under_a_per_call_penalty(store: redcount.Store) -> None:
    """A leased hit decides in the process: redcount.aio puts the core's guard steps around
    it (the block check before, the penalty's count after a refusal), sync and async alike."""
    async def main() -> None:
        lim = aio.Limiter(store)  # no penalty of its own
        strict = redcount.Penalty(after=1, within=60, block=30)
        assert await lim.hit("1/hour", "lk", lease=1, penalty=strict)
        blocked = await lim.hit("1/hour", "lk", lease=1, penalty=strict)  # counted: the block starts
        assert not blocked and blocked.retry_after == 30.0
        assert (await lim.hit("100/hour", "lk", lease=1, penalty=strict)).retry_after == pytest.approx(30.0, abs=0.5)
        assert lim.sync.hit("100/hour", "lk", lease=1, penalty=strict).retry_after == pytest.approx(30.0, abs=0.5)
        lim.sync.return_leases()

    asyncio.run(main())


@pytest.mark.redis_only
def test_a_block_from_another_client_is_honoured_at_once(redis_store: redcount.Store,
                                                         admin: redcount.Store) -> None:
    lim = redcount.Limiter(redis_store, penalty=PEN)
    assert lim.hit("10/hour", "k")
    other = redcount.Limiter(admin, "sliding-window", penalty=redcount.Penalty(after=1, within=60, block=45))
    assert other.hit("1/hour", "k") and not other.hit("1/hour", "k")  # the other starts a block
    d = lim.hit("10/hour", "k")
    assert not d and 44 < d.retry_after <= 45
    assert lim.stats("10/hour", "k")[0].count == 1


def test_a_leased_hit_keeps_its_own_block_check(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, penalty=PEN)
    assert lim.hit("100/minute", "k", lease=10)
    block(store, "k", 10)
    d = lim.hit("100/minute", "k", lease=10)
    assert not d and 9 < d.retry_after <= 10


@pytest.mark.redis_only
@pytest.mark.parametrize("clock", ["server", "server-offset"])
@pytest.mark.parametrize("strategy", ["fixed-window", "sliding-window", "gcra"])
def test_the_gate_under_the_servers_clock(redis_store: redcount.Store, clock: str, strategy: str) -> None:
    lim = redcount.Limiter(redis_store, strategy, clock=clock, penalty=PEN)  # type: ignore[arg-type]
    assert lim.hit("10/hour", "k")
    block(redis_store, "k", 30)
    d = lim.hit("10/hour", "k")
    assert not d and 29 < d.retry_after <= 30
    assert lim.stats("10/hour", "k")[0].count == 1
    redis_store.execute("DEL", "redcount:lim:pen:{k}:b")
    assert lim.hit("10/hour", "k")


def test_a_tagged_state_is_blocked_and_counted_like_the_untagged(store: redcount.Store) -> None:
    # A block is the key's, whatever state (tag=) a call decides on; the tagged state is the
    # one charged, and a per-call penalty with a tag counts against the same block.
    lim = redcount.Limiter(store, "fixed-window", penalty=PEN)
    assert lim.hit("2/minute", "t", tag="org")
    assert lim.hit("2/minute", "t", tag="org")
    assert lim.stats("2/minute", "t", tag="org")[0].remaining == 0
    assert lim.stats("2/minute", "t")[0].remaining == 2  # the untagged state was not touched
    lim.hit("2/minute", "t", tag="org")
    blocked = lim.hit("2/minute", "t", tag="org")  # the second refusal starts the block
    assert not blocked and blocked.retry_after > 50
    assert not lim.hit("100/minute", "t")  # untagged: blocked too
    other = redcount.Limiter(store, "fixed-window", prefix="redcount:lim2")
    assert other.hit("1/minute", "u", tag="org")
    assert not other.hit("1/minute", "u", tag="org", penalty=PEN)
    stopped = other.hit("1/minute", "u", tag="org", penalty=PEN)
    assert not stopped and stopped.retry_after > 50
    assert not other.hit("100/minute", "u", penalty=PEN)
    assert other.hit("100/minute", "u")  # without the penalty, the block does not apply
