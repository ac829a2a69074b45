"""When Redis fails: ``redcount.connect(url, budget=..., breaker=..., fallback=...)``,
``Limiter(on_unavailable=...)`` and the web layer's ``fail=`` built on it.

Against real redis-servers that are SIGKILLed and restarted on the same port, or frozen with
SIGSTOP (so requests time out instead of being refused). The budget is a correctness
contract ("every call decides within it"), so the outage tests assert the p99 decision
latency against it, plus ``SCHEDULING_TOLERANCE`` for a loaded CI machine (thread wake-ups,
the GIL); the plain store would wait its command_timeout (seconds) instead.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redcount
import redcount.aio
from helpers import wait_until
from redcount.web import FailurePolicy, LimitSpec, remote_address
from redcount.web.engine import decide
from redcount.web.spec import resolve_all

pytestmark = pytest.mark.redis_only

BUDGET = 0.05
# Added to the budget for the p99 check: scheduling of a woken thread on a busy 2-core CI
# machine. Far below what the plain store would take (command_timeout, 2 s by default).
SCHEDULING_TOLERANCE = 0.05
# Limits must be enforced again within this long of Redis accepting connections again.
RECOVERY = 1.0


def first_served(call: Callable[[], object]) -> None:
    """Makes a first call on a fresh store until Redis serves it: the very first one also
    waits for the connection's set-up, which a loaded machine may not finish within the
    budget (the call then fails at its budget and the set-up goes on)."""

    def served() -> bool:
        try:
            call()
        except redcount.Unavailable:
            return False
        return True

    wait_until(served, timeout=10, what="a first call served by Redis")


def p99(values: list[float]) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, math.ceil(0.99 * len(s)) - 1)]


class Load:
    """Threads calling ``limiter.hit`` in a loop, recording (start, end, served) per call."""

    def __init__(self, limiter: redcount.Limiter, threads: int = 4) -> None:
        self.limiter = limiter
        self.samples: list[tuple[float, float, bool]] = []
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.threads = [threading.Thread(target=self.run, args=(i,), daemon=True) for i in range(threads)]

    def run(self, i: int) -> None:
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                self.limiter.hit("100000/minute", f"load:{i}")
                served = True
            except redcount.Unavailable:
                served = False
            t1 = time.monotonic()
            with self.lock:
                self.samples.append((t0, t1, served))
            time.sleep(0.002)  # pacing, so that fail-fast calls do not spin on the GIL

    def __enter__(self) -> Load:
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(5)

    def served_after(self, t: float) -> float | None:
        with self.lock:
            ends = [t1 for (_, t1, ok) in self.samples if ok and t1 > t]
        return min(ends) if ends else None

    def latencies(self, start: float, end: float) -> list[float]:
        with self.lock:
            return [t1 - t0 for (t0, t1, _) in self.samples if start <= t0 <= end]


def test_sigkill_and_restart_under_load(redis_factory: Any, capsys: pytest.CaptureFixture[str]) -> None:
    server = redis_factory()
    store = redcount.connect(server.url, budget=BUDGET)
    assert isinstance(store, redcount.ResilientStore)
    limiter = redcount.Limiter(store, "fixed-window")
    try:
        with Load(limiter) as load:
            wait_until(lambda: load.served_after(0) is not None, timeout=3.0, what="a first served call")
            t_kill = time.monotonic()
            server.kill()
            wait_until(lambda: store.breaker_state != "closed", timeout=3.0, what="the breaker to open")
            wait_until(lambda: time.monotonic() > t_kill + 0.6, timeout=3.0, what="an outage of 0.6 s")
            t_restart = time.monotonic()
            server.start()  # returns once the server answers PING
            t_up = time.monotonic()
            wait_until(lambda: load.served_after(t_restart) is not None, timeout=5, what="Redis to serve again")
        down = load.latencies(t_kill, t_restart)
        back = load.served_after(t_restart)
        assert back is not None
        assert len(down) >= 20
        assert p99(down) <= BUDGET + SCHEDULING_TOLERANCE, sorted(down)[-5:]
        assert back - t_up <= RECOVERY
        with capsys.disabled():
            print(f"\n[resilient] SIGKILL: {len(down)} calls while down, p99 {p99(down) * 1000:.1f} ms, "
                  f"max {max(down) * 1000:.1f} ms (budget {BUDGET * 1000:.0f} ms); served by Redis again "
                  f"{(back - t_up) * 1000:.0f} ms after it accepted connections")
        # Enforced again: the restarted server starts empty, and counts from there.
        got = [bool(limiter.hit("2/minute", "after-restart")) for _ in range(3)]
        assert got == [True, True, False]
        assert store.breaker_state == "closed"
    finally:
        store.close()


def test_sigstop_timeouts_stay_within_the_budget(
    redis_factory: Any, stopped: list[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    server = redis_factory()
    stopped.append(server)
    store = redcount.connect(server.url, budget=BUDGET)
    assert isinstance(store, redcount.ResilientStore)
    limiter = redcount.Limiter(store, "sliding-window")
    try:
        first_served(lambda: limiter.hit("5/minute", "k"))
        with Load(limiter, threads=3) as load:
            wait_until(lambda: load.served_after(0) is not None, timeout=3.0, what="a first served call")
            t_stop = time.monotonic()
            os.kill(server.proc.pid, signal.SIGSTOP)
            wait_until(lambda: store.breaker_state != "closed", timeout=3.0, what="the breaker to open")
            wait_until(lambda: time.monotonic() > t_stop + 0.5, timeout=3.0, what="a freeze of 0.5 s")
            t_cont = time.monotonic()
            os.kill(server.proc.pid, signal.SIGCONT)
            wait_until(lambda: load.served_after(t_cont) is not None, timeout=5, what="Redis to serve again")
        frozen = load.latencies(t_stop, t_cont)
        back = load.served_after(t_cont)
        assert back is not None
        # At least one call met the frozen server (and timed out at the budget).
        assert max(frozen) >= BUDGET * 0.8
        assert p99(frozen) <= BUDGET + SCHEDULING_TOLERANCE, sorted(frozen)[-5:]
        assert back - t_cont <= RECOVERY
        with capsys.disabled():
            print(f"\n[resilient] SIGSTOP: {len(frozen)} calls while frozen, p99 {p99(frozen) * 1000:.1f} ms, "
                  f"max {max(frozen) * 1000:.1f} ms (budget {BUDGET * 1000:.0f} ms); served again "
                  f"{(back - t_cont) * 1000:.0f} ms after SIGCONT")
    finally:
        store.close()


def test_fallback_serves_while_down_and_switches_back(redis_factory: Any, caplog: pytest.LogCaptureFixture) -> None:
    server = redis_factory()
    store = redcount.connect(server.url, budget=BUDGET, fallback="memory://")
    assert isinstance(store, redcount.ResilientStore)
    assert store.fallback == "memory://" and store.budget == BUDGET and store.breaker
    limiter = redcount.Limiter(store, "sliding-window")
    counter = redcount.FixedWindowCounter(store, "views", window=60)
    where = f"127.0.0.1:{server.port}"

    def logged(needle: str) -> int:
        return sum(1 for r in caplog.records if where in r.getMessage() and needle in r.getMessage())

    try:
        with caplog.at_level(logging.DEBUG, logger="redcount"):
            first_served(lambda: limiter.hit("3/minute", "user"))
            assert store.breaker_state == "closed" and store.breaker_switches == 0
            server.kill()
            # Refused connections sent nothing, so every call is decided on the fallback,
            # and its limit is enforced there (counted from zero: nothing is copied over).
            got = [bool(limiter.hit("3/minute", "user")) for _ in range(5)]
            assert got == [True, True, True, False, False]
            assert counter.incr("page") == 1
            assert store.breaker_state in ("open", "half-open") and store.using_fallback
            assert store.breaker_switches == 1 and store.breaker_open and store.fallback_active
            wait_until(lambda: logged("circuit breaker open") == 1, timeout=3.0, what="the switch to be logged")
            for _ in range(20):  # more calls: no more log lines
                limiter.test("3/minute", "user")
            server.start()
            t_up = time.monotonic()

            def back() -> bool:
                limiter.test("3/minute", "user")
                return store.breaker_state == "closed"

            wait_until(back, timeout=5, what="the switch back to Redis")
            assert time.monotonic() - t_up <= RECOVERY
            assert not store.using_fallback and store.breaker_switches == 2
            assert not store.breaker_open and not store.fallback_active
            wait_until(lambda: logged("reachable again") == 1, timeout=3.0, what="the switch back to be logged")
            # Redis restarted empty, and the fallback's counts were not merged back.
            d = limiter.hit("3/minute", "user")
            assert d.allowed and d.remaining == 2 and not d.unavailable
            assert counter.incr("page") == 1
        assert logged("circuit breaker open") == 1 and logged("reachable again") == 1
        opened = [r for r in caplog.records if where in r.getMessage() and "circuit breaker open" in r.getMessage()]
        assert opened[0].levelno == logging.WARNING and opened[0].name == "redcount"
    finally:
        store.close()


def test_breaker_ignores_error_replies_and_bad_input(redis_factory: Any) -> None:
    server = redis_factory()
    store = redcount.connect(server.url, budget=BUDGET)
    assert isinstance(store, redcount.ResilientStore)
    limiter = redcount.Limiter(store, "fixed-window")
    try:
        first_served(lambda: store.execute("SET", "s", "text"))
        for _ in range(10):
            with pytest.raises(redcount.ReplyError, match="WRONGTYPE"):
                store.execute("LPUSH", "s", "x")
            with pytest.raises(redcount.ReplyError, match="not an integer"):
                store.execute("INCR", "s")
            with pytest.raises(redcount.InvalidInputError):
                limiter.hit("10/minute", "k", -1)
            with pytest.raises(redcount.InvalidInputError):
                limiter.hit("ten per fortnight", "k")
        assert store.breaker_state == "closed" and store.breaker_switches == 0
        assert limiter.hit("10/minute", "k")
    finally:
        store.close()


def test_open_breaker_fails_fast_without_a_fallback(redis_factory: Any) -> None:
    server = redis_factory()
    store = redcount.connect(server.url, budget=BUDGET)
    assert isinstance(store, redcount.ResilientStore)
    limiter = redcount.Limiter(store)
    try:
        first_served(lambda: limiter.hit("10/minute", "k"))
        server.kill()
        errors = []
        for _ in range(5):
            with pytest.raises(redcount.Unavailable) as info:
                limiter.hit("10/minute", "k")
            errors.append(info.value)
        assert all(isinstance(e, redcount.ConnectionError) for e in errors)
        assert all(e.maybe_applied is False for e in errors)
        assert "circuit breaker is open" in str(errors[-1]) and f":{server.port}" in str(errors[-1])
        assert store.breaker_state in ("open", "half-open")
    finally:
        store.close()


def test_breaker_off_keeps_the_budget(redis_factory: Any, stopped: list[Any]) -> None:
    server = redis_factory()
    stopped.append(server)
    store = redcount.connect(server.url, budget=BUDGET, breaker=False)
    assert isinstance(store, redcount.ResilientStore)
    limiter = redcount.Limiter(store)
    try:
        first_served(lambda: limiter.hit("10/minute", "k"))
        os.kill(server.proc.pid, signal.SIGSTOP)
        for _ in range(4):  # never opens: every call meets the frozen server and its budget
            with pytest.raises(redcount.Unavailable, match="budget 50 ms"):
                limiter.hit("10/minute", "k")
        assert store.breaker_state == "closed" and store.breaker_switches == 0
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        store.close()


@pytest.fixture
def dead_store(redis_factory: Any) -> Iterator[redcount.Store]:
    server = redis_factory()
    store = redcount.connect(server.url, budget=BUDGET)
    first_served(store.ping)
    server.kill()
    yield store
    store.close()


def test_on_unavailable_sync(dead_store: redcount.Store) -> None:
    with pytest.raises(redcount.Unavailable):
        redcount.Limiter(dead_store).hit("1/minute", "k")
    allow = redcount.Limiter(dead_store, on_unavailable="allow")
    deny = redcount.Limiter(dead_store, "token-bucket", on_unavailable="deny")
    for _ in range(5):  # through the breaker's closed and open states alike
        a = allow.hit("1/minute", "k")
        assert a.allowed and a.unavailable and a.retry_after == 0 and "unavailable=True" in repr(a)
        d = deny.hit("2/minute", "k", 2)
        assert not d.allowed and d.unavailable and d.retry_after == 1.0
        assert allow.test("1/minute", "k").allowed and not deny.test("1/minute", "k")
    # Only decisions are made without the store; the other calls raise.
    with pytest.raises(redcount.Unavailable):
        allow.stats("1/minute", "k")
    # Bad input is still bad input, not "unavailable".
    with pytest.raises(redcount.InvalidInputError):
        allow.hit("1/minute", "k", -1)
    assert "on_unavailable='allow'" in repr(allow)


def test_on_unavailable_never_hides_a_closed_store(redis_server: Any) -> None:
    store = redcount.connect(redis_server.url, budget=BUDGET)
    limiter = redcount.Limiter(store, on_unavailable="allow")
    store.close()
    with pytest.raises(redcount.StoreClosed):
        limiter.hit("1/minute", "k")


def test_on_unavailable_async(dead_store: redcount.Store) -> None:
    async def main() -> None:
        with pytest.raises(redcount.Unavailable):
            await redcount.aio.Limiter(dead_store).hit("1/minute", "k")
        allow = redcount.aio.Limiter(dead_store, on_unavailable="allow")
        deny = redcount.aio.Limiter(dead_store, on_unavailable="deny")
        for _ in range(5):
            a, d = await asyncio.gather(allow.hit("1/minute", "k"), deny.hit("1/minute", "k"))
            assert a.allowed and a.unavailable
            assert not d.allowed and d.unavailable and d.retry_after == 1.0
        assert (await allow.test("1/minute", "k")).unavailable
        shared = redcount.aio.Limiter.from_sync(allow.sync, on_unavailable="deny")
        assert not (await shared.hit("1/minute", "k")).allowed
        assert redcount.aio.Limiter.from_sync(allow.sync).on_unavailable == "allow"

    asyncio.run(main())


def test_asyncio_loop_keeps_running_while_redis_is_frozen(redis_factory: Any, stopped: list[Any]) -> None:
    server = redis_factory()
    stopped.append(server)
    store = redcount.aio.connect(server.url, budget=BUDGET)
    limiter = redcount.aio.Limiter(store, on_unavailable="deny")

    first_served(lambda: limiter.sync.hit("10/minute", "k"))

    async def main() -> None:
        os.kill(server.proc.pid, signal.SIGSTOP)
        for _ in range(10):  # closed (each waits out the budget), then open (decided at once)
            ticks = 0
            task = asyncio.ensure_future(limiter.hit("10/minute", "k"))
            while not task.done():
                ticks += 1
                await asyncio.sleep(0)
            d = task.result()
            assert not d.allowed and d.unavailable
            if ticks <= 1:  # decided inline: only an open breaker does that
                assert store.store.breaker_state != "closed"  # type: ignore[attr-defined]
        assert store.store.breaker_state != "closed"  # type: ignore[attr-defined]

    try:
        asyncio.run(main())
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
        store.close()


def test_web_failure_policy_builds_on_on_unavailable(dead_store: redcount.Store) -> None:
    class View:
        method = "GET"
        endpoint = "app.view"
        client = "203.0.113.9"
        native = None

        def header(self, name: str) -> str | None:
            return None

    assert FailurePolicy("open").on_unavailable == "allow"
    assert FailurePolicy("closed").on_unavailable == "deny"
    limiter = redcount.Limiter(dead_store)
    checks = resolve_all([LimitSpec.build("1/minute", name="api", where="route 'view'")], View(), remote_address)
    v = decide(limiter, checks, FailurePolicy("open"))
    assert v.allowed and not v.unavailable and v.outcomes == []
    v = decide(limiter, checks, FailurePolicy("closed"))
    assert not v.allowed and v.unavailable
    # A shadow check counts and reports; it never blocks, even failing closed.
    shadow = resolve_all(
        [LimitSpec.build("1/minute", name="api", where="route 'view'", shadow=True)], View(), remote_address
    )
    v = decide(limiter, shadow, FailurePolicy("closed"))
    assert v.allowed and not v.unavailable
    v = decide(limiter, checks, FailurePolicy("closed"), shadow_all=True)
    assert v.allowed
    # A limiter's own on_unavailable wins: its decision is served as made.
    v = decide(redcount.Limiter(dead_store, on_unavailable="deny"), checks, FailurePolicy("open"))
    assert not v.allowed and v.unavailable


def test_limits_storage_takes_the_connect_keywords(redis_server: Any) -> None:
    limits = pytest.importorskip("limits")
    import redcount.contrib.limits  # noqa: F401  (registers the schemes)

    storage = limits.storage.storage_from_string(
        f"redcount+redis://127.0.0.1:{redis_server.port}/0", budget=BUDGET, fallback="memory://"
    )
    try:
        assert isinstance(storage._core.store, redcount.ResilientStore)
        assert storage.check()
    finally:
        storage._core.store.close()


@pytest.mark.parametrize(
    ("kw", "error", "needle"),
    [
        ({"budget": 0}, redcount.InvalidInputError, "budget must be a finite number of seconds > 0"),
        ({"budget": -1.0}, redcount.InvalidInputError, "budget must be"),
        ({"budget": float("nan")}, redcount.InvalidInputError, "budget must be"),
        ({"budget": float("inf")}, redcount.InvalidInputError, "budget must be"),
        ({"budget": 0.0001}, redcount.InvalidInputError, "at least 1 ms"),
        ({"budget": "0.05"}, TypeError, "budget must be a number of seconds"),
        ({"budget": True}, TypeError, "budget must be a number of seconds"),
        ({"breaker": "yes"}, TypeError, "breaker must be a bool"),
        ({"breaker": None}, TypeError, "breaker must be a bool"),
        ({"fallback": 5}, TypeError, "fallback must be 'memory://' or None"),
        ({"fallback": ""}, redcount.InvalidInputError, "fallback must be"),
        ({"fallback": "redis://127.0.0.1:1/0"}, redcount.InvalidInputError, "fallback must be \"memory://\""),
        ({"fallback": "memory://", "breaker": False}, redcount.InvalidInputError, "needs the circuit breaker"),
        ({"fallback": "nonsense"}, redcount.InvalidInputError, "invalid store URL 'nonsense'"),
    ],
)
def test_bad_input(kw: dict[str, Any], error: type[Exception], needle: str) -> None:
    with pytest.raises(error, match=needle.replace("(", r"\(")):
        redcount.connect("redis://127.0.0.1:1/0", **kw)


def test_bad_input_elsewhere() -> None:
    with pytest.raises(redcount.InvalidInputError, match="a fallback applies to a Redis URL"):
        redcount.connect("memory://", fallback="memory://")
    with pytest.raises(redcount.InvalidInputError, match="on_unavailable must be 'raise', 'allow' or 'deny'"):
        redcount.Limiter(redcount.connect(), on_unavailable="maybe")  # type: ignore[arg-type]
    with pytest.raises(redcount.InvalidInputError, match="on_unavailable"):
        redcount.aio.Limiter(redcount.connect(), on_unavailable="open")  # type: ignore[arg-type]
    # A budget on memory:// changes nothing: it never waits on a network.
    mem = redcount.connect("memory://", budget=BUDGET)
    assert not isinstance(mem, redcount.ResilientStore) and mem.is_memory
    # Neither budget nor fallback: the plain store, breaker or not.
    plain = redcount.connect("redis://127.0.0.1:1/0", breaker=True)
    assert not isinstance(plain, redcount.ResilientStore)
    plain.close()
