"""The counter HTTP service (``redcount serve``), over real HTTP.

Two real servers per module, started as ``python -m redcount serve`` subprocesses on free
loopback ports: one on a private redis-server with SQL snapshots (SQLite) and an adjust
token, one on ``memory://`` (the store lives in the server process). The tests talk to them
with httpx. A few checks that need an app configured otherwise (no token, a store that goes
away) run the same app in-process through httpx's ASGI transport.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import redcount
from conftest import RedisServer, free_port
from helpers import terminate

TOKEN = "svc-token-" + uuid.uuid4().hex
PREFIX = "svc"
API = "/api/v1/counters"


@dataclass
class Service:
    """One ``redcount serve`` process."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    token_file: Path
    redis: RedisServer | None = None
    sql_url: str | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=10)

    def wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        with self.client() as c:
            while True:
                assert self.proc.poll() is None, f"redcount serve exited:\n{self.log.read_text()}"
                assert time.monotonic() < deadline, f"no /healthz within {timeout} s:\n{self.log.read_text()}"
                try:
                    if c.get("/healthz").status_code == 200:
                        return
                except httpx.TransportError:
                    pass
                time.sleep(0.05)

    def stop(self) -> None:
        if not terminate(self.proc):
            raise AssertionError(f"redcount serve did not stop on SIGTERM:\n{self.log.read_text()}")
        # SIGTERM is a graceful shutdown: uvicorn finishes the requests in flight, runs the
        # lifespan shutdown, then dies of the signal it caught (or exits 0).
        log = self.log.read_text()
        assert self.proc.returncode in (0, -signal.SIGTERM), log
        assert "Traceback" not in log and "ERROR" not in log, log


def start_service(tmp: Path, *extra: str, redis: RedisServer | None = None, sql_url: str | None = None) -> Service:
    port = free_port()
    token_file = tmp / "token"
    token_file.write_text(TOKEN + "\n")
    argv = [
        sys.executable, "-m", "redcount", "serve",
        "--url", redis.url if redis is not None else "memory://",
        "--port", str(port), "--prefix", PREFIX, "--token-file", str(token_file),
        "--log-level", "warning", *extra,
    ]
    if sql_url is not None:
        argv += ["--sql", sql_url]
    log = tmp / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    svc = Service(proc, port, log, token_file, redis, sql_url)
    try:
        svc.wait_ready()
    except BaseException:
        svc.stop()
        raise
    return svc


