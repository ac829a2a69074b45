"""redcount.rq and redcount.dramatiq without worker processes: their options, and one
decision at a time driven in this process (RQ's worker on a real redis-server broker,
Dramatiq's stub broker), on both stores.

The real workers are in test_rq_worker.py and test_dramatiq_worker.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import dramatiq
import pytest
import redis
from dramatiq.broker import MessageProxy
from dramatiq.brokers.stub import StubBroker
from dramatiq.middleware import SkipMessage
from rq import Queue, Retry
from rq.job import JobStatus
from rq.registry import FailedJobRegistry, ScheduledJobRegistry

import redcount
import redcount.dramatiq
import redcount.rq
from conftest import RedisServer
from redcount.errors import InvalidInputError


@redcount.rq.limited("1/hour", max_wait=None)
def hourly_job(n: int) -> int:
    return n


@redcount.rq.limited("1/second", max_wait=60)
def busy_job(n: int) -> int:
    return n


@redcount.rq.limited("1/hour", limit_key=lambda args, kwargs: kwargs["tenant"])
def tenant_job(*, tenant: str) -> str:
    return tenant


# -- options -------------------------------------------------------------------------------


def test_rq_limited_records_the_limit_and_returns_the_function() -> None:
    def f(x: int) -> int:
        return x

    assert redcount.rq.limited("5/second")(f) is f
    jl = redcount.rq.limit_of(f)
    assert jl is not None and jl.limit == "5/second" and jl.strategy == "sliding-window"
    assert jl.max_wait == 3600.0 and jl.on_unavailable == "deny" and jl.store is None
    assert jl.key_for((1,), {}) == f"{__name__}.test_rq_limited_records_the_limit_and_returns_the_function.<locals>.f"
    assert redcount.rq.limit_of(tenant_job).key_for((), {"tenant": "acme"}) == "acme"  # type: ignore[union-attr]
    assert redcount.rq.limit_of(print) is None


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"limit": "5/fortnight"}, InvalidInputError, "fortnight"),
        ({"limit": 5}, TypeError, r"job .*\.f: limit must be a limit string"),
        ({"limit": "5/second", "strategy": "concurrency"}, InvalidInputError, "strategy must be one of"),
        ({"limit": "5/second", "max_wait": -1}, InvalidInputError, r"max_wait must be finite and >= 0"),
        ({"limit": "5/second", "on_unavailable": "maybe"}, InvalidInputError, "on_unavailable must be"),
        ({"limit": "5/second", "limit_key": "tenant"}, TypeError, "limit_key must be a callable"),
        ({"limit": "5/second", "store": 6379}, TypeError, "store must be a URL"),
    ],
)
def test_rq_bad_options_fail_at_decoration(options: dict[str, Any], error: type[Exception], match: str) -> None:
    limit = options.pop("limit")
    with pytest.raises(error, match=match):

        @redcount.rq.limited(limit, **options)
        def f() -> None: ...


def test_dramatiq_options_are_checked_when_the_actor_is_declared() -> None:
    broker = StubBroker()
    broker.add_middleware(redcount.dramatiq.RateLimit("memory://"))
    try:
        with pytest.raises(InvalidInputError, match="job bad: max_wait must be finite"):
            dramatiq.actor(limit="5/second", max_wait=float("inf"), broker=broker, actor_name="bad")(lambda: None)
        with pytest.raises(InvalidInputError, match="job keyless: limit_key= needs limit= as well"):
            dramatiq.actor(limit_key=lambda a, k: "x", broker=broker, actor_name="keyless")(lambda: None)
        with pytest.raises(ValueError, match="limit_strat"):  # Dramatiq's own check of option names
            dramatiq.actor(limit_strat="gcra", broker=broker, actor_name="typo")(lambda: None)
        with pytest.raises(TypeError, match="store must be a URL"):
            redcount.dramatiq.RateLimit(6379)  # type: ignore[arg-type]
        with pytest.raises(InvalidInputError, match="on_unavailable must be"):
            redcount.dramatiq.RateLimit("memory://", on_unavailable="maybe")  # type: ignore[arg-type]
    finally:
        broker.close()


# -- Dramatiq: one decision at a time on the stub broker ---------------------------------


@pytest.fixture
def stub(store: redcount.Store) -> Iterator[tuple[StubBroker, redcount.dramatiq.RateLimit]]:
    broker = StubBroker()
    rl = redcount.dramatiq.RateLimit(store, max_wait=30)
    broker.add_middleware(rl)
    try:
        yield broker, rl
    finally:
        broker.close()


def test_dramatiq_refusal_enqueues_the_same_message_with_a_delay(
    stub: tuple[StubBroker, redcount.dramatiq.RateLimit],
) -> None:
    broker, rl = stub

    @dramatiq.actor(limit="1/hour", max_wait=None, broker=broker, max_retries=0, actor_name="hourly")
    def hourly(n: int) -> None: ...

    first = hourly.message(1)
    rl.before_process_message(broker, MessageProxy(first))  # admitted: returns
    second = hourly.message_with_options(args=(2,), retries=0)
    proxy = MessageProxy(second)
    before = time.time()
    with pytest.raises(SkipMessage, match=r"limit '1/hour' reached on key 'hourly'; enqueued again in"):
        rl.before_process_message(broker, proxy)
    assert not proxy.failed and proxy.options["store_results"] is False
    [again] = [dramatiq.Message.decode(m) for m in broker.queues["default.DQ"].queue]
    assert again.message_id == second.message_id and again.args == (2,)
    assert again.options["retries"] == 0  # not a retry
    assert before <= again.options[redcount.dramatiq.FIRST_REFUSED_OPTION] <= time.time()
    assert again.options["eta"] >= (before + 3000) * 1000  # about an hour away


def test_dramatiq_max_wait_counts_from_the_first_refusal(stub: tuple[StubBroker, redcount.dramatiq.RateLimit]) -> None:
    broker, rl = stub

    @dramatiq.actor(limit="1/second", max_wait=5, broker=broker, actor_name="busy")
    def busy() -> None: ...

    rl.before_process_message(broker, MessageProxy(busy.message()))
    # Refused before, 10 s ago: this refusal (retry_after < 1 s) would still pass max_wait.
    late = MessageProxy(busy.message_with_options(**{redcount.dramatiq.FIRST_REFUSED_OPTION: time.time() - 10}))
    with pytest.raises(redcount.dramatiq.MaxWaitExceeded, match=r"not run: refused for 10\.\d+ s on key 'busy'") as e:
        rl.before_process_message(broker, late)
    assert late.failed and isinstance(e.value, redcount.WaitTimeout)
    assert e.value.max_wait == 5 and e.value.limit == 1 and 10 <= e.value.waited < 60
    assert "default.DQ" not in broker.queues or not broker.queues["default.DQ"].queue


@pytest.mark.parametrize("policy", ["deny", "allow", "raise"])
def test_dramatiq_on_unavailable(policy: str) -> None:
    """A store that cannot be reached (nothing listens on port 1): the actor's policy."""
    store = redcount.connect("redis://127.0.0.1:1/0")
    broker = StubBroker()
    rl = redcount.dramatiq.RateLimit(store)
    broker.add_middleware(rl)
    try:

        @dramatiq.actor(limit="5/second", on_unavailable=policy, broker=broker, actor_name="down")
        def down() -> None: ...

        proxy = MessageProxy(down.message())
        if policy == "allow":
            rl.before_process_message(broker, proxy)  # runs, unlimited
        elif policy == "raise":
            with pytest.raises(redcount.dramatiq.DecisionFailed, match=r"down\[.*\] not run: its limit could not be") as e:
                rl.before_process_message(broker, proxy)
            assert isinstance(e.value.__cause__, redcount.ConnectionError)
        else:
            with pytest.raises(SkipMessage, match=r"the store could not decide \(on_unavailable='deny'\) on key 'down'"):
                rl.before_process_message(broker, proxy)
            [again] = [dramatiq.Message.decode(m) for m in broker.queues["default.DQ"].queue]
            assert again.message_id == proxy.message_id
        assert not proxy.failed
    finally:
        broker.close()
        store.close()


