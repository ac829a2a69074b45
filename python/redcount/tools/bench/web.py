"""``redcount bench web``: requests per second of minimal Flask, FastAPI and Django apps under a real
load generator, without a limiter, with redcount and with the peers, in one run.

```text
redcount bench web --seconds 5 --workers 2 --json web.json
```

Each contender is a minimal app with one route under a limit that is never reached
(``1000000/minute``, one key: every request is decided and allowed), without rate-limit
headers (the peers' default, and the same work for everyone), served by gunicorn
(Flask, Django) or uvicorn (FastAPI) with ``--workers`` processes on a free loopback port, against
one private redis-server, and loaded by ``wrk`` (Debian: ``apt-get install wrk``) with
``--connections`` connections for ``--seconds``. Contenders:

- Flask: no limiter; redcount (``redcount.flask``); Flask-Limiter on its Redis storage; and
  Flask-Limiter on redcount's ``limits`` scheme (``redcount+redis://``) where
  ``redcount.contrib.limits`` is installed.
- FastAPI: no limiter; redcount (``redcount.fastapi`` dependency, on ``redcount.aio``);
  slowapi on its Redis storage and on redcount's scheme; fastapi-limiter.
- Django: no limiter; redcount (``redcount.django``'s decorator); django-ratelimit counting in
  Django's cache on django-redis (its documented set-up), which refuses with a 403 when reached.
- A refused client's flood (Flask and FastAPI): every request but the first is refused by
  ``"1/hour"`` on one key, with and without the refusal cache (``-refused-cache``: refusals
  answered in the process until the store's ``retry_after``, no round trip).
- redcount with the same limit leased (``lease=1000``, ``-leased``): each worker takes 1000
  units at a time and decides from them in process (see docs/leased-limits.md); the overhead
  of a leased hot key next to the unleased one.
- Floors, which are not limiters: the route sends one bare ``INCR`` to the same Redis through
  redcount's store and waits for its reply, and decides nothing (Flask and Django; FastAPI awaited, and
  FastAPI blocking the loop for it as slowapi does, the cheapest round trip there is). A
  limiter that is exact across workers asks Redis at least once per request, so its overhead
  cannot go below the lowest floor of its framework on the same machine; the report prints
  that floor next to the overhead the target allows.

A peer whose package is missing is reported as skipped, with the package to install. The
overhead of a contender is the drop in requests per second against no limiter of the same
framework; the target is redcount's overhead at most half of the best peer's. Contenders
take turns (``--rounds`` rounds, the median kept), so a change in the machine's load hits
them alike.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field

from ..servers import RedisServer, die_with_parent, free_port, stop_process
from .harness import BenchError, find_server
from .report import write_json

__all__ = ["run_bench_web"]

LIMIT = "1000000/minute"

_COMMON = """
    import os
    URL = os.environ["BENCH_REDIS_URL"]
    LIMIT = os.environ["BENCH_LIMIT"]
    FLOOD = "1/hour"
