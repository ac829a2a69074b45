"""TTL invariants, read back from the store itself.

- Every key redcount writes has a TTL > 0, and it ends exactly at its window's end plus
  grace (Redis: PEXPIRETIME; memory: PTTL under a frozen ManualClock).
- A key that lost its TTL (PERSIST, a foreign ``SET key 5``) gets it back on the next
  increment, in both modes, and the count carries on.
- SCRIPT FLUSH does not break anything: the next call reloads the script (NOSCRIPT).
- Limiter keys obey the same rules (their grace is 1 s).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redcount
from helpers import all_keys, ms

MODES = ["script", "commands"]
LIMITER_GRACE_MS = 1000

pytestmark = pytest.mark.usefixtures("away_from_hour_boundary")


def expected_deadline_ms(counter: redcount.FixedWindowCounter, user_key: str, storage_key: bytes | str) -> int:
    """Window end + grace of the window a storage key belongs to, from the key's own
    window index (so it is exact even if a window turned over since it was written).
    With stagger, the key's offset is where its current window starts within the window."""
    if isinstance(storage_key, bytes):
        storage_key = storage_key.decode()
    tail = storage_key.split("}:", 1)[1]  # "<window_ms>:<index>[:rid:<id>]"
    window_ms, index = (int(p) for p in tail.split(":")[:2])
    assert window_ms == ms(counter.window)
    offset = ms(counter.current_window(user_key)[0]) % window_ms
    if not getattr(counter, "_stagger", False):
        assert offset == 0  # clock-aligned
    return index * window_ms + offset + window_ms + ms(counter.grace)


def check_redis_key(store: redcount.Store, key: bytes | str, deadline_ms: int) -> None:
    now_before = ms(time.time())
    pttl = store.execute("PTTL", key)
    assert pttl > 0, f"{key!r} has PTTL {pttl}"
    assert pttl <= deadline_ms - now_before + 1, f"{key!r} outlives its window + grace: PTTL {pttl}"
    assert store.execute("PEXPIRETIME", key) == deadline_ms, key


def check_current_key(store: redcount.Store, counter: redcount.FixedWindowCounter, user_key: str) -> None:
    """The key of `user_key`'s current window expires exactly at end + grace."""
    _, end = counter.current_window(user_key)
    key = counter.storage_key(user_key)
    deadline = ms(end) + ms(counter.grace)
    assert deadline == expected_deadline_ms(counter, user_key, key)
    check_redis_key(store, key, deadline)


def make_counter(store: redcount.Store, name: str, window: float, *, stagger: bool = False, **kw: object
                 ) -> redcount.FixedWindowCounter:
    c = redcount.FixedWindowCounter(store, name, window, stagger=stagger, **kw)  # type: ignore[arg-type]
    c._stagger = stagger  # type: ignore[attr-defined]  # remembered for expected_deadline_ms
    return c


def ensure_time_left(store: redcount.Store, counter: redcount.FixedWindowCounter, users: list[str],
                     needed: float) -> None:
    """Wait (at most `needed` s per window) until each user's window has `needed` s left, so
    keys written now cannot expire before the test reads them back."""
    for _ in range(10):
        lefts = [counter.current_window(u)[1] - store.now() for u in users]
        short = [x for x in lefts if x < needed]
        if not short:
            return
        time.sleep(max(short) + 0.01)
    raise AssertionError("could not find a quiet moment in the windows")


# --------------------------------------------------------------------------- Redis


@pytest.mark.redis_only
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize(("window", "grace", "stagger"), [(60, 0.0, False), (3600, 1.0, False), (7, 0.25, True),
                                                          (86400, 2.5, True), (10.5, 0.001, False)])
def test_every_key_ends_at_window_end_plus_grace(redis_store: redcount.Store, mode: str, window: float,
                                                 grace: float, stagger: bool) -> None:
    c = make_counter(redis_store, "inv", window, grace=grace, stagger=stagger, mode=mode)
    users = ["alice", "bob", "日本", "x" * 300, "only-many"]
    ensure_time_left(redis_store, c, users, 0.5)
    users.pop()
    for u in users:
        c.incr(u)
        c.incr(u, 3)
    c.incr_many({u: 2 for u in users})
    c.incr_many({"only-many": 5})
    rids = []
    if mode == "script":
        c.incr("alice", request_id="rid-1")
        c.incr("alice", request_id="rid-1")
        rids.append(("alice", "rid-1"))
    keys = all_keys(redis_store)
    assert len(keys) >= len(users) + 1
    for key in keys:
        user = key.decode().split(":{", 1)[1].split("}:", 1)[0]
        check_redis_key(redis_store, key, expected_deadline_ms(c, user, key))
    for u in users:
        if c.storage_key(u).encode() in keys:  # (not if the window just turned over)
            check_current_key(redis_store, c, u)
    for user, rid in rids:
        assert any(k.endswith(f":rid:{rid}".encode()) for k in keys)


