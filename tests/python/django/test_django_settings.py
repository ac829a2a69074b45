"""The REDCOUNT setting: defaults, validation at start-up with errors naming the setting."""

from __future__ import annotations

# First: configures Django before anything imports it.
from redcount_django_fixtures import *  # noqa: F403  (the fixtures)

from typing import Any

import pytest
from django.apps import apps
from django.core.exceptions import ImproperlyConfigured

import redcount
import redcount.django
from redcount.django import RateLimitMiddleware
from redcount.django.conf import DEFAULTS, get_state


def test_defaults_match_the_other_integrations(configure: Any) -> None:
    configure()
    state = get_state()
    assert state.limiter.strategy == "fixed-window" and state.limiter.prefix == "redcount:web"
    assert state.limiter.store.is_memory
    assert state.settings.policy.mode == "open"
    assert state.settings.budget == 0.1
    assert (state.settings.headers.ietf, state.settings.headers.legacy, state.settings.headers.retry_after) == (True, False, True)
    assert state.settings.identity.trusted is None and state.settings.identity.ipv6_prefix == 128
    assert state.enabled and not state.settings.shadow and state.default == [] and state.paths == []
    assert set(DEFAULTS) >= {"URL", "DEFAULT_LIMITS", "HEADERS", "TRUSTED_PROXIES", "FAIL", "BUDGET", "FALLBACK",
                             "STRATEGY", "ENABLED", "PREFIX", "PATHS", "RATELIMIT_COMPAT_403"}


def test_settings_are_read(configure: Any, redis_url: str) -> None:
    configure(URL=redis_url, STRATEGY="sliding-window", PREFIX="myapp", FAIL="closed", BUDGET="0.25",
              HEADERS="all", TRUSTED_PROXIES="10.0.0.0/8", IPV6_PREFIX="64", FALLBACK="memory://")
    state = get_state()
    assert state.limiter.strategy == "sliding-window" and state.limiter.prefix == "myapp"
    assert not state.limiter.store.is_memory and state.budget == 0.25
    assert state.settings.policy.mode == "closed" and state.settings.headers.legacy
    assert state.settings.identity.trusted is not None and state.settings.identity.ipv6_prefix == 64


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"FAIL": "maybe"}, 'REDCOUNT["FAIL"]'),
        ({"BUDGET": -1}, 'REDCOUNT["BUDGET"]'),
        ({"BUDGET": "soon"}, 'REDCOUNT["BUDGET"]'),
        ({"HEADERS": "ietf,fancy"}, 'REDCOUNT["HEADERS"]'),
        ({"TRUSTED_PROXIES": ["10.0.0.0/33"]}, 'REDCOUNT["TRUSTED_PROXIES"]'),
        ({"IPV6_PREFIX": 200}, 'REDCOUNT["IPV6_PREFIX"]'),
        ({"URL": "ftp://nowhere"}, 'REDCOUNT["URL"]'),
        ({"URL": 5}, 'REDCOUNT["URL"]'),
        ({"STRATEGY": "guesswork"}, 'REDCOUNT["STRATEGY"]'),
        ({"PREFIX": ""}, 'REDCOUNT["PREFIX"]'),
        ({"DEFAULT_LIMITS": "lots"}, 'REDCOUNT["DEFAULT_LIMITS"]'),
        ({"DEFAULT_LIMITS": [5]}, 'REDCOUNT["DEFAULT_LIMITS"]'),
        ({"PATHS": {"api/": "1/minute"}}, 'REDCOUNT["PATHS"]'),
        ({"PATHS": {"/api/": "1/fortnight"}}, 'REDCOUNT["PATHS"]'),
        ({"PATHS": ["/api/"]}, 'REDCOUNT["PATHS"]'),
        ({"KEY": "nobody"}, 'REDCOUNT["KEY"]'),
        ({"ENABLED": "perhaps"}, 'REDCOUNT["ENABLED"]'),
        ({"SHADOW": 2}, 'REDCOUNT["SHADOW"]'),
        ({"BREAKER": "x"}, 'REDCOUNT["BREAKER"]'),
        ({"FALLBACK": 5}, 'REDCOUNT["FALLBACK"]'),
        ({"VIEW": "no.such.view"}, 'REDCOUNT["VIEW"]'),
        ({"VIEW": 5}, 'REDCOUNT["VIEW"]'),
        ({"METRICS": object()}, 'REDCOUNT["METRICS"]'),
        ({"RATELIMIT_COMPAT_403": "x"}, 'REDCOUNT["RATELIMIT_COMPAT_403"]'),
        ({"FAIL_OPEN": True}, 'REDCOUNT["FAIL_OPEN"] is not a redcount setting'),
    ],
)
def test_bad_settings_fail_at_start_up_naming_the_setting(configure: Any, values: dict[str, Any], named: str) -> None:
    configure(**values)
    with pytest.raises(redcount.django.ConfigurationError) as info:
        RateLimitMiddleware(lambda request: None)
    assert named in str(info.value)
    # one class for both ways of catching it
    assert isinstance(info.value, ImproperlyConfigured) and isinstance(info.value, redcount.InvalidInputError)


def test_the_app_validates_in_ready(configure: Any) -> None:
    configure(FAIL="sideways")
    with pytest.raises(ImproperlyConfigured, match=r'REDCOUNT\["FAIL"\]'):
        apps.get_app_config("redcount").ready()


def test_setting_must_be_a_dict(settings: Any) -> None:
    settings.REDCOUNT = ["URL"]
    with pytest.raises(ImproperlyConfigured, match="REDCOUNT must be a dict"):
        get_state()


def test_check_on_start_pings_the_store(configure: Any, redis_factory: Any) -> None:
    server = redis_factory()
    url = server.url
    server.kill()
    configure(URL=url, CHECK_ON_START=True)
    with pytest.raises(redcount.ConnectionError):
        get_state()
    configure(URL=url)  # without the check the app starts, and FAIL decides per request
    get_state()


def test_changing_the_setting_rebuilds_the_state(configure: Any) -> None:
    configure(DEFAULT_LIMITS="1/minute")
    first = get_state()
    assert get_state() is first
    configure(DEFAULT_LIMITS="2/minute")
    assert get_state() is not first


def test_middleware_is_sync_and_async_capable() -> None:
    assert RateLimitMiddleware.sync_capable and RateLimitMiddleware.async_capable

    async def handler(request: Any) -> None:
        return None

    from asgiref.sync import iscoroutinefunction

    assert iscoroutinefunction(RateLimitMiddleware(handler))
    assert not iscoroutinefunction(RateLimitMiddleware(lambda request: None))


@pytest.mark.filterwarnings(r"ignore:.*use of fork\(\) may lead to deadlocks:DeprecationWarning")
def test_a_forked_child_builds_its_own_state(configure: Any, redis_url: str) -> None:
    import os

    configure(URL=redis_url, DEFAULT_LIMITS="1/minute")
    parent = get_state()
    assert parent.limiter.hit("5/minute", "before-fork").allowed
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: a new state, on its own connection, that works
        try:
            state = get_state()
            ok = state is not parent and state.limiter.hit("5/minute", "child").allowed
            os.write(w, b"1" if ok else b"0")
        finally:
            os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.waitpid(pid, 0)
    assert got == b"1"
    assert get_state() is parent and parent.limiter.hit("5/minute", "after-fork").allowed