@pytest.fixture(scope="module")
def redis_service(
    redis_session_factory: Callable[..., RedisServer], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    # A private redis-server: other modules' FLUSHALLs on the session server must not reach it.
    redis = redis_session_factory()
    tmp = tmp_path_factory.mktemp("serve-redis")
    svc = start_service(tmp, redis=redis, sql_url=f"sqlite:///{tmp / 'snapshots.db'}")
    yield svc
    svc.stop()


@pytest.fixture(scope="module")
def memory_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    svc = start_service(tmp_path_factory.mktemp("serve-memory"))
    yield svc
    svc.stop()


@pytest.fixture(scope="module", params=["memory", pytest.param("redis", marks=pytest.mark.redis_only)])
def service(request: pytest.FixtureRequest) -> Service:
    """The same test against both servers."""
    return request.getfixturevalue(f"{request.param}_service")  # type: ignore[no-any-return]


def fresh_key() -> str:
    return f"likes:post:{uuid.uuid4().hex[:12]}"


def value(c: httpx.Client, key: str) -> int:
    r = c.get(f"{API}/{key}", params={"maxStalenessMs": 0})
    assert r.status_code == 200, r.text
    return int(r.json()["value"])


def stored_keys(svc: Service, key: str) -> list[bytes]:
    """Every Redis key of the counter ``key`` (its shards, ids and logs)."""
    assert svc.redis is not None
    with redcount.connect(svc.redis.url) as store:
        return sorted(store.execute("KEYS", f"{{{PREFIX}:{key}:*"))  # type: ignore[arg-type]


# ---- increments and idempotency ---------------------------------------------------------


def test_increment_then_read(service: Service) -> None:
    key = fresh_key()
    with service.client() as c:
        r = c.post(f"{API}/{key}/increment", json={"delta": 5}, headers={"X-Request-Id": "a-1"})
        assert r.status_code == 200, r.text
        assert r.json() == {"accepted": True, "applied": True, "counterKey": key, "requestId": "a-1", "mode": "eventual"}
        r = c.post(f"{API}/{key}/increment")  # no body: delta 1; no id: not idempotent
        assert r.status_code == 200 and r.json()["applied"] is True and r.json()["requestId"] is None
        r = c.post(f"{API}/{key}/increment", json={"delta": -2}, headers={"X-Request-Id": "a-2"})
        assert r.status_code == 200 and r.json()["applied"] is True
        r = c.get(f"{API}/{key}", params={"maxStalenessMs": 0})
        assert r.status_code == 200
        body = r.json()
        assert body["counterKey"] == key and body["value"] == 4 and body["source"] == "live"
        assert isinstance(body["stalenessMs"], int) and body["stalenessMs"] >= 0
        assert set(body) == {"counterKey", "value", "stalenessMs", "source"}


def test_same_request_id_three_times_counts_once(service: Service) -> None:
    key = fresh_key()
    with service.client() as c:
        applied = []
        for _ in range(3):
            r = c.post(f"{API}/{key}/increment", json={"delta": 7}, headers={"X-Request-Id": "retry-1"})
            assert r.status_code == 200, r.text
            assert r.json()["accepted"] is True
            applied.append(r.json()["applied"])
        assert applied == [True, False, False]
        assert value(c, key) == 7


def test_same_request_id_sent_concurrently_counts_once(service: Service) -> None:
    key = fresh_key()
    n = 8
    barrier = threading.Barrier(n)
    results: list[bool] = []
    errors: list[BaseException] = []

    def send() -> None:
        try:
            with service.client() as c:
                c.get("/healthz")  # connect first, so the barrier releases requests, not handshakes
                barrier.wait()
                r = c.post(f"{API}/{key}/increment", json={"delta": 3}, headers={"X-Request-Id": "dup-1"})
                assert r.status_code == 200, r.text
                results.append(r.json()["applied"])
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=send) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert sorted(results) == [False] * (n - 1) + [True]
    with service.client() as c:
        assert value(c, key) == 3


def test_concurrent_increments_from_threads_are_exact(service: Service) -> None:
    key = fresh_key()
    # The full 8 x 200 against Redis; fewer on memory://, whose store is the server process.
    threads_n, per_thread = (8, 200) if service.redis is not None else (8, 50)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            with service.client() as c:
                for i in range(per_thread):
                    r = c.post(f"{API}/{key}/increment", headers={"X-Request-Id": f"t{t}-{i}"})
                    assert r.status_code == 200 and r.json()["applied"] is True, r.text
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors[:3]
    with service.client() as c:
        assert value(c, key) == threads_n * per_thread


def test_concurrent_coroutines_with_retries_are_exact(service: Service) -> None:
    """16 coroutines on 16 connections; every id is sent twice, by two of them at about the
    same time: every id counts exactly once."""
    key = fresh_key()
    ids = [f"co-{i}" for i in range(100)]

    async def run() -> list[bool]:
        queue: asyncio.Queue[str] = asyncio.Queue()
        for rid in ids:
            queue.put_nowait(rid)
            queue.put_nowait(rid)
        applied: list[bool] = []
        # Few requests in flight per client: httpx's async pool slows down with many waiters.
        async with httpx.AsyncClient(base_url=service.url, timeout=20, limits=httpx.Limits(max_connections=16)) as c:

            async def worker() -> None:
                while not queue.empty():
                    rid = queue.get_nowait()
                    r = await c.post(f"{API}/{key}/increment", json={"delta": 2}, headers={"X-Request-Id": rid})
                    assert r.status_code == 200, r.text
                    applied.append(bool(r.json()["applied"]))

            await asyncio.gather(*(worker() for _ in range(16)))
        return applied

    applied = asyncio.run(run())
    assert len(applied) == 2 * len(ids)
    assert sum(applied) == len(ids)
    with service.client() as c:
        assert value(c, key) == 2 * len(ids)


