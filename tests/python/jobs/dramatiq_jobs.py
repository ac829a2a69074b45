"""The Dramatiq broker, middleware and actors the Dramatiq tests run in real ``dramatiq``
worker processes.

Configured by the environment (read at import, in the test process and in the workers):
``JOBS_BROKER`` (the broker, ``redis://127.0.0.1:PORT/0``; its database 1 holds the records
the tests read, and the Results middleware's results) and ``JOBS_STORE`` (redcount's store, on
a redis-server of its own so that a test can stop it).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import dramatiq
import redis
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import CurrentMessage, SkipMessage
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

import redcount.dramatiq

BROKER = os.environ["JOBS_BROKER"]
STORE = os.environ["JOBS_STORE"]
DATA = BROKER.rsplit("/", 1)[0] + "/1"

_records: redis.Redis | None = None


def records() -> redis.Redis:
    global _records
    if _records is None:
        _records = redis.Redis.from_url(DATA)
    return _records


def record(name: str, **fields: Any) -> None:
    records().rpush(f"jobs:{name}", json.dumps(fields))


class RecordingRateLimit(redcount.dramatiq.RateLimit):
    """RateLimit that records each admission with the times before and after its decision
    (the limiter reads its clock inside), and each deferral."""

    def before_process_message(self, broker: dramatiq.Broker, message: Any) -> None:
        before = time.time()
        try:
            super().before_process_message(broker, message)
        except SkipMessage:
            if not message.failed:
                record("deferred", id=message.message_id, first=message.options.get("redcount_first_refused"),
                       pid=os.getpid())  # fmt: skip
            raise
        if message.actor_name != "plain":
            record("admitted", id=message.message_id, before=before, after=time.time(), pid=os.getpid())


broker = RedisBroker(url=BROKER)
broker.add_middleware(Results(backend=RedisBackend(url=DATA)))
broker.add_middleware(CurrentMessage())
broker.add_middleware(RecordingRateLimit(STORE))
dramatiq.set_broker(broker)


@dramatiq.actor(limit="5/second", max_retries=0)
def burst(n: int) -> None:
    message = CurrentMessage.get_current_message()
    assert message is not None
    record("runs", n=n, id=message.message_id, retries=message.options.get("retries", 0), pid=os.getpid())


@dramatiq.actor(limit="1/hour", max_wait=2, store_results=True)
def hourly(n: int) -> int:
    record("hourly", n=n)
    return n


@dramatiq.actor(limit="100/second", limit_key=lambda args, kwargs: f"deny:{args[0]}")
def when_down_deny(n: int) -> None:
    record("deny", n=n)


@dramatiq.actor(limit="100/second", on_unavailable="allow")
def when_down_allow(n: int) -> None:
    record("allow", n=n)
