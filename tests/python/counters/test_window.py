"""Window arithmetic, turnover and stagger, stepped through with a ManualClock."""

from __future__ import annotations

import pytest
import redcount
from helpers import all_keys, fnv1a64, ms

WINDOWS = [0.001, 0.25, 1, 7, 60, 3600, 86400]


@pytest.mark.parametrize("window", WINDOWS)
def test_windows_are_clock_aligned(clock: redcount.ManualClock, clock_store: redcount.Store, window: float) -> None:
    c = redcount.FixedWindowCounter(clock_store, "w", window)
    w = ms(window)
    for step in (0, 0.0004, 0.3, 1.7, 59.9, 3599.999, 86399.5):
        clock.advance(step)
        now = ms(clock.now())
        for key in ("a", "b", "日本"):
            start, end = (ms(x) for x in c.current_window(key))
            assert start % w == 0, (window, start)
            assert end - start == w
            assert start <= now < end
            # Every key shares the boundaries without stagger, and the index is start / window.
            assert c.storage_key(key).endswith(f":{w}:{start // w}")
    assert all_keys(clock_store) == []  # asking about windows stores nothing


def test_hourly_windows_turn_over_on_the_hour(clock: redcount.ManualClock, clock_store: redcount.Store) -> None:
    clock.set(1_700_000_000.0)  # 22:13:20 UTC
    c = redcount.FixedWindowCounter(clock_store, "h", 3600)
    start, end = c.current_window("k")
    assert (start, end) == (1_699_999_200.0, 1_700_002_800.0)  # 22:00 and 23:00


def test_turnover(clock: redcount.ManualClock, clock_store: redcount.Store) -> None:
    c = redcount.FixedWindowCounter(clock_store, "t", 60, grace=5)
    _, end = c.current_window("k")
    old_key = c.storage_key("k")
    assert [c.incr("k") for _ in range(3)] == [1, 2, 3]
    assert ms(c.ttl("k")) == ms(end) + 5000 - ms(clock.now())

    clock.set(end - 0.001)  # the last millisecond of the window
    assert c.get("k") == 3
    assert c.storage_key("k") == old_key
    assert c.ttl("k") == pytest.approx(5.001)

    clock.set(end)  # windows are [start, end): this is the next one
    assert c.current_window("k") == (end, end + 60)
    assert c.get("k") == 0
    new_key = c.storage_key("k")
    assert new_key != old_key
    assert int(new_key.rsplit(":", 1)[1]) == int(old_key.rsplit(":", 1)[1]) + 1
    assert c.incr("k", 2) == 2
    # The old window's key lives on for the grace period, then goes.
    assert clock_store.execute("GET", old_key) == b"3"
    assert clock_store.execute("PTTL", old_key) == 5000
    clock.advance(4.999)
    assert clock_store.execute("GET", old_key) == b"3"
    clock.advance(0.001)
    assert clock_store.execute("GET", old_key) is None
    assert c.get("k") == 2

    clock.advance(3600)  # many windows later: a fresh start, and the old keys are gone
    assert c.get("k") == 0
    assert clock_store.execute("DBSIZE") == 0


def test_incr_many_and_get_many_turn_over_together(clock: redcount.ManualClock, clock_store: redcount.Store) -> None:
    c = redcount.FixedWindowCounter(clock_store, "m", 10, grace=0)
    assert c.incr_many({"a": 1, "b": 2}) == {"a": 1, "b": 2}
    _, end = c.current_window("a")
    clock.set(end)
    assert c.get_many(["a", "b"]) == {"a": 0, "b": 0}
    assert c.incr_many({"a": 5, "b": 5}) == {"a": 5, "b": 5}
    assert clock_store.execute("DBSIZE") == 2  # grace 0: the old keys died at the boundary


def stagger_offset_ms(key: str, window_ms: int) -> int:
    return fnv1a64(key.encode()) % window_ms


