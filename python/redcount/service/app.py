"""The counter HTTP service: [`create_app`][redcount.service.app.create_app] builds the ASGI app ``redcount serve`` runs.

```python
store = redcount.connect("redis://127.0.0.1:6379/0")
app = create_app(store, sql_url="sqlite:///counters.db", token="s3cret", shards=16)

# POST /api/v1/counters/likes:post:987/increment  X-Request-Id: r-1  {"delta": 1}
#   -> {"accepted": true, "applied": true, "counterKey": "likes:post:987", ...}
# GET  /api/v1/counters/likes:post:987?maxStalenessMs=100
#   -> {"counterKey": "likes:post:987", "value": 1, "stalenessMs": 0, "source": "live"}
```

Every counter key is a [`redcount.ShardedCounter`][redcount.sharded.ShardedCounter] of this ``prefix`` and ``shards``
(the same keys, delta logs and request-id deduplication as the library's), driven through
[`redcount.aio`][redcount.aio], so the event loop never waits on the store. SQL snapshot reads, which
SQLAlchemy only does blocking, run in the default thread pool.

Errors are RFC 9457 problem details (``application/problem+json``) with an extra ``error``
member, a stable machine-readable code (``invalid_json``, ``invalid_body``, ``invalid_key``,
``body_too_large``, ``unauthorized``, ``store_unavailable``, ...). A request that is refused
writes nothing: bodies, keys and headers are checked before the store is called.
"""

from __future__ import annotations

import asyncio
import hmac
import re
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from http import HTTPStatus
from typing import Annotated, Any, Literal, Optional

try:
    from fastapi import Body, Depends, FastAPI, Header, Query, Request
    from fastapi.exceptions import RequestValidationError
    from fastapi.responses import JSONResponse
    from pydantic import BaseModel, ConfigDict, Field, field_validator
    from starlette.exceptions import HTTPException as StarletteHTTPException
except ImportError as exc:  # pragma: no cover - exercised by test_service's missing-extra test
    raise ImportError(
        f"the redcount counter service needs FastAPI and uvicorn ({exc.name} is missing): "
        "pip install 'redcount[serve]'"
    ) from exc

from .. import aio
from .._core import Store
from ..errors import ConnectionError as StoreConnectionError
from ..errors import InvalidInputError, RedcountError

__all__ = ["PROBLEM_CONTENT_TYPE", "ServiceLimits", "create_app"]

PROBLEM_CONTENT_TYPE = "application/problem+json"
"""The media type of the service's error bodies (RFC 9457 problem details)."""

MAX_EXACT = 2**53 - 1
"""The library's bound on one sharded increment (an exact integer in a Lua double)."""

MAX_REQUEST_ID = 200
"""Request ids are stored in the SQL audit log too, whose column holds 255 characters."""
_REQUEST_ID = re.compile(r"[\x21-\x7e]+")  # visible ASCII: no spaces, no control characters

_KEY_CHARS = "letters, digits and . _ : -"
_KEY = re.compile(r"[A-Za-z0-9._:-]+")


