"""redcount.flask against real Flask apps, on the embedded store and on a real redis-server."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from typing import Any

import pytest
import redcount
import redcount.flask
from flask import Blueprint, Flask, abort, jsonify, request
from redcount.web import TrustedProxies, api_key

pytestmark = pytest.mark.usefixtures("away_from_minute_boundary")


@pytest.fixture
def away_from_minute_boundary() -> None:
    """Fixed windows of a minute on the real clock: start a test with 10 s to spare."""
    from helpers import wait_for_fresh_window

    wait_for_fresh_window(redcount.connect(), 60, 10)


def make_app(store: redcount.Store, **kw: Any) -> tuple[Flask, redcount.flask.RateLimiter]:
    app = Flask(__name__)
    kw.setdefault("headers", "all")
    rl = redcount.flask.RateLimiter(app, limiter=redcount.Limiter(store), **kw)
    return app, rl


def statuses(get: Callable[[], Any], n: int) -> list[int]:
    return [get().status_code for _ in range(n)]


def test_route_limit_429_json_and_headers(store: redcount.Store) -> None:
    app, rl = make_app(store)

    @app.get("/search")
    @rl.limit("2/minute")
    def search() -> str:
        return "ok"

    c = app.test_client()
    r = c.get("/search")
    assert r.status_code == 200
    assert r.headers["RateLimit-Policy"] == '"search";q=2;w=60'
    assert r.headers["RateLimit"].startswith('"search";r=1;t=')
    assert r.headers["X-RateLimit-Remaining"] == "1"
    assert "Retry-After" not in r.headers
    c.get("/search")
    r = c.get("/search")
    assert r.status_code == 429
    assert r.content_type == "application/problem+json"
    body = json.loads(r.get_data())
    assert body["status"] == 429 and body["violated-policies"] == ["search"] and body["retry_after"] >= 1
    assert int(r.headers["Retry-After"]) >= 1
    assert r.headers["RateLimit"].startswith('"search";r=0;')
    for name in ("RateLimit", "RateLimit-Policy", "Retry-After", "X-RateLimit-Limit"):
        assert len(r.headers.getlist(name)) == 1


def test_decorator_order_does_not_matter_and_limits_stack(store: redcount.Store) -> None:
    app, rl = make_app(store)

    @rl.limit("3/minute")
    @app.get("/a")
    def a() -> str:
        return "a"

    @app.get("/b")
    @rl.limit("1/hour")
    @rl.limit("2/minute")
    def b() -> str:
        return "b"

    c = app.test_client()
    assert statuses(lambda: c.get("/a"), 4) == [200, 200, 200, 429]
    assert c.get("/b").status_code == 200
    r = c.get("/b")  # the 1/hour limit refuses (decorators apply bottom-up: it is "b-2")
    assert r.status_code == 429
    assert r.headers["RateLimit-Policy"] == '"b";q=2;w=60, "b-2";q=1;w=3600'
    assert r.headers["RateLimit"].startswith('"b-2";r=0;')


def test_default_per_route_application_and_exempt(store: redcount.Store) -> None:
    app, rl = make_app(store, default="2/minute", application="5/minute")

    @app.get("/x")
    def x() -> str:
        return "x"

    @app.get("/y")
    def y() -> str:
        return "y"

    @app.get("/z")
    def z() -> str:
        return "z"

    @app.get("/health")
    @rl.exempt
    def health() -> str:
        return "up"

    c = app.test_client()
    # Default limits count per route; the application limit counts every admitted request:
    # a request's limits are decided together, so one refused by a limit is charged against
    # none of them.
    assert statuses(lambda: c.get("/x"), 3) == [200, 200, 429]  # application: 2 used
    r = c.get("/y")
    assert r.status_code == 200
    assert r.headers["RateLimit-Policy"] == '"application";q=5;w=60, "default";q=2;w=60'
    assert r.headers["RateLimit"].startswith('"default";r=1;')  # the application has 2 left
    r = c.get("/y")
    assert r.status_code == 200 and r.headers["RateLimit"].startswith('"default";r=0;')
    r = c.get("/y")
    assert r.status_code == 429 and r.headers["RateLimit"].startswith('"default";r=0;')
    assert r.get_json()["violated-policies"] == ["default"]
    r = c.get("/z")  # the refusal above was not charged: the application's 5th request
    assert r.status_code == 200 and r.headers["RateLimit"].startswith('"application";r=0;')
    r = c.get("/z")
    assert r.status_code == 429 and r.headers["RateLimit"].startswith('"application";r=0;')
    assert r.get_json()["violated-policies"] == ["application"]
    assert statuses(lambda: c.get("/health"), 10) == [200] * 10
    assert "RateLimit" not in c.get("/health").headers


def test_shared_limit_is_one_count(store: redcount.Store) -> None:
    app, rl = make_app(store)
    reports = rl.shared_limit("3/minute", "reports")

    @app.get("/r1")
    @reports
    def r1() -> str:
        return "r1"

    @app.get("/r2")
    @reports
    def r2() -> str:
        return "r2"

    c = app.test_client()
    got = [c.get("/r1").status_code, c.get("/r2").status_code, c.get("/r1").status_code, c.get("/r2").status_code]
    assert got == [200, 200, 200, 429]
    assert c.get("/r1").headers["RateLimit-Policy"] == '"reports";q=3;w=60'


def test_blueprint_limits_and_exempt_blueprint(store: redcount.Store) -> None:
    app, rl = make_app(store, application="100/minute")
    api = Blueprint("api", __name__)
    free = Blueprint("free", __name__)

    @api.get("/one")
    def one() -> str:
        return "1"

    @api.get("/two")
    def two() -> str:
        return "2"

    @free.get("/open")
    def open_() -> str:
        return "o"

    rl.limit("1/minute")(api)
    rl.exempt(free)
    app.register_blueprint(api, url_prefix="/api")
    app.register_blueprint(free, url_prefix="/free")
    c = app.test_client()
    assert statuses(lambda: c.get("/api/one"), 2) == [200, 429]
    assert c.get("/api/two").status_code == 200  # blueprint limits count per route
    assert statuses(lambda: c.get("/free/open"), 5) == [200] * 5


def test_methods_per_method_exempt_when_cost(store: redcount.Store) -> None:
    app, rl = make_app(store)

    @app.route("/items", methods=["GET", "POST"])
    @rl.limit("1/minute", methods=["POST"])
    def items() -> str:
        return "i"

    @app.route("/pm", methods=["GET", "PUT"])
    @rl.limit("1/minute", per_method=True)
    def pm() -> str:
        return "p"

    @app.get("/admin")
    @rl.limit("1/minute", exempt_when=lambda: request.headers.get("X-Admin") == "yes")
    def admin() -> str:
        return "a"

    @app.get("/heavy")
    @rl.limit("5/minute", cost=lambda req: int(req.args.get("n", "1")))
    def heavy() -> str:
        return "h"

    c = app.test_client()
    assert statuses(lambda: c.get("/items"), 3) == [200, 200, 200]
    assert statuses(lambda: c.post("/items"), 2) == [200, 429]
    assert [c.get("/pm").status_code, c.put("/pm").status_code, c.get("/pm").status_code] == [200, 200, 429]
    assert statuses(lambda: c.get("/admin", headers={"X-Admin": "yes"}), 3) == [200, 200, 200]
    assert statuses(lambda: c.get("/admin"), 2) == [200, 429]
    assert c.get("/heavy?n=4").status_code == 200
    assert c.get("/heavy?n=2").status_code == 429
    assert c.get("/heavy?n=1").status_code == 200


def test_dynamic_limit_per_plan_and_user_key(store: redcount.Store) -> None:
    app, rl = make_app(store)

    def plan(req: Any) -> str:
        return "3/minute" if req.headers.get("X-Plan") == "pro" else "1/minute"

    @app.get("/export")
    @rl.limit(plan, key=lambda req: "user:" + req.headers.get("X-User", "anon"))
    def export() -> str:
        return "e"

    c = app.test_client()
    pro = {"X-Plan": "pro", "X-User": "alice"}
    assert statuses(lambda: c.get("/export", headers=pro), 4) == [200, 200, 200, 429]
    assert statuses(lambda: c.get("/export", headers={"X-User": "bob"}), 2) == [200, 429]
    assert c.get("/export", headers={"X-User": "bob"}).headers["RateLimit-Policy"] == '"export";q=1;w=60'


def test_429_is_customisable_with_an_error_handler(store: redcount.Store) -> None:
    app, rl = make_app(store)

    @app.errorhandler(redcount.flask.RateLimitExceeded)
    def too_many(e: redcount.flask.RateLimitExceeded) -> Any:
        assert e.verdict.refusal is not None
        return jsonify(error="slow down", policy=e.verdict.refusal.policy.name), 429

    @app.get("/p")
    @rl.limit("1/minute")
    def p() -> str:
        return "p"

    c = app.test_client()
    c.get("/p")
    r = c.get("/p")
    assert r.status_code == 429 and r.get_json() == {"error": "slow down", "policy": "p"}
    # The headers still come, once each, from the after_request hook.
    assert len(r.headers.getlist("RateLimit")) == 1 and r.headers["RateLimit"].startswith('"p";r=0;')
    assert int(r.headers["Retry-After"]) >= 1


def test_headers_reach_responses_of_routes_that_raise(store: redcount.Store) -> None:
    app, rl = make_app(store)

    @app.get("/forbidden")
    @rl.limit("5/minute")
    def forbidden() -> str:
        abort(403)

    @app.get("/crash")
    @rl.limit("5/minute")
    def crash() -> str:
        raise RuntimeError("boom")

    c = app.test_client()
    r = c.get("/forbidden")
    assert r.status_code == 403 and r.headers["RateLimit"].startswith('"forbidden";r=4;')
    r = c.get("/crash")
    assert r.status_code == 500 and r.headers["RateLimit"].startswith('"crash";r=4;')


def test_spoofed_forwarded_for_changes_nothing_by_default(store: redcount.Store) -> None:
    app, rl = make_app(store)

    @app.get("/s")
    @rl.limit("2/minute")
    def s() -> str:
        return "s"

    c = app.test_client()
    got = [
        c.get("/s", headers={"X-Forwarded-For": f"10.0.0.{i}"}, environ_base={"REMOTE_ADDR": "198.51.100.7"}).status_code
        for i in range(4)
    ]
    assert got == [200, 200, 429, 429]


def test_trusted_proxy_by_cidr_from_config(store: redcount.Store) -> None:
    app = Flask(__name__)
    app.config.update(REDCOUNT_TRUSTED_PROXIES="10.0.0.0/8", REDCOUNT_HEADERS="ietf")
    rl = redcount.flask.RateLimiter(limiter=redcount.Limiter(store))

    @app.get("/s")
    @rl.limit("1/minute")
    def s() -> str:
        return "s"

    rl.init_app(app)
    c = app.test_client()
    via_proxy = {"REMOTE_ADDR": "10.1.1.1"}
    assert c.get("/s", headers={"X-Forwarded-For": "203.0.113.1"}, environ_base=via_proxy).status_code == 200
    assert c.get("/s", headers={"X-Forwarded-For": "203.0.113.2"}, environ_base=via_proxy).status_code == 200
    assert c.get("/s", headers={"X-Forwarded-For": "203.0.113.1"}, environ_base=via_proxy).status_code == 429
    # Not from the proxy: the header is ignored and the peer is the client.
    direct = {"REMOTE_ADDR": "198.51.100.7"}
    assert c.get("/s", headers={"X-Forwarded-For": "203.0.113.3"}, environ_base=direct).status_code == 200
    assert c.get("/s", headers={"X-Forwarded-For": "203.0.113.4"}, environ_base=direct).status_code == 429
    assert "X-RateLimit-Limit" not in c.get("/s").headers


def test_trusted_proxy_count_and_ipv6_grouping(store: redcount.Store) -> None:
    app, rl = make_app(store, trusted_proxies=TrustedProxies(1), ipv6_prefix=64)

    @app.get("/s")
    @rl.limit("1/minute")
    def s() -> str:
        return "s"

    c = app.test_client()
    env = {"REMOTE_ADDR": "10.0.0.1"}
    assert c.get("/s", headers={"X-Forwarded-For": "2001:db8:1:2::1"}, environ_base=env).status_code == 200
    # Same /64: the same client.
    assert c.get("/s", headers={"X-Forwarded-For": "2001:db8:1:2::ffff"}, environ_base=env).status_code == 429
    assert c.get("/s", headers={"X-Forwarded-For": "2001:db8:1:3::1"}, environ_base=env).status_code == 200


def test_api_key_key(store: redcount.Store) -> None:
    app, rl = make_app(store, key=api_key("X-API-Key"))

    @app.get("/k")
    @rl.limit("1/minute")
    def k() -> str:
        return "k"

    c = app.test_client()
    assert c.get("/k", headers={"X-API-Key": "one"}).status_code == 200
    assert c.get("/k", headers={"X-API-Key": "two"}).status_code == 200
    assert c.get("/k", headers={"X-API-Key": "one"}).status_code == 429
    keys = [k.decode() if isinstance(k, bytes) else k for k in store.execute("KEYS", "*")]
    assert keys and not any("one" in k or "two" in k for k in keys)


def test_config_from_app_config(store: redcount.Store, redis_server: Any) -> None:
    app = Flask(__name__)
    app.config.update(
        REDCOUNT_URL=redis_server.url, REDCOUNT_DEFAULT="1/minute", REDCOUNT_HEADERS="legacy",
        REDCOUNT_STRATEGY="sliding-window", REDCOUNT_PREFIX="redcount:test-flask-config",
    )
    rl = redcount.flask.RateLimiter()

    @app.get("/c")
    def c_() -> str:
        return "c"

    rl.init_app(app)
    state = app.extensions["redcount"]
    state.limiter.store.execute("FLUSHALL")
    assert state.limiter.strategy == "sliding-window"
    c = app.test_client()
    assert c.get("/c").headers["X-RateLimit-Limit"] == "1"
    assert c.get("/c").status_code == 429
    assert any(k.startswith(b"redcount:test-flask-config") for k in state.limiter.store.execute("KEYS", "*"))
    state.limiter.store.close()


def test_budget_and_fallback_from_app_config_serve_from_memory_while_redis_is_down(
    redis_factory: Any,
) -> None:
    server = redis_factory()
    app = Flask(__name__)
    app.config.update(
        REDCOUNT_URL=server.url, REDCOUNT_BUDGET="0.05", REDCOUNT_FALLBACK="memory://",
        REDCOUNT_FAIL="closed", REDCOUNT_DEFAULT="2/minute",
    )
    rl = redcount.flask.RateLimiter(app)

    @app.get("/b")
    def b_() -> str:
        return "b"

    store = app.extensions["redcount"].limiter.store
    try:
        c = app.test_client()
        assert c.get("/b").status_code == 200
        assert not store.using_fallback
        server.kill()
        # fail="closed" alone would answer 503 while Redis is down; the fallback decides instead,
        # within the budget, from its own (empty) counts.
        codes = [c.get("/b").status_code for _ in range(8)]
        assert store.using_fallback
        assert 503 not in codes and codes[-1] == 429
    finally:
        store.close()


def test_enabled_false_turns_checks_off(store: redcount.Store) -> None:
    app = Flask(__name__)
    app.config["REDCOUNT_ENABLED"] = "false"
    rl = redcount.flask.RateLimiter(app, limiter=redcount.Limiter(store))

    @app.get("/e")
    @rl.limit("1/minute")
    def e() -> str:
        return "e"

    c = app.test_client()
    assert statuses(lambda: c.get("/e"), 3) == [200] * 3


@pytest.mark.parametrize(
    ("config", "needle"),
    [
        ({"REDCOUNT_DEFAULT": "10 per fortnight"}, "bad limit on REDCOUNT_DEFAULT \\(default=\\): invalid rate limit '10 per fortnight'"),
        ({"REDCOUNT_TRUSTED_PROXIES": "10.0.0.0/40"}, "malformed trusted proxy CIDR"),
        ({"REDCOUNT_HEADERS": "ietf,github"}, "unknown header set 'github'"),
        ({"REDCOUNT_FAIL": "sometimes"}, "fail must be 'open' or 'closed'"),
        ({"REDCOUNT_SHADOW": "perhaps"}, "REDCOUNT_SHADOW must be a boolean"),
        ({"REDCOUNT_URL": "mongodb://x"}, "unknown scheme 'mongodb'"),
        ({"REDCOUNT_BUDGET": "fast"}, "REDCOUNT_BUDGET must be a number of seconds, got 'fast'"),
        ({"REDCOUNT_BUDGET": "-1"}, "budget"),
        ({"REDCOUNT_BREAKER": "maybe"}, "REDCOUNT_BREAKER must be a boolean"),
        ({"REDCOUNT_FALLBACK": "redis://other:6379"}, "fallback"),
    ],
)
def test_bad_config_fails_in_init_app(config: dict[str, Any], needle: str) -> None:
    app = Flask(__name__)
    app.config.update(config)
    with pytest.raises(redcount.InvalidInputError, match=needle):
        redcount.flask.RateLimiter(app)


def test_bad_decorator_fails_at_import_naming_the_route() -> None:
    rl = redcount.flask.RateLimiter()
    with pytest.raises(redcount.InvalidInputError, match="bad limit on route 'orders': invalid rate limit '5/fortnight'"):

        @rl.limit("5/fortnight")
        def orders() -> str:
            return "o"


def test_key_function_returning_non_string_is_a_clear_500_logged_once(
    store: redcount.Store, caplog: pytest.LogCaptureFixture
) -> None:
    app, rl = make_app(store, key=lambda req: None)
    app.debug = True

    @app.get("/u")
    @rl.limit("5/minute")
    def u() -> str:
        return "u"

    c = app.test_client()
    with caplog.at_level(logging.ERROR, logger="redcount.web"):
        for _ in range(3):
            r = c.get("/u")
            assert r.status_code == 500
            assert "must return a str, got NoneType" in r.get_data(as_text=True)
    assert caplog.text.count("must return a str") == 1
    app.debug = False
    r = c.get("/u")
    assert r.status_code == 500 and "must return a str" not in r.get_data(as_text=True)


def test_shadow_mode_never_refuses(store: redcount.Store) -> None:
    app, rl = make_app(store, shadow=True)

    @app.get("/sh")
    @rl.limit("1/minute")
    def sh() -> str:
        return "s"

    c = app.test_client()
    assert statuses(lambda: c.get("/sh"), 3) == [200] * 3
    assert "RateLimit" not in c.get("/sh").headers


@pytest.mark.redis_only
def test_fail_open_and_closed_when_redis_dies(redis_factory: Any) -> None:
    server = redis_factory()
    for fail, expect in (("open", 200), ("closed", 503)):
        store = redcount.connect(server.url, connect_timeout=0.5, command_timeout=0.5)
        app, rl = make_app(store, fail=fail)

        @app.get("/f")
        @rl.limit("100/minute")
        def f() -> str:
            return "f"

        c = app.test_client()
        assert c.get("/f").status_code == 200
        server.kill()
        r = c.get("/f")
        assert r.status_code == expect
        if fail == "open":
            assert "RateLimit" not in r.headers
        else:
            assert r.content_type == "application/problem+json" and r.headers["Retry-After"] == "1"
        server.restart()
        store.close()


def test_headers_none_still_decides_and_exposes_the_verdict(store: redcount.Store) -> None:
    app, rl = make_app(store, headers="none")
    seen: list[int] = []

    @app.get("/n")
    @rl.limit("2/minute", cost=1)
    def n() -> str:
        v = rl.verdict()
        assert v is not None and v.allowed
        seen.append(v.outcomes[0].decision.remaining)
        return "n"

    c = app.test_client()
    r = c.get("/n")
    assert r.status_code == 200 and seen == [1]
    assert not any(k.lower().startswith(("ratelimit", "x-ratelimit", "retry-after")) for k in r.headers.keys())
    c.get("/n")
    r = c.get("/n")
    assert r.status_code == 429 and json.loads(r.get_data())["violated-policies"] == ["n"]
    assert "Retry-After" not in r.headers and "RateLimit" not in r.headers


def test_nested_blueprints_and_limits_declared_after_the_first_request(store: redcount.Store) -> None:
    app, rl = make_app(store)
    outer = Blueprint("outer", __name__)
    inner = Blueprint("inner", __name__)

    @inner.get("/x")
    def x() -> str:
        return "x"

    @app.get("/late")
    def late() -> str:
        return "l"

    rl.limit("1/minute")(outer)
    outer.register_blueprint(inner, url_prefix="/inner")
    app.register_blueprint(outer, url_prefix="/outer")
    c = app.test_client()
    assert statuses(lambda: c.get("/outer/inner/x"), 2) == [200, 429]  # the outer blueprint's limit holds
    assert statuses(lambda: c.get("/late"), 3) == [200] * 3
    rl.limit("1/minute")(late)  # after requests were served: the cache of what applies is not stale
    assert statuses(lambda: c.get("/late"), 2) == [200, 429]
