"""Every limiter strategy on both stores: exact decisions under a stepped clock, memory and
Redis making identical decisions, refused hits storing nothing, TTLs that always come back,
the concurrency leases, and the clock modes."""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from collections.abc import Iterator

import pytest
import redcount
from conftest import RedisServer
from helpers import all_keys, ms

T0 = 1_700_000_123.456  # not aligned to seconds, minutes or hours
RATE_STRATEGIES = ["fixed-window", "sliding-window", "sliding-window-approx", "token-bucket", "gcra"]
ALL_STRATEGIES = [*RATE_STRATEGIES, "concurrency"]


@pytest.fixture
def twins(redis_server: RedisServer) -> Iterator[tuple[redcount.ManualClock, redcount.Store, redcount.Store]]:
    """A memory store and a Redis store whose clients share one ManualClock: the same
    traffic must get the same decisions from both. The clock starts at the real time: the
    fixed window sets absolute deadlines (PEXPIREAT) from the client clock, which Redis
    judges by its own."""
    clock = redcount.ManualClock(int(time.time()) + 0.456)
    mem = redcount.connect(clock=clock)
    red = redcount.connect(redis_server.url, clock=clock)
    red.execute("FLUSHALL")
    try:
        yield clock, mem, red
    finally:
        mem.close()
        red.close()


def decision_tuple(d: redcount.Decision) -> tuple[bool, int, int, int, int]:
    return (d.allowed, d.limit, d.remaining, ms(d.reset_after), ms(d.retry_after))


# ----------------------------------------------------------------- hand-computed decisions


def test_sliding_log_exact_fields(clock_store: redcount.Store, clock: redcount.ManualClock) -> None:
    lim = redcount.Limiter(clock_store, "sliding-window")
    assert decision_tuple(lim.hit("3/10 seconds", "k")) == (True, 3, 2, 10_000, 0)
    clock.advance(2)
    assert decision_tuple(lim.hit("3/10 seconds", "k")) == (True, 3, 1, 10_000, 0)
    clock.advance(2)
    assert decision_tuple(lim.hit("3/10 seconds", "k")) == (True, 3, 0, 10_000, 0)
    clock.advance(1)
    # Full: the oldest hit (5 s ago) leaves the window 5 s from now; the newest in 9 s.
    assert decision_tuple(lim.hit("3/10 seconds", "k")) == (False, 3, 0, 9_000, 5_000)
    # cost 2 needs the two oldest gone: the second oldest leaves in 7 s.
    assert decision_tuple(lim.test("3/10 seconds", "k", 2)) == (False, 3, 0, 9_000, 7_000)
    clock.advance(4.999)
    assert not lim.hit("3/10 seconds", "k")
    clock.advance(0.001)
    assert lim.hit("3/10 seconds", "k")
    (s,) = lim.stats("3/10 seconds", "k")
    assert (s.count, s.remaining) == (3, 0)


def test_sliding_log_counts_only_the_last_window_length(clock_store: redcount.Store, clock: redcount.ManualClock) -> None:
    lim = redcount.Limiter(clock_store, "sliding-window")
    for _ in range(5):
        assert lim.hit("5/second", "k")
    clock.advance(0.999)
    assert not lim.hit("5/second", "k")  # the 5 hits are 999 ms old: still in the window
    clock.advance(0.001)
    for _ in range(5):
        assert lim.hit("5/second", "k")  # 1000 ms old: gone
    assert not lim.hit("5/second", "k")


def test_sliding_approx_two_bucket_estimate(clock_store: redcount.Store, clock: redcount.ManualClock) -> None:
    lim = redcount.Limiter(clock_store, "sliding-window-approx")
    clock.set(1_700_000_160.0)  # the start of a minute: sub-bucket = window = 60 s
    for _ in range(10):
        assert lim.hit("10/minute", "k")
    assert not lim.hit("10/minute", "k")
    clock.advance(60 + 15)  # a quarter into the next window: 10 * 0.75 = 7.5 -> 8 counted
    (s,) = lim.stats("10/minute", "k")
    assert (s.count, s.remaining) == (8, 2)
    # 7.5 + 2 <= 10: two more allowed; then 9.5 + 1 > 10.
    assert lim.hit("10/minute", "k")
    assert lim.hit("10/minute", "k")
    d = lim.hit("10/minute", "k")
    assert not d
    # Allowed again when 10 * (60 - e) / 60 + 2 + 1 <= 10, i.e. e >= 18 s: 3 s from now.
    assert ms(d.retry_after) == 3000
    clock.advance(d.retry_after - 0.001)
    assert not lim.hit("10/minute", "k")
    clock.advance(0.001)
    assert lim.hit("10/minute", "k")