@dataclass(frozen=True)
class ServiceLimits:
    """What one request may ask for. Every limit is checked before the store is called.
    Immutable, so thread-safe.

    Attributes:
        max_body: bytes of a request body (larger: 413).
        max_key_length: characters of a counter key (keys are ASCII, ``[A-Za-z0-9._:-]``).
        max_batch: keys in one batch-get.
        max_delta: absolute value of one increment's or adjustment's delta (at most 2**53 - 1).
        cache_size: counter objects kept (least recently used evicted); each holds its key's
            read cache, so a key evicted and read again starts with a fresh read.
        default_staleness_ms: how old a ``GET`` value may be when the client does not say.
        max_staleness_ms: the largest ``maxStalenessMs`` a client may ask for.
    """

    max_body: int = 64 * 1024
    max_key_length: int = 200
    max_batch: int = 100
    max_delta: int = 1_000_000_000
    cache_size: int = 10_000
    default_staleness_ms: int = 250
    max_staleness_ms: int = 3_600_000

    def check(self) -> None:
        for name in ("max_body", "max_key_length", "max_batch", "max_delta", "cache_size", "max_staleness_ms"):
            if getattr(self, name) < 1:
                raise InvalidInputError(f"ServiceLimits.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_delta > MAX_EXACT:
            raise InvalidInputError(f"ServiceLimits.max_delta must be <= 2**53 - 1, got {self.max_delta}")
        if self.max_key_length > 255:
            raise InvalidInputError("ServiceLimits.max_key_length must be <= 255 (the SQL snapshots' name column)")
        if not 0 <= self.default_staleness_ms <= self.max_staleness_ms:
            raise InvalidInputError("ServiceLimits.default_staleness_ms must be within 0..max_staleness_ms")


# ---- request and response bodies --------------------------------------------------------
# Strict: "5", 5.0 and true are not a delta (lax parsing would count a typo), and unknown
# members are refused (a misspelt "detla" must not silently become the default delta of 1).


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")


def _nonzero(v: int) -> int:
    if v == 0:
        raise ValueError("delta must not be 0 (a positive or negative integer)")
    return v


class IncrementBody(_Strict):
    delta: int = Field(1, ge=-MAX_EXACT, le=MAX_EXACT, description="non-zero; negative subtracts (default 1)")

    _check_delta = field_validator("delta")(_nonzero)


class AdjustBody(_Strict):
    delta: int = Field(ge=-MAX_EXACT, le=MAX_EXACT, description="the correction, non-zero")
    reason: str = Field(min_length=1, max_length=255, description="why: 1..255 bytes of UTF-8, not blank")

    _check_delta = field_validator("delta")(_nonzero)

    @field_validator("reason")
    @classmethod
    def _check_reason(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("reason must not be blank: an adjustment says why it was made")
        if len(v.encode()) > 255:
            raise ValueError("reason must be at most 255 bytes of UTF-8")
        return v


class BatchGetBody(_Strict):
    keys: list[str] = Field(min_length=1, max_length=10_000, description="counter keys (at most max_batch)")


class IncrementResult(BaseModel):
    accepted: bool = Field(description="always true on success")
    applied: bool = Field(description="false when this X-Request-Id was already applied to this counter")
    counterKey: str
    requestId: Optional[str]
    mode: Literal["eventual"] = "eventual"


class AdjustResult(BaseModel):
    accepted: bool
    applied: bool
    counterKey: str
    delta: int
    reason: str
    requestId: Optional[str]


class CounterReading(BaseModel):
    counterKey: str
    value: int
    stalenessMs: int = Field(description="how old the value may be, in milliseconds")
    source: Literal["live", "snapshot"]
    watermark: Optional[str] = Field(default=None, description="snapshot only: the newest delta-log id in it (<ms>-<seq>)")
    snapshotUpdatedMs: Optional[int] = Field(default=None, description="snapshot only: when the flusher last wrote it (epoch ms)")


class BatchValues(BaseModel):
    values: dict[str, int]
    stalenessMs: int = Field(description="the round trip of the read, in milliseconds")


class Health(BaseModel):
    status: Literal["ok"]
    store: str


class FieldError(BaseModel):
    loc: str
    message: str
    type: str


class Problem(BaseModel):
    """RFC 9457 problem details, plus ``error``, a stable code."""

    type: str = "about:blank"
    title: str
    status: int
    error: str
    detail: str
    errors: Optional[list[FieldError]] = None


_PROBLEMS: dict[int | str, dict[str, Any]] = {
    code: {"model": Problem, "content": {PROBLEM_CONTENT_TYPE: {}}, "description": HTTPStatus(code).phrase}
    for code in (400, 413, 415, 422, 503)
}


# ---- errors -----------------------------------------------------------------------------


async def _no_body_at_all(request: Request) -> None:
    """An increment without a body counts 1; FastAPI also hands a JSON ``null`` and an empty
    body sent as JSON to the endpoint as "no body", which would count 1 for what is more
    likely a client's bug (a serialised missing value): refuse both, writing nothing."""
    raw = await request.body()  # already read and kept by FastAPI: no second read
    if raw.strip():  # the only non-empty body FastAPI turns into None is JSON null
        raise ServiceProblem(
            422, "invalid_body", 'the body must be a JSON object such as {"delta": 1}, or no body at all (delta 1); got null'
        )
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if raw == b"" and (content_type == "application/json" or content_type.endswith("+json")):
        raise ServiceProblem(
            400, "invalid_json",
            "the request body is empty but its Content-Type says JSON: send a JSON object such as "
            '{"delta": 1}, or no body and no Content-Type (delta 1)',
        )


class ServiceProblem(Exception):
    """Raised inside the app; answered as a problem+json response."""

    def __init__(self, status: int, error: str, detail: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail
        self.headers = headers


def problem_response(
    status: int,
    error: str,
    detail: str,
    *,
    errors: list[dict[str, str]] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": HTTPStatus(status).phrase,
        "status": status,
        "error": error,
        "detail": detail,
    }
    if errors is not None:
        body["errors"] = errors
    return JSONResponse(body, status_code=status, media_type=PROBLEM_CONTENT_TYPE, headers=headers)


# FastAPI raises a bare 400 only when it cannot parse a body (e.g. an integer of 5,000 digits).
_STATUS_CODES = {400: "invalid_json", 401: "unauthorized", 403: "forbidden", 404: "not_found", 405: "method_not_allowed"}


def _loc(loc: tuple[Any, ...] | list[Any]) -> str:
    return ".".join(str(p) for p in loc)


async def _on_validation_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errs = list(exc.errors())
    for e in errs:
        if e.get("type") == "json_invalid":
            why = (e.get("ctx") or {}).get("error", "")
            return problem_response(400, "invalid_json", f"the request body is not valid JSON ({why})".replace(" ()", ""))
        if tuple(e.get("loc", ()))[:1] == ("body",) and isinstance(e.get("input"), (bytes, bytearray)):
            return problem_response(
                415, "unsupported_media_type", "send the request body as a JSON object with Content-Type: application/json"
            )
    where = str(errs[0].get("loc", ("body",))[0]) if errs else "body"
    # The rejected input is not echoed back: it may be large, or carry what it should not.
    fields = [
        {"loc": _loc(e.get("loc", ())), "message": str(e.get("msg", "")), "type": str(e.get("type", ""))}
        for e in errs
    ]
    detail = "; ".join(f"{f['loc']}: {f['message']}" for f in fields) or "invalid request"
    return problem_response(422, f"invalid_{where}", detail, errors=fields)


async def _on_problem(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ServiceProblem)
    return problem_response(exc.status, exc.error, exc.detail, headers=exc.headers)


async def _on_http_exception(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _STATUS_CODES.get(exc.status_code, "http_error")
    return problem_response(exc.status_code, code, str(exc.detail), headers=dict(exc.headers or {}) or None)


@contextmanager
def _store_errors(what: str) -> Iterator[None]:
    """Turns the store's errors into problems: bad input 400, everything else 503."""
    try:
        yield
    except InvalidInputError as e:
        raise ServiceProblem(400, "invalid_input", str(e)) from None
    except StoreConnectionError as e:
        detail = f"{what} failed: the store is unavailable ({e})"
        if getattr(e, "maybe_applied", False):
            detail += "; the write may or may not have been applied: retry it with the same X-Request-Id"
        raise ServiceProblem(503, "store_unavailable", detail, {"Retry-After": "1"}) from None
    except RedcountError as e:
        detail = f"{what} failed: the store refused it ({e})"
        raise ServiceProblem(503, "store_error", detail, {"Retry-After": "1"}) from None


# ---- the body-size limit ----------------------------------------------------------------

_Scope = MutableMapping[str, Any]
_Message = MutableMapping[str, Any]
_Receive = Callable[[], Awaitable[_Message]]
_Send = Callable[[_Message], Awaitable[None]]
_ASGIApp = Callable[[_Scope, _Receive, _Send], Awaitable[None]]


class _BodyLimit:
    """Reads each HTTP request body up to ``max_body`` bytes before the app sees it, and
    answers 413 past that, whether the client sent a Content-Length or chunks. Bodies here
    are small JSON documents, so buffering one costs nothing and keeps the check in one place."""

    def __init__(self, app: _ASGIApp, max_body: int) -> None:
        self.app = app
        self.max_body = max_body

    async def __call__(self, scope: _Scope, receive: _Receive, send: _Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        too_big = problem_response(
            413, "body_too_large", f"the request body must be at most {self.max_body} bytes"
        )
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                if not value.isdigit():
                    await problem_response(400, "invalid_header", "Content-Length is not a number")(scope, receive, send)
                    return
                if int(value) > self.max_body:
                    await too_big(scope, receive, send)
                    return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return  # the client went away before its body arrived
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                await too_big(scope, receive, send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def replay() -> _Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


# ---- the counters -----------------------------------------------------------------------


class _Counters:
    """The counter object of each key, least recently used evicted past ``capacity``.

    Not thread-safe: used only on the event loop's thread, and never across an ``await``."""

    def __init__(self, store: Store, *, shards: int, prefix: str, idempotency_ttl: float, capacity: int) -> None:
        self.store = store
        self.shards = shards
        self.prefix = prefix
        self.idempotency_ttl = idempotency_ttl
        self.capacity = capacity
        self._lru: OrderedDict[str, aio.ShardedCounter] = OrderedDict()

    def make(self, key: str) -> aio.ShardedCounter:
        return aio.ShardedCounter(
            self.store, key, shards=self.shards, prefix=self.prefix, idempotency_ttl=self.idempotency_ttl
        )

    def get(self, key: str) -> aio.ShardedCounter:
        counter = self._lru.get(key)
        if counter is not None:
            self._lru.move_to_end(key)
            return counter
        counter = self.make(key)
        self._lru[key] = counter
        if len(self._lru) > self.capacity:
            self._lru.popitem(last=False)
        return counter

    def __len__(self) -> int:
        return len(self._lru)


def _check_token(token: str | None) -> None:
    if token is not None and (not token or token != token.strip() or len(token) < 16):
        raise InvalidInputError(
            "the adjust token must be at least 16 characters without surrounding whitespace "
            "(e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))')"
        )


def create_app(
    store: Store | aio.AsyncStore,
    *,
    sql_url: str | None = None,
    token: str | None = None,
    shards: int = 16,
    prefix: str = "redcount",
    idempotency_ttl: float = 86400,
    limits: ServiceLimits | None = None,
    title: str = "redcount counters",
) -> FastAPI:
    """The counter service as a FastAPI app.

    Args:
        store: from [`redcount.connect`][redcount.store.connect] (Redis or ``memory://``); the app does not close it.
        sql_url: the SQL snapshots the flusher writes ([`redcount.SnapshotStore`][redcount.sql.snapshots.SnapshotStore]); enables
            ``GET ...?source=snapshot``. Tables are created if missing.
        token: the bearer token that ``/adjust`` requires (at least 16 characters); without
            one, adjustments are refused (403).
        shards: of every counter, as for [`redcount.ShardedCounter`][redcount.sharded.ShardedCounter]; keep it equal to
            what the flusher and other writers use.
        prefix: the same, the counters' key prefix.
        idempotency_ttl: the same, seconds a request id is remembered.
        limits: request limits ([`ServiceLimits`][redcount.service.app.ServiceLimits]).

    Raises InvalidInputError for a bad argument (before anything is served). The app serves
    one event loop (one worker process); its counter cache is not shared across threads.
    """
    sync_store = store.store if isinstance(store, aio.AsyncStore) else store
    lim = limits if limits is not None else ServiceLimits()
    lim.check()
    _check_token(token)
    counters = _Counters(
        sync_store, shards=shards, prefix=prefix, idempotency_ttl=idempotency_ttl, capacity=lim.cache_size
    )
    reader = counters.make("batch-get")  # values() reads any names of this prefix and shard count
    astore = aio.AsyncStore(sync_store)
    snapshots: Any = None
    sql_errors: tuple[type[BaseException], ...] = ()
    if sql_url is not None:
        from ..sql import SnapshotStore

        snapshots = SnapshotStore(sql_url)
        import sqlalchemy

        sql_errors = (sqlalchemy.exc.SQLAlchemyError,)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        if snapshots is not None:
            snapshots.close()

    app = FastAPI(
        title=title,
        version="1",
        description=(
            "Sharded, idempotent counters (redcount.ShardedCounter) over HTTP. Errors are "
            "application/problem+json with a stable `error` code."
        ),
        lifespan=lifespan,
    )
    app.add_exception_handler(RequestValidationError, _on_validation_error)
    app.add_exception_handler(ServiceProblem, _on_problem)
    app.add_exception_handler(StarletteHTTPException, _on_http_exception)
    app.add_middleware(_BodyLimit, max_body=lim.max_body)
    app.state.counters = counters
    app.state.snapshots = snapshots

    def key_of(key: str) -> str:
        if len(key) > lim.max_key_length:
            raise ServiceProblem(
                400, "invalid_key", f"counter key must be at most {lim.max_key_length} characters, got {len(key)}"
            )
        if not _KEY.fullmatch(key):
            raise ServiceProblem(400, "invalid_key", f"counter key {key!r} may only contain {_KEY_CHARS}")
        return key

    def request_id_of(value: str | None) -> str | None:
        if value is None:
            return None
        if not value or len(value) > MAX_REQUEST_ID:
            why = f"got {len(value)} characters"
        elif not _REQUEST_ID.fullmatch(value):
            why = "it has a space, a control character or a non-ASCII character"
        else:
            return value
        raise ServiceProblem(
            400, "invalid_request_id", f"X-Request-Id must be 1..{MAX_REQUEST_ID} visible ASCII characters: {why}"
        )

    def delta_of(delta: int) -> int:
        if abs(delta) > lim.max_delta:
            raise ServiceProblem(422, "invalid_body", f"delta must be within +-{lim.max_delta}, got {delta}")
        return delta

    def authorize(authorization: Optional[str] = Header(None, include_in_schema=False)) -> None:
        if token is None:
            raise ServiceProblem(
                403,
                "adjust_disabled",
                "adjustments are disabled: this service was started without a token (redcount serve --token-file FILE)",
            )
        scheme, _, given = (authorization or "").partition(" ")
        # compare_digest: the time taken does not tell how much of a guess was right.
        if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), token.encode()):
            raise ServiceProblem(
                401,
                "unauthorized",
                "adjust needs the header Authorization: Bearer <token> with the service's token",
                {"WWW-Authenticate": 'Bearer realm="redcount"'},
            )

    request_id_doc = (
        "Idempotency key: a repeat within the idempotency TTL returns the same success with applied=false. "
        f"1..{MAX_REQUEST_ID} visible ASCII characters. Without it, a retried request counts again."
    )

    @app.post(
        "/api/v1/counters/{key}/increment",
        response_model=IncrementResult,
        responses=_PROBLEMS,
        summary="Add delta to a counter (idempotent with X-Request-Id)",
    )
    async def increment(
        request: Request,
        key: str,
        body: Annotated[Optional[IncrementBody], Body()] = None,
        x_request_id: Optional[str] = Header(None, alias="X-Request-Id", description=request_id_doc),
    ) -> IncrementResult:
        key = key_of(key)
        rid = request_id_of(x_request_id)
        if body is None:
            await _no_body_at_all(request)
        delta = delta_of(body.delta if body is not None else 1)
        with _store_errors("increment"):
            applied = await counters.get(key).incr(delta, request_id=rid)
        return IncrementResult(accepted=True, applied=applied, counterKey=key, requestId=rid)

    @app.post(
        "/api/v1/counters/batch-get",
        response_model=BatchValues,
        responses=_PROBLEMS,
        summary="Values of many counters in one round trip (fresh)",
    )
    async def batch_get(body: BatchGetBody) -> BatchValues:
        if len(body.keys) > lim.max_batch:
            detail = f"keys: at most {lim.max_batch} keys per batch-get, got {len(body.keys)}"
            raise ServiceProblem(422, "invalid_body", detail)
        keys = list(dict.fromkeys(key_of(k) for k in body.keys))
        start = time.monotonic()
        with _store_errors("batch-get"):
            values = await reader.values(keys)
        took = round((time.monotonic() - start) * 1000)
        return BatchValues(values={k: values[k] for k in keys}, stalenessMs=took)

    @app.get(
        "/api/v1/counters/{key}",
        response_model=CounterReading,
        response_model_exclude_none=True,
        responses={**_PROBLEMS, 404: {"model": Problem, "description": "no snapshot of this counter yet"}},
        summary="A counter's value and how stale it may be",
    )
    async def get_counter(
        key: str,
        max_staleness_ms: Optional[int] = Query(
            None,
            alias="maxStalenessMs",
            ge=0,
            le=lim.max_staleness_ms,
            description=f"live: serve a cached value at most this old (default {lim.default_staleness_ms}; 0 = fresh)",
        ),
        source: Literal["live", "snapshot"] = Query(
            "live", description="live: the shards in the store; snapshot: the SQL total the flusher wrote (needs --sql)"
        ),
    ) -> CounterReading:
        key = key_of(key)
        if source == "snapshot":
            return await read_snapshot(key)
        staleness = lim.default_staleness_ms if max_staleness_ms is None else max_staleness_ms
        with _store_errors("read"):
            reading = await counters.get(key).read(staleness / 1000)
        return CounterReading(
            counterKey=key, value=reading.value, stalenessMs=reading.staleness_ms, source="live"
        )

    async def read_snapshot(key: str) -> CounterReading:
        if snapshots is None:
            raise ServiceProblem(
                400, "snapshot_unavailable", "source=snapshot needs the service started with an SQL URL (redcount serve --sql URL)"
            )
        try:
            # SQLAlchemy blocks: off the loop, in the default thread pool.
            total = await asyncio.to_thread(snapshots.total_snapshot, key)
        except InvalidInputError:
            raise ServiceProblem(
                404,
                "snapshot_not_found",
                f"no SQL snapshot of counter {key!r} yet: the flusher has not applied it (redcount flush --counter {key})",
            ) from None
        except sql_errors as e:
            raise ServiceProblem(
                503, "snapshot_store_unavailable", f"cannot read the SQL snapshots at {snapshots.url}: {type(e).__name__}",
                {"Retry-After": "1"},
            ) from None
        age = max(0, int(time.time() * 1000) - total.updated_ms)
        return CounterReading(
            counterKey=key,
            value=total.value,
            stalenessMs=age,
            source="snapshot",
            watermark=str(total.watermark),
            snapshotUpdatedMs=total.updated_ms,
        )

    @app.post(
        "/api/v1/counters/{key}/adjust",
        response_model=AdjustResult,
        responses={
            **_PROBLEMS,
            401: {"model": Problem, "description": "missing or wrong bearer token"},
            403: {"model": Problem, "description": "no token configured: adjustments are disabled"},
        },
        dependencies=[Depends(authorize)],
        summary="An audited correction (internal; needs the bearer token)",
    )
    async def adjust(
        key: str,
        body: AdjustBody,
        x_request_id: Optional[str] = Header(None, alias="X-Request-Id", description=request_id_doc),
    ) -> AdjustResult:
        key = key_of(key)
        rid = request_id_of(x_request_id)
        delta = delta_of(body.delta)
        with _store_errors("adjust"):
            applied = await counters.get(key).adjust(delta, body.reason, request_id=rid)
        return AdjustResult(
            accepted=True, applied=applied, counterKey=key, delta=delta, reason=body.reason, requestId=rid
        )

    @app.get("/healthz", response_model=Health, responses={503: _PROBLEMS[503]}, summary="The store answers")
    async def healthz() -> Health:
        with _store_errors("ping"):
            await astore.ping()
        return Health(status="ok", store=sync_store.url)

    return app
