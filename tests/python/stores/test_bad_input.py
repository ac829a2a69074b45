"""Bad input gets a clear error and changes nothing in the store.

Every value error is a :class:`redcount.InvalidInputError` (a ``ValueError``); wrong
types are ``TypeError``. Each case runs on both stores and compares the whole keyspace
before and after. Bad URLs, unreachable servers and authentication failures at the end.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redcount
from conftest import RedisServer, free_port
from helpers import snapshot

pytestmark = pytest.mark.usefixtures("away_from_hour_boundary")

BAD_KEYS = [
    pytest.param("", "must not be empty", id="empty"),
    pytest.param("x" * 1_000_000, "1000000 bytes", id="1MB"),
    pytest.param("y" * 1025, "1025 bytes", id="1025B"),
    pytest.param(b"\xff\xfe", "UTF-8", id="bytes-not-utf8"),
    pytest.param(b"ok\xc0\xaf", "UTF-8", id="overlong-utf8"),
    pytest.param("\ud800", "surrogate", id="lone-surrogate"),
]


@pytest.fixture
def populated(store: redcount.Store) -> Iterator[redcount.Store]:
    """The store with a few keys in it, so "nothing changed" is not trivially true."""
    c = redcount.FixedWindowCounter(store, "pre", 3600)
    c.incr("existing", 3)
    c.incr("existing", request_id="r")
    redcount.Limiter(store).hit("5/hour", "existing")
    store.execute("SET", "plain", "v")
    assert store.execute("DBSIZE") == 4
    yield store


def unchanged(store: redcount.Store, fn: Callable[[], Any], exc: type[BaseException] = redcount.InvalidInputError,
              match: str | None = None) -> BaseException:
    """Run fn, expect `exc`, and prove the store is exactly as before."""
    before = snapshot(store)
    size = store.execute("DBSIZE")
    with pytest.raises(exc, match=match) as info:
        fn()
    assert store.execute("DBSIZE") == size
    assert snapshot(store) == before
    if isinstance(info.value, ValueError):
        assert isinstance(info.value, redcount.InvalidInputError), f"a bare ValueError: {info.value!r}"
    if exc is redcount.InvalidInputError:
        assert isinstance(info.value, ValueError) and isinstance(info.value, redcount.RedcountError)
    return info.value


# --------------------------------------------------------------------------- keys


@pytest.mark.parametrize(("key", "match"), BAD_KEYS)
@pytest.mark.parametrize("mode", ["script", "commands"])
def test_bad_keys_counter(populated: redcount.Store, key: str | bytes, match: str, mode: str) -> None:
    c = redcount.FixedWindowCounter(populated, "c", 60, mode=mode)  # type: ignore[arg-type]
    unchanged(populated, lambda: c.incr(key), match=match)
    unchanged(populated, lambda: c.incr_many({"good": 1, key: 1, "good2": 2}), match=match)
    unchanged(populated, lambda: c.get(key), match=match)
    unchanged(populated, lambda: c.get_many(["good", key]), match=match)
    unchanged(populated, lambda: c.ttl(key), match=match)
    unchanged(populated, lambda: c.storage_key(key), match=match)
    unchanged(populated, lambda: c.current_window(key), match=match)


@pytest.mark.parametrize(("key", "match"), BAD_KEYS)
def test_bad_keys_limiter(populated: redcount.Store, key: str | bytes, match: str) -> None:
    lim = redcount.Limiter(populated)
    unchanged(populated, lambda: lim.hit("5/hour", key), match=match)
    unchanged(populated, lambda: lim.test("5/hour", key), match=match)
    unchanged(populated, lambda: lim.stats("5/hour", key), match=match)
    unchanged(populated, lambda: lim.reset("5/hour", key), match=match)


def test_key_of_wrong_type(populated: redcount.Store) -> None:
    c = redcount.FixedWindowCounter(populated, "c", 60)
    for key in (42, None, ["k"], 1.5):
        unchanged(populated, lambda key=key: c.incr(key), TypeError, match="key must be str or bytes")
    unchanged(populated, lambda: c.incr_many({1: 1}), TypeError)  # type: ignore[dict-item]


# --------------------------------------------------------------------------- amounts


@pytest.mark.parametrize("mode", ["script", "commands"])
@pytest.mark.parametrize(("amount", "exc", "match"), [
    (0, redcount.InvalidInputError, "positive"),
    (-1, redcount.InvalidInputError, "positive"),
    (-(2**63), redcount.InvalidInputError, "positive"),
    (2**63, redcount.InvalidInputError, "64-bit"),
    (2**64, redcount.InvalidInputError, "64-bit"),
    (-(2**64), redcount.InvalidInputError, "64-bit"),
    (1.5, TypeError, "int"),
    (1.0, TypeError, "int"),
    (True, TypeError, "int"),
    ("1", TypeError, "int"),
    (None, TypeError, "int"),
])
def test_bad_amounts(populated: redcount.Store, mode: str, amount: Any, exc: type[BaseException], match: str) -> None:
    c = redcount.FixedWindowCounter(populated, "c", 60, mode=mode)  # type: ignore[arg-type]
    unchanged(populated, lambda: c.incr("k", amount), exc, match=match)
    unchanged(populated, lambda: c.incr_many({"a": 1, "k": amount, "z": 1}), exc, match=match)
    unchanged(populated, lambda: c.incr("existing", amount), exc, match=match)


# --------------------------------------------------------------------------- counter options


@pytest.mark.parametrize(("window", "match"), [
    (0, "> 0"), (-1, "> 0"), (-0.5, "> 0"), (math.nan, "finite"), (math.inf, "finite"), (-math.inf, "finite"),
    (0.0004, "1 ms"), (1e-9, "1 ms"), (1e300, "too long"),
])
def test_bad_windows(populated: redcount.Store, window: float, match: str) -> None:
    unchanged(populated, lambda: redcount.FixedWindowCounter(populated, "w", window), match=match)


def test_smallest_window_is_accepted(store: redcount.Store) -> None:
    c = redcount.FixedWindowCounter(store, "w", 0.001)
    assert c.window == 0.001
    assert c.incr("k") >= 1


def test_window_of_wrong_type(populated: redcount.Store) -> None:
    for window in ("60", None, True):
        unchanged(populated, lambda window=window: redcount.FixedWindowCounter(populated, "w", window), TypeError)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"grace": -1}, "grace"),
    ({"grace": -0.001}, "grace"),
    ({"grace": math.nan}, "grace"),
    ({"grace": math.inf}, "grace"),
    ({"mode": "fast"}, "mode"),
    ({"mode": ""}, "mode"),
    ({"on_error": "ignore"}, "on_error"),
    ({"prefix": "a{b"}, "prefix"),
    ({"prefix": "a}b"}, "prefix"),
    ({"prefix": ""}, "prefix"),
    ({"queue_capacity": 0}, "queue_capacity"),
    ({"queue_capacity": -5}, "queue_capacity"),
    ({"retry_backoff": 0}, "retry_backoff"),
    ({"retry_backoff": 1.0, "retry_backoff_max": 0.5}, "retry_backoff_max"),
])
def test_bad_counter_options(populated: redcount.Store, kwargs: dict[str, Any], match: str) -> None:
    unchanged(populated, lambda: redcount.FixedWindowCounter(populated, "c", 60, **kwargs), match=match)


@pytest.mark.parametrize("name", ["{tag}", "a{", "b}", "", "n" * 257, b"\xff"])
def test_bad_counter_names(populated: redcount.Store, name: Any) -> None:
    unchanged(populated, lambda: redcount.FixedWindowCounter(populated, name, 60), match="name")


def test_grace_zero_is_fine(store: redcount.Store) -> None:
    c = redcount.FixedWindowCounter(store, "g", 60, grace=0)
    assert c.grace == 0.0
    assert c.incr("k") == 1


# --------------------------------------------------------------------------- request ids


@pytest.mark.parametrize(("rid", "match"), [
    ("", "must not be empty"),
    (b"", "must not be empty"),
    ("r" * 257, "257 bytes"),
    ("é" * 129, "258 bytes"),
    (b"\xff", "UTF-8"),
    ("\udfff", "surrogate"),
])
def test_bad_request_ids(populated: redcount.Store, rid: Any, match: str) -> None:
    c = redcount.FixedWindowCounter(populated, "pre", 3600)
    unchanged(populated, lambda: c.incr("existing", request_id=rid), match=match)
    unchanged(populated, lambda: c.incr("new", request_id=rid), match=match)


def test_request_id_of_256_bytes_is_fine(store: redcount.Store) -> None:
    c = redcount.FixedWindowCounter(store, "c", 60)
    assert c.incr("k", request_id="r" * 256) == 1
    assert c.incr("k", request_id="r" * 256) == 1


def test_request_id_needs_script_mode(populated: redcount.Store) -> None:
    c = redcount.FixedWindowCounter(populated, "pre", 3600, mode="commands")
    unchanged(populated, lambda: c.incr("existing", request_id="r1"), match="mode='script'")


def test_request_id_of_wrong_type(populated: redcount.Store) -> None:
    c = redcount.FixedWindowCounter(populated, "pre", 3600)
    unchanged(populated, lambda: c.incr("existing", request_id=5), TypeError)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- limits


BAD_LIMITS = [
    pytest.param("", "empty", id="empty"),
    pytest.param("   ", "empty", id="blank"),
    pytest.param("10", "missing '/' or 'per'", id="no-unit"),
    pytest.param("ten/minute", "not a whole number", id="ten"),
    pytest.param("10/fortnight", "unknown time unit 'fortnight'", id="fortnight"),
    pytest.param("0/second", "amount must be >= 1", id="zero"),
    pytest.param("-1/second", "not a whole number|>= 1", id="negative"),
    pytest.param("10/minute;", "empty limit", id="trailing-sep"),
    pytest.param("10/minute;;5/second", "empty limit", id="double-sep"),
    pytest.param("10/0 minutes", "multiple must be >= 1", id="zero-multiple"),
    pytest.param("1.5/second", "not a whole number", id="fraction"),
    pytest.param("99999999999999999999/second", "too large", id="huge"),
    pytest.param("10/", "missing time unit", id="no-unit-after-slash"),
    pytest.param(";".join(["1/second"] * 17), "at most 16", id="17-limits"),
]


@pytest.mark.parametrize(("text", "match"), BAD_LIMITS)
def test_bad_limit_strings(populated: redcount.Store, text: str, match: str) -> None:
    with pytest.raises(redcount.InvalidInputError, match=match) as info:
        redcount.parse_limits(text)
    assert isinstance(info.value, ValueError)
    lim = redcount.Limiter(populated)
    unchanged(populated, lambda: lim.hit(text, "existing"), match=match)
    unchanged(populated, lambda: lim.test(text, "existing"), match=match)
    unchanged(populated, lambda: lim.stats(text, "existing"), match=match)
    unchanged(populated, lambda: lim.reset(text, "existing"), match=match)


@pytest.mark.parametrize(("limits", "cost", "exc", "match"), [
    ("5/hour", 0, redcount.InvalidInputError, "cost must be >= 1"),
    ("5/hour", -3, redcount.InvalidInputError, "cost must be >= 1"),
    ("5/hour", 6, redcount.InvalidInputError, "exceeds the limit '5/hour'"),
    ("50/hour;5/minute", 6, redcount.InvalidInputError, "exceeds the limit '5/minute'"),
    ("5/hour", 2**63, redcount.InvalidInputError, "64-bit"),
    ("5/hour", 1.0, TypeError, "int"),
    ("5/hour", True, TypeError, "int"),
])
def test_bad_costs(populated: redcount.Store, limits: str, cost: Any, exc: type[BaseException], match: str) -> None:
    lim = redcount.Limiter(populated)
    unchanged(populated, lambda: lim.hit(limits, "existing", cost), exc, match=match)
    unchanged(populated, lambda: lim.test(limits, "existing", cost), exc, match=match)


def test_unknown_strategy_and_bad_prefix(populated: redcount.Store) -> None:
    e = unchanged(populated, lambda: redcount.Limiter(populated, "sliding-log"), match="unknown rate-limit strategy")
    assert "fixed-window" in str(e)  # names the known ones
    unchanged(populated, lambda: redcount.Limiter(populated, prefix="lim{x}"), match="prefix")
    unchanged(populated, lambda: redcount.Limiter(populated, prefix=""), match="prefix")


def test_good_limit_strings_parse(store: redcount.Store) -> None:
    # (The other side of the coin: the parser is not simply refusing everything.)
    for text in ("10/minute", "10 per minute", "100/5 minutes", "5/second;100/hour", "5/s, 100/h", "1/DAY"):
        assert len(redcount.parse_limits(text)) >= 1


# --------------------------------------------------------------------------- stores


def test_execute_misuse(store: redcount.Store) -> None:
    with pytest.raises(redcount.InvalidInputError):
        store.execute()
    with pytest.raises(TypeError):
        store.execute("GET", ["k"])  # type: ignore[arg-type]
    with pytest.raises(redcount.InvalidInputError):
        store.execute_many([()])


def test_closed_store_raises_connection_error(store: redcount.Store) -> None:
    c = redcount.FixedWindowCounter(store, "c", 60)
    store.close()
    with pytest.raises(redcount.ConnectionError, match="closed"):
        store.execute("PING")
    with pytest.raises(redcount.ConnectionError, match="closed"):
        c.incr("k")


def test_manual_clock_only_moves_forward() -> None:
    clock = redcount.ManualClock(100.0)
    with pytest.raises(redcount.InvalidInputError):
        clock.advance(-1)
    assert clock.now() == 100.0


def test_memory_only_methods_on_redis(redis_store: redcount.Store) -> None:
    with pytest.raises(redcount.InvalidInputError, match="memory"):
        redis_store.sweep()
    with pytest.raises(redcount.InvalidInputError, match="memory"):
        redis_store.stored_keys()


@pytest.mark.parametrize(("url", "match"), [
    ("redis://host:notaport", "port must be a number 1-65535, got 'notaport'"),
    ("redis://host:0", "port"),
    ("redis://host:65536", "port"),
    ("redis://host:-1", "port"),
    ("foo://x", "unknown scheme 'foo'"),
    ("rediss://x?ssl_cert_reqs=maybe", "ssl_cert_reqs must be required, optional or none"),
    ("redis://h/abc", "database must be a number"),
    ("redis://h/-1", "database"),
    ("redis://", "missing host"),
    ("redis://:6379", "missing host"),
    ("localhost:6379", "missing scheme"),
    ("unix://relative/path", "absolute"),
    ("unix:///tmp/x.sock?timeout=1", "db=N"),
    ("memory://somewhere", "memory://"),
    ("redis://user:@h", "needs a password"),
    ("redis://:p%zz@h", "escape"),
    ("redis://[::1", "IPv6"),
    ("redis://h ost:6379", "invalid character"),
])
def test_bad_urls(url: str, match: str) -> None:
    with pytest.raises(redcount.InvalidInputError, match=match) as info:
        redcount.connect(url)
    assert isinstance(info.value, ValueError)
    assert "expected memory://" in str(info.value)  # says what a good URL looks like


def test_a_sentinel_service_name_must_decode_as_utf8() -> None:
    """A %-escaped service name that is not UTF-8 is refused when the URL is read (the name
    shows in the store's URL and messages, which Python decodes strictly), alone or in a ring."""
    url = "redis+sentinel://127.0.0.1:26379/a%FFb"
    for args, kw in (((url,), {}), (([url, "redis://127.0.0.1:6379"],), {"routing": "ring"})):
        with pytest.raises(redcount.InvalidInputError, match=r"not valid UTF-8 once %-decoded: 'a\\xffb'"):
            redcount.connect(*args, **kw)


@pytest.mark.parametrize("url", [
    "redis://app:hunter2secret@host:notaport/0",
    "redis://:hunter2secret@host/abc",
    "http://app:hunter2secret@localhost",
    "app:hunter2secret@localhost:6379",  # scheme forgotten
    "redis:/app:hunter2secret@localhost",  # one slash short
    "app:hunter2secret@redis://localhost",  # credentials before the scheme
])
def test_bad_url_never_echoes_the_password(url: str) -> None:
    with pytest.raises(redcount.InvalidInputError) as info:
        redcount.connect(url)
    assert "hunter2secret" not in str(info.value)
    assert "***" in str(info.value)


@pytest.mark.parametrize(("kwargs", "exc"), [
    ({"max_connections": 0}, redcount.InvalidInputError),
    ({"max_connections": "3"}, TypeError),
    ({"max_connections": True}, TypeError),
    ({"connect_timeout": -1}, redcount.InvalidInputError),
    ({"command_timeout": math.nan}, redcount.InvalidInputError),
    ({"pool_timeout": "1"}, TypeError),
    ({"spin": -0.0001}, redcount.InvalidInputError),
    ({"spin": 0.01}, redcount.InvalidInputError),
    ({"spin": math.nan}, redcount.InvalidInputError),
    ({"spin": "0"}, TypeError),
    ({"spin": True}, TypeError),
])
def test_bad_connect_options(kwargs: dict[str, Any], exc: type[BaseException]) -> None:
    with pytest.raises(exc):
        redcount.connect("redis://127.0.0.1:6379/0", **kwargs)


def test_url_of_wrong_type_and_clock_on_redis() -> None:
    with pytest.raises(TypeError):
        redcount.connect(6379)  # type: ignore[arg-type]
    # On Redis a clock replaces the client's idea of now (see test_strategies.py's skew tests).
    skewed = redcount.connect("redis://127.0.0.1:6379/0", clock=redcount.ManualClock(1_000_000.0))
    assert skewed.now() == 1_000_000.0


def test_connection_refused() -> None:
    port = free_port()  # nothing listens there
    store = redcount.connect(f"redis://127.0.0.1:{port}/0")
    with pytest.raises(redcount.ConnectionError, match="refused") as info:
        store.ping()
    assert isinstance(info.value, ConnectionError)
    assert str(port) in str(info.value)
    c = redcount.FixedWindowCounter(store, "c", 60)
    with pytest.raises(redcount.ConnectionError, match="refused"):
        c.incr("k")


def test_unknown_host() -> None:
    host = "no-such-host.redcount-test.invalid"  # .invalid never resolves (RFC 2606)
    store = redcount.connect(f"redis://{host}:6379/0", connect_timeout=2)
    with pytest.raises(redcount.ConnectionError) as info:
        store.ping()
    assert host in str(info.value)


# --------------------------------------------------------------------------- authentication


@pytest.fixture(scope="module")
def auth_server(redis_session_factory: Callable[..., RedisServer]) -> RedisServer:
    return redis_session_factory(["--requirepass", "s3cret", "--user", "app", "on", ">app-pw", "~*", "+@all",
                          "--user", "off-user", "off", ">pw", "~*", "+@all"], password="s3cret")


@pytest.mark.redis_only
def test_right_password_works(auth_server: RedisServer) -> None:
    for url in (f"redis://:s3cret@127.0.0.1:{auth_server.port}/0", f"redis://s3cret@127.0.0.1:{auth_server.port}/0",
                f"redis://default:s3cret@127.0.0.1:{auth_server.port}/0"):
        store = redcount.connect(url)
        assert store.ping()
        assert "s3cret" not in store.url and "s3cret" not in repr(store)
        store.execute("FLUSHALL")
        assert redcount.FixedWindowCounter(store, "a", 60).incr("k") == 1
        store.close()


@pytest.mark.redis_only
def test_wrong_password_is_an_authentication_error(auth_server: RedisServer) -> None:
    store = redcount.connect(f"redis://:wrong-pw@127.0.0.1:{auth_server.port}/0")
    with pytest.raises(redcount.AuthenticationError) as info:
        store.ping()
    assert not isinstance(info.value, ConnectionError)  # not transient: retrying cannot help
    assert isinstance(info.value, redcount.ReplyError)
    assert "wrong-pw" not in str(info.value)
    assert "default" in str(info.value)
    # A queueing counter must not queue it either.
    c = redcount.FixedWindowCounter(store, "q", 60, on_error="queue")
    with pytest.raises(redcount.AuthenticationError):
        c.incr("k")
    assert c.pending == 0 and c.stats().queued == 0


@pytest.mark.redis_only
def test_acl_user(auth_server: RedisServer) -> None:
    good = redcount.connect(f"redis://app:app-pw@127.0.0.1:{auth_server.port}/0")
    assert good.ping()
    assert good.url.startswith("redis://app@127.0.0.1:")
    assert redcount.Limiter(good, prefix="acl").hit("5/hour", "k")
    good.close()
    for url, who in ((f"redis://app:s3cret@127.0.0.1:{auth_server.port}/0", "app"),
                     (f"redis://nobody:app-pw@127.0.0.1:{auth_server.port}/0", "nobody"),
                     (f"redis://off-user:pw@127.0.0.1:{auth_server.port}/0", "off-user")):
        bad = redcount.connect(url)
        with pytest.raises(redcount.AuthenticationError) as info:
            bad.ping()
        assert who in str(info.value)
        bad.close()


@pytest.mark.redis_only
def test_no_password_against_requirepass(auth_server: RedisServer) -> None:
    store = redcount.connect(auth_server.url)
    with pytest.raises(redcount.AuthenticationError, match="password") as info:
        store.ping()
    assert "requires a password" in str(info.value)
    with pytest.raises(redcount.AuthenticationError):
        redcount.FixedWindowCounter(store, "c", 60).incr("k")


@pytest.mark.redis_only
def test_password_against_a_server_without_one(redis_server: RedisServer) -> None:
    store = redcount.connect(f"redis://:unneeded@127.0.0.1:{redis_server.port}/0")
    with pytest.raises(redcount.AuthenticationError) as info:
        store.ping()
    assert "unneeded" not in str(info.value)


@pytest.mark.redis_only
def test_database_out_of_range(redis_server: RedisServer) -> None:
    store = redcount.connect(f"redis://127.0.0.1:{redis_server.port}/999")
    with pytest.raises(redcount.ReplyError, match="database 999"):
        store.ping()


@pytest.mark.redis_only
def test_selected_database_is_used(redis_server: RedisServer) -> None:
    s0 = redcount.connect(f"redis://127.0.0.1:{redis_server.port}/0")
    s3 = redcount.connect(f"redis://127.0.0.1:{redis_server.port}/3")
    s0.execute("FLUSHALL")
    redcount.FixedWindowCounter(s3, "db", 60).incr("k")
    assert s3.execute("DBSIZE") == 1
    assert s0.execute("DBSIZE") == 0
    s3.execute("FLUSHALL")
    s0.close()
    s3.close()


# --------------------------------------------------------------- numbers out of range, NUL bytes


# Non-finite clocks and huge numbers are InvalidInputError naming the argument.
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, 1e300])
def test_manual_clock_refuses_non_finite_or_huge_start(bad: float) -> None:
    with pytest.raises(redcount.InvalidInputError, match="start"):
        redcount.ManualClock(bad)