# ---- reads ------------------------------------------------------------------------------


def test_read_cache_staleness_is_reported_and_fresher_can_be_asked(service: Service) -> None:
    key = fresh_key()
    with service.client() as c:
        c.post(f"{API}/{key}/increment", json={"delta": 1})
        assert value(c, key) == 1  # a fresh read fills the server's cache for this key
        c.post(f"{API}/{key}/increment", json={"delta": 1})
        cached = c.get(f"{API}/{key}", params={"maxStalenessMs": 600_000}).json()
        # Served from the cache: the value before the second increment, and how old it is.
        assert cached["value"] == 1
        assert cached["stalenessMs"] >= 0
        assert value(c, key) == 2  # maxStalenessMs=0: fresh


def test_batch_get(service: Service) -> None:
    a, b, unknown = fresh_key(), fresh_key(), fresh_key()
    with service.client() as c:
        c.post(f"{API}/{a}/increment", json={"delta": 10})
        c.post(f"{API}/{b}/increment", json={"delta": -4})
        r = c.post(f"{API}/batch-get", json={"keys": [a, b, unknown, a]})
        assert r.status_code == 200, r.text
        assert r.json()["values"] == {a: 10, b: -4, unknown: 0}
        assert r.json()["stalenessMs"] >= 0
        r = c.post(f"{API}/batch-get", json={"keys": [f"k{i}" for i in range(101)]})
        assert r.status_code == 422 and "at most 100 keys" in r.json()["detail"]
        r = c.post(f"{API}/batch-get", json={"keys": [a, "bad key"]})
        assert r.status_code == 400 and r.json()["error"] == "invalid_key"
        r = c.post(f"{API}/batch-get", json={"keys": []})
        assert r.status_code == 422 and r.json()["error"] == "invalid_body"
        r = c.post(f"{API}/batch-get", json={"keys": "a"})
        assert r.status_code == 422


def test_openapi_schema(service: Service) -> None:
    with service.client() as c:
        r = c.get("/openapi.json")
    assert r.status_code == 200
    spec = r.json()
    assert spec["openapi"].startswith("3.")
    paths = spec["paths"]
    for path, method in [
        (f"{API}/{{key}}/increment", "post"),
        (f"{API}/{{key}}", "get"),
        (f"{API}/batch-get", "post"),
        (f"{API}/{{key}}/adjust", "post"),
        ("/healthz", "get"),
    ]:
        assert method in paths[path], path
    params = {p["name"] for p in paths[f"{API}/{{key}}/increment"]["post"]["parameters"]}
    assert "X-Request-Id" in params
    schemas = spec["components"]["schemas"]
    assert schemas["IncrementBody"]["additionalProperties"] is False
    assert {"delta", "reason"} <= set(schemas["AdjustBody"]["properties"])
    assert "Problem" in schemas


# ---- bad requests write nothing ---------------------------------------------------------

JSON = {"Content-Type": "application/json"}