"""

# One minimal app per contender: the route answers a short text body.
_APPS: dict[str, str] = {
    "flask-none": """
        from flask import Flask
        app = Flask(__name__)

        @app.get("/")
        def index():
            return "ok"
    """,
    "flask-redcount": """
        import redcount, redcount.flask
        from flask import Flask
        app = Flask(__name__)
        app.config.update(REDCOUNT_URL=URL, REDCOUNT_PREFIX="bench:web:redcount", REDCOUNT_HEADERS="none",
                          REDCOUNT_BUDGET=0)  # every request decided by the store, never let through
        rl = redcount.flask.RateLimiter(app)

        @app.get("/")
        @rl.limit(LIMIT)
        def index():
            return "ok"
    """,
    # The same hot key (one client, one limit) as a leased limit: each worker takes 1000 units
    # at a time and decides from them in process, with a round trip per 1000 requests.
    "flask-redcount-leased": """
        import redcount, redcount.flask
        from flask import Flask
        app = Flask(__name__)
        app.config.update(REDCOUNT_URL=URL, REDCOUNT_PREFIX="bench:web:redcountl", REDCOUNT_HEADERS="none",
                          REDCOUNT_BUDGET=0)
        rl = redcount.flask.RateLimiter(app)

        @app.get("/")
        @rl.limit(LIMIT, lease=1000)
        def index():
            return "ok"
    """,
    # A route under three limits of three keys (the client's address application-wide, an
    # organisation, the route per address), decided in one round trip; "-seq" has them decided
    # one by one, one round trip each, as the web layer did before: one limit costs 2, and
    # checks of different costs are not decided together (a per-app switch, unlike
    # redcount.web.engine.BATCH_CHECKS, so that in-process runs can hold both apps).
    "flask-redcount-3": """
        import redcount, redcount.flask
        from flask import Flask
        app = Flask(__name__)
        app.config.update(REDCOUNT_URL=URL, REDCOUNT_PREFIX="bench:web:redcount3", REDCOUNT_HEADERS="none",
                          REDCOUNT_BUDGET=0, REDCOUNT_APPLICATION=LIMIT)
        rl = redcount.flask.RateLimiter(app)

        @app.get("/")
        @rl.limit(LIMIT, key=lambda: "acme", name="org")
        @rl.limit(LIMIT, name="ip")
        def index():
            return "ok"
    """,
    "flask-redcount-3-seq": """
        import redcount, redcount.flask
        from flask import Flask
        app = Flask(__name__)
        app.config.update(REDCOUNT_URL=URL, REDCOUNT_PREFIX="bench:web:redcount3s", REDCOUNT_HEADERS="none",
                          REDCOUNT_BUDGET=0, REDCOUNT_APPLICATION=LIMIT)
        rl = redcount.flask.RateLimiter(app)

        @app.get("/")
        @rl.limit(LIMIT, key=lambda: "acme", name="org")
        @rl.limit(LIMIT, name="ip", cost=2)
        def index():
            return "ok"
    """,
    # A refused client flooding the app: one key over "1/hour", so every request but the
    # first is refused (429). "-cache" answers the refusals from the refusal cache until the
    # store's retry_after, without a round trip.
    "flask-redcount-refused": """
        import redcount, redcount.flask
        from flask import Flask
        app = Flask(__name__)
        app.config.update(REDCOUNT_URL=URL, REDCOUNT_PREFIX="bench:web:flood", REDCOUNT_HEADERS="none",
                          REDCOUNT_BUDGET=0)
        rl = redcount.flask.RateLimiter(app)

        @app.get("/")
        @rl.limit(FLOOD, key=lambda: "flood")
        def index():
            return "ok"
    """,
    "flask-redcount-refused-cache": """
        import redcount, redcount.flask
        from flask import Flask
        app = Flask(__name__)
        app.config.update(REDCOUNT_URL=URL, REDCOUNT_PREFIX="bench:web:floodc", REDCOUNT_HEADERS="none",
                          REDCOUNT_BUDGET=0, REDCOUNT_REFUSAL_CACHE=1000)
        rl = redcount.flask.RateLimiter(app)

        @app.get("/")
        @rl.limit(FLOOD, key=lambda: "flood")
        def index():
            return "ok"
    """,
    "flask-limiter-redis": """
        from flask import Flask
        from flask_limiter import Limiter
        from flask_limiter.util import get_remote_address
        app = Flask(__name__)
        limiter = Limiter(get_remote_address, app=app, storage_uri=URL, key_prefix="bench-fl")

        @app.get("/")
        @limiter.limit(LIMIT)
        def index():
            return "ok"
    """,
    "flask-limiter-redcount": """
        import redcount.contrib.limits  # registers the redcount+redis:// scheme
        from flask import Flask
        from flask_limiter import Limiter
        from flask_limiter.util import get_remote_address
        app = Flask(__name__)
        limiter = Limiter(get_remote_address, app=app, storage_uri="redcount+" + URL, key_prefix="bench-flrc")

        @app.get("/")
        @limiter.limit(LIMIT)
        def index():
            return "ok"
    """,
    "flask-floor": """
        import redcount
        from flask import Flask
        store = redcount.connect(URL)
        app = Flask(__name__)

        @app.get("/")
        def index():
            store.execute("INCR", "bench:web:floor")
            return "ok"
    """,
    "fastapi-none": """
        from fastapi import FastAPI
        from fastapi.responses import PlainTextResponse
        app = FastAPI()

        @app.get("/", response_class=PlainTextResponse)
        async def index():
            return "ok"
    """,
    "fastapi-floor": """
        import redcount.aio
        from fastapi import FastAPI
        from fastapi.responses import PlainTextResponse
        store = redcount.aio.connect(URL)
        app = FastAPI()

        @app.get("/", response_class=PlainTextResponse)
        async def index():
            await store.execute("INCR", "bench:web:floor")
            return "ok"
    """,
    "fastapi-floor-blocking": """
        import redcount
        from fastapi import FastAPI
        from fastapi.responses import PlainTextResponse
        store = redcount.connect(URL)
        app = FastAPI()

        @app.get("/", response_class=PlainTextResponse)
        async def index():
            store.execute("INCR", "bench:web:floor")  # blocks the loop for the round trip
            return "ok"
    """,
    "fastapi-redcount": """
        import redcount, redcount.aio
        from fastapi import Depends, FastAPI
        from fastapi.responses import PlainTextResponse
        from redcount.fastapi import RateLimiter
        rl = RateLimiter(redcount.aio.Limiter(redcount.connect(URL), prefix="bench:web:redcount"), headers="none",
                         budget=None)  # every request decided by the store, never let through
        app = FastAPI()

        @app.get("/", response_class=PlainTextResponse, dependencies=[Depends(rl.limit(LIMIT))])
        async def index():
            return "ok"
    """,
    "fastapi-redcount-leased": """
        import redcount, redcount.aio
        from fastapi import Depends, FastAPI
        from fastapi.responses import PlainTextResponse
        from redcount.fastapi import RateLimiter
        rl = RateLimiter(redcount.aio.Limiter(redcount.connect(URL), prefix="bench:web:redcountl"), headers="none",
                         budget=None)
        app = FastAPI()

        @app.get("/", response_class=PlainTextResponse, dependencies=[Depends(rl.limit(LIMIT, lease=1000))])
        async def index():
            return "ok"
    """,
    "fastapi-redcount-3": """
        import redcount, redcount.aio
        from fastapi import Depends, FastAPI
        from fastapi.responses import PlainTextResponse
        from redcount.fastapi import RateLimiter
        rl = RateLimiter(redcount.aio.Limiter(redcount.connect(URL), prefix="bench:web:redcount3"), headers="none",
                         budget=None)
        three = rl.all_of(rl.spec(LIMIT, scope="app"), rl.spec(LIMIT, key=lambda r: "acme", scope="org"),
                          rl.spec(LIMIT, name="ip"))
        app = FastAPI()

        @app.get("/", response_class=PlainTextResponse, dependencies=[Depends(three)])
        async def index():
            return "ok"
    """,
    "fastapi-redcount-3-seq": """
        import redcount, redcount.aio
        from fastapi import Depends, FastAPI
        from fastapi.responses import PlainTextResponse
        from redcount.fastapi import RateLimiter
        rl = RateLimiter(redcount.aio.Limiter(redcount.connect(URL), prefix="bench:web:redcount3s"), headers="none",
                         budget=None)
        three = rl.all_of(rl.spec(LIMIT, scope="app"), rl.spec(LIMIT, key=lambda r: "acme", scope="org"),
                          rl.spec(LIMIT, name="ip", cost=2))
        app = FastAPI()

        @app.get("/", response_class=PlainTextResponse, dependencies=[Depends(three)])
        async def index():
            return "ok"
    """,
    "fastapi-redcount-refused": """
        import redcount, redcount.aio
        from fastapi import Depends, FastAPI
        from fastapi.responses import PlainTextResponse
        from redcount.fastapi import RateLimiter
        rl = RateLimiter(redcount.aio.Limiter(redcount.connect(URL), prefix="bench:web:flood"), headers="none",
                         budget=None)
        app = FastAPI()

        @app.get("/", response_class=PlainTextResponse, dependencies=[Depends(rl.limit(FLOOD, key=lambda r: "flood"))])
        async def index():
            return "ok"
    """,
    "fastapi-redcount-refused-cache": """
        import redcount, redcount.aio
        from fastapi import Depends, FastAPI
        from fastapi.responses import PlainTextResponse
        from redcount.fastapi import RateLimiter
        rl = RateLimiter(redcount.aio.Limiter(redcount.connect(URL), prefix="bench:web:floodc"), headers="none",
                         budget=None, refusal_cache=1000)
        app = FastAPI()

        @app.get("/", response_class=PlainTextResponse, dependencies=[Depends(rl.limit(FLOOD, key=lambda r: "flood"))])
        async def index():
            return "ok"
    """,
    "slowapi-redis": """
        from fastapi import FastAPI, Request
        from fastapi.responses import PlainTextResponse
        from slowapi import Limiter, _rate_limit_exceeded_handler
        from slowapi.errors import RateLimitExceeded
        from slowapi.util import get_remote_address
        limiter = Limiter(key_func=get_remote_address, storage_uri=URL, key_prefix="bench-sa", headers_enabled=False)
        app = FastAPI()
        app.state.limiter = limiter
        app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)

        @app.get("/", response_class=PlainTextResponse)
        @limiter.limit(LIMIT)
        async def index(request: Request):
            return "ok"
    """,
    "slowapi-redcount": """
        import redcount.contrib.limits  # registers the redcount+redis:// scheme
        from fastapi import FastAPI, Request
        from fastapi.responses import PlainTextResponse
        from slowapi import Limiter, _rate_limit_exceeded_handler
        from slowapi.errors import RateLimitExceeded
        from slowapi.util import get_remote_address
        limiter = Limiter(key_func=get_remote_address, storage_uri="redcount+" + URL, key_prefix="bench-sarc",
                          headers_enabled=False)
        app = FastAPI()
        app.state.limiter = limiter
        app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)

        @app.get("/", response_class=PlainTextResponse)
        @limiter.limit(LIMIT)
        async def index(request: Request):
            return "ok"
    """,
    "fastapi-limiter": """
        from contextlib import asynccontextmanager
        from fastapi import Depends, FastAPI
        from fastapi.responses import PlainTextResponse
        from fastapi_limiter.depends import RateLimiter
        from pyrate_limiter import Duration, Limiter, Rate
        from pyrate_limiter.buckets.redis_bucket import RedisBucket
        from redis.asyncio import Redis

        amount = int(LIMIT.split("/")[0])  # LIMIT is "<amount>/minute"
        dependency = RateLimiter(None)  # its pyrate-limiter bucket needs a loop: made in the lifespan

        @asynccontextmanager
        async def lifespan(app):
            bucket = await RedisBucket.init([Rate(amount, Duration.MINUTE)], Redis.from_url(URL), "bench-fal")
            dependency.limiter = Limiter(bucket)
            yield

        app = FastAPI(lifespan=lifespan)

        @app.get("/", response_class=PlainTextResponse, dependencies=[Depends(dependency)])
        async def index():
            return "ok"
    """,
    # Django: one module is the whole project (settings, URLconf, WSGI app). No middleware
    # other than the limiter's, no database: the same minimal app for every contender.
    "django-none": """
        from django.http import HttpResponse
        setup_django()

        def index(request):
            return HttpResponse("ok")
    """,
    "django-floor": """
        import redcount
        from django.http import HttpResponse
        setup_django()
        store = redcount.connect(URL)

        def index(request):
            store.execute("INCR", "bench:web:floor")
            return HttpResponse("ok")
    """,
    "django-redcount": """
        from django.http import HttpResponse
        setup_django(REDCOUNT={"URL": URL, "PREFIX": "bench:web:redcount", "HEADERS": "none",
                               "BUDGET": 0})  # every request decided by the store, never let through
        from redcount.django import limit

        @limit(LIMIT)
        def index(request):
            return HttpResponse("ok")
    """,
    "django-ratelimit-redis": """
        from django.http import HttpResponse
        setup_django(CACHES={"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": URL,
                                         "KEY_PREFIX": "bench-drl"}})
        from django_ratelimit.decorators import ratelimit

        @ratelimit(key="ip", rate=LIMIT.split("/")[0] + "/m", block=True)  # its spelling of LIMIT
        def index(request):
            return HttpResponse("ok")
    """,
}

# The project around a Django contender's view: settings, then ``urlpatterns`` and ``app``.
_DJANGO_HEAD = """
    import django
    from django.conf import settings

    def setup_django(**extra):
        settings.configure(DEBUG=False, SECRET_KEY="bench", ALLOWED_HOSTS=["*"], ROOT_URLCONF=__name__,
                           MIDDLEWARE=[], INSTALLED_APPS=[], DATABASES={}, USE_TZ=True, **extra)
        django.setup()
