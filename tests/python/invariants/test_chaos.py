"""A bounded chaos run on both stores: what foreign writers can do to redcount's keys.

Worker threads drive every counter and every limiter strategy while another client
PERSISTs their keys, writes foreign values of other types, DELetes them, gives them
expiries decades away and (on Redis) runs SCRIPT FLUSH. Afterwards one more round of
calls, then:

- no call raised anything but a documented redcount error (a FixedWindowCounter whose
  key holds a foreign value raises ReplyError; nothing else may raise at all);
- every key redcount has written has a TTL, and none further away than the longest
  window it serves (plus grace): nothing lives for ever, nothing outlives its window;
- every limiter works again.

Bounded for CI: about 2 s of chaos per store.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

import pytest
import redcount
from helpers import all_keys, wait_for_fresh_window

CHAOS_SECONDS = 2.0
USERS = [f"u{i}" for i in range(4)]
RIDS = [f"r{i}" for i in range(4)]
LIMITS = "200/hour;1000/day"  # named after hours and days: see wait_for_fresh_window below
STRATEGIES = ["fixed-window", "sliding-window", "sliding-window-approx", "token-bucket", "gcra"]
LONGEST_MS = 2 * 86_400_000 + 1_000  # sliding-window-approx (k=1) keeps a day's key for 2 days


class Fleet:
    """Every counter and limiter, with the calls a worker makes on them."""

    def __init__(self, store: redcount.Store) -> None:
        self.script = redcount.FixedWindowCounter(store, "fws", 3600)
        self.commands = redcount.FixedWindowCounter(store, "fwc", 3600, mode="commands")
        self.sliding = redcount.SlidingWindowCounter(store, "swc", 60)
        self.limiters = {s: redcount.Limiter(store, s, prefix=f"lim-{s}") for s in STRATEGIES}  # type: ignore[arg-type]
        self.concurrency = redcount.Limiter(store, "concurrency", prefix="lim-cc")

    def counter_calls(self, rng: random.Random) -> list[Callable[[], object]]:
        u = rng.choice(USERS)
        return [
            lambda: self.script.incr(u, rng.randint(1, 3)),
            lambda: self.script.incr(u, request_id=rng.choice(RIDS)),
            lambda: self.script.incr_many({u: 1, rng.choice(USERS): 2}),
            lambda: self.script.get(u),
            lambda: self.commands.incr(u, rng.randint(1, 3)),
            lambda: self.commands.incr_many({u: 1}),
        ]

    def other_calls(self, rng: random.Random) -> list[Callable[[], object]]:
        u = rng.choice(USERS)
        calls: list[Callable[[], object]] = [
            lambda: self.sliding.add(u, rng.randint(1, 3)),
            lambda: self.sliding.count(u),
            lambda: self.sliding.add_unique(u, f"item{rng.randint(0, 5)}"),
            lambda: self.sliding.count_unique(u),
            lambda: self.concurrency.hit("5/minute", u),
            lambda: self.lease(u),
        ]
        for lim in self.limiters.values():
            calls.append(lambda lim=lim: lim.hit(LIMITS, u, cost=rng.randint(1, 2)))  # type: ignore[misc]
            calls.append(lambda lim=lim: lim.test(LIMITS, u))  # type: ignore[misc]
            calls.append(lambda lim=lim: lim.stats(LIMITS, u))  # type: ignore[misc]
        return calls

    def lease(self, user: str) -> None:
        lease = self.concurrency.acquire(3, user, lease_timeout=30)
        if lease is not None:
            self.concurrency.release(lease)

    def final_round(self) -> None:
        """Every key every call above can write, once more."""
        for u in USERS:
            for c in (self.script, self.commands):
                try:
                    c.incr(u)
                except redcount.ReplyError:
                    pass  # a foreign value in this window's key: documented, and the key got its TTL
            for rid in RIDS:  # a repeat of an id repairs its key
                try:
                    self.script.incr(u, request_id=rid)
                except redcount.ReplyError:
                    pass
            self.sliding.add(u, 2)
            self.sliding.add_unique(u, "final")
            for lim in self.limiters.values():
                lim.hit(LIMITS, u)
            self.concurrency.hit("5/minute", u)
            self.lease(u)


def chaos(store: redcount.Store, stop: threading.Event, seed: int, on_redis: bool, log: list[str]) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        keys = all_keys(store)
        if not keys:
            continue
        key = rng.choice(keys)
        action = rng.randrange(6)
        try:
            if action == 0:
                store.execute("PERSIST", key)
            elif action == 1:
                store.execute("PEXPIRE", key, 10**12)
            elif action == 2:
                store.execute("DEL", key)
            elif action == 3:  # a value of another type, without a TTL
                if store.execute("TYPE", key) == "string":
                    store.execute("DEL", key)
                    store.execute("HSET", key, "foreign", "1")
                else:
                    store.execute("SET", key, "3")
            elif action == 4:
                store.execute("SET", key, "3")  # a string, whatever was there
            elif on_redis:
                store.execute("SCRIPT", "FLUSH")
        except redcount.ReplyError as e:  # a race with the workers (the key changed type)
            log.append(repr(e))


@pytest.mark.usefixtures("away_from_hour_boundary")
def test_chaos(store: redcount.Store) -> None:
    on_redis = store.url.startswith("redis")
    # The final round must hit the windows the chaos touched: stay clear of the hour (and
    # so the day) boundary for the whole run.
    wait_for_fresh_window(store, 3600, 30)
    fleet = Fleet(store)
    admin = redcount.connect(store.url) if on_redis else store  # "another client"
    stop = threading.Event()
    unexpected: list[str] = []
    counts = [0]

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        while not stop.is_set():
            for call in fleet.counter_calls(rng):
                try:
                    call()
                except redcount.ReplyError as e:
                    if type(e) is not redcount.ReplyError:
                        unexpected.append(f"counter: {e!r}")
                except Exception as e:  # noqa: BLE001 - the test collects anything else
                    unexpected.append(f"counter: {e!r}")
            for call in fleet.other_calls(rng):
                try:
                    call()
                except Exception as e:  # noqa: BLE001
                    unexpected.append(f"limiter or sliding counter: {e!r}")
            counts[0] += 1

    chaos_log: list[str] = []
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    threads.append(threading.Thread(target=chaos, args=(admin, stop, 99, on_redis, chaos_log)))
    for t in threads:
        t.start()
    time.sleep(CHAOS_SECONDS)  # the run's length, not a wait for readiness
    stop.set()
    for t in threads:
        t.join(30)
        assert not t.is_alive()
    assert counts[0] > 0
    assert unexpected == [], unexpected[:10]

    fleet.final_round()
    keys = all_keys(store)
    assert keys
    for key in keys:
        left = store.execute("PTTL", key)
        assert left != -1, f"{key!r} has no TTL"
        assert left <= LONGEST_MS, f"{key!r} outlives its window: PTTL {left}"

    # Every limiter works again: from a reset, the full amount.
    for u in USERS:
        for lim in fleet.limiters.values():
            lim.reset(LIMITS, u)
            assert lim.hit(LIMITS, u).remaining == 199
        fleet.concurrency.reset("5/minute", u)
        assert fleet.concurrency.hit("5/minute", u).remaining == 4
        fleet.sliding.clear(u)
        assert fleet.sliding.add(u) == 1
    if admin is not store:
        admin.close()
