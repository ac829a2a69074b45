"""Closing or dropping a queueing counter (``on_error="queue"``) while its server is stalled.

The retry thread can be stuck in an attempt for as long as the store's timeouts allow
(here 30 s, against a SIGSTOPped server). ``close(timeout)`` must return within its
timeout and a dropped counter must not wait for that thread at all (its destructor runs
with the GIL held: waiting there would freeze every Python thread), so neither may join
the retry thread.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
from collections.abc import Callable

import redcount
from conftest import RedisServer
from helpers import server_rx_queued, wait_until

Factory = Callable[..., RedisServer]


def in_thread(fn: Callable[[], object], limit: float = 10.0) -> list[object]:
    """Runs fn in a thread and waits for it at most `limit` s (a liveness bound far above
    the timeouts under test, not a speed assertion): the old code waited 30 s here."""
    out: list[object] = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(limit)
    assert not t.is_alive(), "blocked on the stalled server's retry attempt"
    return out


def test_close_and_drop_do_not_wait_for_a_stalled_retry(redis_factory: Factory,
                                                        stopped: list[RedisServer]) -> None:
    server = redis_factory()
    store = redcount.connect(server.url, connect_timeout=30, command_timeout=30)
    make = lambda name: redcount.FixedWindowCounter(  # noqa: E731
        store, name, 3600, on_error="queue", retry_backoff=2.0, retry_backoff_max=2.0)
    kept = make("kept")
    dropped = [make("dropped")]
    server.stop()  # refused: both increments go to the queue at once
    assert kept.incr("k") == 0
    assert dropped[0].incr("k") == 0
    server.start()
    assert server.proc is not None
    os.kill(server.proc.pid, signal.SIGSTOP)  # before the first retry (2 s backoff) is due
    stopped.append(server)
    # The retry threads reconnect and send to the stalled server: stuck for up to 30 s.
    wait_until(lambda: server_rx_queued(server.port), what="a retry to reach the stalled server")

    # A ticker shows that other Python threads run while the counter goes away.
    ticks = [0]
    stop_ticking = threading.Event()

    def tick() -> None:
        while not stop_ticking.is_set():
            ticks[0] += 1
            time.sleep(0.001)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()

    def drop() -> int:
        dropped.clear()
        gc.collect()
        return ticks[0]

    in_thread(drop)
    (left,) = in_thread(lambda: kept.close(0.2))
    assert left >= 0
    stop_ticking.set()
    ticker.join()
    assert ticks[0] > 0
    assert server_rx_queued(server.port)  # still stalled: nothing above waited for it

    os.kill(server.proc.pid, signal.SIGCONT)
    # The attempt that close() left behind ends on its own and is accounted for: delivered,
    # or counted as failed, never lost silently.
    wait_until(lambda: kept.stats().delivered + kept.stats().failed == kept.stats().queued,
               timeout=40, what="the abandoned attempt to be accounted for")
    store.close()