def test_sliding_approx_sub_buckets_weigh_only_the_oldest(clock_store: redcount.Store, clock: redcount.ManualClock) -> None:
    lim = redcount.Limiter(clock_store, "sliding-window-approx", sub_buckets=4)  # 15 s sub-buckets
    clock.set(1_700_000_160.0)
    for _ in range(8):
        assert lim.hit("8/minute", "k")  # all in sub-bucket 0
    clock.advance(60 + 7.5)  # sub-bucket 0 is now the oldest, half weighed: 8 * 0.5 = 4
    (s,) = lim.stats("8/minute", "k")
    assert s.count == 4
    clock.advance(7.5)  # sub-bucket 0 fully out
    (s,) = lim.stats("8/minute", "k")
    assert s.count == 0 and s.reset_after == 0


def test_token_bucket_burst_then_rate(clock_store: redcount.Store, clock: redcount.ManualClock) -> None:
    lim = redcount.Limiter(clock_store, "token-bucket")
    limit = "10/second burst 20"
    for i in range(20):
        d = lim.hit(limit, "k")
        assert d and d.remaining == 19 - i and d.limit == 20
    d = lim.hit(limit, "k")
    assert decision_tuple(d) == (False, 20, 0, 2000, 100)  # full again in 2 s; a token in 0.1 s
    clock.advance(0.099)
    assert not lim.hit(limit, "k")
    clock.advance(0.001)
    assert lim.hit(limit, "k")
    clock.advance(0.35)  # 3.5 tokens
    assert [bool(lim.hit(limit, "k")) for _ in range(4)] == [True, True, True, False]
    assert lim.hit(limit, "k", 1) is not None
    d = lim.test(limit, "k", 5)
    assert not d and ms(d.retry_after) == 450  # 0.5 left, 4.5 more tokens at 10/s


def test_gcra_burst_then_rate(clock_store: redcount.Store, clock: redcount.ManualClock) -> None:
    lim = redcount.Limiter(clock_store, "gcra")
    limit = "10/second burst 20"
    for i in range(20):
        d = lim.hit(limit, "k")
        assert d and d.remaining == 19 - i
    d = lim.hit(limit, "k")
    assert decision_tuple(d) == (False, 20, 0, 2000, 100)
    clock.advance(0.099)
    assert not lim.hit(limit, "k")
    clock.advance(0.001)
    assert lim.hit(limit, "k")
    (key,) = all_keys(clock_store, "redcount:lim:gcra:*")
    assert clock_store.execute("TYPE", key) == "string"  # one key holding one time


def test_token_bucket_and_gcra_decide_alike(clock_store: redcount.Store, clock: redcount.ManualClock) -> None:
    tb = redcount.Limiter(clock_store, "token-bucket")
    gc = redcount.Limiter(clock_store, "gcra")
    rng = random.Random(5)
    limit = "8/second burst 12"  # 125 ms per token: exact in both
    for _ in range(3000):
        cost = rng.choice([1, 1, 1, 2, 3])
        a, b = tb.hit(limit, "k", cost), gc.hit(limit, "k", cost)
        assert (a.allowed, a.remaining, ms(a.retry_after)) == (b.allowed, b.remaining, ms(b.retry_after))
        clock.advance(rng.choice([0, 0.001, 0.01, 0.05, 0.125, 0.3]))