"""
_DJANGO_TAIL = """
    from django.core.wsgi import get_wsgi_application
    from django.urls import path
    urlpatterns = [path("", index)]
    app = get_wsgi_application()
"""

# What each contender imports, and the package to install when it is missing.
_NEEDS: dict[str, list[tuple[str, str]]] = {
    "flask-none": [("flask", "flask")],
    "flask-redcount": [("flask", "flask")],
    "flask-redcount-leased": [("flask", "flask")],
    "flask-redcount-3": [("flask", "flask")],
    "flask-redcount-3-seq": [("flask", "flask")],
    "flask-redcount-refused": [("flask", "flask")],
    "flask-redcount-refused-cache": [("flask", "flask")],
    "flask-limiter-redis": [("flask_limiter", "flask-limiter"), ("redis", "redis")],
    "flask-limiter-redcount": [("flask_limiter", "flask-limiter"), ("redcount.contrib.limits", "redcount with redcount.contrib.limits")],
    "flask-floor": [("flask", "flask")],
    "fastapi-none": [("fastapi", "fastapi")],
    "fastapi-floor": [("fastapi", "fastapi")],
    "fastapi-floor-blocking": [("fastapi", "fastapi")],
    "fastapi-redcount": [("fastapi", "fastapi")],
    "fastapi-redcount-leased": [("fastapi", "fastapi")],
    "fastapi-redcount-3": [("fastapi", "fastapi")],
    "fastapi-redcount-3-seq": [("fastapi", "fastapi")],
    "fastapi-redcount-refused": [("fastapi", "fastapi")],
    "fastapi-redcount-refused-cache": [("fastapi", "fastapi")],
    "slowapi-redis": [("slowapi", "slowapi"), ("redis", "redis")],
    "slowapi-redcount": [("slowapi", "slowapi"), ("redcount.contrib.limits", "redcount with redcount.contrib.limits")],
    "fastapi-limiter": [("fastapi_limiter", "fastapi-limiter"), ("redis", "redis")],
    "django-none": [("django", "django")],
    "django-floor": [("django", "django")],
    "django-redcount": [("django", "django")],
    "django-ratelimit-redis": [("django_ratelimit", "django-ratelimit"), ("django_redis", "django-redis")],
}

# Contenders whose every request but the first is refused: a 429 is their expected answer.
_REFUSED = frozenset(n for n in _APPS if "-refused" in n)

_FRAMEWORK = {name: next((fw for fw in ("flask", "django") if name.startswith(fw)), "fastapi") for name in _APPS}
_FRAMEWORKS = ("flask", "fastapi", "django")
_WSGI = ("flask", "django")  # served by gunicorn; the others by uvicorn
_PEERS = {
    "flask": ["flask-limiter-redis", "flask-limiter-redcount"],
    "fastapi": ["slowapi-redis", "slowapi-redcount", "fastapi-limiter"],
    "django": ["django-ratelimit-redis"],
}


def _source(name: str) -> str:
    """The module of one contender's app."""
    if _FRAMEWORK[name] == "django":
        return textwrap.dedent(_COMMON) + textwrap.dedent(_DJANGO_HEAD) + textwrap.dedent(_APPS[name]) + textwrap.dedent(_DJANGO_TAIL)
    return textwrap.dedent(_COMMON) + textwrap.dedent(_APPS[name])


