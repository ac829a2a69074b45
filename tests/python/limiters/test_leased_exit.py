"""Leased units when a process ends, on a real redis-server: every normal end gives them back
(the end of the main module, sys.exit, SIGINT, a SIGTERM nothing handles, a SIGTERM an
application handles by exiting), and a SIGKILL loses what the process held and no more: at
most its lease, at most half of what the window had left when it was taken."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import uuid

import pytest
import redcount
import redcount.aio as aio
from fault_proxy import FaultProxy
from redcount.tools.servers import RedisServer

pytestmark = [pytest.mark.redis_only, pytest.mark.usefixtures("away_from_hour_boundary")]

# A process that takes a lease, says how many units it holds, then ends as argv[4] says.
HOLDER = textwrap.dedent(
    """
    import signal, sys, time
    import redcount

    url, prefix, lease, how = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
    if how == "app-sigterm":
        # An application's own SIGTERM handler: it decides how the process ends.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
    store = redcount.connect(url)
    lim = redcount.Limiter(store, prefix=prefix, lease_ttl=1)
    assert lim.hit("20/hour", "k", lease=lease)
    print(lim.leased_units, redcount._core._sigterm_returns_leases(), flush=True)
    if how == "sys.exit":
        sys.exit(0)
    if how != "end":
        time.sleep(120)  # until the signal
    """
)


def hold_then_end(url: str, prefix: str, lease: int, how: str) -> tuple[int, bool, int]:
    """Runs HOLDER: (units it held, whether its SIGTERM returned leases, its return code)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, url, prefix, str(lease), how], stdout=subprocess.PIPE, env=env
    )
    assert proc.stdout is not None
    held, armed = proc.stdout.readline().split()
    sig = {
        "sigint": signal.SIGINT,
        "sigterm": signal.SIGTERM,
        "app-sigterm": signal.SIGTERM,
        "sigkill": signal.SIGKILL,
    }
    if how in sig:
        proc.send_signal(sig[how])
    try:
        proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()  # never leave it to a later test's garbage collection
        proc.communicate()
        raise AssertionError(f"the holder did not end within 60 s of {how!r}") from None
    return int(held), armed == b"True", proc.returncode


def admitted_after(store: redcount.Store, prefix: str) -> int:
    """What another process (another limiter) can still admit of "20/hour"."""
    lim = redcount.Limiter(store, prefix=prefix)
    n = 0
    while lim.hit("20/hour", "k", lease=100):
        n += 1
    return n


@pytest.mark.parametrize(
    ("how", "status"),
    [
        ("end", 0),
        ("sys.exit", 0),
        ("sigint", -signal.SIGINT),  # an uncaught KeyboardInterrupt, then SIGINT's own end
        ("sigterm", -signal.SIGTERM),
        ("app-sigterm", 3),
    ],
)
def test_a_process_that_ends_gives_its_units_back(
    redis_server: RedisServer, redis_store: redcount.Store, how: str, status: int
) -> None:
    prefix = f"exit:{uuid.uuid4().hex[:8]}"
    held, armed, code = hold_then_end(redis_server.url, prefix, 100, how)
    assert held == 9  # min(100, 20 / 2) taken, one admitted
    # SIGTERM: the leases' handler only where nothing else handles the signal; the process
    # still ends the way it would have (killed by SIGTERM, or the application's exit code).
    assert armed == (how != "app-sigterm")
    assert code == status
    assert admitted_after(redis_store, prefix) == 19  # nothing lost: the limit exactly


@pytest.mark.parametrize(("lease", "held"), [(100, 9), (4, 3)])
def test_sigkill_loses_what_the_process_held_and_no_more(
    redis_server: RedisServer, redis_store: redcount.Store, lease: int, held: int
) -> None:
    prefix = f"kill:{uuid.uuid4().hex[:8]}"
    got, _, code = hold_then_end(redis_server.url, prefix, lease, "sigkill")
    assert code == -signal.SIGKILL
    # The process took min(lease, 20 // 2) units and admitted one: the rest is lost until the
    # window ends (a killed process cannot say it is gone; giving its units back on a guess
    # could admit past the limit). At most the lease, and at most half of what was left.
    assert got == held <= min(lease, 20 // 2)
    assert admitted_after(redis_store, prefix) == 19 - held


def test_asynchronous_refills_side_by_side_hold_one_lease(fault_proxy: FaultProxy) -> None:
    # Callers of an event loop never wait for each other's refill: each empty-handed one
    # takes its own. Only the first takes a whole lease; the others take just their cost,
    # so the process never holds more than one lease's leftover (what a SIGKILL would lose).
    store = redcount.connect(fault_proxy.url)
    try:
        sync = redcount.Limiter(store, prefix=f"aio:{uuid.uuid4().hex[:8]}")
        lim = aio.Limiter.from_sync(sync)

        async def burst() -> list[redcount.Decision]:
            await lim.hit("1000/hour", "warm")  # the connection
            seen = len(fault_proxy.seen(b"EVALSHA"))
            fault_proxy.stall()  # no reply before every caller has asked (none completes inline)
            calls = [asyncio.ensure_future(lim.hit("1000/hour", "k", lease=10)) for _ in range(8)]
            try:
                for _ in range(6000):  # bounded: until all 8 refills reached the proxy
                    if len(fault_proxy.seen(b"EVALSHA")) - seen >= 8:
                        break
                    await asyncio.sleep(0.005)
            finally:
                fault_proxy.heal()
            return await asyncio.gather(*calls)

        assert all(asyncio.run(burst()))
        assert sync.leased_units == 9
        assert sync.stats("1000/hour", "k")[0].count == 10 + 7
    finally:
        store.close()


def test_a_hit_needing_more_than_the_lease_holds_gives_those_back(redis_store: redcount.Store) -> None:
    lim = redcount.Limiter(redis_store, prefix=f"cost:{uuid.uuid4().hex[:8]}")
    assert lim.hit("40/hour", "k", lease=10)  # takes 10, holds 9
    assert lim.leased_units == 9
    assert lim.hit("40/hour", "k", cost=12, lease=10)  # the 9 go back, a lease of 12 is taken
    assert lim.leased_units == 0
    assert lim.stats("40/hour", "k")[0].count == 1 + 12