BAD_INCREMENTS = [
    pytest.param({"content": b"{not json", "headers": JSON}, 400, "invalid_json", id="not-json"),
    pytest.param({"content": b'{"delta": ' + b"9" * 5000 + b"}", "headers": JSON}, 400, "invalid_json",
                 id="unparsable-number"),
    pytest.param({"content": b"\xff\xfe", "headers": JSON}, 400, "invalid_json", id="not-utf8"),
    pytest.param({"content": b"", "headers": JSON}, 400, "invalid_json", id="empty-as-json"),
    pytest.param({"content": b"delta=5", "headers": {"Content-Type": "text/plain"}}, 415, "unsupported_media_type",
                 id="not-json-content-type"),
    pytest.param({"json": {"delta": 0}}, 422, "invalid_body", id="delta-0"),
    pytest.param({"json": {"delta": "5"}}, 422, "invalid_body", id="delta-string"),
    pytest.param({"json": {"delta": 1.5}}, 422, "invalid_body", id="delta-float"),
    pytest.param({"json": {"delta": True}}, 422, "invalid_body", id="delta-bool"),
    pytest.param({"json": {"delta": None}}, 422, "invalid_body", id="delta-null"),
    pytest.param({"json": {"detla": 1}}, 422, "invalid_body", id="unknown-member"),
    pytest.param({"json": [1]}, 422, "invalid_body", id="array"),
    pytest.param({"json": {"delta": 10**9 + 1}}, 422, "invalid_body", id="delta-too-big"),
    pytest.param({"json": {"delta": 2**64}}, 422, "invalid_body", id="delta-huge"),
    pytest.param({"content": b'{"delta": 1' + b" " * 70_000 + b"}", "headers": JSON}, 413, "body_too_large",
                 id="body-too-large"),
    pytest.param({"json": {"delta": 1}, "headers": {"X-Request-Id": "has space"}}, 400, "invalid_request_id",
                 id="request-id-space"),
    pytest.param({"json": {"delta": 1}, "headers": {"X-Request-Id": "r" * 201}}, 400, "invalid_request_id",
                 id="request-id-too-long"),
]


@pytest.mark.parametrize(("kwargs", "status", "error"), BAD_INCREMENTS)
def test_bad_increment_is_refused_and_writes_nothing(
    service: Service, kwargs: dict[str, object], status: int, error: str | None
) -> None:
    key = fresh_key()
    kwargs = {k: v for k, v in kwargs.items() if v is not None}
    with service.client() as c:
        r = c.post(f"{API}/{key}/increment", **kwargs)  # type: ignore[arg-type]
        assert r.status_code == status, r.text
        if error is None:
            assert value(c, key) == 1
            return
        assert r.headers["content-type"] == "application/problem+json"
        body = r.json()
        assert body["status"] == status and body["error"] == error and body["detail"]
        assert value(c, key) == 0
    if service.redis is not None:
        assert stored_keys(service, key) == []


def test_body_too_large_when_chunked(service: Service) -> None:
    """No Content-Length: the limit counts the chunks as they arrive."""
    key = fresh_key()

    def chunks() -> Iterator[bytes]:
        yield b'{"delta": 1'
        for _ in range(20):
            yield b" " * 4096
        yield b"}"

    with service.client() as c:
        r = c.post(f"{API}/{key}/increment", content=chunks(), headers=JSON)
        assert r.status_code == 413, r.text
        assert r.json()["error"] == "body_too_large"
        assert value(c, key) == 0


@pytest.mark.parametrize(
    ("key", "why"),
    [("k" * 201, "at most 200 characters"), ("a{b}", "may only contain"), ("white space", "may only contain"),
     ("caf\u00e9", "may only contain")],
    ids=["too-long", "braces", "space", "non-ascii"],
)
def test_bad_key_is_refused(service: Service, key: str, why: str) -> None:
    with service.client() as c:
        for r in (c.post(f"{API}/{key}/increment", json={"delta": 1}), c.get(f"{API}/{key}")):
            assert r.status_code == 400, r.text
            assert r.json()["error"] == "invalid_key" and why in r.json()["detail"]
        assert value(c, "k" * 200) == 0  # the longest allowed key is fine


def test_bad_query_parameters(service: Service) -> None:
    with service.client() as c:
        for params in ({"maxStalenessMs": -1}, {"maxStalenessMs": "soon"}, {"source": "cache"}):
            r = c.get(f"{API}/k", params=params)
            assert r.status_code == 422, r.text
            assert r.json()["error"] == "invalid_query"


# ---- adjust -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "authorization",
    [None, "Bearer wrong-token-wrong-token", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer"],
    ids=["missing", "wrong", "basic", "longer", "empty"],
)
def test_adjust_without_the_right_token_is_401_and_writes_nothing(service: Service, authorization: str | None) -> None:
    key = fresh_key()
    headers = {"Authorization": authorization} if authorization is not None else {}
    with service.client() as c:
        r = c.post(f"{API}/{key}/adjust", json={"delta": 5, "reason": "test"}, headers=headers)
        assert r.status_code == 401, r.text
        assert r.json()["error"] == "unauthorized"
        assert r.headers["www-authenticate"].startswith("Bearer")
        assert value(c, key) == 0
    if service.redis is not None:
        assert stored_keys(service, key) == []


