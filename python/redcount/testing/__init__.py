"""Helpers for testing an app that uses redcount, with or without pytest.

```python
from redcount.testing import assert_allowed, assert_limited, disable_limits, exhaust

assert exhaust(limiter, "5/minute", "user:42") == 5      # hit until refused: 5 were admitted
assert_limited(limiter.test("5/minute", "user:42"))      # a Decision...
assert_limited(client.get("/search"))                    # ...or a test client's response (429)

with disable_limits():                                   # every integration admits everything
    assert_allowed(client.get("/search"))
```

The pytest plugin ([`redcount.testing.plugin`][redcount.testing.plugin], loaded by itself when redcount is
installed) adds fixtures on top of these: a fresh store per test, a clock that tests move,
and the ``redcount_disabled`` marker and fixture. Importing this module loads neither pytest
nor any web framework.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any, TypeVar, overload

from .. import _enforcement
from .._core import Decision, LimitSet
from ..errors import InvalidInputError, RateLimitExceeded

__all__ = ["assert_allowed", "assert_limited", "disable_limits", "exhaust", "limits_disabled", "reset_all"]

T = TypeVar("T")

TOO_MANY_REQUESTS = 429
# The rate-limit fields a failure message shows, so that a reader sees which limit spoke.
_SHOWN_HEADERS = ("RateLimit-Policy", "RateLimit", "Retry-After", "RateLimit-Undecided", "X-RateLimit-Remaining")


@contextlib.contextmanager
def disable_limits() -> Iterator[None]:
    """Turn off the limits of every integration of this process while the block runs:
    Flask, FastAPI and Starlette, Django (middleware, decorators, the django-ratelimit
    drop-in), Django REST framework throttles, [`redcount.celery.LimitedTask`][redcount.celery.LimitedTask] and
    [`redcount.jobs.throttle`][redcount.jobs.throttle]. Every request and task start is admitted without asking
    the store (nothing is counted, no rate-limit header is sent), whatever each
    integration's own settings say; their ``enabled=False`` / ``REDCOUNT_ENABLED`` /
    ``REDCOUNT["ENABLED"]`` keep working as before.

    Also a decorator (``@disable_limits()``). Nestable and thread-safe; it is process-wide,
    so an app served on another thread (a test client's or a live server's) sees it too.
    A [`Limiter`][redcount.limiter.Limiter] called directly is not affected."""
    _enforcement.suspend()
    try:
        yield
    finally:
        _enforcement.resume()


def limits_disabled() -> bool:
    """True while [`disable_limits`][redcount.testing.disable_limits] (or the plugin's marker, fixture or
    session setting) is in force."""
    return _enforcement.suspended


# -- what a test holds: a decision, a response, or a call that gives one ----------------------


def _status(subject: object) -> int | None:
    """The HTTP status of a test client's response (Flask/werkzeug, Starlette/httpx, Django,
    DRF: ``status_code``; others: an int ``status``), else None."""
    for name in ("status_code", "status"):
        value = getattr(subject, name, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _headers(subject: object) -> str:
    headers = getattr(subject, "headers", None)
    if headers is None:
        return ""
    shown = []
    for name in _SHOWN_HEADERS:
        try:
            value = headers.get(name)
        except Exception:  # a headers object of an unknown shape: show none
            return ""
        if value is not None:
            shown.append(f"{name}: {value}")
    return "; rate-limit headers: " + (", ".join(shown) if shown else "none")


def _describe(subject: object) -> str:
    status = _status(subject)
    if status is not None:
        return f"a {status} response{_headers(subject)}"
    return repr(subject)


def _limited(subject: object, what: str) -> bool:
    if isinstance(subject, Decision):
        return not subject.allowed
    status = _status(subject)
    if status is not None:
        return status == TOO_MANY_REQUESTS
    allowed = getattr(subject, "allowed", None)
    if isinstance(allowed, bool):  # a web integration's Verdict, or a Decision-like object
        return not allowed
    raise TypeError(
        f"{what} takes a redcount Decision, a test client's response (with status_code), or a callable "
        f"returning one; got {type(subject).__name__}"
    )


def _resolve(subject: Any) -> tuple[Any, bool | None]:
    """What to inspect, and whether a call raised a refusal (a lease refused by
    [`redcount.Limiter.lease`][redcount.limiter.Limiter.lease] raises [`RateLimitExceeded`][redcount.errors.RateLimitExceeded])."""
    if callable(subject) and not isinstance(subject, Decision) and _status(subject) is None:
        try:
            return subject(), None
        except RateLimitExceeded as e:
            return e, True
    return subject, None


def assert_limited(subject: Any, message: str | None = None) -> Any:
    """Assert that the rate limiter refused: a [`Decision`][redcount.limiter.Decision] that is not
    ``allowed``, a test client's response with status 429 (Flask, Starlette/FastAPI, httpx,
    Django, DRF), or a callable with no arguments returning one of those (or raising
    [`RateLimitExceeded`][redcount.errors.RateLimitExceeded]). Returns what it inspected (the decision, the
    response), so a test can go on to check ``retry_after`` or the headers. ``message`` is
    put in front of the failure's own."""
    seen, raised = _resolve(subject)
    if raised or _limited(seen, "assert_limited"):
        return seen
    prefix = f"{message}: " if message else ""
    raise AssertionError(f"{prefix}expected the rate limiter to refuse, but it allowed: {_describe(seen)}")