@pytest.mark.parametrize("bad", [math.nan, math.inf, 1e300])
def test_manual_clock_set_and_advance_refuse_non_finite(bad: float) -> None:
    clock = redcount.ManualClock(100.0)
    with pytest.raises(redcount.InvalidInputError, match="t"):
        clock.set(bad)
    with pytest.raises(redcount.InvalidInputError, match="seconds"):
        clock.advance(bad)
    assert clock.now() == 100.0  # untouched


def test_manual_clock_advance_cannot_overflow() -> None:
    clock = redcount.ManualClock(8.9e15)
    with pytest.raises(redcount.InvalidInputError, match="range"):
        clock.advance(2e14)
    assert clock.now() == 8.9e15


@pytest.mark.parametrize("window", [10**400, -(10**400), math.nan, math.inf])
def test_huge_or_non_finite_window_is_invalid_input(memory_store: redcount.Store, window: float) -> None:
    with pytest.raises(redcount.InvalidInputError, match="window"):
        redcount.FixedWindowCounter(memory_store, "c", window)
    with pytest.raises(redcount.InvalidInputError, match="window"):
        redcount.SlidingWindowCounter(memory_store, "c", window)


def test_huge_timeout_is_invalid_input() -> None:
    with pytest.raises(redcount.InvalidInputError, match="command_timeout"):
        redcount.connect("redis://127.0.0.1:1", command_timeout=10**400)