def test_concurrency_hit_holds_slots_for_the_period(clock_store: redcount.Store, clock: redcount.ManualClock) -> None:
    lim = redcount.Limiter(clock_store, "concurrency")
    assert lim.hit("2/10 seconds", "k")
    clock.advance(3)
    assert lim.hit("2/10 seconds", "k")
    d = lim.hit("2/10 seconds", "k")
    assert decision_tuple(d) == (False, 2, 0, 10_000, 7_000)
    clock.advance(7)
    assert lim.hit("2/10 seconds", "k")


# ----------------------------------------------------------- memory and Redis decide alike


@pytest.mark.redis_only
@pytest.mark.parametrize("strategy", ALL_STRATEGIES)
def test_memory_and_redis_make_identical_decisions(
    twins: tuple[redcount.ManualClock, redcount.Store, redcount.Store], strategy: str
) -> None:
    clock, mem, red = twins
    kwargs = {"sub_buckets": 4} if strategy == "sliding-window-approx" else {}
    lm = redcount.Limiter(mem, strategy, **kwargs)  # type: ignore[arg-type]
    lr = redcount.Limiter(red, strategy, **kwargs)  # type: ignore[arg-type]
    if strategy == "concurrency":
        limits = ["6/minute"]
    elif strategy in ("token-bucket", "gcra"):
        limits = ["8/minute burst 12", "20/5 minutes;8/minute burst 10"]
    else:
        limits = ["8/minute", "20/5 minutes;8/minute"]
    rng = random.Random(strategy)
    for step in range(600):
        limit = rng.choice(limits)
        key = rng.choice(["a", "b", "ключ"])
        cost = rng.choice([1, 1, 1, 2]) if strategy != "concurrency" else 1
        op = rng.random()
        if op < 0.75:
            a, b = lm.hit(limit, key, cost), lr.hit(limit, key, cost)
        else:
            a, b = lm.test(limit, key, cost), lr.test(limit, key, cost)
        assert decision_tuple(a) == decision_tuple(b), (step, limit, key)
        sa = [(s.count, s.remaining, ms(s.reset_after)) for s in lm.stats(limit, key)]
        sb = [(s.count, s.remaining, ms(s.reset_after)) for s in lr.stats(limit, key)]
        assert sa == sb, step
        clock.advance(rng.choice([0, 0.001, 0.5, 2.0, 7.5, 13.0]))


# --------------------------------------------------- refused hits store nothing, TTLs hold


def state(store: redcount.Store) -> dict[bytes, object]:
    out: dict[bytes, object] = {}
    for k in all_keys(store):
        kind = store.execute("TYPE", k)
        if kind == "zset":
            out[k] = store.execute("ZRANGE", k, 0, -1, "WITHSCORES")
        elif kind == "hash":
            out[k] = sorted(store.execute("HGETALL", k))
        else:
            out[k] = store.execute("GET", k)
    return out


@pytest.mark.parametrize("strategy", RATE_STRATEGIES)
def test_a_refused_hit_stores_nothing(store: redcount.Store, strategy: str) -> None:
    lim = redcount.Limiter(store, strategy)  # type: ignore[arg-type]
    limit = "3/minute;5/hour"
    for _ in range(3):
        assert lim.hit(limit, "k")
    before = state(store)
    for _ in range(20):
        assert not lim.hit(limit, "k")
        assert not lim.hit(limit, "k", 2)
    assert state(store) == before


@pytest.mark.parametrize("strategy", RATE_STRATEGIES)
def test_all_or_nothing_across_limits(store: redcount.Store, strategy: str) -> None:
    lim = redcount.Limiter(store, strategy)  # type: ignore[arg-type]
    lim.hit("1/minute", "k")  # the second limit alone is used up ...
    before = state(store)
    assert not lim.hit("10/hour;1/minute", "k")  # ... so the hour limit is not charged either
    assert state(store) == before
    (hour,) = lim.stats("10/hour", "k")
    assert hour.count == 0


def test_exact_log_memory_is_bounded_by_the_limit(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, "sliding-window")
    admitted = sum(bool(lim.hit("25/minute", "hammer")) for _ in range(1000))
    assert admitted == 25
    (key,) = all_keys(store)
    assert store.execute("ZCARD", key) == 25


