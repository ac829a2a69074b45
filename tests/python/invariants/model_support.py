"""What the model-based tests (test_model_*.py) share: a store under test with the clock the
model may move, and Hypothesis settings that keep the suite short.

On ``memory://`` the store runs on a :class:`redcount.ManualClock`, so a model steps through
windows, expiry and refills exactly. On a real redis-server time is the wall clock and
cannot be moved: the machines use windows far longer than a run there (an hour or a day),
so nothing expires while they run, and a run that straddles a fixed window's boundary
stops comparing (:meth:`Backend.turned_over`).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
import redcount
from hypothesis import HealthCheck, settings
from redcount.tools.servers import RedisServer

# Modest on purpose: every example talks to a real server on the Redis runs, and the suite
# has to stay well under a minute on two busy cores.
MODEL_SETTINGS = settings(
    max_examples=20,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@dataclass
class Backend:
    """The store a machine drives. ``clock`` is None on Redis (the wall clock)."""

    name: str
    store: redcount.Store
    clock: redcount.ManualClock | None
    started: float = field(default_factory=time.time)

    @property
    def movable(self) -> bool:
        return self.clock is not None

    def now_ms(self) -> int:
        """Now as the store's counters see it, in whole milliseconds."""
        t = self.clock.now() if self.clock is not None else time.time()
        return round(t * 1000)

    def advance_ms(self, ms: int) -> int:
        """Moves the manual clock ``ms`` forward; returns the new now in ms."""
        assert self.clock is not None
        self.clock.set((self.now_ms() + ms) / 1000)
        return self.now_ms()

    def turned_over(self, window_s: int) -> bool:
        """On the wall clock: whether a boundary of ``window_s``-second windows passed since
        this machine started (its fixed-window expectations no longer hold)."""
        if self.clock is not None:
            return False
        return int(self.started // window_s) != int(time.time() // window_s)


def unique(name: str) -> str:
    """A name no other example uses (the stores are shared by a test's examples)."""
    return f"{name}-{uuid.uuid4().hex[:12]}"


@pytest.fixture(params=["memory", pytest.param("redis", marks=pytest.mark.redis_only)])
def model_backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    """``memory://`` on a manual clock, then a real redis-server (the session's)."""
    if request.param == "memory":
        clock = redcount.ManualClock(1_700_000_123.456)
        store = redcount.connect(clock=clock)
        backend = Backend("memory", store, clock)
    else:
        server: RedisServer = request.getfixturevalue("redis_server")
        store = redcount.connect(f"redis://127.0.0.1:{server.port}/0")
        backend = Backend("redis", store, None)
    try:
        yield backend
    finally:
        store.close()