# A huge limit string is refused before it is parsed, with a short message.
def test_huge_limit_string_is_refused_quickly(memory_store: redcount.Store) -> None:
    limiter = redcount.Limiter(memory_store)
    text = "1/second;" * 900_000  # 8.1 MB
    started = time.perf_counter()
    with pytest.raises(redcount.InvalidInputError) as err:
        limiter.hit(text, "k")
    elapsed = time.perf_counter() - started
    assert len(str(err.value)) < 400
    assert "2048" in str(err.value)
    # Not a speed assertion on redcount: parsing all 900,000 limits first would take far
    # longer than the length check; this only guards against going back to a full parse.
    assert elapsed < 5.0


# A NUL byte in a limit string or a name must not cut the error message.
def test_nul_in_limit_string_keeps_the_reason(memory_store: redcount.Store) -> None:
    limiter = redcount.Limiter(memory_store)
    with pytest.raises(redcount.InvalidInputError) as err:
        limiter.hit("10/min\x00ute", "k")
    message = str(err.value)
    assert "\\x00" in message
    assert "unknown time unit" in message


def test_nul_in_counter_name_keeps_the_reason(memory_store: redcount.Store) -> None:
    with pytest.raises(redcount.InvalidInputError) as err:
        redcount.FixedWindowCounter(memory_store, "a\x00{b}", 60)
    message = str(err.value)
    assert "\\x00" in message
    assert "hash tag" in message


def test_error_messages_with_bytes_that_are_not_utf8(store: redcount.Store) -> None:
    # An error reply quotes what it was sent; bytes that are not UTF-8 arrive as \xNN
    # instead of a UnicodeDecodeError in place of the ReplyError.
    with pytest.raises(redcount.ReplyError) as err:
        store.execute(b"\xff\xfe")
    assert "\\xff\\xfe" in str(err.value)
    with pytest.raises(redcount.ReplyError) as err:
        store.execute("NOSUCH", b"\xff")
    assert "\\xff" in str(err.value)


def test_limit_string_messages_cut_between_characters(memory_store: redcount.Store) -> None:
    # The quoted string is cut at 80 bytes; a cut inside "é" made a message Python could
    # not decode (UnicodeDecodeError instead of InvalidInputError).
    limiter = redcount.Limiter(memory_store)
    for text in ["x" * 79 + "é/minute", "1/" + "é" * 60]:
        with pytest.raises(redcount.InvalidInputError, match="invalid rate limit"):
            limiter.hit(text, "k")