def test_adjust_with_the_token(service: Service) -> None:
    key = fresh_key()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with service.client() as c:
        c.post(f"{API}/{key}/increment", json={"delta": 100})
        r = c.post(f"{API}/{key}/adjust", json={"delta": -40, "reason": "refund 77"},
                   headers={**auth, "X-Request-Id": "adj-77"})
        assert r.status_code == 200, r.text
        assert r.json() == {"accepted": True, "applied": True, "counterKey": key, "delta": -40,
                            "reason": "refund 77", "requestId": "adj-77"}
        r = c.post(f"{API}/{key}/adjust", json={"delta": -40, "reason": "refund 77"},
                   headers={**auth, "X-Request-Id": "adj-77"})
        assert r.status_code == 200 and r.json()["applied"] is False
        assert value(c, key) == 60
        for body in ({"delta": 0, "reason": "x"}, {"delta": 1, "reason": ""}, {"delta": 1, "reason": "   "},
                     {"delta": 1}, {"reason": "x"}, {"delta": 1, "reason": "x" * 256}, {"delta": "1", "reason": "x"}):
            r = c.post(f"{API}/{key}/adjust", json=body, headers=auth)
            assert r.status_code == 422, (body, r.text)
            assert r.json()["error"] == "invalid_body"
        assert value(c, key) == 60


@pytest.mark.redis_only
def test_a_foreign_value_at_a_shard_is_a_503_with_the_reason(redis_service: Service) -> None:
    key = fresh_key()
    assert redis_service.redis is not None
    with redcount.connect(redis_service.redis.url) as store:
        for shard in range(16):  # whichever shard the write lands on
            store.execute("SET", f"{{{PREFIX}:{key}:{shard}}}", "not a number")
    with redis_service.client() as c:
        r = c.post(f"{API}/{key}/increment", json={"delta": 1}, headers={"X-Request-Id": "f-1"})
        assert r.status_code == 503, r.text
        assert r.json()["error"] == "store_error" and "increment failed" in r.json()["detail"]
        r = c.get(f"{API}/{key}", params={"maxStalenessMs": 0})
        assert r.status_code == 503 and r.json()["error"] == "store_error", r.text


# ---- SQL snapshots (Redis: the flusher is another process) ------------------------------


@pytest.mark.redis_only
def test_snapshot_read_after_a_flush(redis_service: Service) -> None:
    svc = redis_service
    key = fresh_key()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with svc.client() as c:
        r = c.get(f"{API}/{key}", params={"source": "snapshot"})
        assert r.status_code == 404 and r.json()["error"] == "snapshot_not_found"
        for i in range(30):
            c.post(f"{API}/{key}/increment", json={"delta": 2}, headers={"X-Request-Id": f"s-{i}"})
        r = c.post(f"{API}/{key}/adjust", json={"delta": -5, "reason": "http adjust"}, headers=auth)
        assert r.status_code == 200
        assert svc.redis is not None and svc.sql_url is not None
        flush = subprocess.run(
            [sys.executable, "-m", "redcount", "flush", "--url", svc.redis.url, "--sql", svc.sql_url,
             "--counter", key, "--prefix", PREFIX, "--once", "--quiet"],
            capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL,
        )
        assert flush.returncode == 0, flush.stderr
        r = c.get(f"{API}/{key}", params={"source": "snapshot"})
        assert r.status_code == 200, r.text
        snap = r.json()
        assert snap["value"] == 55 and snap["source"] == "snapshot" and snap["counterKey"] == key
        ms, _, seq = snap["watermark"].partition("-")
        assert ms.isdigit() and seq.isdigit() and int(ms) > 0
        assert snap["stalenessMs"] >= 0 and snap["snapshotUpdatedMs"] > 0
        # A write after the flush is live at once and not in the snapshot until the next one.
        c.post(f"{API}/{key}/increment", json={"delta": 1})
        assert value(c, key) == 56
        assert c.get(f"{API}/{key}", params={"source": "snapshot"}).json()["value"] == 55
    with redcount.connect(svc.redis.url) as store:
        # Everything the service wrote went through the delta logs: no drift between Redis, the
        # snapshot and the log (the increment after the flush counts as not yet flushed).
        report = redcount.reconcile(store, svc.sql_url, key, record=False)
        assert report.ok and report.abs_drift == 0 and report.audit_drift == 0, report.table()
    with redcount.SnapshotStore(svc.sql_url, create=False) as snaps:
        assert [(a.delta, a.reason) for a in snaps.adjustments(key)] == [(-5, "http adjust")]
        assert sorted(d.request_id or "" for d in snaps.deltas(key)) == sorted(["", *(f"s-{i}" for i in range(30))])


