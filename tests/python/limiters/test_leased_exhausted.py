"""Round trips of a leased limit under threads, on a real redis-server. On an exhausted key a
refusal costs one round trip at most (as an unleased one does), the refusals of several
threads go to the store side by side rather than one after another, and with a refusal cache
none reach it until the window can admit again. On a key with room, threads share whole
leases."""

from __future__ import annotations

import threading
import time
import uuid

import pytest
import redcount
from fault_proxy import FaultProxy
from helpers import wait_until
from redcount.tools.servers import RedisServer

pytestmark = pytest.mark.redis_only

THREADS = 8


def scripts_run(store: redcount.Store) -> int:
    """EVALSHA calls the server has run (INFO commandstats): one per round trip here."""
    info = store.execute("INFO", "commandstats")
    text = info.decode() if isinstance(info, bytes) else str(info)
    for line in text.splitlines():
        if line.startswith("cmdstat_evalsha:"):
            return int(line.split("calls=")[1].split(",")[0])
    return 0


def asked(proxy: FaultProxy) -> int:
    """Decisions sent through ``proxy``: script calls and reads of a window's count (a
    connection's set-up commands are neither)."""
    return len(proxy.seen(b"EVALSHA")) + len(proxy.seen(b"GET"))


def exhaust(lim: redcount.Limiter, key: str) -> None:
    while lim.hit("10/hour", key, lease=100):
        pass


@pytest.mark.usefixtures("away_from_hour_boundary")
def test_a_leased_refusal_is_one_round_trip(fault_proxy: FaultProxy) -> None:
    store = redcount.connect(fault_proxy.url)
    try:
        lim = redcount.Limiter(store, prefix=f"ex:{uuid.uuid4().hex[:8]}")
        exhaust(lim, "k")
        before = asked(fault_proxy)
        refused = [0] * THREADS

        def refuse(i: int) -> None:
            for _ in range(25):
                d = lim.hit("10/hour", "k", lease=100)
                assert not d and d.retry_after > 0
                refused[i] += 1

        threads = [threading.Thread(target=refuse, args=(i,)) for i in range(THREADS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # One command per refusal (a read of the window's count: one limit) reached the
        # server, never more than an unleased refusal's script call.
        assert asked(fault_proxy) - before == sum(refused) == THREADS * 25
    finally:
        store.close()


def test_refusals_of_an_exhausted_key_do_not_wait_for_each_other(fault_proxy: FaultProxy) -> None:
    store = redcount.connect(fault_proxy.url)
    try:
        lim = redcount.Limiter(store, prefix=f"ex:{uuid.uuid4().hex[:8]}")
        exhaust(lim, "k")
        # A socket per thread first (a stalled proxy would hold their connection set-up too).
        stop = threading.Event()

        def warm() -> None:
            while not stop.is_set():
                lim.hit("10/hour", "k")

        warmers = [threading.Thread(target=warm) for _ in range(THREADS)]
        for t in warmers:
            t.start()
        try:
            wait_until(lambda: fault_proxy.open_connections() >= THREADS, 30, "a connection per thread")
        finally:
            stop.set()
            for t in warmers:
                t.join()
        seen = asked(fault_proxy)
        fault_proxy.stall()  # nothing is answered: every refusal still asking is in flight
        decisions: list[redcount.Decision] = []
        callers = [
            threading.Thread(target=lambda: decisions.append(lim.hit("10/hour", "k", lease=100)))
            for _ in range(THREADS)
        ]
        for t in callers:
            t.start()
        try:
            # Each caller asks the store itself, at once, as unleased callers do; none queues
            # behind another's round trip (which cost a leased hot key 3.5x its refusal rate).
            wait_until(
                lambda: asked(fault_proxy) - seen >= THREADS, 30, "every refusal in flight"
            )
        finally:
            fault_proxy.heal()
            for t in callers:
                t.join()
        assert len(decisions) == THREADS and not any(decisions)
        assert asked(fault_proxy) - seen == THREADS
    finally:
        store.close()


def test_with_a_refusal_cache_no_round_trip_until_the_window_can_admit(redis_server: RedisServer) -> None:
    clock = redcount.ManualClock(time.time() // 3600 * 3600 + 1)  # early in the hour
    store = redcount.connect(redis_server.url, clock=clock)
    try:
        lim = redcount.Limiter(store, prefix=f"ex:{uuid.uuid4().hex[:8]}", refusal_cache=100)
        admitted = 0
        while lim.hit("10/hour", "k", lease=100):
            admitted += 1
        assert admitted == 10
        before = scripts_run(store)
        for _ in range(50):
            d = lim.hit("10/hour", "k", lease=100)
            assert not d and d.retry_after > 0
        assert scripts_run(store) == before  # answered in the process
        clock.advance(d.retry_after)  # the window ends: the store is asked, and admits
        assert lim.hit("10/hour", "k", lease=100)
        assert scripts_run(store) == before + 1
    finally:
        store.close()


@pytest.mark.usefixtures("away_from_hour_boundary")
def test_threads_on_a_key_with_room_share_whole_leases(redis_store: redcount.Store) -> None:
    lim = redcount.Limiter(redis_store, prefix=f"room:{uuid.uuid4().hex[:8]}")
    before = scripts_run(redis_store)

    def hits() -> None:
        for _ in range(500):
            assert lim.hit("1000000/hour", "k", lease=100)

    threads = [threading.Thread(target=hits) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # A thread whose lease ran out takes the next one while the others wait for it, so the
    # 4,000 hits need 40 leases of 100, not a round trip each (a refill the woken threads
    # still saw running made each of them take only its cost, one after another).
    assert scripts_run(redis_store) - before <= 2 * THREADS * 500 // 100
