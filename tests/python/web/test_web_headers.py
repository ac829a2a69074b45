"""The shared web layer without a framework: limit specs checked at start-up, header
rendering (IETF structured fields, legacy, Retry-After), the engine and its failure policy."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import redcount
from redcount.web import FailurePolicy, HeaderSets, LimitSpec, api_key, by_header, remote_address, render
from redcount.web.engine import decide
from redcount.web.spec import KeyFunctionError, resolve_all


@dataclass
class FakeView:
    """A request as the shared layer sees it (the frameworks' adapters are tested with real apps)."""

    method: str = "GET"
    endpoint: str = "app.view"
    client: str = "203.0.113.9"
    headers: dict[str, str] | None = None
    native: Any = None

    def header(self, name: str) -> str | None:
        return (self.headers or {}).get(name)


@pytest.fixture
def limiter(clock_store: redcount.Store) -> redcount.Limiter:
    return redcount.Limiter(clock_store)


def spec(limit: Any = "3/minute", **kw: Any) -> LimitSpec:
    kw.setdefault("name", "api")
    return LimitSpec.build(limit, where="route 'view'", **kw)


# -- start-up checks ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("limit", "kw", "needle"),
    [
        ("10/minutes please", {}, "bad limit on route 'view': invalid rate limit '10/minutes please'"),
        ("", {}, "bad limit on route 'view': rate limit string is empty"),
        (42, {}, "limit on route 'view' must be a string"),
        ("10/minute", {"cost": 0}, "cost on route 'view' must be >= 1"),
        ("10/minute", {"cost": 11}, "cost 11 on route 'view' is more than the limit"),
        ("10/minute", {"cost": "2"}, "cost on route 'view' must be an int"),
        ("10/minute", {"methods": ["GTE"]}, "methods on route 'view' must be HTTP method names"),
        ("10/minute", {"key": lambda a, b: "x"}, "key on route 'view' must take the request or nothing"),
        ("10/minute", {"key": "ip"}, "key on route 'view' must be callable"),
        ("10/minute", {"name": "caf\u00e9"}, "must be printable ASCII"),
        ("10/minute", {"exempt_when": 3}, "exempt_when on route 'view' must be callable"),
    ],
)
def test_bad_specs_fail_at_start_naming_the_route(limit: Any, kw: dict[str, Any], needle: str) -> None:
    with pytest.raises(redcount.InvalidInputError) as e:
        spec(limit, **kw)
    assert needle in str(e.value)


@pytest.mark.parametrize("text", ["10/fortnight", "5/second;lots/minute", "10 per"])
def test_a_bad_limit_string_is_quoted_no_more_often_than_the_parser_quotes_it(text: str) -> None:
    with pytest.raises(redcount.InvalidInputError) as parser:
        redcount.parse_limits(text)
    bad = text.split(";")[-1]
    quoted = str(parser.value).count(bad)
    assert quoted >= 1, parser.value
    with pytest.raises(redcount.InvalidInputError) as static:
        spec(text)
    assert str(static.value).count(bad) == quoted, static.value  # the route is added, not the string
    assert str(static.value).startswith("bad limit on route 'view': ")
    # FastAPI names a route-less dependency by its limit: then the parser's message alone.
    with pytest.raises(redcount.InvalidInputError) as named:
        LimitSpec.build(text, name=None, where=f"limit {text!r}")
    assert str(named.value) == str(parser.value)
    with pytest.raises(redcount.InvalidInputError) as dynamic:
        resolve_all([spec(lambda req: text)], FakeView(), remote_address)
    assert str(dynamic.value).count(bad) == quoted, dynamic.value


def test_header_sets_parse() -> None:
    assert HeaderSets.parse(None) == HeaderSets(True, False, True)
    assert HeaderSets.parse("all") == HeaderSets(True, True, True)
    assert HeaderSets.parse("none") == HeaderSets(False, False, False)
    assert HeaderSets.parse(["legacy", "Retry-After"]) == HeaderSets(False, True, True)
    with pytest.raises(redcount.InvalidInputError, match="unknown header set 'draft7'"):
        HeaderSets.parse("ietf,draft7")
    with pytest.raises(redcount.InvalidInputError, match="unknown header set"):
        HeaderSets.parse(["x-ratelimit"])


# -- rendering -------------------------------------------------------------------------------


def run(limiter: redcount.Limiter, specs: list[LimitSpec], view: FakeView | None = None, **kw: Any) -> Any:
    checks = resolve_all(specs, view or FakeView(), remote_address)
    return decide(limiter, checks, FailurePolicy("open"), **kw)


