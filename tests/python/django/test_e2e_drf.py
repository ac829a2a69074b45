"""Django REST framework under gunicorn (2 threaded workers) against a real Redis: DRF's own
``AnonRateThrottle`` and ``UserRateThrottle`` on Django's cache (django-redis) over-admit a
concurrent burst, because they read the request history, decide, and write it back in
separate cache calls, so concurrent requests overwrite each other's entries; redcount's twins
decide each request in one atomic step and admit exactly the limit, burst after burst.

How often DRF's own over-admits is printed (run with ``-s``): on the 2-core development
machine, every burst of every run so far, by a wide margin (it admitted all 100 requests).
The test asks only that it over-admitted in at least one of its bursts, so a run in which the
race happens not to be hit in one burst does not fail."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from redcount.tools.servers import RedisServer
from django_e2e import WORKERS, burst, start, statuses
from helpers import AppServer

pytestmark = [pytest.mark.redis_only, pytest.mark.slow]

LIMIT = 25
REQUESTS = 100
CLIENTS = 24
BURSTS = 4


@pytest.fixture(scope="module")
def gunicorn(redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[AppServer]:
    srv = start("gunicorn", tmp_path_factory.mktemp("drf-e2e"), redis_server.url, LIMIT=f"{LIMIT}/minute")
    try:
        srv.wait_ready(WORKERS)
        yield srv
    finally:
        srv.stop()


def who(kind: str, burst_no: int) -> Callable[[int], dict[str, str]]:
    """The headers of one burst's requests: one client, a fresh one for every burst (DRF keys
    anonymous requests by X-Forwarded-For when present, users by their id)."""
    if kind == "anon":
        return lambda _: {"X-Forwarded-For": f"192.0.2.{burst_no + 1}"}
    return lambda _: {"X-User": str(burst_no + 1)}


@pytest.mark.parametrize("kind", ["anon", "user"])
def test_drf_builtin_throttle_over_admits_and_the_twin_admits_exactly_the_limit(
    gunicorn: AppServer, redis_server: RedisServer, kind: str
) -> None:
    builtin: list[int] = []
    for i in range(BURSTS):
        redis_server.command("FLUSHALL")  # both throttles start from an empty history
        got = statuses(burst(gunicorn.url + f"/drf/{kind}/builtin", REQUESTS, CLIENTS, headers=who(kind, i)))
        assert set(got) <= {200, 429}, got
        builtin.append(got.get(200, 0))
        ours = burst(gunicorn.url + f"/drf/{kind}/redcount", REQUESTS, CLIENTS, headers=who(kind, i))
        assert statuses(ours) == {200: LIMIT, 429: REQUESTS - LIMIT}, i
        for r in ours:
            if r.status_code == 429:
                assert 1 <= int(r.headers["Retry-After"]) <= 60
    print(f"\nDRF's {kind} throttle admitted {builtin} of {REQUESTS} (limit {LIMIT}) in {BURSTS} bursts; "
          f"over the limit in {sum(n > LIMIT for n in builtin)} of them")
    assert all(n >= LIMIT for n in builtin), builtin  # it never under-admits
    # A race, so not a property of every burst; of several bursts of 24 concurrent clients
    # over 16 server threads, yes.
    assert max(builtin) > LIMIT, builtin