@pytest.mark.parametrize("strategy", ALL_STRATEGIES)
def test_every_key_carries_a_ttl_and_gets_it_back(store: redcount.Store, strategy: str) -> None:
    lim = redcount.Limiter(store, strategy)  # type: ignore[arg-type]
    limit = "2/minute" if strategy == "concurrency" else "2/minute;3/hour"
    assert lim.hit(limit, "k")
    keys = all_keys(store)
    assert keys
    for k in keys:
        assert store.execute("PTTL", k) > 0, k
        store.execute("PERSIST", k)  # injected TTL loss
    lim.hit(limit, "k")  # allowed (or refused): either way the TTL comes back
    lim.hit(limit, "k")
    lim.hit(limit, "k")
    for k in all_keys(store):
        assert store.execute("PTTL", k) > 0, k


@pytest.mark.parametrize("strategy", ALL_STRATEGIES)
def test_a_foreign_value_is_garbage_and_the_key_starts_afresh(store: redcount.Store, strategy: str) -> None:
    # A foreign write of another type is reset by the next call, which then
    # works as on an empty key (docs/fixed-windows.md, "Exactly what is written").
    lim = redcount.Limiter(store, strategy)  # type: ignore[arg-type]
    lim.hit("2/minute", "k")
    (key,) = all_keys(store)
    kind = store.execute("TYPE", key)
    if kind == "string":  # fixed-window and gcra: a hash, then a string that is no number
        foreign: list[tuple[object, ...]] = [("HSET", key, "f", "v"), ("SET", key, "not-a-number")]
    else:  # sorted sets and hashes: a string in their place
        foreign = [("SET", key, "not-a-set")]
    for command in foreign:
        store.execute("DEL", key)
        store.execute(*command)
        assert lim.test("2/minute", "k")
        d = lim.hit("2/minute", "k")
        assert d and d.remaining == 1
        assert store.execute("TYPE", key) == kind
        assert store.execute("PTTL", key) > 0


# ------------------------------------------------------------------------- concurrency


def test_leases(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, "concurrency")
    a = lim.acquire(2, "job")
    b = lim.acquire(2, "job")
    assert a is not None and b is not None and a.id != b.id
    assert lim.acquire(2, "job") is None
    assert lim.in_flight("job") == 2
    assert lim.acquire(3, "job") is not None  # the cap is per call: raising it frees a slot
    assert lim.release(a) is True
    assert a.released
    with pytest.raises(redcount.InvalidInputError, match="already released"):
        lim.release(a)
    assert lim.in_flight("job") == 2
    with lim.lease(3, "job") as lease:
        assert lim.in_flight("job") == 3
        assert not lease.released
    assert lim.in_flight("job") == 2
    with pytest.raises(RuntimeError, match="boom"), lim.lease(3, "job"):
        raise RuntimeError("boom")
    assert lim.in_flight("job") == 2  # released on the way out of an exception
    with pytest.raises(redcount.RateLimitExceeded) as info, lim.lease(2, "job"):
        pytest.fail("the block must not run when every slot is taken")
    assert info.value.limit == 2 and isinstance(info.value, redcount.RedcountError)


def test_an_unreleased_lease_expires(clock_store: redcount.Store, clock: redcount.ManualClock) -> None:
    lim = redcount.Limiter(clock_store, "concurrency")
    lease = lim.acquire(1, "job", lease_timeout=5)
    assert lease is not None and lease.expires_at == pytest.approx(clock.now() + 5)
    assert lim.acquire(1, "job", lease_timeout=5) is None
    clock.advance(4.999)
    assert lim.acquire(1, "job", lease_timeout=5) is None
    clock.advance(0.001)
    again = lim.acquire(1, "job", lease_timeout=5)
    assert again is not None
    assert lim.release(lease) is False  # it had expired: nothing was held any more
    assert lim.in_flight("job") == 1  # and the new holder keeps its slot


def _hold_lease_and_hang(url: str, ready: multiprocessing.synchronize.Event) -> None:  # type: ignore[name-defined]
    store = redcount.connect(url)
    lim = redcount.Limiter(store, "concurrency")
    assert lim.acquire(1, "crashy", lease_timeout=0.5) is not None
    ready.set()
    time.sleep(60)