def headers(verdict: Any, sets: str = "all", now: float = 1_700_000_000.0) -> dict[str, str]:
    out = render(verdict, HeaderSets.parse(sets), now=now)
    names = [n for n, _ in out]
    assert len(names) == len(set(names)), f"duplicated field in {out}"
    return dict(out)


def test_allowed_then_refused_headers(limiter: redcount.Limiter, clock: redcount.ManualClock) -> None:
    clock.set(1_700_000_080.0)  # 20 s left in the minute
    s = spec("2/minute")
    h = headers(run(limiter, [s]), now=clock.now())
    assert h == {
        "RateLimit-Policy": '"api";q=2;w=60',
        "RateLimit": '"api";r=1;t=20',
        "X-RateLimit-Limit": "2",
        "X-RateLimit-Remaining": "1",
        "X-RateLimit-Reset": "1700000100",
    }
    run(limiter, [s])
    v = run(limiter, [s])
    assert not v.allowed
    h = headers(v, now=clock.now())
    assert h["RateLimit"] == '"api";r=0;t=20'
    assert h["Retry-After"] == "20"
    # Retry-After is never earlier than the effective window t.
    assert int(h["Retry-After"]) >= int(h["RateLimit"].rsplit("t=", 1)[1])


def test_only_the_chosen_sets_are_sent(limiter: redcount.Limiter) -> None:
    s = spec("1/minute")
    run(limiter, [s])
    v = run(limiter, [s])
    assert set(headers(v, "ietf")) == {"RateLimit-Policy", "RateLimit"}
    assert set(headers(v, "legacy")) == {"X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset"}
    assert set(headers(v, "retry-after")) == {"Retry-After"}
    assert headers(v, "none") == {}


def test_binding_limit_speaks_and_every_policy_is_listed(limiter: redcount.Limiter) -> None:
    app_wide = spec("100/hour", name="default")
    route = spec("2/minute", name="search")
    v = run(limiter, [app_wide, route])
    h = headers(v)
    assert h["RateLimit-Policy"] == '"default";q=100;w=3600, "search";q=2;w=60'
    assert h["RateLimit"].startswith('"search";r=1;')  # the route limit binds: fewest left
    run(limiter, [app_wide, route])
    v = run(limiter, [app_wide, route])
    assert not v.allowed and v.refusal is not None and v.refusal.policy.name == "search"
    assert headers(v)["RateLimit"].startswith('"search";r=0;')
    assert headers(v)["X-RateLimit-Limit"] == "2"


def test_multi_limit_string_names_each_window(limiter: redcount.Limiter) -> None:
    s = spec("2/second;5/hour")
    h = headers(run(limiter, [s]))
    assert h["RateLimit-Policy"] == '"api-1s";q=2;w=1, "api-3600s";q=5;w=3600'
    assert h["RateLimit"].startswith('"api-1s";r=1;')
    auto = LimitSpec.build("10/minute", name=None, where="route 'x'")
    assert headers(run(limiter, [auto]))["RateLimit-Policy"] == '"10-per-60s";q=10;w=60'


def test_policy_names_are_escaped_structured_strings(limiter: redcount.Limiter) -> None:
    s = spec("5/minute", name='a "quoted" \\ name')
    assert headers(run(limiter, [s]))["RateLimit-Policy"] == '"a \\"quoted\\" \\\\ name";q=5;w=60'


def test_shadow_counts_reports_and_never_refuses(
    limiter: redcount.Limiter, caplog: pytest.LogCaptureFixture
) -> None:
    s = spec("1/minute", shadow=True)
    assert run(limiter, [s]).allowed
    with caplog.at_level(logging.INFO, logger="redcount.web"):
        v = run(limiter, [s])
    assert v.allowed and not v.outcomes[0].decision.allowed
    assert headers(v) == {}  # a dry run does not tell clients anything
    assert "would refuse" in caplog.text
    v = run(limiter, [spec("1/minute", name="x")], shadow_all=True)
    assert v.allowed


def test_dynamic_limit_key_and_cost(limiter: redcount.Limiter) -> None:
    plan = {"pro": "5/minute", "free": "1/minute"}
    s = spec(lambda req: plan[req["plan"]], key=lambda req: req["user"], cost=lambda req: req["cost"])
    pro = FakeView(native={"plan": "pro", "user": "u1", "cost": 2})
    v = run(limiter, [s], pro)
    assert v.allowed and v.outcomes[0].decision.remaining == 3
    assert v.outcomes[0].check.key == "api|u1"
    free = FakeView(native={"plan": "free", "user": "u2", "cost": 1})
    assert run(limiter, [s], free).allowed
    assert not run(limiter, [s], free).allowed