@pytest.mark.redis_only
@pytest.mark.parametrize("mode", MODES)
def test_persisted_key_gets_its_ttl_back(redis_store: redcount.Store, mode: str) -> None:
    c = make_counter(redis_store, "persist", 3600, mode=mode, grace=1.5)
    assert c.incr("k", 2) == 2
    key = c.storage_key("k")
    assert redis_store.execute("PERSIST", key) == 1
    assert redis_store.execute("PTTL", key) == -1
    assert c.ttl("k") == -1.0
    assert c.incr("k") == 3
    check_current_key(redis_store, c, "k")
    # incr_many repairs too.
    assert redis_store.execute("PERSIST", key) == 1
    assert c.incr_many({"k": 4, "other": 1}) == {"k": 7, "other": 1}
    check_current_key(redis_store, c, "k")
    check_current_key(redis_store, c, "other")


@pytest.mark.redis_only
def test_duplicate_request_id_still_repairs_a_lost_ttl(redis_store: redcount.Store) -> None:
    c = make_counter(redis_store, "persist", 3600)
    assert c.incr("k", request_id="r") == 1
    redis_store.execute("PERSIST", c.storage_key("k"))
    assert c.incr("k", request_id="r") == 1  # a duplicate: counts nothing...
    check_current_key(redis_store, c, "k")  # ...but the deadline is back


@pytest.mark.redis_only
@pytest.mark.parametrize("mode", MODES)
def test_foreign_set_without_ttl_is_repaired(redis_store: redcount.Store, mode: str) -> None:
    c = make_counter(redis_store, "foreign", 3600, mode=mode)
    key = c.storage_key("k")
    assert redis_store.execute("SET", key, "5") == "OK"  # someone else wrote it, no TTL
    assert redis_store.execute("PTTL", key) == -1
    assert c.incr("k") == 6  # the count carries on from 5
    check_current_key(redis_store, c, "k")
    assert c.get("k") == 6


@pytest.mark.redis_only
@pytest.mark.parametrize("mode", MODES)
def test_foreign_set_with_a_short_ttl_keeps_a_bounded_ttl(redis_store: redcount.Store, mode: str) -> None:
    # A key that has a (shorter) TTL may keep it; it must never end up without one or
    # with one past the window's end + grace.
    c = make_counter(redis_store, "foreign", 3600, mode=mode)
    key = c.storage_key("k")
    redis_store.execute("SET", key, "5", "PX", 100_000)
    assert c.incr("k") == 6
    _, end = c.current_window("k")
    now_before = ms(time.time())
    assert 0 < redis_store.execute("PTTL", key) <= ms(end) + ms(c.grace) - now_before + 1


@pytest.mark.redis_only
@pytest.mark.parametrize("mode", MODES)
def test_incr_after_script_flush(redis_store: redcount.Store, mode: str) -> None:
    c = make_counter(redis_store, "flush", 3600, mode=mode)
    assert c.incr("k") == 1
    assert redis_store.execute("SCRIPT", "FLUSH") == "OK"
    assert c.incr("k") == 2  # NOSCRIPT -> SCRIPT LOAD -> run again, counted once
    assert c.incr_many({"k": 1, "j": 1}) == {"k": 3, "j": 1}
    if mode == "script":
        redis_store.execute("SCRIPT", "FLUSH")
        assert c.incr("k", request_id="once") == 4
        redis_store.execute("SCRIPT", "FLUSH")
        assert c.incr("k", request_id="once") == 4
    check_current_key(redis_store, c, "k")
    assert c.get("k") == (4 if mode == "script" else 3)


@pytest.mark.redis_only
def test_scripts_are_loaded_again_after_flush(redis_store: redcount.Store) -> None:
    c = make_counter(redis_store, "flush", 3600)
    c.incr("k")
    lim = redcount.Limiter(redis_store)
    lim.hit("5/hour", "k")
    redis_store.execute("SCRIPT", "FLUSH")
    assert c.incr("k") == 2
    assert lim.hit("5/hour", "k").remaining == 3