@pytest.mark.redis_only
def test_a_killed_worker_gives_its_slot_back(redis_store: redcount.Store, redis_server: RedisServer) -> None:
    ctx = multiprocessing.get_context("spawn")
    ready = ctx.Event()
    proc = ctx.Process(target=_hold_lease_and_hang, args=(redis_server.url, ready))
    proc.start()
    try:
        assert ready.wait(30)
        lim = redcount.Limiter(redis_store, "concurrency")
        assert lim.acquire(1, "crashy") is None
        assert proc.pid is not None
        os.kill(proc.pid, signal.SIGKILL)
        proc.join(10)
        deadline = time.monotonic() + 5
        got = None
        while got is None and time.monotonic() < deadline:
            got = lim.acquire(1, "crashy")
            if got is None:
                time.sleep(0.05)
        assert got is not None, "the dead worker's lease never expired"
    finally:
        proc.kill()
        proc.join()


def test_acquire_needs_the_concurrency_strategy(store: redcount.Store) -> None:
    lim = redcount.Limiter(store, "sliding-window")
    with pytest.raises(redcount.InvalidInputError, match="concurrency"):
        lim.acquire(1, "k")


# -------------------------------------------------------------------------- clock modes


@pytest.mark.redis_only
@pytest.mark.parametrize("mode", ["server", "server-offset"])
@pytest.mark.parametrize("strategy", ["sliding-window", "sliding-window-approx", "token-bucket", "gcra", "fixed-window"])
def test_server_time_is_immune_to_client_skew(redis_server: RedisServer, mode: str, strategy: str) -> None:
    """Two app servers whose clocks are 90 s apart share one limit. With the client clock
    they disagree about the window and let far more through; with server time they
    enforce the limit together."""
    results = {}
    for clock_mode in ("client", mode):
        ahead = redcount.connect(redis_server.url, clock=redcount.ManualClock(time.time() + 45))
        behind = redcount.connect(redis_server.url, clock=redcount.ManualClock(time.time() - 45))
        ahead.execute("FLUSHALL")
        la = redcount.Limiter(ahead, strategy, clock=clock_mode)  # type: ignore[arg-type]
        lb = redcount.Limiter(behind, strategy, clock=clock_mode)  # type: ignore[arg-type]
        admitted = 0
        for _ in range(10):
            admitted += bool(la.hit("5/minute", "shared"))
            admitted += bool(lb.hit("5/minute", "shared"))
        results[clock_mode] = admitted
        expect = "server-offset" if strategy == "fixed-window" or mode == "server-offset" else "server"
        assert la.clock == (expect if clock_mode != "client" else "client")
        ahead.close()
        behind.close()
    assert results[mode] == 5
    if strategy != "token-bucket" and strategy != "gcra":
        assert results["client"] > 5  # the skew really breaks the client clock
    else:
        assert results["client"] >= 5


@pytest.mark.redis_only
def test_server_clock_where_time_is_refused(redis_factory: object) -> None:
    """A user whose ACL forbids TIME: clock='server' cannot work and says so plainly,
    clock='client' keeps working."""
    server: RedisServer = redis_factory()  # type: ignore[operator]
    admin = redcount.connect(server.url)
    admin.execute("ACL", "SETUSER", "app", "on", ">pw", "~*", "&*", "+@all", "-time")
    app = redcount.connect(f"redis://app:pw@127.0.0.1:{server.port}/0")
    lim = redcount.Limiter(app, "sliding-window", clock="server")
    with pytest.raises(redcount.ReplyError, match="clock='server' needs the Redis TIME command"):
        lim.hit("5/minute", "k")
    assert all_keys(admin) == []  # nothing stored
    assert redcount.Limiter(app, "sliding-window").hit("5/minute", "k")
    admin.close()
    app.close()


def test_unknown_clock_is_refused(store: redcount.Store) -> None:
    with pytest.raises(redcount.InvalidInputError, match="unknown clock 'sever'"):
        redcount.Limiter(store, "gcra", clock="sever")  # type: ignore[arg-type]