def test_snapshot_read_without_sql_is_refused(memory_service: Service) -> None:
    with memory_service.client() as c:
        r = c.get(f"{API}/k", params={"source": "snapshot"})
    assert r.status_code == 400
    assert r.json()["error"] == "snapshot_unavailable" and "--sql" in r.json()["detail"]


@pytest.mark.redis_only
def test_docs_curl_examples(redis_service: Service) -> None:
    """The service page's curl lines (docs/service.md), run as written against the service:
    each answer equals the JSON shown under it (stalenessMs, which varies, left out)."""
    if shutil.which("curl") is None:
        pytest.fail("curl is needed for the docs check (apt-get install curl)", pytrace=False)
    root = next(p for p in Path(__file__).resolve().parents if (p / "pyproject.toml").exists())
    page = (root / "docs" / "service.md").read_text()
    block = next((b for b in re.findall(r"```sh\n(.*?)```", page, re.S) if "curl " in b), None)
    assert block is not None, "docs/service.md has no sh block with curl lines"
    lines = block.replace("\\\n", " ").splitlines()
    checked = 0
    for i, line in enumerate(lines):
        if not line.startswith("curl "):
            continue
        cmd = line.replace("http://127.0.0.1:8080", redis_service.url).replace(
            "/etc/redcount/token", str(redis_service.token_file)
        )
        proc = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, timeout=30, check=False)
        assert proc.returncode == 0, (cmd, proc.stderr)
        got = json.loads(proc.stdout)
        assert "error" not in got, (cmd, got)
        shown = lines[i + 1].removeprefix("# ") if i + 1 < len(lines) else ""
        try:
            want = json.loads(shown)
        except ValueError:
            continue  # an abridged answer ("...")
        got.pop("stalenessMs", None)
        want.pop("stalenessMs", None)
        assert got == want, cmd
        checked += 1
    assert checked >= 3


def test_healthz_and_unknown_routes(service: Service) -> None:
    with service.client() as c:
        r = c.get("/healthz")
        assert r.status_code == 200 and r.json()["status"] == "ok"
        r = c.get("/api/v1/nothing")
        assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
        r = c.delete(f"{API}/k")
        assert r.status_code == 405 and r.json()["error"] == "method_not_allowed"


# ---- in-process (ASGI transport): configurations the two servers do not have -------------


def asgi_call(app: object, method: str, path: str, **kwargs: object) -> httpx.Response:
    async def run() -> httpx.Response:
        transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://svc") as c:
            return await c.request(method, path, **kwargs)  # type: ignore[arg-type]

    return asyncio.run(run())


