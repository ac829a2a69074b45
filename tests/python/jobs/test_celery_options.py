"""redcount.celery without a worker: option checks at task creation, the settings it needs,
direct calls, and ``apply()`` / ``task_always_eager`` (which wait in the caller). Run on the
embedded store and on a real redis-server."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
import redcount
import redcount.celery
from celery import Celery
from redcount.celery import LimitedTask, MaxWaitExceeded, limited
from redcount.tools.servers import free_port


def nothing() -> None:
    return None


def ran() -> str:
    return "ran"


def double(x: int) -> int:
    return x * 2


def echo(to: str) -> str:
    return to


@pytest.fixture
def app(store: redcount.Store, request: pytest.FixtureRequest) -> Iterator[Any]:
    """A Celery app whose limiter store is the parametrized store (memory or Redis). Its tasks
    are made with ``shared=False``: Celery would otherwise add them to every app made later."""
    a = Celery(f"t{id(request)}", broker="memory://", backend="cache+memory://", set_as_current=False)
    a.conf.update(redcount_store=store, task_eager_propagates=True)
    a.finalize()  # tasks are then made at once, not on first use
    try:
        yield a
    finally:
        a.close()


def test_a_bad_option_fails_when_the_task_is_made(app: Any) -> None:
    """When Celery makes the task class: at once on a finalized app (a worker's), else when
    the app is finalized or the task first used."""
    with pytest.raises(ValueError, match="10/fortnight"):
        app.task(base=LimitedTask, limit="10/fortnight", name="bad1", shared=False)(nothing)
    with pytest.raises(redcount.InvalidInputError, match="strategy must be one of .* got 'bogus'"):
        app.task(base=LimitedTask, limit="1/second", strategy="bogus", name="bad2", shared=False)(nothing)
    with pytest.raises(redcount.InvalidInputError, match="concurrency must be an int >= 1 or None, got 0"):
        app.task(base=LimitedTask, concurrency=0, name="bad3", shared=False)(nothing)
    with pytest.raises(redcount.InvalidInputError, match="max_wait must be finite and >= 0"):
        limited("1/second", app=app, max_wait=-1, name="bad4", shared=False)(nothing)
    with pytest.raises(TypeError, match="limit_key must be a callable"):
        limited("1/second", app=app, limit_key="user", name="bad5", shared=False)(nothing)
    with pytest.raises(TypeError, match="subclass of redcount.celery.LimitedTask"):
        limited("1/second", app=app, base=object)  # type: ignore[arg-type]


def test_missing_store_setting_is_named() -> None:
    a = Celery("nostore", broker="memory://", set_as_current=False)
    try:
        t = a.task(base=LimitedTask, limit="1/second", name="nostore.t", shared=False)(nothing)
        with pytest.raises(redcount.InvalidInputError, match="app.conf.redcount_url is not set"):
            t.apply(throw=True).get()
    finally:
        a.close()


def test_a_direct_call_is_not_limited(app: Any) -> None:
    t = limited("1/minute", app=app, name="direct", shared=False)(double)
    assert [t(i) for i in range(3)] == [0, 2, 4]  # a function call, as with Celery's rate_limit


def test_apply_waits_in_the_caller(app: Any) -> None:
    calls: list[float] = []

    @limited("2/second", app=app, name="eager.wait", shared=False)
    def job(x: int) -> int:
        calls.append(time.monotonic())
        return x

    started = time.monotonic()
    assert [job.apply((i,)).get() for i in range(3)] == [0, 1, 2]
    assert calls[2] - started >= 0.9  # the third waited for the window to slide
    assert job.limiter.strategy == "sliding-window"


def test_apply_gives_up_after_max_wait(app: Any) -> None:
    job = app.task(base=LimitedTask, limit="1/minute", max_wait=0.2, name="eager.max_wait", shared=False)(ran)
    assert job.apply().get() == "ran"
    started = time.monotonic()
    with pytest.raises(MaxWaitExceeded, match=r"limit '1/minute' reached on 'eager.max_wait'; it would not be admitted within max_wait=0.2 s") as e:
        job.apply().get()
    assert time.monotonic() - started < 0.2  # it knows at once that 60 s is past max_wait
    assert isinstance(e.value, redcount.WaitTimeout) and isinstance(e.value, redcount.RedcountError)
    assert e.value.max_wait == 0.2 and e.value.key == "eager.max_wait" and e.value.limit == 1


def test_limit_key_shares_or_splits_the_count(app: Any) -> None:
    @limited("1/minute", app=app, max_wait=0, limit_key=lambda args, kwargs: f"tenant:{kwargs['tenant']}",
             name="keyed", shared=False)  # fmt: skip
    def job(*, tenant: str) -> str:
        return tenant

    assert job.apply(kwargs={"tenant": "a"}).get() == "a"
    assert job.apply(kwargs={"tenant": "b"}).get() == "b"  # another key: its own count
    with pytest.raises(MaxWaitExceeded):
        job.apply(kwargs={"tenant": "a"}).get()
    assert job.key_for((), {"tenant": "a"}) == "tenant:a"


def test_in_flight_cap_in_eager_mode_is_released(app: Any) -> None:
    @limited(app=app, concurrency=1, max_wait=0, name="capped", shared=False)
    def job(fail: bool) -> str:
        assert job.slots.in_flight("capped") == 1
        if fail:
            raise ValueError("on purpose")
        return "ok"

    assert job.apply((False,)).get() == "ok"
    with pytest.raises(ValueError, match="on purpose"):
        job.apply((True,)).get()
    assert job.slots.in_flight("capped") == 0
    held = job.slots.acquire(1, "capped")
    assert held is not None
    with pytest.raises(MaxWaitExceeded, match="all 1 in-flight slots in use on 'capped' for max_wait=0 s"):
        job.apply((False,)).get()
    job.slots.release(held)


def test_a_limited_task_without_limits_is_refused(app: Any) -> None:
    job = app.task(base=LimitedTask, name="nolimits", shared=False)(nothing)
    with pytest.raises(redcount.InvalidInputError, match="neither limit= nor concurrency="):
        job.apply().get()


def test_subclass_options(app: Any) -> None:
    class Emails(LimitedTask):
        limit = "2/second;100/hour"
        strategy = "gcra"

        @staticmethod
        def limit_key(args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
            return f"domain:{args[0].split('@')[1]}"

    job = app.task(base=Emails, name="emails", shared=False)(echo)
    assert job.apply(("a@example.com",)).get() == "a@example.com"
    assert job.key_for(("b@example.org",), {}) == "domain:example.org"
    assert job.limiter.strategy == "gcra"
    assert job.limiter.clock == "client"
    # the decorator keeps the base's own attributes where it is given no option
    other = limited(app=app, base=Emails, max_wait=5, name="emails2", shared=False)(echo)
    assert other.limit == "2/second;100/hour" and other.max_wait == 5 and other.strategy == "gcra"


def test_server_clock_setting(app: Any) -> None:
    app.conf.redcount_clock = "server"
    job = limited("3/second", app=app, name="server.clock", shared=False)(ran)
    assert job.apply().get() == "ran"
    assert job.limiter.clock == "server"


@pytest.mark.parametrize("limits", [{"limit": "5/second"}, {"concurrency": 2}])
def test_on_unavailable(limits: dict[str, Any]) -> None:
    """A store that cannot be reached: "deny" keeps refusing (until max_wait), "allow" runs
    the task unlimited, "raise" fails it with the store's error."""
    dead = redcount.connect(f"redis://127.0.0.1:{free_port()}/0", connect_timeout=0.2)
    a = Celery("dead", broker="memory://", backend="cache+memory://", set_as_current=False)
    a.conf.update(redcount_store=dead, task_eager_propagates=True)
    a.finalize()
    try:
        deny = limited(app=a, max_wait=0.3, name="deny", shared=False, **limits)(ran)
        allow = limited(app=a, on_unavailable="allow", name="allow", shared=False, **limits)(ran)
        fail = limited(app=a, on_unavailable="raise", name="raise", shared=False, **limits)(ran)
        with pytest.raises(MaxWaitExceeded, match=r"the store could not decide \(on_unavailable='deny'\)"):
            deny.apply().get()
        assert allow.apply().get() == "ran"
        with pytest.raises(redcount.ConnectionError):
            fail.apply().get()
    finally:
        a.close()
        dead.close()


def test_default_lease_timeout_follows_the_time_limit(app: Any) -> None:
    plain = limited(app=app, concurrency=1, name="lease.plain", shared=False)(ran)
    timed = limited(app=app, concurrency=1, time_limit=30, name="lease.timed", shared=False)(ran)
    given = limited(app=app, concurrency=1, time_limit=30, lease_timeout=7, name="lease.given", shared=False)(ran)
    assert plain._lease_timeout() == 300.0
    assert timed._lease_timeout() == 30 + redcount.celery.LEASE_MARGIN
    assert given._lease_timeout() == 7
    app.conf.task_time_limit = 60
    assert plain._lease_timeout() == 60 + redcount.celery.LEASE_MARGIN
