"""Django REST framework under gunicorn (2 threaded workers) against a real Redis: DRF's own
``AnonRateThrottle`` on Django's cache (django-redis) over-admits a concurrent burst, because
it reads the request history, decides, and writes it back in separate cache calls, so
concurrent requests overwrite each other's entries; redcount's twin decides each request in
one atomic step and admits exactly the limit, burst after burst."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from redcount.tools.servers import RedisServer
from django_e2e import WORKERS, burst, start, statuses
from helpers import AppServer

pytestmark = [pytest.mark.redis_only, pytest.mark.slow]

LIMIT = 25
REQUESTS = 100
CLIENTS = 24
BURSTS = 5


@pytest.fixture(scope="module")
def gunicorn(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    srv = start("gunicorn", tmp_path_factory.mktemp("drf-e2e"), redis_server.url, LIMIT=f"{LIMIT}/minute")
    try:
        srv.wait_ready(WORKERS)
        yield srv
    finally:
        srv.stop()


def test_drf_builtin_throttle_over_admits_and_the_twin_admits_exactly_the_limit(
    gunicorn: AppServer, redis_server: RedisServer
) -> None:
    builtin: list[int] = []
    for i in range(BURSTS):
        redis_server.command("FLUSHALL")  # both throttles start from an empty history
        # DRF's own: the same client (DRF keys anonymous requests by X-Forwarded-For when
        # present, so each burst gets a fresh key).
        got = statuses(burst(gunicorn.url + "/drf/builtin", REQUESTS, CLIENTS,
                             headers=lambda _: {"X-Forwarded-For": f"192.0.2.{i + 1}"}))
        assert set(got) <= {200, 429}, got
        builtin.append(got.get(200, 0))
        ours = burst(gunicorn.url + "/drf/redcount", REQUESTS, CLIENTS)
        assert statuses(ours) == {200: LIMIT, 429: REQUESTS - LIMIT}, i
        for r in ours:
            if r.status_code == 429:
                assert 1 <= int(r.headers["Retry-After"]) <= 60
    print(f"DRF's AnonRateThrottle admitted {builtin} of {REQUESTS} (limit {LIMIT}) in {BURSTS} bursts")
    assert all(n >= LIMIT for n in builtin), builtin  # it never under-admits
    # Not a property of every burst (a race), but of five bursts of 24 concurrent clients
    # over 16 server threads: measured to over-admit in every burst.
    assert max(builtin) > LIMIT, builtin
