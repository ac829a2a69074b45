"""The pytest plugin for apps that use redcount: fixtures, a marker and a session switch.

pytest loads it by itself wherever redcount is installed (the ``pytest11`` entry point
``redcount``); ``pytest -p no:redcount`` leaves it out. Loading it costs what
``import redcount`` costs and nothing more: the stores are opened by the fixtures a test
asks for, and no web framework or Celery is imported.

Fixtures:

- ``redcount_store``: a fresh [`Store`][redcount.store.Store] per test. By default an embedded
  ``memory://`` store on ``redcount_clock``: nothing leaks from one test into the next, and
  its time stands still unless the test moves it, so no test straddles a window boundary by
  bad luck. With a Redis URL configured (below), a store on that server: each test's counters
  and limiters keep their keys under ``redcount_prefix``, which are deleted after the test.
- ``redcount_clock``: the [`ManualClock`][redcount.store.ManualClock] of that store;
  ``redcount_clock.advance(60)`` moves every counter and limiter on it a minute on. Redis
  keeps its own time for expiry, so a test asking for it is skipped when the tests run on Redis.
- ``redcount_prefix``: a key prefix unique to the test (``redcount-test:<12 hex digits>``).
- ``redcount_limiter``: a [`Limiter`][redcount.limiter.Limiter] on ``redcount_store`` under
  ``redcount_prefix``, fixed-window; another strategy by indirect parametrization
  (``@pytest.mark.parametrize("redcount_limiter", ["gcra"], indirect=True)``).
- ``redcount_disabled``: the test runs with every integration's limits turned off
  ([`redcount.testing.disable_limits`][redcount.testing.disable_limits]); so does a test marked
  ``@pytest.mark.redcount_disabled``, its fixtures' set-up and teardown included.

Settings (ini file or environment; the environment wins):

- ``redcount_url`` / ``REDCOUNT_TEST_URL``: the store ``redcount_store`` opens (default
  ``memory://``), e.g. ``redis://localhost:6379/15``.
- ``redcount_disabled`` / ``REDCOUNT_TEST_DISABLED``: true turns every integration's
  limits off for the whole session.
"""

from __future__ import annotations

import os
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any

import pytest

from .. import _enforcement

if TYPE_CHECKING:
    from ..limiter import Limiter
    from ..store import ManualClock, Store

__all__ = [
    "redcount_clock",
    "redcount_disabled",
    "redcount_limiter",
    "redcount_prefix",
    "redcount_store",
    "redcount_url",
]

_URL_ENV = "REDCOUNT_TEST_URL"
_DISABLED_ENV = "REDCOUNT_TEST_DISABLED"
_MARKER = "redcount_disabled"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")
# Whether pytest_configure turned the limits off for the session (to undo it once).
_SESSION_HOLD = pytest.StashKey[bool]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini("redcount_url", "the store redcount_store opens: memory:// (default) or a Redis URL; "
                  f"${_URL_ENV} wins", default="")
    parser.addini("redcount_disabled", "turn every redcount integration's limits off for the session; "
                  f"${_DISABLED_ENV} wins", type="bool", default=False)


def _session_disabled(config: pytest.Config) -> bool:
    env = os.environ.get(_DISABLED_ENV)
    if env is not None:
        value = env.strip().lower()
        if value in _TRUE or value in _FALSE:
            return value in _TRUE
        raise pytest.UsageError(
            f"{_DISABLED_ENV} must be a boolean (1/0, true/false, yes/no, on/off), got {env!r}"
        )
    return bool(config.getini("redcount_disabled"))


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{_MARKER}: turn every redcount integration's limits off for this test (redcount.testing)"
    )
    held = _session_disabled(config)
    if held:
        _enforcement.suspend()
    config.stash[_SESSION_HOLD] = held


def pytest_unconfigure(config: pytest.Config) -> None:
    if config.stash.get(_SESSION_HOLD, False):
        config.stash[_SESSION_HOLD] = False
        _enforcement.resume()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, None, None]:
    # The marker covers the test's set-up and teardown too: an app fixture that makes
    # requests while it sets up runs with the limits off as well.
    if item.get_closest_marker(_MARKER) is None:
        yield
        return
    _enforcement.suspend()
    try:
        yield
    finally:
        _enforcement.resume()


@pytest.fixture(scope="session")
def redcount_url(pytestconfig: pytest.Config) -> str:
    """The store URL the tests run on: ``$REDCOUNT_TEST_URL``, else the ini option
    ``redcount_url``, else ``memory://``."""
    url = os.environ.get(_URL_ENV) or str(pytestconfig.getini("redcount_url") or "")
    return url.strip() or "memory://"


def _is_memory(url: str) -> bool:
    return url.startswith("memory:")


@pytest.fixture
def redcount_prefix() -> str:
    """A key prefix unique to this test."""
    import uuid

    return f"redcount-test:{uuid.uuid4().hex[:12]}"


@pytest.fixture
def redcount_clock(redcount_url: str) -> ManualClock:
    """The manual clock of this test's ``memory://`` store; skips the test on Redis."""
    if not _is_memory(redcount_url):
        pytest.skip(
            f"redcount_clock needs the memory:// store (Redis keeps its own time); the tests run on {redcount_url}"
        )
    from ..store import ManualClock

    return ManualClock()


@pytest.fixture
def redcount_store(request: pytest.FixtureRequest, redcount_url: str, redcount_prefix: str) -> Iterator[Store]:
    """A fresh store for this test: ``memory://`` on ``redcount_clock``, or the configured
    Redis, where the keys under ``redcount_prefix`` are deleted after the test."""
    from ..store import connect

    if _is_memory(redcount_url):
        clock = request.getfixturevalue("redcount_clock")
        with connect(redcount_url, clock=clock) as store:
            yield store
        return
    from . import reset_all

    with connect(redcount_url) as store:
        try:
            yield store
        finally:
            reset_all(store, redcount_prefix)


@pytest.fixture
def redcount_limiter(request: pytest.FixtureRequest, redcount_store: Store, redcount_prefix: str) -> Limiter:
    """A limiter on this test's store and prefix (fixed-window, or the strategy given by
    indirect parametrization)."""
    from ..limiter import Limiter

    strategy: Any = getattr(request, "param", "fixed-window")
    return Limiter(redcount_store, strategy, prefix=redcount_prefix)


@pytest.fixture
def redcount_disabled() -> Iterator[None]:
    """Every redcount integration's limits are off while this test runs."""
    _enforcement.suspend()
    try:
        yield
    finally:
        _enforcement.resume()