def test_adjust_without_a_configured_token_is_403() -> None:
    from redcount.service import create_app

    with redcount.connect() as store:
        app = create_app(store)
        r = asgi_call(app, "POST", f"{API}/k/adjust", json={"delta": 1, "reason": "x"},
                      headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code == 403, r.text
        assert r.json()["error"] == "adjust_disabled" and "--token-file" in r.json()["detail"]
        assert redcount.ShardedCounter(store, "k").value() == 0


def test_store_down_is_503_with_a_message(redis_factory: Callable[..., RedisServer]) -> None:
    from redcount.service import create_app

    server = redis_factory()
    with redcount.connect(server.url, connect_timeout=1, command_timeout=1) as store:
        app = create_app(store, token=TOKEN)
        assert asgi_call(app, "POST", f"{API}/k/increment", json={"delta": 1}).status_code == 200
        server.stop()
        for method, path, kwargs in [
            ("POST", f"{API}/k/increment", {"json": {"delta": 1}, "headers": {"X-Request-Id": "x"}}),
            ("GET", f"{API}/k?maxStalenessMs=0", {}),
            ("POST", f"{API}/batch-get", {"json": {"keys": ["k"]}}),
            ("GET", "/healthz", {}),
        ]:
            r = asgi_call(app, method, path, **kwargs)
            assert r.status_code == 503, (path, r.text)
            assert r.json()["error"] == "store_unavailable" and "unavailable" in r.json()["detail"]
            assert r.headers["retry-after"] == "1"


def test_the_counter_cache_is_bounded_and_keeps_counts_right() -> None:
    from redcount.service import ServiceLimits, create_app

    with redcount.connect() as store:
        app = create_app(store, limits=ServiceLimits(cache_size=3))
        for i in range(10):
            r = asgi_call(app, "POST", f"{API}/k{i % 5}/increment", json={"delta": 1}, headers={"X-Request-Id": f"r{i}"})
            assert r.status_code == 200 and r.json()["applied"] is True
        assert len(app.state.counters) == 3
        # An evicted key's new counter object still meets the request ids its shards recorded.
        r = asgi_call(app, "POST", f"{API}/k0/increment", json={"delta": 1}, headers={"X-Request-Id": "r0"})
        assert r.json()["applied"] is False
        assert [redcount.ShardedCounter(store, f"k{i}").value() for i in range(5)] == [2] * 5


def test_importing_the_service_without_fastapi_says_what_to_install() -> None:
    code = "import sys; sys.modules['fastapi'] = None; import redcount.service"
    proc = run_cli(code=code)
    assert proc.returncode == 1
    assert "ImportError" in proc.stderr and "pip install 'redcount[serve]'" in proc.stderr


def test_create_app_refuses_bad_configuration() -> None:
    from redcount.service import ServiceLimits, create_app

    with redcount.connect() as store:
        with pytest.raises(redcount.InvalidInputError, match="at least 16 characters"):
            create_app(store, token="short")
        with pytest.raises(redcount.InvalidInputError, match="max_delta"):
            create_app(store, limits=ServiceLimits(max_delta=2**53))
        with pytest.raises(redcount.InvalidInputError, match="max_body"):
            create_app(store, limits=ServiceLimits(max_body=0))
        with pytest.raises(redcount.InvalidInputError, match="shards"):
            create_app(store, shards=0).openapi()
        with pytest.raises(redcount.InvalidInputError, match="SQL"):
            create_app(store, sql_url="nonsense:://x")


# ---- the command line -------------------------------------------------------------------


def run_cli(*args: str, code: str) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-c", code, *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL,
                          env=dict(os.environ))


def test_serve_without_the_extra_says_what_to_install() -> None:
    # uvicorn made unimportable in the child: what a user without redcount[serve] sees.
    code = "import sys; sys.modules['uvicorn'] = None; from redcount.tools.cli import main; sys.exit(main(sys.argv[1:]))"
    proc = run_cli("serve", code=code)
    assert proc.returncode == 2
    assert "pip install 'redcount[serve]'" in proc.stderr and "uvicorn" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_serve_with_a_bad_token_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from redcount.tools.cli import main

    # Refused before a store is opened or a port is bound: nothing to clean up.
    assert main(["serve", "--token-file", str(tmp_path / "missing"), "--port", str(free_port())]) == 2
    assert "cannot read the token file" in capsys.readouterr().err
    (tmp_path / "empty").write_text("\n")
    assert main(["serve", "--token-file", str(tmp_path / "empty"), "--port", str(free_port())]) == 2
    assert "is empty" in capsys.readouterr().err
    (tmp_path / "short").write_text("short\n")
    assert main(["serve", "--token-file", str(tmp_path / "short"), "--port", str(free_port())]) == 2
    assert "at least 16 characters" in capsys.readouterr().err
