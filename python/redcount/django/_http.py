"""What the middleware, the decorators and the throttles share: a Django request as the web
layer sees it, the verdict a request carries, and the responses for refused requests."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from asgiref.sync import async_to_sync
from django.http import HttpResponse

from ..web import problem
from ..web.engine import Verdict
from ..web.headers import render
from ..web.spec import LimitSpec
from .conf import State
from .keys import needs_user

__all__ = ["RateLimitExceeded", "View", "apply_headers", "attach", "load_user", "refuse", "refuse_sync", "verdict"]

_ATTR = "_redcount_verdict"
_UNSET: Any = object()


class RateLimitExceeded(Exception):
    """What ``REDCOUNT["VIEW"]`` is called with for a refused request: ``verdict`` (which
    limit refused and when to retry), ``headers`` (the rate-limit headers, also added to the
    view's response) and ``problem`` (the RFC 9457 body of the default answer)."""

    def __init__(self, verdict: Verdict, headers: list[tuple[str, str]]) -> None:
        self.verdict = verdict
        self.headers = headers
        self.problem = problem.too_many_requests(verdict)
        super().__init__(str(self.problem["detail"]))


class View:
    """A Django request as the shared web layer sees it ([`redcount.web.RequestView`][redcount.web.spec.RequestView])."""

    __slots__ = ("_client", "_state", "native", "user")

    def __init__(self, request: Any, state: State, user: Any = _UNSET) -> None:
        self.native = request
        self._state = state
        self._client: str | None = None
        self.user = getattr(request, "user", None) if user is _UNSET else user

    @property
    def method(self) -> str:
        return str(self.native.method)

    @property
    def endpoint(self) -> str:
        # The URL pattern once the URL is resolved (inside a view): one key per route, not
        # per URL; the path before (the middleware runs before resolution).
        match = getattr(self.native, "resolver_match", None)
        route = getattr(match, "route", None) if match is not None else None
        return f"/{route}" if route else str(self.native.path_info)

    @property
    def client(self) -> str:
        if self._client is None:
            identity = self._state.settings.identity
            header = identity.header
            meta = self.native.META
            values: list[str] = []
            if header:
                raw = meta.get("HTTP_" + header.upper().replace("-", "_"))
                if raw:
                    values = [raw]
            self._client = identity.resolve(meta.get("REMOTE_ADDR"), values)
        return self._client

    def header(self, name: str) -> str | None:
        value = self.native.headers.get(name)
        return None if value is None else str(value)


def _wants_user(specs: Sequence[LimitSpec], state: State) -> bool:
    return any(needs_user(s.key if s.key is not None else state.settings.key) for s in specs)


async def load_user(request: Any, specs: Sequence[LimitSpec], state: State) -> Any:
    """The request's user, loaded with ``await request.auser()`` when a key needs it (the
    lazy ``request.user`` would query the database on the event loop); else ``_UNSET``."""
    if not _wants_user(specs, state):
        return _UNSET
    auser = getattr(request, "auser", None)
    if auser is not None:
        return await auser()
    return getattr(request, "user", None)


def verdict(request: Any) -> Verdict | None:
    """The [`redcount.web.Verdict`][redcount.web.engine.Verdict] of everything decided for this request so far (the
    middleware's limits, then each decorator's), or None."""
    found: Verdict | None = getattr(request, _ATTR, None)
    return found


def attach(request: Any, decided: Verdict) -> Verdict:
    """Add ``decided`` to the request's verdict; the merged verdict."""
    merged: Verdict | None = getattr(request, _ATTR, None)
    if merged is None:
        setattr(request, _ATTR, decided)
        return decided
    if merged is not decided:
        merged.merge(decided)
    return merged


def apply_headers(response: Any, decided: Verdict | None, state: State) -> Any:
    """Set the rate-limit headers of ``decided`` on ``response`` (set, never added twice)."""
    if decided is not None and state.settings.headers.any and hasattr(response, "headers"):
        for name, value in render(decided, state.settings.headers):
            response[name] = value
    return response


def _problem_response(body: dict[str, Any], status: int) -> HttpResponse:
    return HttpResponse(json.dumps(body), status=status, content_type=problem.CONTENT_TYPE)


def refuse_sync(request: Any, decided: Verdict, state: State) -> Any:
    """`refuse` for sync code: an async ``VIEW`` is run to completion here."""
    answer = refuse(request, decided, state)
    if hasattr(answer, "__await__"):
        async def wait() -> Any:
            return await answer

        return async_to_sync(wait)()
    return answer


def refuse(request: Any, decided: Verdict, state: State) -> Any:
    """The answer to a refused request: 503 when the store is down and ``FAIL`` is closed;
    else ``REDCOUNT["VIEW"]``'s response or a 429 problem+json, with the rate-limit headers.
    May return an awaitable when ``VIEW`` is an async view (the async paths await it; sync
    code calls `refuse_sync`)."""
    if decided.unavailable:
        response = _problem_response(problem.store_unavailable(), 503)
        response["Retry-After"] = "1"
        if decided.undecided is not None:
            response["RateLimit-Undecided"] = decided.undecided
        return response
    headers = render(decided, state.settings.headers) if state.settings.headers.any else []
    if state.view is not None:
        answer = state.view(request, RateLimitExceeded(decided, headers))
        if hasattr(answer, "__await__"):
            return _finish_async(answer, headers)
        return _with(answer, headers)
    return _with(_problem_response(problem.too_many_requests(decided), 429), headers)


def _with(response: Any, headers: list[tuple[str, str]]) -> Any:
    for name, value in headers:
        response[name] = value
    return response


async def _finish_async(answer: Any, headers: list[tuple[str, str]]) -> Any:
    return _with(await answer, headers)