@dataclass
class WebResult:
    """One contender's figures: requests per second per round and their median."""

    name: str
    framework: str
    rounds: list[float] = field(default_factory=list)
    skipped: str | None = None
    non_2xx: int = 0

    @property
    def rps(self) -> float:
        return statistics.median(self.rounds) if self.rounds else 0.0


def _missing(name: str) -> str | None:
    for module, package in _NEEDS[name]:
        try:
            found = importlib.util.find_spec(module) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return f"needs {package} (pip install {package})" if " " not in package else f"needs {package}"
    return None


def _wait_ready(proc: subprocess.Popen[bytes], url: str, log: str, refused: bool = False) -> None:
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            with open(log, errors="replace") as f:
                raise BenchError(f"the app server exited ({proc.returncode}):\n{f.read()[-1500:]}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except urllib.error.HTTPError as e:
            if refused and e.code == 429:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise BenchError(f"the app server at {url} did not answer within 60 s")
        time.sleep(0.05)  # polling interval, not a fixed wait


@contextlib.contextmanager
def _serve(name: str, workdir: str, redis_url: str, workers: int) -> Iterator[str]:
    """Start the contender's app under gunicorn or uvicorn; yield its URL."""
    module = "bench_app_" + name.replace("-", "_")  # never the name of an imported package
    with open(os.path.join(workdir, f"{module}.py"), "w", encoding="utf-8") as f:
        f.write(_source(name))
    port = free_port()
    env = dict(os.environ, BENCH_REDIS_URL=redis_url, BENCH_LIMIT=LIMIT, PYTHONDONTWRITEBYTECODE="1")
    if _FRAMEWORK[name] in _WSGI:
        argv = [sys.executable, "-m", "gunicorn", "--workers", str(workers), "--bind", f"127.0.0.1:{port}",
                "--chdir", workdir, "--log-level", "warning", f"{module}:app"]
    else:
        argv = [sys.executable, "-m", "uvicorn", f"{module}:app", "--workers", str(workers), "--host", "127.0.0.1",
                "--port", str(port), "--app-dir", workdir, "--log-level", "warning", "--no-access-log"]
    log = os.path.join(workdir, f"{module}.log")
    with open(log, "wb") as out:
        proc = subprocess.Popen(argv, env=env, cwd=workdir, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True,
                                preexec_fn=die_with_parent())
    try:
        url = f"http://127.0.0.1:{port}/"
        _wait_ready(proc, url, log, name in _REFUSED)
        yield url
    finally:
        stop_process(proc)


_RPS = re.compile(r"Requests/sec:\s+([0-9.]+)")
_NON2XX = re.compile(r"Non-2xx or 3xx responses:\s+(\d+)")


def _wrk(wrk: str, url: str, seconds: float, connections: int, threads: int) -> tuple[float, int]:
    duration = max(1, round(seconds))
    try:
        done = subprocess.run(
            [wrk, f"-t{threads}", f"-c{connections}", f"-d{duration}s", url],
            stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False,
            timeout=duration + 60, preexec_fn=die_with_parent(),
        )
    except subprocess.TimeoutExpired:
        raise BenchError(f"wrk did not finish within {duration + 60} s of a {duration} s run against {url}") from None
    m = _RPS.search(done.stdout)
    if done.returncode != 0 or m is None:
        raise BenchError(f"wrk failed (exit {done.returncode}): {done.stdout[-500:]} {done.stderr[-500:]}")
    bad = _NON2XX.search(done.stdout)
    return float(m.group(1)), int(bad.group(1)) if bad else 0


def _overhead(base: float, rps: float) -> float:
    return 1.0 - rps / base if base > 0 else float("nan")


def run_bench_web(args: argparse.Namespace) -> int:
    """The ``redcount bench web`` command."""
    wrk = shutil.which(args.wrk)
    if wrk is None:
        raise BenchError(f"wrk not found (looked for {args.wrk!r}): apt-get install wrk, or pass --wrk PATH")
    if args.workers < 1 or args.connections < 1 or args.seconds <= 0 or args.rounds < 1:
        raise BenchError("--workers, --connections and --rounds must be >= 1 and --seconds > 0")
    wanted = [n for n in _APPS if args.framework in ("all", _FRAMEWORK[n])]
    results = {n: WebResult(n, _FRAMEWORK[n]) for n in wanted}
    for n in wanted:
        results[n].skipped = _missing(n)
    runnable = [n for n in wanted if results[n].skipped is None]
    print(f"redcount bench web: {len(runnable)} contenders, {args.rounds} round(s) of {args.seconds:g} s, "
          f"{args.workers} worker(s), wrk -c{args.connections}", flush=True)
    binary = find_server(args.redis_server)
    with RedisServer(binary, new_session=True, die_with_owner=True) as server, tempfile.TemporaryDirectory(prefix="redcount-bench-web-") as tmp:
        redis_url = server.url
        for rnd in range(args.rounds):
            for n in runnable:
                with _serve(n, tmp, redis_url, args.workers) as url:
                    _wrk(wrk, url, min(1.0, args.seconds), args.connections, args.threads)  # warm-up
                    rps, bad = _wrk(wrk, url, args.seconds, args.connections, args.threads)
                results[n].rounds.append(rps)
                results[n].non_2xx += bad
                print(f"  round {rnd + 1}: {n:24s} {rps:10.0f} req/s", flush=True)
    report = _report(results)
    _print(results, report)
    if args.json:
        write_json(args.json, {"results": [asdict(r) | {"rps": r.rps} for r in results.values()], "summary": report})
    return 0


def _report(results: dict[str, WebResult]) -> dict[str, dict[str, float | str | None]]:
    """Per framework: redcount's overhead, the best peer's, and their ratio (target <= 0.5)."""
    out: dict[str, dict[str, float | str | None]] = {}
    for fw in _FRAMEWORKS:
        base = results.get(f"{fw}-none")
        ours = results.get(f"{fw}-redcount")
        if base is None or ours is None or not base.rounds or not ours.rounds:
            continue
        peers = [results[p] for p in _PEERS[fw] if p in results and results[p].rounds]
        ov = _overhead(base.rps, ours.rps)
        best = min(peers, key=lambda r: _overhead(base.rps, r.rps)) if peers else None
        best_ov = _overhead(base.rps, best.rps) if best else None
        ratio = ov / best_ov if best_ov and best_ov > 0 else None
        floors = [r for n, r in results.items() if n.startswith(f"{fw}-floor") and r.rounds]
        floor_ov = min(_overhead(base.rps, r.rps) for r in floors) if floors else None
        out[fw] = {"overhead": ov, "best_peer": best.name if best else None, "best_peer_overhead": best_ov,
                   "ratio": ratio, "target": 0.5,
                   # The target as an overhead, and the lowest overhead of one bare round trip to Redis.
                   "target_overhead": 0.5 * best_ov if best_ov is not None else None,
                   "floor_overhead": floor_ov}
    return out


def _print(results: dict[str, WebResult], report: dict[str, dict[str, float | str | None]]) -> None:
    print()
    print(f"{'contender':26s} {'req/s':>10s} {'overhead':>9s}  note")
    for r in results.values():
        base = results.get(f"{r.framework}-none")
        if r.skipped:
            print(f"{r.name:26s} {'-':>10s} {'-':>9s}  skipped: {r.skipped}")
            continue
        ov = _overhead(base.rps, r.rps) if base and base.rounds and r is not base else None
        note = f"{r.non_2xx} non-2xx responses" if r.non_2xx else ""
        if r.name in _REFUSED:
            note = "a refused client's flood (429s expected)" + (f", {note}" if note else "")
        print(f"{r.name:26s} {r.rps:10.0f} {'' if ov is None else f'{ov:9.1%}'}  {note}")
    for fw, s in report.items():
        if s["ratio"] is None:
            print(f"{fw}: redcount overhead {float(s['overhead'] or 0):.1%}; no peer to compare with")
        else:
            verdict = "meets" if float(s["ratio"]) <= 0.5 else "misses"
            print(f"{fw}: redcount overhead {float(s['overhead'] or 0):.1%} vs best peer {s['best_peer']} "
                  f"{float(s['best_peer_overhead'] or 0):.1%}: ratio {float(s['ratio']):.2f} ({verdict} the target 0.5)")
        if s["floor_overhead"] is not None and s["target_overhead"] is not None:
            floor_ov, allowed = float(s["floor_overhead"]), float(s["target_overhead"])
            print(f"{fw}: lowest floor (one bare INCR round trip per request, no limiter) {floor_ov:.1%}; the target allows "
                  f"{allowed:.1%}" + ("; the floor alone is above it on this machine" if floor_ov > allowed else ""))


# -- CPU per request, in process ----------------------------------------------------------
#
# wrk on a shared machine measures the machine as much as the app; the CPU one request costs
# in the app's own process is steadier. ``python -m redcount.tools.bench.web [N]`` builds the
# same apps as above in this process, against a private redis-server, drives N requests
# through each (WSGI: the app called as gunicorn calls it; ASGI: the app awaited on uvloop
# as uvicorn calls it, ``--concurrency`` requests in flight) and prints the process CPU time
# per request (every thread of the process: the store's I/O thread included), the best of
# ``--repeat`` runs, contenders taking turns.

_CPU_CONTENDERS = ["flask-none", "flask-floor", "flask-redcount", "flask-redcount-leased", "flask-redcount-3",
                   "flask-redcount-3-seq", "flask-redcount-refused", "flask-redcount-refused-cache",
                   "flask-limiter-redis", "flask-limiter-redcount",
                   "fastapi-none", "fastapi-floor", "fastapi-floor-blocking",
                   "fastapi-redcount", "fastapi-redcount-leased", "fastapi-redcount-3", "fastapi-redcount-3-seq",
                   "fastapi-redcount-refused", "fastapi-redcount-refused-cache", "slowapi-redis", "slowapi-redcount"]


def _load_app(name: str, redis_url: str) -> object:
    os.environ["BENCH_REDIS_URL"] = redis_url
    os.environ["BENCH_LIMIT"] = LIMIT
    namespace: dict[str, object] = {"__name__": "bench_app_" + name.replace("-", "_")}
    exec(compile(textwrap.dedent(_COMMON) + textwrap.dedent(_APPS[name]), name, "exec"), namespace)  # noqa: S102
    return namespace["app"]


def _wsgi_runner(app: object, ok: tuple[str, ...] = ("200",)) -> Callable[[int], None]:
    environ_base = {
        "REQUEST_METHOD": "GET", "SCRIPT_NAME": "", "PATH_INFO": "/", "QUERY_STRING": "", "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000", "SERVER_PROTOCOL": "HTTP/1.1", "REMOTE_ADDR": "127.0.0.1", "REMOTE_PORT": "40000",
        "HTTP_HOST": "127.0.0.1:8000", "HTTP_USER_AGENT": "bench", "wsgi.version": (1, 0), "wsgi.url_scheme": "http",
        "wsgi.multithread": False, "wsgi.multiprocess": True, "wsgi.run_once": False,
    }
    import io

    statuses: list[str] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: object = None) -> None:
        statuses.append(status)

    def run(n: int) -> None:
        for _ in range(n):
            env = dict(environ_base, **{"wsgi.input": io.BytesIO(b""), "wsgi.errors": sys.stderr})
            body = app(env, start_response)  # type: ignore[operator]
            for _chunk in body:
                pass
            close = getattr(body, "close", None)
            if close is not None:
                close()
        bad = [s for s in statuses if not s.startswith(ok)]
        statuses.clear()
        if bad:
            raise BenchError(f"the app answered {bad[0]}")

    return run