# -- RQ: the worker's decision, on a real broker -----------------------------------------


@pytest.fixture
def rq_queue(redis_server: RedisServer) -> Iterator[Queue]:
    conn = redis.Redis(port=redis_server.port, db=3)
    conn.flushdb()
    try:
        yield Queue("opts", connection=conn)
    finally:
        conn.close()


def dequeue(queue: Queue) -> Any:
    got = Queue.dequeue_any([queue], None, connection=queue.connection)
    assert got is not None
    return got[0]


def test_rq_refused_job_is_scheduled_again_with_its_id(rq_queue: Queue, store: redcount.Store) -> None:
    worker = redcount.rq.LimitedSimpleWorker([rq_queue], connection=rq_queue.connection, redcount_store=store)
    rq_queue.enqueue(hourly_job, 1)
    sent = rq_queue.enqueue(hourly_job, 2, job_id="second", retry=Retry(max=2))
    assert worker._admit(dequeue(rq_queue), rq_queue)
    job = dequeue(rq_queue)
    assert job.id == "second"
    before = time.time()
    assert not worker._admit(job, rq_queue)
    sent.refresh()
    assert sent.get_status() == JobStatus.SCHEDULED and sent.args == (2,)
    assert sent.retries_left == 2  # a deferral is not a retry
    assert before <= sent.meta[redcount.rq.FIRST_REFUSED_META] <= time.time()
    registry = ScheduledJobRegistry(queue=rq_queue)
    assert registry.get_job_ids() == ["second"]
    assert registry.get_scheduled_time("second").timestamp() >= before + 3000  # about an hour away
    # (Job 1 was admitted but not run here: it is still there.)
    assert b"second" not in rq_queue.connection.lrange(f"{rq_queue.key}:intermediate", 0, -1)