def limiter_deadline(key: bytes) -> int:
    window_ms, index = (int(p) for p in key.split(b":")[-2:])
    return (index + 1) * window_ms + LIMITER_GRACE_MS


@pytest.mark.redis_only
def test_limiter_keys_ttl_and_repair(redis_store: redcount.Store) -> None:
    lim = redcount.Limiter(redis_store, prefix="L")
    limits = "3/minute;10/hour"
    for _ in range(2):
        assert lim.hit(limits, "ip")
    keys = all_keys(redis_store)
    assert len(keys) == 2
    for k in keys:
        check_redis_key(redis_store, k, limiter_deadline(k))
    # A limiter key that lost its TTL is repaired by the next allowed hit...
    for k in keys:
        redis_store.execute("PERSIST", k)
    assert lim.hit(limits, "ip")
    for k in keys:
        check_redis_key(redis_store, k, limiter_deadline(k))
    # ...and by a denied one (or the client would be locked out forever).
    for k in keys:
        redis_store.execute("PERSIST", k)
    d = lim.hit(limits, "ip")
    assert not d
    for k in keys:
        check_redis_key(redis_store, k, limiter_deadline(k))
    assert [s.count for s in lim.stats(limits, "ip")] == [3, 3]


@pytest.mark.redis_only
def test_limiter_foreign_set_is_repaired(redis_store: redcount.Store) -> None:
    lim = redcount.Limiter(redis_store, prefix="L")
    lim.hit("5/hour", "ip")
    (key,) = all_keys(redis_store)
    redis_store.execute("SET", key, "4")
    d = lim.hit("5/hour", "ip")
    assert d and d.remaining == 0
    check_redis_key(redis_store, key, limiter_deadline(key))


@pytest.mark.redis_only
def test_no_key_without_ttl_after_mixed_workload(redis_store: redcount.Store) -> None:
    counters = [make_counter(redis_store, f"n{i}", w, mode=m, grace=g)  # type: ignore[arg-type]
                for i, (w, m, g) in enumerate([(60, "script", 0), (3600, "commands", 1), (5, "script", 0.5)])]
    lim = redcount.Limiter(redis_store)
    for i in range(50):
        for c in counters:
            c.incr(f"user{i % 7}", 1 + i % 3)
        counters[0].incr(f"user{i % 7}", request_id=f"r{i % 10}")
        counters[1].incr_many({f"user{j}": j + 1 for j in range(i % 4 + 1)})
        lim.hit("20/minute;100/hour", f"user{i % 5}")
    keys = all_keys(redis_store)
    assert len(keys) > 20
    for k in keys:
        assert redis_store.execute("PTTL", k) > 0, k


# --------------------------------------------------------------------------- memory


def test_memory_every_key_has_exact_ttl(clock: redcount.ManualClock, clock_store: redcount.Store) -> None:
    counters = {}
    for mode in MODES:
        c = counters[f"m{mode}"] = make_counter(clock_store, f"m{mode}", 60, mode=mode, grace=1.25)
        for u in ("a", "b", "c"):
            c.incr(u, 2)
        c.incr_many({"a": 1, "d": 1})
        if mode == "script":
            c.incr("a", request_id="rid")
    s = counters["stag"] = make_counter(clock_store, "stag", 60, stagger=True, grace=0.5)
    s.incr("a")
    s.incr("b")
    redcount.Limiter(clock_store).hit("3/minute;50/hour", "ip")
    now = ms(clock.now())
    keys = all_keys(clock_store)
    assert len(keys) == 5 + 4 + 2 + 2
    for key in keys:
        pttl = clock_store.execute("PTTL", key)
        text = key.decode()
        if text.startswith("redcount:lim:"):
            deadline = limiter_deadline(key)
        else:
            user = text.split(":{", 1)[1].split("}:", 1)[0]
            deadline = expected_deadline_ms(counters[text.split(":")[1]], user, key)
        assert pttl == deadline - now, key  # exactly, under a frozen clock
    # Staggered keys end at different times, each at its own window end + grace.
    assert clock_store.execute("PTTL", s.storage_key("a")) != clock_store.execute("PTTL", s.storage_key("b"))
    for u in ("a", "b"):
        _, end = s.current_window(u)
        assert clock_store.execute("PTTL", s.storage_key(u)) == ms(end) + 500 - now


