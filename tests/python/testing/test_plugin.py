"""The pytest plugin for apps that use redcount (redcount.testing.plugin), run the way a user's
suite runs it: each test writes a small test module and runs pytest on it with ``pytester``.

The inner runs load the plugin with ``-p redcount.testing.plugin`` (the ``pytest11`` entry
point exists only once redcount is installed with this pyproject.toml), except the tests of
the entry point itself, which put a distribution declaring it on ``sys.path``. They run
in-process, so the process-wide switch they turn is this process's: each test checks that it
is back off afterwards. The Django one runs in a subprocess, since Django's settings can be
configured once per process."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redcount
from redcount import _enforcement
from redcount.testing import assert_allowed, assert_limited, disable_limits, exhaust, limits_disabled, reset_all

pytest_plugins = ["pytester"]

ROOT = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
PLUGIN = ("-p", "redcount.testing.plugin")


@pytest.fixture(autouse=True)
def inner(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Inner runs see only the plugins they name, with warnings as errors, and leave the
    switch as they found it."""
    monkeypatch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
    for name in ("REDCOUNT_TEST_URL", "REDCOUNT_TEST_DISABLED"):
        monkeypatch.delenv(name, raising=False)
    pytester.makeini("[pytest]\nfilterwarnings = error\naddopts = -p no:cacheprovider\n")
    assert not _enforcement.suspended
    yield
    assert not _enforcement.suspended, "an inner run left the limits turned off"


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest(*PLUGIN, *args)


# -- loading ---------------------------------------------------------------------------------------


def test_the_entry_point_is_declared_in_pyproject() -> None:
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert meta["project"]["entry-points"]["pytest11"] == {"redcount": "redcount.testing.plugin"}


def _installed(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    """A distribution on sys.path that declares the entry point as pyproject.toml does, as
    installing redcount would."""
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD")
    # Every installed plugin loads now: their own start-up warnings are not this test's.
    pytester.makeini("[pytest]\naddopts = -p no:cacheprovider\n")
    info = pytester.path / "site" / "redcount_probe-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: redcount-probe\nVersion: 0\n")
    (info / "entry_points.txt").write_text("[pytest11]\nredcount = redcount.testing.plugin\n")
    pytester.syspathinsert(pytester.path / "site")