def test_stagger_gives_each_key_its_own_boundaries(clock: redcount.ManualClock, clock_store: redcount.Store) -> None:
    c = redcount.FixedWindowCounter(clock_store, "s", 3600, stagger=True)
    keys = [f"user:{i}" for i in range(20)]
    starts = {}
    now = ms(clock.now())
    for k in keys:
        start, end = (ms(x) for x in c.current_window(k))
        offset = stagger_offset_ms(k, 3_600_000)
        assert (start - offset) % 3_600_000 == 0, k  # aligned, shifted by the key's own offset
        assert end - start == 3_600_000
        assert start <= now < end
        starts[k] = start
    assert len(set(starts.values())) > 15  # spread out, not all on the hour


def test_stagger_is_deterministic(clock: redcount.ManualClock) -> None:
    a = redcount.connect(clock=clock)
    b = redcount.connect(clock=redcount.ManualClock(clock.now()))
    ca = redcount.FixedWindowCounter(a, "s", 600, stagger=True)
    cb = redcount.FixedWindowCounter(b, "s", 600, stagger=True)
    for k in ("alice", "bob", "carol", "日本"):
        assert ca.current_window(k) == cb.current_window(k)
        assert ca.storage_key(k) == cb.storage_key(k)
    # A day later the offsets are the same: they depend only on the key and the window.
    clock.advance(86400)
    b_clock_counter = redcount.FixedWindowCounter(a, "s", 600, stagger=True)
    for k in ("alice", "bob"):
        start, _ = b_clock_counter.current_window(k)
        assert (ms(start) - stagger_offset_ms(k, 600_000)) % 600_000 == 0
    a.close()
    b.close()


def test_stagger_turnover_per_key(clock: redcount.ManualClock, clock_store: redcount.Store) -> None:
    c = redcount.FixedWindowCounter(clock_store, "s", 60, stagger=True, grace=0)
    ends = {k: c.current_window(k)[1] for k in ("a", "b", "c", "d")}
    assert len(set(ends.values())) > 1
    for k in ends:
        c.incr(k, 10)
    first = min(ends, key=ends.__getitem__)
    clock.set(ends[first])  # only `first` turns over now
    for k, end in ends.items():
        expected = 0 if end <= ends[first] else 10
        assert c.get(k) == expected, k
        assert clock_store.execute("EXISTS", c.storage_key(k)) == (expected > 0)


def test_stagger_near_the_epoch() -> None:
    # Floor division must hold for times before a key's first shifted boundary.
    clock = redcount.ManualClock(0.0)
    store = redcount.connect(clock=clock)
    c = redcount.FixedWindowCounter(store, "s", 1, stagger=True)
    for k in ("a", "b", "c", "zz", "key-9"):
        start, end = c.current_window(k)
        assert start <= 0.0 < end
        assert ms(end) - ms(start) == 1000
        assert c.incr(k) == 1
        assert c.get(k) == 1
    store.close()


def test_ttl_is_window_end_plus_grace(clock: redcount.ManualClock, clock_store: redcount.Store) -> None:
    for grace in (0, 0.5, 1, 30):
        c = redcount.FixedWindowCounter(clock_store, f"g{grace}", 60, grace=grace)
        c.incr("k")
        _, end = c.current_window("k")
        assert ms(c.ttl("k")) == ms(end) + ms(grace) - ms(clock.now())


def test_manual_clock() -> None:
    clock = redcount.ManualClock(1000.5)
    assert clock.now() == 1000.5
    clock.advance(0.25)
    assert clock.now() == 1000.75
    clock.advance(0.0004)  # rounds to the millisecond
    assert clock.now() == 1000.75
    clock.advance(0.0006)
    assert clock.now() == 1000.751
    clock.set(5.0)  # set may jump anywhere
    assert clock.now() == 5.0
    store = redcount.connect(clock=clock)
    assert store.now() == 5.0
    assert store.execute("TIME") == [b"5", b"0"]
    store.close()
    assert redcount.ManualClock().now() == 1_700_000_000.0