def test_rq_max_wait_fails_the_job_without_running_it(rq_queue: Queue, store: redcount.Store) -> None:
    worker = redcount.rq.LimitedSimpleWorker([rq_queue], connection=rq_queue.connection, redcount_store=store)
    worker.push_exc_handler(lambda job, *exc_info: False)  # the handler chain ends here (no log noise)
    rq_queue.enqueue(busy_job, 1)
    assert worker._admit(dequeue(rq_queue), rq_queue)
    rq_queue.enqueue(busy_job, 2, job_id="late", meta={redcount.rq.FIRST_REFUSED_META: time.time() - 100})
    job = dequeue(rq_queue)
    assert not worker._admit(job, rq_queue)
    job.refresh()
    assert job.get_status() == JobStatus.FAILED
    assert FailedJobRegistry(queue=rq_queue).get_job_ids() == ["late"]
    result = job.latest_result()
    assert result is not None and result.exc_string is not None
    assert "redcount.rq.MaxWaitExceeded: job test_queue_options.busy_job[late] not run: refused for 100." in (
        result.exc_string
    )
    assert "would pass max_wait=60.0 s" in result.exc_string


def test_rq_key_function_error_fails_the_job(rq_queue: Queue, store: redcount.Store) -> None:
    worker = redcount.rq.LimitedSimpleWorker([rq_queue], connection=rq_queue.connection, redcount_store=store)
    worker.push_exc_handler(lambda job, *exc_info: False)
    rq_queue.enqueue(tenant_job, job_id="nokey")  # no tenant= : the key function raises KeyError
    job = dequeue(rq_queue)
    assert not worker._admit(job, rq_queue)
    job.refresh()
    assert job.get_status() == JobStatus.FAILED
    assert "KeyError: 'tenant'" in job.latest_result().exc_string  # type: ignore[union-attr]


def test_rq_unmarked_jobs_and_missing_store(rq_queue: Queue) -> None:
    worker = redcount.rq.LimitedSimpleWorker([rq_queue], connection=rq_queue.connection)
    rq_queue.enqueue(print, "not limited")
    assert worker._admit(dequeue(rq_queue), rq_queue)
    worker.push_exc_handler(lambda job, *exc_info: False)
    rq_queue.enqueue(hourly_job, 1, job_id="nostore")
    job = dequeue(rq_queue)
    assert not worker._admit(job, rq_queue)
    job.refresh()
    assert job.get_status() == JobStatus.FAILED
    assert "no store to decide on; give store=" in job.latest_result().exc_string  # type: ignore[union-attr]
    with pytest.raises(TypeError, match="redcount_store must be a URL"):
        redcount.rq.LimitedWorker([rq_queue], connection=rq_queue.connection, redcount_store=6379)  # type: ignore[arg-type]


@redcount.rq.limited("5/second", on_unavailable="raise", store="redis://127.0.0.1:1/0")
def strict_job() -> None: ...


@redcount.rq.limited("5/second", on_unavailable="allow", store="redis://127.0.0.1:1/0")
def lenient_job() -> None: ...


def test_rq_on_unavailable_raise_fails_the_job_and_allow_runs_it(rq_queue: Queue) -> None:
    """A store that cannot be reached (nothing listens on port 1)."""
    worker = redcount.rq.LimitedSimpleWorker([rq_queue], connection=rq_queue.connection)
    worker.push_exc_handler(lambda job, *exc_info: False)
    rq_queue.enqueue(lenient_job)
    assert worker._admit(dequeue(rq_queue), rq_queue)
    rq_queue.enqueue(strict_job, job_id="strict", retry=Retry(max=3))
    job = dequeue(rq_queue)
    assert not worker._admit(job, rq_queue)
    job.refresh()
    assert job.get_status() == JobStatus.FAILED  # not retried: it never ran
    assert "redcount.ConnectionError" in job.latest_result().exc_string  # type: ignore[union-attr]