def test_methods_exempt_per_method_and_builtin_keys(limiter: redcount.Limiter) -> None:
    s = spec("1/minute", methods=["post"])
    assert resolve_all([s], FakeView(method="GET"), remote_address) == []
    assert len(resolve_all([s], FakeView(method="POST"), remote_address)) == 1
    e = spec("1/minute", exempt_when=lambda: True)
    assert resolve_all([e], FakeView(), remote_address) == []
    pm = spec("1/minute", per_method=True)
    assert resolve_all([pm], FakeView(method="PUT"), remote_address)[0].key == "api|PUT|203.0.113.9"
    k = spec("1/minute", key=api_key("X-API-Key"))
    got = resolve_all([k], FakeView(headers={"X-API-Key": "s3cret"}), remote_address)[0].key
    assert got.startswith("api|apikey:") and "s3cret" not in got
    assert resolve_all([k], FakeView(), remote_address)[0].key == "api|203.0.113.9"
    t = spec("1/minute", key=by_header("X-Tenant"))
    assert resolve_all([t], FakeView(headers={"X-Tenant": "acme"}), remote_address)[0].key == "api|x-tenant:acme"


def test_key_function_returning_a_non_string_is_a_clear_error_logged_once(
    limiter: redcount.Limiter, caplog: pytest.LogCaptureFixture
) -> None:
    def user_id(req: Any) -> Any:
        return 42

    s = spec("1/minute", key=user_id)
    with caplog.at_level(logging.ERROR, logger="redcount.web"):
        for _ in range(3):
            with pytest.raises(KeyFunctionError, match="key function 'user_id' on route 'view' must return a str, got int"):
                resolve_all([s], FakeView(), remote_address)
    assert caplog.text.count("must return a str") == 1


def test_dynamic_limit_that_does_not_parse(limiter: redcount.Limiter) -> None:
    s = spec(lambda req: "lots/minute")
    with pytest.raises(redcount.InvalidInputError, match="limit callable on route 'view' returned a bad limit"):
        resolve_all([s], FakeView(), remote_address)


# -- failure policy --------------------------------------------------------------------------


@pytest.fixture
def dead_limiter(redis_factory: Any) -> Iterator[redcount.Limiter]:
    server = redis_factory()
    store = redcount.connect(server.url, connect_timeout=0.5, command_timeout=0.5)
    store.ping()
    server.kill()
    yield redcount.Limiter(store)
    store.close()


@pytest.mark.redis_only
def test_fail_open_and_closed_on_a_dead_store(dead_limiter: redcount.Limiter, caplog: pytest.LogCaptureFixture) -> None:
    checks = resolve_all([spec("1/minute")], FakeView(), remote_address)
    open_ = FailurePolicy("open")
    with caplog.at_level(logging.ERROR, logger="redcount.web"):
        for _ in range(3):
            v = decide(dead_limiter, checks, open_)
            assert v.allowed and not v.unavailable and v.outcomes == []
            # No limit fields; the mark that the store did not decide it (connection refused).
            assert render(v, HeaderSets.parse("all")) == [("RateLimit-Undecided", "unavailable")]
            assert render(v, HeaderSets.parse("none")) == []
    assert open_.store_down
    assert caplog.text.count("rate-limit store failed") == 1  # logged once, not per request
    v = decide(dead_limiter, checks, FailurePolicy("closed"))
    assert not v.allowed and v.unavailable
    with pytest.raises(redcount.InvalidInputError, match="fail must be 'open' or 'closed'"):
        FailurePolicy("maybe")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("kw", "fast"),
    [
        ({}, True),
        ({"per_route": True}, True),
        ({"cost": 2}, True),
        ({"limit": "5/second;100/hour"}, True),
        ({"per_method": True}, False),
        ({"methods": ["GET"]}, False),
        ({"exempt_when": lambda: False}, False),
        ({"key": by_header("X-Tenant")}, False),
        ({"limit": lambda: "3/minute"}, False),
        ({"cost": lambda: 1}, False),
    ],
)
def test_client_prefix_builds_the_key_resolve_builds(kw: dict[str, Any], fast: bool) -> None:
    from redcount.web.spec import Check, client_prefix

    s = spec(kw.pop("limit", "3/minute"), **kw)
    view = FakeView()
    prefix = client_prefix(s, view.endpoint)
    assert (prefix is not None) == fast
    if prefix is None:
        return
    assert s.static is not None
    built = Check(s, s.static, prefix + view.client, s.cost, s.static_policies)  # type: ignore[arg-type]
    assert resolve_all([s], view, remote_address) == [built]
    if s.per_route:
        assert client_prefix(s, None) is None  # no endpoint: the request's path decides