def test_memory_persist_and_foreign_set_are_repaired(clock: redcount.ManualClock,
                                                     clock_store: redcount.Store) -> None:
    for mode in MODES:
        c = make_counter(clock_store, f"rep{mode}", 60, mode=mode, grace=1.0)
        _, end = c.current_window("k")
        deadline = ms(end) + 1000
        assert c.incr("k") == 1
        clock_store.execute("PERSIST", c.storage_key("k"))
        assert c.ttl("k") == -1.0
        assert c.incr("k") == 2
        assert clock_store.execute("PTTL", c.storage_key("k")) == deadline - ms(clock.now())
        clock_store.execute("SET", c.storage_key("j"), "5")
        assert c.incr("j") == 6
        assert clock_store.execute("PTTL", c.storage_key("j")) == deadline - ms(clock.now())
    lim = redcount.Limiter(clock_store, prefix="L")
    lim.hit("2/minute", "ip")
    (key,) = all_keys(clock_store, "L:*")
    clock_store.execute("PERSIST", key)
    lim.hit("2/minute", "ip")
    assert clock_store.execute("PTTL", key) == limiter_deadline(key) - ms(clock.now())
    clock_store.execute("PERSIST", key)
    assert not lim.hit("2/minute", "ip")  # denied, and still repaired
    assert clock_store.execute("PTTL", key) == limiter_deadline(key) - ms(clock.now())


def test_memory_keys_really_expire(clock: redcount.ManualClock) -> None:
    store = redcount.connect(clock=clock, sweep_interval=0)  # no background sweep: we sweep by hand
    c = make_counter(store, "exp", 10, grace=2.0)
    lim = redcount.Limiter(store)
    c.incr("k", 5)
    c.incr("k", 1, request_id="r")
    lim.hit("5/10 seconds", "k")
    _, end = c.current_window("k")
    key = c.storage_key("k")
    assert store.stored_keys() == 3  # count, request id, limiter
    clock.set(end + 1.0)  # the limiter's deadline (1 s grace): its key is gone
    assert store.execute("DBSIZE") == 2
    assert store.execute("KEYS", "redcount:lim:*") == []
    clock.set(end + 2.0 - 0.001)  # 1 ms before the counter's deadline: still there
    assert store.execute("GET", key) == b"6"
    assert store.execute("PTTL", key) == 1
    assert c.get("k") == 0  # (a new window has begun, though)
    clock.set(end + 2.0)  # at the deadline: gone
    assert store.execute("GET", key) is None
    assert store.execute("DBSIZE") == 0
    # GET freed the count's key lazily; the request id and limiter keys are dead but held
    # until a sweep frees them.
    assert store.stored_keys() == 2
    assert store.sweep() == 2
    assert store.stored_keys() == 0
    store.close()


@pytest.mark.redis_only
def test_a_server_of_unknown_version_gets_the_scripts_every_version_has(redis_factory: Any) -> None:
    # The INCRBY + PEXPIREAT ... LT transaction needs Redis >= 7.0, which the handshake reads
    # from INFO. Managed services often deny INFO (and Debian has no Redis 6 to test with): a
    # user without it stands for a server too old for LT. Its increments must take the
    # script, which every version runs, and keep every TTL promise; the default user on the
    # same server takes the transaction.
    server = redis_factory()
    admin = redcount.connect(server.url)
    admin.execute("ACL", "SETUSER", "noinfo", "on", ">pw", "~*", "&*", "+@all", "-info")
    old = redcount.connect(f"redis://noinfo:pw@127.0.0.1:{server.port}")
    try:
        with pytest.raises(redcount.ReplyError, match="NOPERM"):
            old.execute("INFO", "server")

        for store, name, via in ((old, "old", "evalsha"), (admin, "new", "exec")):
            c = make_counter(store, name, 3600, grace=1.0)
            ensure_time_left(store, c, ["k"], 0.5)
            admin.execute("CONFIG", "RESETSTAT")
            assert [c.incr("k") for _ in range(5)] == [1, 2, 3, 4, 5]
            calls = command_calls(admin)
            assert calls.get(via, 0) == 5, calls
            assert calls.get("exec" if via == "evalsha" else "evalsha", 0) == 0, calls
            check_current_key(admin, c, "k")
            # A far foreign expiry is cut back on either path.
            admin.execute("PEXPIRE", c.storage_key("k"), 10**12)
            assert c.incr("k") == 6
            check_current_key(admin, c, "k")
    finally:
        old.close()
        admin.close()


def command_calls(admin: redcount.Store) -> dict[str, int]:
    """Calls per command since the last CONFIG RESETSTAT (INFO commandstats)."""
    out = {}
    for line in admin.execute("INFO", "commandstats").decode().splitlines():  # type: ignore[union-attr]
        if line.startswith("cmdstat_"):
            name, rest = line[len("cmdstat_"):].split(":", 1)
            out[name] = int(rest.split(",", 1)[0].split("=", 1)[1])
    return out