def test_the_entry_point_loads_the_plugin_and_no_redcount_turns_it_off(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    _installed(pytester, monkeypatch)
    pytester.makepyfile(
        """
        def test_store(redcount_store):
            assert redcount_store.is_memory
        """
    )
    # Every installed plugin loads in this in-process run: pytest-asyncio warns at start-up
    # without its ini option, and pytest-django would set Django up a second time in this
    # process when this test runs in one session with the Django tests.
    quiet = ("-p", "no:asyncio", "-p", "no:django")
    pytester.runpytest(*quiet).assert_outcomes(passed=1)
    off = pytester.runpytest(*quiet, "-p", "no:redcount")
    off.assert_outcomes(errors=1)
    off.stdout.fnmatch_lines(["*fixture 'redcount_store' not found*"])


def test_importing_the_plugin_loads_no_web_framework_or_celery() -> None:
    code = (
        "import sys, redcount.testing.plugin; "
        "print(sorted(m for m in ('flask', 'fastapi', 'starlette', 'django', 'rest_framework', 'celery') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# A child interpreter in which no web framework and no Celery can be imported.
WITHOUT_FRAMEWORKS = """
import importlib.abc, sys
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"flask", "fastapi", "starlette", "django", "rest_framework", "celery"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, Refuse())
import pytest
sys.exit(pytest.main(["-p", "redcount.testing.plugin", "-q"]))
"""


def test_a_session_without_any_framework_installed_works(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        from redcount.testing import assert_limited, exhaust, limits_disabled

        @pytest.mark.redcount_disabled
        def test_limits(redcount_limiter):
            assert limits_disabled()
            assert exhaust(redcount_limiter, "2/minute", "k") == 2
            assert_limited(redcount_limiter.test("2/minute", "k"))
        """
    )
    package_dir = str(Path(redcount.__file__).parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([package_dir, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-c", WITHOUT_FRAMEWORKS], cwd=pytester.path, env=env,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "1 passed" in out.stdout


def test_the_fixtures_are_listed(pytester: pytest.Pytester) -> None:
    result = run(pytester, "--fixtures")
    result.stdout.fnmatch_lines(["*fixtures defined from redcount.testing.plugin*", "redcount_url *", "redcount_prefix *",
                                 "redcount_clock *", "redcount_store *", "redcount_limiter *", "redcount_disabled *"])


# -- fixtures --------------------------------------------------------------------------------------


def test_each_test_gets_a_fresh_store(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import redcount
        from redcount.testing import exhaust

        stores = []

        def test_first(redcount_store, redcount_limiter):
            stores.append(redcount_store)
            assert exhaust(redcount_limiter, "3/minute", "user:1") == 3
            redcount.FixedWindowCounter(redcount_store, "views", window=60).incr("page")

        def test_second_sees_nothing_of_the_first(redcount_store, redcount_limiter):
            assert redcount_store is not stores[0]
            assert redcount_store.execute("KEYS", "*") == []
            assert exhaust(redcount_limiter, "3/minute", "user:1") == 3
        """
    )
    run(pytester).assert_outcomes(passed=2)


def test_the_clock_moves_every_limiter_and_counter_on_the_store(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import redcount
        from redcount.testing import assert_allowed, assert_limited, exhaust

        def test_clock(redcount_store, redcount_clock):
            gcra = redcount.Limiter(redcount_store, "gcra", prefix="t")
            views = redcount.FixedWindowCounter(redcount_store, "views", window=60)
            assert exhaust(gcra, "2/minute", "k") == 2
            views.incr("page")
            start = redcount_store.now()
            assert redcount_store.now() == start  # it stands still until moved
            redcount_clock.advance(60)
            assert redcount_store.now() == start + 60
            assert_allowed(gcra.hit("2/minute", "k"))
            assert views.get("page") == 0

        def test_the_limiter_fixture_shares_the_clock(redcount_limiter, redcount_clock):
            assert exhaust(redcount_limiter, "1/second", "k") == 1
            assert_limited(redcount_limiter.test("1/second", "k"))
            redcount_clock.advance(1)
            assert_allowed(redcount_limiter.test("1/second", "k"))

        import pytest

        @pytest.mark.parametrize("redcount_limiter", ["gcra", "token-bucket"], indirect=True)
        def test_strategy_by_indirect_parametrization(redcount_limiter):
            assert redcount_limiter.strategy in ("gcra", "token-bucket")
        """
    )
    run(pytester).assert_outcomes(passed=4)


@pytest.mark.redis_only
def test_on_redis_keys_live_under_the_test_prefix_and_are_deleted_after(
    pytester: pytest.Pytester, redis_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"redis://127.0.0.1:{redis_server.port}/5"
    admin = redcount.connect(url)
    admin.execute("SET", "someone-elses-key", "1")
    pytester.makepyfile(
        """
        import redcount
        from redcount.testing import exhaust

        def test_limits(redcount_store, redcount_limiter, redcount_prefix):
            assert not redcount_store.is_memory
            assert exhaust(redcount_limiter, "3/minute", "user:1") == 3
            redcount.FixedWindowCounter(redcount_store, "views", window=60, prefix=redcount_prefix).incr("p")
            keys = redcount_store.execute("KEYS", "*")
            assert sum(k.startswith(redcount_prefix.encode()) for k in keys) == 2

        def test_clock(redcount_clock):
            pass
        """
    )
    try:
        monkeypatch.setenv("REDCOUNT_TEST_URL", url)
        result = run(pytester, "-rs")
        result.assert_outcomes(passed=1, skipped=1)
        result.stdout.fnmatch_lines(["*redcount_clock needs the memory:// store*"])
        assert admin.execute("KEYS", "*") == [b"someone-elses-key"]
        # The ini option says the same when the environment does not.
        monkeypatch.delenv("REDCOUNT_TEST_URL")
        run(pytester, "-o", f"redcount_url={url}").assert_outcomes(passed=1, skipped=1)
        assert admin.execute("KEYS", "*") == [b"someone-elses-key"]
    finally:
        admin.execute("FLUSHDB")
        admin.close()


# -- turning the limits off ------------------------------------------------------------------------

FLASK_APP = """
import flask
import pytest
import redcount
import redcount.flask
from redcount.testing import assert_allowed, assert_limited, disable_limits


@pytest.fixture
def client(redcount_store, redcount_prefix):
    app = flask.Flask(__name__)
    rl = redcount.flask.RateLimiter(
        app, limiter=redcount.Limiter(redcount_store, prefix=redcount_prefix), default="1/minute",
        enabled=ENABLED,
    )

    @app.get("/")
    def index():
        return "ok"

    return app.test_client()
"""

FLASK_TESTS = """
def test_limited(client):
    assert_allowed(client.get("/"))
    assert_limited(client.get("/"))

@pytest.mark.redcount_disabled
def test_marker(client):
    for _ in range(3):
        response = assert_allowed(client.get("/"))
        assert "RateLimit" not in response.headers

def test_fixture(client, redcount_disabled):
    for _ in range(3):
        assert_allowed(client.get("/"))

def test_context_manager(client):
    with disable_limits():
        for _ in range(3):
            assert_allowed(client.get("/"))
    assert_allowed(client.get("/"))  # nothing was counted while off
    assert_limited(client.get("/"))
"""


def test_the_switch_turns_off_a_flask_app(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(FLASK_APP.replace("ENABLED", "True") + FLASK_TESTS)
    run(pytester).assert_outcomes(passed=4)


def test_flasks_own_setting_still_turns_it_off(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        FLASK_APP.replace("ENABLED", "False")
        + """
def test_off_by_its_own_setting(client):
    for _ in range(3):
        assert_allowed(client.get("/"))
"""
    )
    run(pytester).assert_outcomes(passed=1)


@pytest.mark.parametrize("how", ["ini", "env"])
def test_a_setting_turns_the_limits_off_for_the_whole_session(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    pytester.makepyfile(
        FLASK_APP.replace("ENABLED", "True")
        + """
from redcount.testing import limits_disabled

def test_every_request_is_admitted(client):
    assert limits_disabled()
    for _ in range(3):
        assert_allowed(client.get("/"))
"""
    )
    if how == "env":
        monkeypatch.setenv("REDCOUNT_TEST_DISABLED", "1")
        run(pytester).assert_outcomes(passed=1)
        monkeypatch.setenv("REDCOUNT_TEST_DISABLED", "0")  # the environment wins over the ini file
        run(pytester, "-o", "redcount_disabled=true").assert_outcomes(failed=1)
    else:
        run(pytester, "-o", "redcount_disabled=true").assert_outcomes(passed=1)


def test_a_bad_session_setting_is_a_usage_error(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("REDCOUNT_TEST_DISABLED", "maybe")
    result = run(pytester)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*REDCOUNT_TEST_DISABLED must be a boolean*'maybe'*"])


def test_the_switch_turns_off_a_fastapi_app(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import asyncio
        import httpx
        import pytest
        import redcount.aio
        from fastapi import Depends, FastAPI
        from redcount.fastapi import RateLimiter, RateLimitMiddleware
        from redcount.testing import assert_allowed, assert_limited, disable_limits

        @pytest.fixture
        def get(redcount_store, redcount_prefix):
            rl = RateLimiter(redcount.aio.Limiter(redcount_store, prefix=redcount_prefix), default="3/minute")
            app = FastAPI()
            app.add_middleware(RateLimitMiddleware, ratelimiter=rl)

            @app.get("/search", dependencies=[Depends(rl.limit("1/minute"))])
            async def search():
                return {}

            @app.get("/")
            async def index():
                return {}

            async def many(path, n):
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                    return [await client.get(path) for _ in range(n)]

            return lambda path, n=1: asyncio.run(many(path, n))

        def test_limited(get):
            first, second = get("/search", 2)
            assert_allowed(first)
            assert_limited(second)
            assert_allowed(get("/")[0])  # the middleware's 3/minute counts every route of the app
            assert_limited(get("/")[0])

        @pytest.mark.redcount_disabled
        def test_marker(get):
            for response in get("/search", 5) + get("/", 5):
                assert_allowed(response)
                assert "ratelimit" not in response.headers

        def test_context_manager(get):
            with disable_limits():
                for response in get("/search", 5):
                    assert_allowed(response)
            assert_allowed(get("/search")[0])  # nothing was counted while off
            assert_limited(get("/search")[0])
        """
    )
    run(pytester).assert_outcomes(passed=3)


def test_the_switch_turns_off_a_celery_limited_task(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        from celery import Celery
        from redcount.celery import LimitedTask, MaxWaitExceeded
        from redcount.testing import disable_limits

        def send(to):
            return to

        @pytest.fixture
        def app(redcount_store):
            app = Celery("t", broker="memory://", backend="cache+memory://", set_as_current=False)
            app.conf.update(redcount_store=redcount_store, task_eager_propagates=True)
            yield app
            app.close()

        @pytest.fixture
        def task(app):
            return app.task(base=LimitedTask, limit="1/minute", max_wait=0, name="send", shared=False)(send)

        def test_limited(task):
            assert task.apply(("a",)).get() == "a"
            with pytest.raises(MaxWaitExceeded):
                task.apply(("b",))

        @pytest.mark.redcount_disabled
        def test_marker(task):
            for to in "abc":
                assert task.apply((to,)).get() == to

        def test_without_a_store_configured(redcount_disabled):
            app = Celery("u", broker="memory://", backend="cache+memory://", set_as_current=False)
            task = app.task(base=LimitedTask, limit="1/minute", name="send2", shared=False)(send)
            assert task.apply(("a",)).get() == "a"   # no redcount_url: nothing asks for a store
            app.close()

        def test_context_manager(task):
            with disable_limits():
                for to in "abc":
                    assert task.apply((to,)).get() == to
            assert task.apply(("d",)).get() == "d"   # nothing was counted while off
        """
    )
    run(pytester).assert_outcomes(passed=4)


def test_the_switch_turns_off_django_views_and_drf_throttles(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        """
        import django
        from django.conf import settings

        settings.configure(
            DEBUG=False,
            SECRET_KEY="test",
            ALLOWED_HOSTS=["*"],
            ROOT_URLCONF="urls",
            INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "rest_framework", "redcount.django"],
            MIDDLEWARE=["redcount.django.RateLimitMiddleware"],
            DATABASES={},
            REDCOUNT={"URL": "memory://", "PATHS": {"/site": "1/minute"}},
            REST_FRAMEWORK={
                "DEFAULT_THROTTLE_CLASSES": ["redcount.django.drf.AnonRateThrottle"],
                "DEFAULT_THROTTLE_RATES": {"anon": "1/minute"},
                "DEFAULT_AUTHENTICATION_CLASSES": [],
                "DEFAULT_PERMISSION_CLASSES": [],
                "UNAUTHENTICATED_USER": None,
            },
        )
        django.setup()
        """
    )
    pytester.makepyfile(
        urls="""
        from django.http import HttpResponse
        from django.urls import path
        from rest_framework.decorators import api_view
        from rest_framework.response import Response
        from redcount.django import limit

        def site(request):
            return HttpResponse("ok")

        @limit("1/minute")
        def decorated(request):
            return HttpResponse("ok")

        @api_view(["GET"])
        def api(request):
            return Response({})

        urlpatterns = [path("site", site), path("decorated", decorated), path("api", api)]
        """,
        test_django="""
        import pytest
        import redcount.django
        from django.test import Client
        from redcount.testing import assert_allowed, assert_limited

        PATHS = ["/site", "/decorated", "/api"]

        @pytest.fixture(autouse=True)
        def fresh():
            redcount.django.reset_state()  # a new memory:// store per test

        @pytest.mark.parametrize("path", PATHS)
        def test_limited(path):
            client = Client()
            assert_allowed(client.get(path))
            assert_limited(client.get(path))

        @pytest.mark.redcount_disabled
        @pytest.mark.parametrize("path", PATHS)
        def test_marker(path):
            client = Client()
            for _ in range(3):
                response = assert_allowed(client.get(path))
                assert response.status_code == 200
                assert "RateLimit" not in response.headers
        """,
    )
    result = pytester.runpytest_subprocess(*PLUGIN, "-p", "no:django")
    result.assert_outcomes(passed=6)


def test_throttle_of_job_queues_admits_at_once_while_off() -> None:
    from redcount.jobs import throttle

    with redcount.connect() as store:
        limiter = redcount.Limiter(store)
        with disable_limits():
            assert [throttle(limiter, "1/hour", "k", block=False) for _ in range(3)] == [0.0] * 3
        assert throttle(limiter, "1/hour", "k", block=False) == 0.0  # nothing was counted while off
        assert throttle(limiter, "1/hour", "k", block=False) > 0


def test_disable_limits_nests_and_is_a_decorator() -> None:
    with disable_limits():
        with disable_limits():
            assert limits_disabled()
        assert limits_disabled()
    assert not limits_disabled()

    @disable_limits()
    def inside() -> bool:
        return limits_disabled()

    assert inside() and not limits_disabled()
    with pytest.raises(RuntimeError, match="without a matching suspend"):
        _enforcement.resume()


def test_a_direct_limiter_is_not_affected() -> None:
    with redcount.connect() as store, disable_limits():
        assert exhaust(redcount.Limiter(store), "2/minute", "k") == 2


# -- helpers ---------------------------------------------------------------------------------------


class Response:
    """A test client's response as the helpers see it (a status code and headers)."""

    def __init__(self, status_code: int, headers: dict[str, str] | None = None) -> None:
        self.status_code = status_code
        self.headers = headers or {}


def test_the_helpers_read_decisions_responses_and_calls() -> None:
    with redcount.connect() as store:
        limiter = redcount.Limiter(store)
        first = assert_allowed(limiter.hit("1/minute", "k"))
        assert first.allowed
        refused = assert_limited(limiter.test("1/minute", "k"))
        assert refused.retry_after > 0
        assert_limited(lambda: limiter.test("1/minute", "k"))
        assert_allowed(lambda: limiter.test("1/minute", "other"))
    assert_limited(Response(429))
    assert_allowed(Response(404))  # not refused by the rate limiter
    with pytest.raises(TypeError, match="assert_limited takes a redcount Decision"):
        assert_limited("429")


def ping() -> Response:
    return Response(200)


def test_the_helpers_fail_with_a_readable_message() -> None:
    with redcount.connect() as store:
        limiter = redcount.Limiter(store)
        with pytest.raises(AssertionError, match=r"^expected the rate limiter to refuse, but it allowed: "
                           r"Decision\(allowed=True, limit=5, remaining=4"):
            assert_limited(limiter.hit("5/minute", "k"))
        exhaust(limiter, "5/minute", "k")
        with pytest.raises(AssertionError, match=r"^after the burst: expected the rate limiter to admit, but it "
                           r"refused \(retry after \d+\.\d+ s\): Decision\(allowed=False"):
            assert_allowed(limiter.test("5/minute", "k"), "after the burst")
        with pytest.raises(AssertionError, match=r"exhaust: 100 hits of '1000/minute' on key 'x' were all admitted"):
            exhaust(limiter, "1000/minute", "x", max_hits=100)
    with pytest.raises(AssertionError, match=r"^exhaust: 5 hits of the call were all admitted, none refused; "):
        exhaust(lambda: Response(200), max_hits=5)
    with disable_limits(), pytest.raises(AssertionError, match=r"5 hits of ping\(\) .*limits are turned off"):
        exhaust(ping, max_hits=5)
    refused = Response(429, {"RateLimit": '"default";r=0;t=60', "Retry-After": "60"})
    with pytest.raises(AssertionError, match=r'a 429 response; rate-limit headers: RateLimit: "default";r=0;t=60, '
                       r"Retry-After: 60$"):
        assert_allowed(refused)
    with pytest.raises(AssertionError, match=r"expected the rate limiter to refuse, but it allowed: a 200 response; "
                       r"rate-limit headers: none$"):
        assert_limited(Response(200))


def test_a_failing_helper_reads_well_in_a_pytest_report(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        from redcount.testing import assert_limited

        def test_expects_a_refusal(redcount_limiter):
            assert_limited(redcount_limiter.hit("5/minute", "user:42"), "the sixth login")
        """
    )
    result = run(pytester)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["E*AssertionError: the sixth login: expected the rate limiter to refuse, but it "
                                 "allowed: Decision(allowed=True, limit=5, remaining=4*"])


def test_reset_all_deletes_what_was_stored_under_a_prefix() -> None:
    with redcount.connect() as store:
        redcount.Limiter(store, prefix="a*b").hit("1/minute", "k")
        redcount.FixedWindowCounter(store, "views", window=60, prefix="a*b").incr("p")
        redcount.Limiter(store, prefix="axb").hit("1/minute", "k")
        assert reset_all(store, "a*b") == 2  # the * is a character of the prefix, not a pattern
        assert store.execute("KEYS", "*") != []
        assert reset_all(store, "") == 1


@pytest.mark.redis_only
def test_reset_all_wants_a_prefix_on_redis(redis_store: redcount.Store) -> None:
    with pytest.raises(redcount.InvalidInputError, match="non-empty prefix on Redis"):
        reset_all(redis_store, "")