def assert_allowed(subject: Any, message: str | None = None) -> Any:
    """Assert that the rate limiter admitted: the opposite of
    [`assert_limited`][redcount.testing.assert_limited], for the same kinds of subject (a response passes
    with any status other than 429). Returns what it inspected."""
    seen, raised = _resolve(subject)
    prefix = f"{message}: " if message else ""
    if raised:
        raise AssertionError(f"{prefix}expected the rate limiter to admit, but it refused: {seen}")
    if not _limited(seen, "assert_allowed"):
        return seen
    extra = ""
    if isinstance(seen, Decision):
        extra = f" (retry after {seen.retry_after:.3f} s)"
    raise AssertionError(f"{prefix}expected the rate limiter to admit, but it refused{extra}: {_describe(seen)}")


# -- driving a limit to its end ------------------------------------------------------------------

DEFAULT_MAX_HITS = 10_000
"""How many admitted hits [`exhaust`][redcount.testing.exhaust] allows before it fails."""


@overload
def exhaust(target: Callable[[], Any], *, max_hits: int = DEFAULT_MAX_HITS) -> int: ...
@overload
def exhaust(
    target: Any, limit: str | LimitSet, key: str | bytes, *, cost: int = 1, max_hits: int = DEFAULT_MAX_HITS
) -> int: ...


def exhaust(
    target: Any,
    limit: str | LimitSet | None = None,
    key: str | bytes | None = None,
    *,
    cost: int = 1,
    max_hits: int = DEFAULT_MAX_HITS,
) -> int:
    """Hit until refused and return how many hits were admitted before the refusal.

    ``exhaust(limiter, "5/minute", "user:42")`` calls [`Limiter.hit`][redcount.limiter.Limiter.hit] with
    ``cost`` (a [`redcount.aio.Limiter`][redcount.aio.Limiter] is driven through its sync twin);
    ``exhaust(lambda: client.get("/search"))`` calls the function until it returns a
    refusal ([`assert_limited`][redcount.testing.assert_limited]'s kinds: a 429, a refused decision). The refused
    hit charges nothing. Raises ``AssertionError`` when ``max_hits`` hits were all admitted
    (the limit is off, or larger than expected)."""
    if isinstance(max_hits, bool) or not isinstance(max_hits, int) or max_hits < 1:
        raise InvalidInputError(f"max_hits must be an int >= 1, got {max_hits!r}")
    if limit is None and key is None:
        if not callable(target):
            raise TypeError(
                f"exhaust takes a limiter with a limit and a key, or a callable; got {type(target).__name__}"
            )
        call: Callable[[], Any] = target
        name = str(getattr(target, "__name__", ""))
        what = f"{name}()" if name.isidentifier() else "the call"
    else:
        if limit is None or key is None:
            raise TypeError("exhaust(limiter, limit, key): give both the limit and the key")
        limiter = getattr(target, "sync", target)  # redcount.aio.Limiter -> its redcount.Limiter
        hit = getattr(limiter, "hit", None)
        if hit is None:
            raise TypeError(f"exhaust takes a redcount.Limiter or redcount.aio.Limiter, got {type(target).__name__}")
        bound_limit, bound_key = limit, key

        def call() -> Any:
            return hit(bound_limit, bound_key, cost)

        what = f"{limit!r} on key {key!r}"
    for admitted in range(max_hits):
        seen, raised = _resolve(call)
        if raised or _limited(seen, "exhaust"):
            return admitted
    off = " (limits are turned off: redcount.testing.disable_limits is in force)" if _enforcement.suspended else ""
    raise AssertionError(f"exhaust: {max_hits} hits of {what} were all admitted, none refused{off}; "
                         "pass max_hits= for a larger limit")


# -- cleaning up -----------------------------------------------------------------------------------


def _glob_escape(text: str) -> str:
    return "".join("\\" + ch if ch in "*?[]\\" else ch for ch in text)


def reset_all(store: Any, prefix: str) -> int:
    """Delete every key of ``store`` whose name starts with ``prefix`` (on every node of a
    cluster or ring), and return how many were deleted: what the counters and limiters built
    with ``prefix=prefix`` stored. The plugin's Redis-backed ``redcount_store`` calls it
    with the test's ``redcount_prefix`` after each test. ``prefix`` may not be empty on
    Redis (that would empty a database the tests may share with others); on ``memory://``,
    ``""`` deletes every key."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str, got {type(prefix).__name__}")
    if not prefix and not store.is_memory:
        raise InvalidInputError("reset_all needs a non-empty prefix on Redis, e.g. the test's redcount_prefix")
    pattern = _glob_escape(prefix) + "*"
    deleted = 0
    for node in store.nodes():
        if store.is_memory:  # the embedded store has KEYS, not SCAN
            keys = list(node.execute("KEYS", pattern) or [])
            if keys:
                deleted += int(node.execute("UNLINK", *keys) or 0)
            continue
        cursor: Any = "0"
        while True:
            cursor, keys = node.execute("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
            # One key at a time: on a cluster, keys of different slots cannot share a command.
            for k in keys or []:
                deleted += int(node.execute("UNLINK", k) or 0)
            if cursor in (b"0", "0", 0):
                break
    return deleted