def wait_until_server_busy(probe: redcount.Store) -> None:
    """Until a PING on ``probe`` (a 50 ms command timeout) goes unanswered: another call
    (DEBUG SLEEP) holds the server, so that call is in flight."""
    deadline = time.monotonic() + 10
    while True:
        try:
            probe.ping()
        except redcount.TimeoutError:
            return
        assert time.monotonic() < deadline, "DEBUG SLEEP never reached the server"


def incr_while_another_thread_waits(store: redcount.Store, probe: redcount.Store,
                                    counter: redcount.FixedWindowCounter, key: str) -> int:
    """``counter.incr(key)``, prepared while another thread's call (DEBUG SLEEP 0.5) is in
    flight on ``store``."""
    other = threading.Thread(target=store.execute, args=("DEBUG", "SLEEP", "0.5"))
    other.start()
    try:
        wait_until_server_busy(probe)
        return counter.incr(key)
    finally:
        other.join()


@contextlib.contextmanager
def debug_server_stores(redis_factory: Any, **options: Any
                        ) -> Iterator[tuple[redcount.Store, redcount.Store, redcount.Store]]:
    """A server that takes DEBUG SLEEP, and three stores on it: the one under test (with
    ``options``), an admin, and a probe for wait_until_server_busy; closed on the way out."""
    server = redis_factory(["--enable-debug-command", "yes"])
    store = redcount.connect(server.url, **options)
    admin = redcount.connect(server.url)
    probe = redcount.connect(server.url, command_timeout=0.05)
    try:
        yield store, admin, probe
    finally:
        probe.close()
        admin.close()
        store.close()


@pytest.mark.redis_only
def test_an_increment_takes_the_script_while_another_thread_waits_on_the_store(redis_factory: Any) -> None:
    # Alone, an increment is the INCRBY + PEXPIREAT LT transaction (less work for the
    # server). While another thread waits on a store that gives each thread a socket of its
    # own (max_connections above connections), it is one script call (less work for the
    # client, which is what runs out then). Both count and hold the TTL alike, and a foreign
    # far expiry is cut back on both.
    with debug_server_stores(redis_factory, max_connections=2) as (store, admin, probe):
        c = make_counter(store, "busy", 3600, grace=1.0)
        ensure_time_left(store, c, ["k"], 5.0)
        store.ping()  # connected: the server's version is known (LT needs 7.0)
        admin.execute("CONFIG", "RESETSTAT")
        assert c.incr("k") == 1  # alone
        admin.execute("PEXPIRE", c.storage_key("k"), 10**12)
        assert incr_while_another_thread_waits(store, probe, c, "k") == 2
        check_current_key(admin, c, "k")
        admin.execute("PEXPIRE", c.storage_key("k"), 10**12)
        assert c.incr("k") == 3  # alone again
        check_current_key(admin, c, "k")
        calls = command_calls(admin)
        assert calls.get("exec", 0) == 2 and calls.get("evalsha", 0) == 1, calls


@pytest.mark.redis_only
def test_pipelined_increments_keep_the_transaction_while_other_calls_are_in_flight(redis_factory: Any) -> None:
    # Where concurrent calls share pipelined writes (one socket for every thread, with
    # max_connections=1; coroutines), the transaction stays: it costs the server less.
    import asyncio

    import redcount.aio

    with debug_server_stores(redis_factory, max_connections=1) as (store, admin, probe):
        c = make_counter(store, "pbusy", 3600, grace=1.0)
        ac = redcount.aio.FixedWindowCounter.from_sync(c)
        astore = redcount.aio.AsyncStore(store)

        async def awaited() -> int:
            other = asyncio.ensure_future(astore.execute("DEBUG", "SLEEP", "0.5"))
            await asyncio.to_thread(wait_until_server_busy, probe)
            count = await ac.incr("k")  # prepared while another coroutine's call was in flight
            await other
            return count

        ensure_time_left(store, c, ["k"], 5.0)
        store.ping()
        admin.execute("CONFIG", "RESETSTAT")
        assert incr_while_another_thread_waits(store, probe, c, "k") == 1  # on the same socket
        assert asyncio.run(awaited()) == 2
        check_current_key(admin, c, "k")
        calls = command_calls(admin)
        assert calls.get("exec", 0) == 2 and calls.get("evalsha", 0) == 0, calls