def _asgi_runner(app: object, concurrency: int, ok: tuple[int, ...] = (200,)) -> Callable[[int], None]:
    import asyncio

    try:
        import uvloop

        loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    except ImportError:
        loop = asyncio.new_event_loop()
    bad: list[int] = []

    async def one() -> None:
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": "GET", "scheme": "http", "path": "/", "raw_path": b"/", "root_path": "", "query_string": b"",
            "headers": [(b"host", b"127.0.0.1:8000"), (b"user-agent", b"bench")],
            "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000), "state": {},
        }

        async def receive() -> dict[str, object]:
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message: dict[str, object]) -> None:
            if message["type"] == "http.response.start" and message["status"] not in ok:
                bad.append(int(message["status"]))  # type: ignore[call-overload]

        await app(scope, receive, send)  # type: ignore[operator]

    async def worker(n: int) -> None:
        for _ in range(n):
            await one()

    async def many(n: int) -> None:
        per = [n // concurrency + (1 if i < n % concurrency else 0) for i in range(concurrency)]
        await asyncio.gather(*(worker(k) for k in per))
        if bad:
            raise BenchError(f"the app answered {bad[0]}")

    # No lifespan is run: the apps measured here have none (fastapi-limiter, which needs one,
    # is not among _CPU_CONTENDERS).
    return lambda n: loop.run_until_complete(many(n))


def cpu_per_request(names: list[str], n: int, repeat: int, concurrency: int) -> dict[str, float]:
    """Microseconds of process CPU per request for each contender (the best of ``repeat``)."""
    binary = find_server("redis-server")
    best: dict[str, float] = {}
    with RedisServer(binary, new_session=True, die_with_owner=True) as server:
        redis_url = server.url
        runners: dict[str, Callable[[int], None]] = {}
        for name in names:
            app = _load_app(name, redis_url)
            refused = name in _REFUSED
            runners[name] = (
                _wsgi_runner(app, ("200", "429") if refused else ("200",))
                if _FRAMEWORK[name] in _WSGI
                else _asgi_runner(app, concurrency, (200, 429) if refused else (200,))
            )
            runners[name](max(100, n // 10))  # warm-up: caches, connections, scripts loaded
        for _ in range(repeat):
            for name in names:
                t0 = time.process_time()
                runners[name](n)
                us = (time.process_time() - t0) / n * 1e6
                best[name] = min(best.get(name, us), us)
    return best


def _cpu_main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m redcount.tools.bench.web",
                                description="Process CPU per request of the bench apps, driven in process.")
    p.add_argument("requests", nargs="?", type=int, default=5000, help="requests per run (default 5000)")
    p.add_argument("--repeat", type=int, default=5, help="runs per contender, the best kept (default 5)")
    p.add_argument("--concurrency", type=int, default=32, help="ASGI requests in flight (default 32)")
    p.add_argument("--only", default="", help="comma-separated contenders (default: all that are installed)")
    a = p.parse_args(argv)
    names = [n for n in (a.only.split(",") if a.only else _CPU_CONTENDERS) if n]
    unknown = [n for n in names if n not in _CPU_CONTENDERS]
    if unknown:
        # Django's settings are configured once per process, so its apps cannot take turns here.
        p.error(f"not measurable in process: {', '.join(unknown)} (choose among {', '.join(_CPU_CONTENDERS)})")
    names = [n for n in names if _missing(n) is None]
    best = cpu_per_request(names, a.requests, a.repeat, a.concurrency)
    for fw in ("flask", "fastapi"):
        base = best.get(f"{fw}-none")
        for name in (n for n in names if _FRAMEWORK[n] == fw):
            extra = f"  +{best[name] - base:6.1f} us over no limiter" if base is not None and name != f"{fw}-none" else ""
            print(f"{name:24s} {best[name]:7.1f} us/request{extra}")
    return 0


if __name__ == "__main__":
    sys.exit(_cpu_main())
