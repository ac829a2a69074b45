"""The embedded memory:// store and a real redis-server must behave the same.

Every test here runs on both stores (the ``store`` fixture); a few run one scripted
sequence on both at once and compare the outputs value for value.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import redcount
from conftest import server_product
from helpers import all_keys, ms, snapshot, wait_for_fresh_window

MAX64 = 2**63 - 1
LIMITER_GRACE_MS = 1000  # limiter keys outlive their window by 1 s (kLimiterGraceMs, cpp/include/redcount/common/bounds.h)

pytestmark = pytest.mark.usefixtures("away_from_hour_boundary")

# --------------------------------------------------------------------------- raw commands


def test_get_set_nx_xx(store: redcount.Store) -> None:
    x = store.execute
    assert x("GET", "k") is None
    assert x("SET", "k", "1") == "OK"
    assert x("GET", "k") == b"1"
    assert x("SET", "k", "2", "NX") is None  # exists: NX refuses
    assert x("GET", "k") == b"1"
    assert x("SET", "other", "2", "XX") is None  # absent: XX refuses
    assert x("EXISTS", "other") == 0
    assert x("SET", "k", "3", "XX") == "OK"
    assert x("GET", "k") == b"3"
    assert x("SET", "fresh", "4", "NX") == "OK"
    assert x("GET", "fresh") == b"4"
    # Values are binary-safe bytes; ints are sent as their decimal text.
    assert x("SET", "bin", b"\x00\xff") == "OK"
    assert x("GET", "bin") == b"\x00\xff"
    assert x("SET", "n", 42) == "OK"
    assert x("GET", "n") == b"42"


def test_set_px_pxat_keepttl(store: redcount.Store) -> None:
    x = store.execute
    assert x("SET", "k", "v", "PX", 100_000) == "OK"
    pttl = x("PTTL", "k")
    assert 99_000 < pttl <= 100_000
    # KEEPTTL keeps the deadline; a plain SET drops it.
    assert x("SET", "k", "w", "KEEPTTL") == "OK"
    assert x("GET", "k") == b"w"
    assert 99_000 < x("PTTL", "k") <= 100_000
    assert x("SET", "k", "z") == "OK"
    assert x("PTTL", "k") == -1
    # PXAT: an absolute deadline in ms since the epoch.
    at = ms(store.now()) + 50_000
    assert x("SET", "a", "1", "PXAT", at) == "OK"
    assert 49_000 < x("PTTL", "a") <= 50_000
    # PXAT in the past: the key is gone at once.
    assert x("SET", "gone", "1", "PXAT", 1000) == "OK"
    assert x("GET", "gone") is None
    assert x("EXISTS", "gone") == 0
    # NX together with PXAT, as the commands mode uses it.
    assert x("SET", "a", "2", "NX", "PXAT", at + 1000) is None
    assert x("GET", "a") == b"1"
    assert 49_000 < x("PTTL", "a") <= 50_000


def test_set_bad_options_are_reply_errors(store: redcount.Store) -> None:
    for args in (("SET", "k", "v", "PX", "0"), ("SET", "k", "v", "PX", "abc"), ("SET", "k", "v", "NX", "XX"),
                 ("SET", "k", "v", "BOGUS")):
        with pytest.raises(redcount.ReplyError):
            store.execute(*args)
    assert store.execute("EXISTS", "k") == 0


def test_incrby_and_non_integer_errors(store: redcount.Store) -> None:
    x = store.execute
    assert x("INCRBY", "c", 5) == 5
    assert x("INCRBY", "c", 7) == 12
    assert x("INCRBY", "c", -2) == 10
    assert x("GET", "c") == b"10"
    x("SET", "text", "abc")
    with pytest.raises(redcount.ReplyError, match="not an integer"):
        x("INCRBY", "text", 1)
    assert x("GET", "text") == b"abc"
    with pytest.raises(redcount.ReplyError, match="not an integer"):
        x("INCRBY", "c", "1.5")
    with pytest.raises(redcount.ReplyError, match="not an integer"):
        x("INCRBY", "c", "ten")
    assert x("GET", "c") == b"10"
    # " 1" and "01" are not integers to Redis either.
    x("SET", "padded", "01")
    with pytest.raises(redcount.ReplyError):
        x("INCRBY", "padded", 1)
    # A ReplyError is a RedcountError but not an InvalidInputError: the server refused it.
    try:
        x("INCRBY", "text", 1)
    except redcount.ReplyError as e:
        assert isinstance(e, redcount.RedcountError)
        assert not isinstance(e, ValueError)


def test_incrby_overflow_leaves_value_unchanged(store: redcount.Store) -> None:
    x = store.execute
    x("SET", "big", MAX64)
    with pytest.raises(redcount.ReplyError, match="overflow"):
        x("INCRBY", "big", 1)
    assert x("GET", "big") == str(MAX64).encode()
    x("SET", "small", -MAX64 - 1)
    with pytest.raises(redcount.ReplyError, match="overflow"):
        x("INCRBY", "small", -1)
    assert x("GET", "small") == str(-MAX64 - 1).encode()
    assert x("INCRBY", "big", -1) == MAX64 - 1


def test_pttl_states_and_persist(store: redcount.Store) -> None:
    x = store.execute
    assert x("PTTL", "nope") == -2
    assert x("TTL", "nope") == -2
    x("SET", "k", "1")
    assert x("PTTL", "k") == -1
    assert x("TTL", "k") == -1
    assert x("PERSIST", "k") == 0  # nothing to remove
    assert x("PEXPIRE", "k", 30_000) == 1
    assert 29_000 < x("PTTL", "k") <= 30_000
    assert x("TTL", "k") == 30
    assert x("PERSIST", "k") == 1
    assert x("PTTL", "k") == -1
    assert x("GET", "k") == b"1"
    assert x("PERSIST", "nope") == 0


def test_pexpireat_in_the_past_deletes(store: redcount.Store) -> None:
    x = store.execute
    x("SET", "k", "1")
    assert x("PEXPIREAT", "k", ms(store.now()) - 1000) == 1
    assert x("EXISTS", "k") == 0
    assert x("GET", "k") is None
    assert x("PTTL", "k") == -2
    assert x("PEXPIREAT", "k", ms(store.now()) + 10_000) == 0  # absent: nothing to expire
    x("SET", "k2", "1")
    assert x("EXPIREAT", "k2", 1) == 1
    assert x("EXISTS", "k2") == 0
    x("SET", "k3", "1")
    assert x("EXPIRE", "k3", -5) == 1
    assert x("EXISTS", "k3") == 0


def test_exists_and_del(store: redcount.Store) -> None:
    x = store.execute
    x("SET", "a", "1")
    x("SET", "b", "1")
    assert x("EXISTS", "a") == 1
    assert x("EXISTS", "a", "a", "b", "zz") == 3  # repeats count, like Redis
    assert x("DEL", "a", "zz") == 1
    assert x("DEL", "a") == 0
    assert x("EXISTS", "a", "b") == 1
    assert x("DBSIZE") == 1


def test_expire_nx_xx_gt_lt(store: redcount.Store) -> None:
    x = store.execute
    x("SET", "k", "1")
    assert x("EXPIRE", "k", 100, "XX") == 0  # no TTL yet
    assert x("PTTL", "k") == -1
    assert x("EXPIRE", "k", 100, "GT") == 0  # no TTL counts as infinite
    assert x("PTTL", "k") == -1
    assert x("EXPIRE", "k", 100, "NX") == 1
    assert x("EXPIRE", "k", 500, "NX") == 0  # already has one
    assert x("TTL", "k") == 100
    assert x("EXPIRE", "k", 50, "GT") == 0
    assert x("EXPIRE", "k", 200, "GT") == 1
    assert x("TTL", "k") == 200
    assert x("EXPIRE", "k", 300, "LT") == 0
    assert x("EXPIRE", "k", 150, "LT") == 1
    assert x("TTL", "k") == 150
    assert x("EXPIRE", "k", 120, "XX") == 1
    assert x("TTL", "k") == 120
    x("SET", "nottl", "1")
    assert x("EXPIRE", "nottl", 80, "LT") == 1  # infinite > 80
    assert x("TTL", "nottl") == 80
    with pytest.raises(redcount.ReplyError):
        x("EXPIRE", "k", 10, "NX", "XX")
    with pytest.raises(redcount.ReplyError):
        x("EXPIRE", "k", 10, "GT", "LT")
    assert x("EXPIRE", "missing", 10) == 0


def test_unknown_command_is_a_reply_error(store: redcount.Store) -> None:
    with pytest.raises(redcount.ReplyError):
        store.execute("NOSUCHCOMMAND", "x")


def test_execute_many_returns_errors_inline(store: redcount.Store) -> None:
    out = store.execute_many([("SET", "a", "x"), ("INCRBY", "a", 1), ("INCRBY", "b", 2), ("GET", "b")])
    assert out[0] == "OK"
    assert isinstance(out[1], str) and "not an integer" in out[1]
    assert out[2] == 2
    assert out[3] == b"2"


# A sequence of raw commands run on both stores; outputs must match exactly except
# remaining TTLs, which may differ by the time that passed between the two runs.
SEQUENCE: list[tuple[Any, ...]] = [
    ("SET", "s", "1"), ("GET", "s"), ("SET", "s", "2", "NX"), ("SET", "t", "2", "XX"), ("SET", "s", "3", "XX"),
    ("INCRBY", "s", 39), ("SET", "p", "v", "PX", 60_000), ("PTTL", "p"), ("SET", "p", "w", "KEEPTTL"),
    ("TTL", "p"), ("PERSIST", "p"), ("PTTL", "p"), ("EXPIRE", "p", 10, "XX"), ("EXPIRE", "p", 10, "NX"),
    ("EXPIRE", "p", 5, "GT"), ("EXPIRE", "p", 20, "GT"), ("EXPIRE", "p", 30, "LT"), ("TTL", "p"),
    ("PEXPIREAT", "p", 1000), ("EXISTS", "p", "s", "s"), ("SET", "x", "abc"), ("INCRBY", "x", 1),
    ("SET", "m", MAX64), ("INCRBY", "m", 1), ("GET", "m"), ("DEL", "s", "m", "zz"), ("PTTL", "zz"),
    ("INCRBY", "new", 3), ("PTTL", "new"), ("DBSIZE",), ("KEYS", "*"),
]


def run_sequence(store: redcount.Store, sequence: list[tuple[Any, ...]] = SEQUENCE) -> list[Any]:
    out: list[Any] = []
    for cmd in sequence:
        try:
            r = store.execute(*cmd)
        except redcount.RedcountError as e:
            r = (type(e).__name__, str(e))
        if cmd[0] == "KEYS":
            r = sorted(r)
        out.append(r)
    return out


@pytest.mark.redis_only
def test_same_command_sequence_same_results(memory_store: redcount.Store, redis_store: redcount.Store) -> None:
    mem = run_sequence(memory_store)
    red = run_sequence(redis_store)
    assert len(mem) == len(red)
    for cmd, a, b in zip(SEQUENCE, mem, red):
        if cmd[0] in ("PTTL", "TTL") and isinstance(a, int) and a >= 0:
            tolerance = 2_000 if cmd[0] == "PTTL" else 2
            assert abs(a - b) <= tolerance, (cmd, a, b)
        else:
            assert a == b, (cmd, a, b)
    # The sequence is not trivially empty: it hit every kind of reply.
    flat = [type(r) for r in mem]
    assert {int, bytes, str, type(None), tuple, list} <= set(flat)


# --------------------------------------------------------------------------- sorted sets and hashes

WRONGTYPE = "WRONGTYPE Operation against a key holding the wrong kind of value"


def reply_error(store: redcount.Store, *args: Any) -> str:
    """The error text of a command that must fail with a ReplyError."""
    with pytest.raises(redcount.ReplyError) as info:
        store.execute(*args)
    return str(info.value)


def test_type_of_each_kind_of_key(store: redcount.Store) -> None:
    x = store.execute
    x("SET", "s", "1")
    x("ZADD", "z", 1, "m")
    x("HSET", "h", "f", "v")
    assert [x("TYPE", k) for k in ("s", "z", "h", "none")] == ["string", "zset", "hash", "none"]
    # SET replaces a key of any type; NX still sees it.
    assert x("SET", "z", "x", "NX") is None
    assert x("SET", "z", "x") == "OK"
    assert x("TYPE", "z") == "string"


def test_wrongtype_errors_both_directions(store: redcount.Store) -> None:
    x = store.execute
    x("SET", "s", "1")
    x("ZADD", "z", 1, "m")
    x("HSET", "h", "f", "v")
    for key in ("z", "h"):
        for cmd in (("GET", key), ("INCR", key), ("INCRBY", key, 1), ("DECRBY", key, 1)):
            assert reply_error(store, *cmd) == WRONGTYPE, cmd
    for key in ("s", "h"):
        for cmd in (("ZADD", key, 1, "a"), ("ZREM", key, "a"), ("ZCARD", key), ("ZSCORE", key, "a"),
                    ("ZCOUNT", key, 0, 1), ("ZRANGE", key, 0, -1), ("ZRANGEBYSCORE", key, 0, 1),
                    ("ZREMRANGEBYSCORE", key, 0, 1)):
            assert reply_error(store, *cmd) == WRONGTYPE, cmd
    for key in ("s", "z"):
        for cmd in (("HSET", key, "f", "v"), ("HGET", key, "f"), ("HMGET", key, "f"), ("HGETALL", key),
                    ("HDEL", key, "f"), ("HLEN", key), ("HEXISTS", key, "f"), ("HINCRBY", key, "f", 1)):
            assert reply_error(store, *cmd) == WRONGTYPE, cmd
    # In a batch the error comes back in-line.
    assert store.execute_many([("GET", "z"), ("ZCARD", "z")]) == [WRONGTYPE, 1]
    assert (x("GET", "s"), x("ZSCORE", "z", "m"), x("HGET", "h", "f")) == (b"1", b"1", b"v")


def test_zscore_formatting(store: redcount.Store) -> None:
    x = store.execute
    # These print the same on every Redis 7; scores like 0.1 print as 0.10000000000000001
    # on 7.0 ("%.17g") but as 0.1 on 7.2+, so only their value is compared.
    for score, text in ((1.5, b"1.5"), (100, b"100"), ("1e20", b"1e+20"), ("-inf", b"-inf"), ("+inf", b"inf"),
                        (-2.25, b"-2.25"), ("-0", b"0"), (2**53, b"9007199254740992")):
        x("ZADD", "z", score, "m")
        assert x("ZSCORE", "z", "m") == text, score
    # A hexadecimal score: Redis 7 reads it (strtod), and so does the memory store; Valkey 9
    # refuses it as it refuses "nan".
    if store.is_memory or not server_product().startswith("Valkey"):
        x("ZADD", "z", "0x10", "m")
        assert x("ZSCORE", "z", "m") == b"16"
    else:
        assert reply_error(store, "ZADD", "z", "0x10", "m") == "ERR value is not a valid float"
    for score in ("0.1", "1e-300", "3.141592653589793", "12345678901234567890"):
        x("ZADD", "z", score, "m")
        assert float(x("ZSCORE", "z", "m")) == float(score)
    for bad in ("nan", "", " 1", "1e400", "abc"):
        assert reply_error(store, "ZADD", "z", bad, "m") == "ERR value is not a valid float", bad
    assert x("ZSCORE", "z", "nope") is None
    assert x("ZSCORE", "nope", "m") is None


def test_zadd_flags(store: redcount.Store) -> None:
    x = store.execute
    assert x("ZADD", "z", "XX", 1, "a") == 0
    assert x("EXISTS", "z") == 0
    assert x("ZADD", "z", 1, "a", 2, "b") == 2
    assert x("ZADD", "z", "NX", 5, "a", 3, "c") == 1
    assert x("ZADD", "z", "XX", "CH", 5, "a", 9, "new") == 1
    assert x("ZADD", "z", "GT", "CH", 4, "a", 7, "b", 1, "d") == 2
    assert x("ZADD", "z", "LT", "CH", 6, "a", 2, "b") == 1
    assert x("ZADD", "z", "CH", 2, "b") == 0
    assert x("ZRANGE", "z", 0, -1, "WITHSCORES") == [b"d", b"1", b"b", b"2", b"c", b"3", b"a", b"5"]
    assert reply_error(store, "ZADD", "z", "NX", "XX", 1, "a") == (
        "ERR XX and NX options at the same time are not compatible")
    assert reply_error(store, "ZADD", "z", "GT", "LT", 1, "a").startswith("ERR GT, LT, and/or NX")
    assert reply_error(store, "ZADD", "z", 1, "a", 2) == "ERR syntax error"
    assert reply_error(store, "ZADD", "z", 1, "x", "bad", "y") == "ERR value is not a valid float"
    assert x("ZCARD", "z") == 4  # the refused commands wrote nothing


def test_zrange_by_rank_and_by_score(store: redcount.Store) -> None:
    x = store.execute
    # Ties at one score go by member bytes.
    assert x("ZADD", "z", 2, "b", 1, "c", 2, "a", 1, b"\xff", 1, "", 2, "A", "-inf", "lo", "inf", "hi") == 8
    assert x("ZRANGE", "z", 0, -1) == [b"lo", b"", b"c", b"\xff", b"A", b"a", b"b", b"hi"]
    assert x("ZRANGE", "z", -3, -2) == [b"a", b"b"]
    assert x("ZRANGE", "z", -100, 0, "WITHSCORES") == [b"lo", b"-inf"]
    assert x("ZRANGE", "z", 7, 100, "WITHSCORES") == [b"hi", b"inf"]
    assert x("ZRANGE", "z", 3, 1) == []
    assert x("ZRANGE", "nope", 0, -1) == []
    assert x("ZRANGEBYSCORE", "z", 1, 2) == [b"", b"c", b"\xff", b"A", b"a", b"b"]
    assert x("ZRANGEBYSCORE", "z", "(1", 2) == [b"A", b"a", b"b"]
    assert x("ZRANGEBYSCORE", "z", 1, "(2", "WITHSCORES") == [b"", b"1", b"c", b"1", b"\xff", b"1"]
    assert x("ZRANGEBYSCORE", "z", "(-inf", "(inf") == [b"", b"c", b"\xff", b"A", b"a", b"b"]
    assert x("ZRANGEBYSCORE", "z", "-inf", "+inf", "LIMIT", 2, 3) == [b"c", b"\xff", b"A"]
    assert x("ZRANGEBYSCORE", "z", "-inf", "+inf", "WITHSCORES", "LIMIT", 6, -1) == [
        b"b", b"2", b"hi", b"inf"]
    assert x("ZRANGEBYSCORE", "z", "-inf", "+inf", "LIMIT", -1, 2) == []
    assert x("ZRANGEBYSCORE", "z", "(2", "(2") == []
    assert x("ZRANGEBYSCORE", "z", 3, 1) == []
    assert x("ZCOUNT", "z", "(1", "+inf") == 4
    assert x("ZCOUNT", "z", "-inf", "(1") == 1
    for bad in ("x", "nan", "((1", "[1"):
        assert reply_error(store, "ZRANGEBYSCORE", "z", bad, 1) == "ERR min or max is not a float"
        assert reply_error(store, "ZCOUNT", "z", 0, bad) == "ERR min or max is not a float"
    assert reply_error(store, "ZRANGE", "z", "a", 1) == "ERR value is not an integer or out of range"
    assert reply_error(store, "ZRANGE", "z", 0, 1, "LIMIT", 0, 1).startswith("ERR syntax error")
    assert reply_error(store, "ZRANGEBYSCORE", "z", 0, 1, "LIMIT", 0) == "ERR syntax error"


def test_zrem_and_zremrangebyscore_delete_an_emptied_set_with_its_ttl(store: redcount.Store) -> None:
    x = store.execute
    x("ZADD", "z", 1, "a", 2, "b", 3, "c")
    assert x("PEXPIRE", "z", 60_000) == 1
    assert x("ZREM", "z", "a", "zz", "a") == 1
    assert x("ZREMRANGEBYSCORE", "z", "(2", 10) == 1
    assert 0 < x("PTTL", "z") <= 60_000
    assert x("ZREM", "z", "b") == 1
    assert (x("EXISTS", "z"), x("TYPE", "z"), x("PTTL", "z")) == (0, "none", -2)
    assert x("ZADD", "z", 1, "a") == 1
    assert x("PTTL", "z") == -1  # a fresh set, without the old TTL
    x("PEXPIRE", "z", 60_000)
    assert x("ZREMRANGEBYSCORE", "z", "-inf", "+inf") == 1
    assert x("EXISTS", "z") == 0
    assert x("ZREM", "nope", "a") == 0
    assert x("ZREMRANGEBYSCORE", "nope", 0, 1) == 0
    assert x("ZCARD", "nope") == 0


def test_hash_commands(store: redcount.Store) -> None:
    x = store.execute
    assert x("HSET", "h", "f1", "v1", "f2", "v2") == 2
    assert x("HSET", "h", "f1", "x", "f3", b"\x00\xff") == 1
    assert x("HGET", "h", "f1") == b"x"
    assert x("HGET", "h", "f3") == b"\x00\xff"
    assert x("HGET", "h", "nope") is None
    assert x("HMGET", "h", "f2", "nope", "f1") == [b"v2", None, b"x"]
    assert x("HMGET", "nope", "a") == [None]
    # A small hash answers in insertion order on Redis too.
    assert x("HGETALL", "h") == [b"f1", b"x", b"f2", b"v2", b"f3", b"\x00\xff"]
    assert x("HGETALL", "nope") == []
    assert (x("HLEN", "h"), x("HLEN", "nope")) == (3, 0)
    assert (x("HEXISTS", "h", "f2"), x("HEXISTS", "h", "zz"), x("HEXISTS", "nope", "f2")) == (1, 0, 0)
    assert x("HINCRBY", "h", "n", 5) == 5
    assert x("HINCRBY", "h", "n", -7) == -2
    assert x("HGET", "h", "n") == b"-2"
    assert reply_error(store, "HINCRBY", "h", "f1", 1) == "ERR hash value is not an integer"
    assert reply_error(store, "HINCRBY", "h", "n", "1.5") == "ERR value is not an integer or out of range"
    x("HSET", "h", "max", MAX64)
    assert reply_error(store, "HINCRBY", "h", "max", 1) == "ERR increment or decrement would overflow"
    assert reply_error(store, "HSET", "h", "f") == "ERR wrong number of arguments for 'hset' command"
    assert x("HDEL", "h", "f2", "zz", "f2") == 1
    x("PEXPIRE", "h", 60_000)
    assert x("HDEL", "h", "f1", "f3", "n", "max") == 4
    assert (x("EXISTS", "h"), x("PTTL", "h")) == (0, -2)  # emptied: deleted, TTL and all
    assert x("HDEL", "nope", "f") == 0


def test_zset_and_hash_keys_expire(store: redcount.Store) -> None:
    x = store.execute
    x("ZADD", "z", 1, "a")
    x("HSET", "h", "f", "v")
    assert x("PEXPIRE", "z", 100) == 1
    assert x("PEXPIREAT", "h", ms(store.now()) + 100) == 1
    assert 0 < x("PTTL", "h") <= 100
    deadline = time.monotonic() + 10
    while x("EXISTS", "z", "h") and time.monotonic() < deadline:
        time.sleep(0.01)  # a bounded poll: real time must pass on the real server
    assert (x("EXISTS", "z", "h"), x("ZCARD", "z"), x("HGET", "h", "f"), x("DBSIZE")) == (0, 0, None, 0)
    x("HSET", "h", "f", "v")
    assert x("EXPIRE", "h", -1) == 1  # in the past: deleted at once
    assert x("TYPE", "h") == "none"


# Sorted-set and hash commands, replies and errors alike, compared value for value.
ZSET_HASH_SEQUENCE: list[tuple[Any, ...]] = [
    ("ZADD", "z", 3, "c", 1, "a", 2, "b", 2, "bb", "1.5", "x"), ("ZADD", "z", "NX", "CH", 9, "a", 4, "d"),
    ("ZADD", "z", "XX", 7, "zz"), ("ZADD", "z", "GT", "CH", 0, "c", 10, "c"),
    ("ZADD", "z", "INCR", 1, "a", 2, "b"), ("ZADD", "z", "LT", "GT", 1, "a"), ("ZADD", "z"), ("ZADD", "z", 1),
    ("ZADD", "z", "nan", "a"), ("ZRANGE", "z", 0, -1, "WITHSCORES"), ("ZRANGE", "z", -2, 10),
    ("ZRANGE", "z", 1, 0), ("ZRANGE", "z", "x", 1),
    ("ZRANGEBYSCORE", "z", "(1", 3, "WITHSCORES", "LIMIT", 1, 2),
    ("ZRANGEBYSCORE", "z", "-inf", "(2"), ("ZRANGEBYSCORE", "z", "foo", 1), ("ZCOUNT", "z", 2, 2),
    ("ZCOUNT", "z", "(2", "(2"), ("ZSCORE", "z", "x"),
    ("ZSCORE", "z", "missing"), ("ZREM", "z", "x", "x", "missing"), ("ZREMRANGEBYSCORE", "z", 2, "(4"),
    ("ZCARD", "z"), ("TYPE", "z"), ("GET", "z"), ("HSET", "z", "f", "v"), ("HSET", "h", "a", 1, "b", 2),
    ("HSET", "h", "a", 3), ("HSET", "h", "c"), ("HGET", "h", "a"), ("HMGET", "h", "b", "q"), ("HGETALL", "h"),
    ("HINCRBY", "h", "b", 40), ("HINCRBY", "h", "b", "x"), ("HLEN", "h"), ("HEXISTS", "h", "c"),
    ("HDEL", "h", "a", "b"), ("EXISTS", "h"), ("ZADD", "h", 1, "m"), ("TYPE", "h"), ("INCR", "h"),
    ("ZREMRANGEBYSCORE", "z", "-inf", "+inf"), ("EXISTS", "z"), ("DBSIZE",),
]


@pytest.mark.redis_only
def test_same_zset_and_hash_sequence_same_results(memory_store: redcount.Store,
                                                   redis_store: redcount.Store) -> None:
    mem = run_sequence(memory_store, ZSET_HASH_SEQUENCE)
    red = run_sequence(redis_store, ZSET_HASH_SEQUENCE)
    assert len(mem) == len(red) == len(ZSET_HASH_SEQUENCE)
    for cmd, a, b in zip(ZSET_HASH_SEQUENCE, mem, red):
        assert a == b, (cmd, a, b)


# --------------------------------------------------------------------------- counters

MODES = ["script", "commands"]


@pytest.mark.parametrize("mode", MODES)
def test_counter_incr_get_ttl_storage_key(store: redcount.Store, mode: str) -> None:
    c = redcount.FixedWindowCounter(store, "views", 3600, mode=mode, grace=2.5)  # type: ignore[arg-type]
    assert (c.name, c.prefix, c.window, c.grace, c.mode, c.on_error) == ("views", "redcount", 3600.0, 2.5, mode, "raise")
    assert c.get("page") == 0
    assert c.ttl("page") == -2.0
    assert c.incr("page") == 1
    assert c.incr("page", 5) == 6
    assert c.incr("page", amount=10) == 16
    assert c.get("page") == 16
    assert c.get("other") == 0

    start, end = c.current_window("page")
    index = ms(start) // 3_600_000
    assert ms(start) % 3_600_000 == 0
    assert ms(end) - ms(start) == 3_600_000
    assert start <= store.now() < end
    key = c.storage_key("page")
    assert key == f"redcount:views:{{page}}:3600000:{index}"
    assert store.execute("GET", key) == b"16"
    assert all_keys(store) == [key.encode()]

    # Read back, the TTL ends no later than the window's end plus grace.
    deadline_ms = ms(end) + 2500
    now_before = ms(store.now())
    ttl = c.ttl("page")
    pttl = store.execute("PTTL", key)
    assert 0 < ttl <= (deadline_ms - now_before + 1) / 1000
    assert 0 < pttl <= deadline_ms - now_before + 1
    assert pttl > deadline_ms - ms(store.now()) - 2000  # and not much earlier either


@pytest.mark.parametrize("mode", MODES)
def test_counter_bytes_and_unicode_keys(store: redcount.Store, mode: str) -> None:
    c = redcount.FixedWindowCounter(store, "u", 3600, mode=mode)  # type: ignore[arg-type]
    assert c.incr("naïve ✓") == 1
    assert c.incr("naïve ✓".encode()) == 2  # bytes and str name the same key
    assert c.get(b"na\xc3\xafve \xe2\x9c\x93") == 2
    assert c.storage_key("naïve ✓").startswith("redcount:u:{naïve ✓}:")
    assert c.incr("x" * 1024) == 1  # the longest key allowed


@pytest.mark.parametrize("mode", MODES)
def test_counter_incr_many_get_many(store: redcount.Store, mode: str) -> None:
    c = redcount.FixedWindowCounter(store, "batch", 3600, mode=mode)  # type: ignore[arg-type]
    assert c.incr_many({}) == {}
    assert c.incr_many({"a": 1, "b": 2, b"c": 3}) == {"a": 1, "b": 2, b"c": 3}
    assert c.incr_many({"a": 10, "c": 1}) == {"a": 11, "c": 4}
    assert c.get_many(["a", "b", "c", "missing"]) == {"a": 11, "b": 2, "c": 4, "missing": 0}
    assert c.get_many([]) == {}
    # Large batches span several script calls (512 items each) and keep their order.
    big = {f"k{i}": i + 1 for i in range(1200)}
    assert c.incr_many(big) == big
    assert c.get_many(list(big)) == big
    for k in ("a", "k0", "k1199"):
        assert store.execute("PTTL", c.storage_key(k)) > 0


@pytest.mark.parametrize("mode", MODES)
def test_incr_many_with_stagger_keeps_the_order(store: redcount.Store, mode: str) -> None:
    # With stagger the keys of one batch have different deadlines (the batch is split by
    # deadline on the way out); every result must still come back to its own key.
    c = redcount.FixedWindowCounter(store, "stag", 3600, mode=mode, stagger=True)  # type: ignore[arg-type]
    batch = {f"user-{i}": i + 1 for i in range(100)}
    assert c.incr_many(batch) == batch
    assert c.incr_many({k: 1 for k in batch}) == {k: v + 1 for k, v in batch.items()}
    assert c.get_many(list(batch)) == {k: v + 1 for k, v in batch.items()}
    for k in ("user-0", "user-57", "user-99"):
        _, end = c.current_window(k)
        now_before = ms(store.now())
        assert 0 < store.execute("PTTL", c.storage_key(k)) <= ms(end) + 1000 - now_before + 1


@pytest.mark.parametrize("mode", MODES)
def test_incr_many_partial_failure_names_the_key(store: redcount.Store, mode: str) -> None:
    c = redcount.FixedWindowCounter(store, "part", 3600, mode=mode)  # type: ignore[arg-type]
    store.execute("SET", c.storage_key("bad"), "x", "PX", 600_000)
    with pytest.raises(redcount.ReplyError) as info:
        c.incr_many({"a": 1, "bad": 1, "b": 2})
    # The message says exactly what happened: which key failed, and that the others landed.
    assert "1 of 3" in str(info.value) and "'bad'" in str(info.value) and "the others were" in str(info.value)
    assert (c.get("a"), c.get("b")) == (1, 2)
    assert store.execute("GET", c.storage_key("bad")) == b"x"


def test_counter_modes_write_the_same_keys(store: redcount.Store) -> None:
    s = redcount.FixedWindowCounter(store, "same", 3600, mode="script")
    m = redcount.FixedWindowCounter(store, "same", 3600, mode="commands")
    assert s.storage_key("k") == m.storage_key("k")
    assert s.incr("k", 2) == 2
    assert m.incr("k", 3) == 5
    assert s.incr_many({"k": 1}) == {"k": 6}
    assert m.get("k") == 6 and s.get("k") == 6


def test_request_id_dedup(store: redcount.Store) -> None:
    c = redcount.FixedWindowCounter(store, "orders", 3600)
    assert c.incr("shop", request_id="req-1") == 1
    assert c.incr("shop", request_id="req-1") == 1  # repeat: counted once, current count returned
    assert c.incr("shop", 5, request_id="req-1") == 1  # even with another amount
    assert c.incr("shop", 5, request_id="req-2") == 6
    assert c.incr("shop", request_id=b"req-2") == 6  # bytes id == str id
    assert c.incr("shop") == 7  # no id: always counted
    assert c.get("shop") == 7
    # The id is per key: the same id on another key counts there.
    assert c.incr("other", request_id="req-1") == 1
    # Request-id keys live beside the count and expire with it.
    rid = c.storage_key("shop") + ":rid:req-1"
    assert store.execute("EXISTS", rid) == 1
    # The count's TTL is read first: read later, the id's can only be smaller if it ends no
    # later (the other order compares two readings a few ms apart on a loaded machine).
    count_ttl = store.execute("PTTL", c.storage_key("shop"))
    assert 0 < store.execute("PTTL", rid) <= count_ttl
    # A duplicate on a key that does not exist any more reads as 0, and counts nothing.
    store.execute("DEL", c.storage_key("shop"))
    assert c.incr("shop", request_id="req-1") == 0
    assert c.get("shop") == 0


@pytest.mark.parametrize("mode", MODES)
def test_counter_overflow_is_an_error_and_changes_nothing(store: redcount.Store, mode: str) -> None:
    c = redcount.FixedWindowCounter(store, "ovf", 3600, mode=mode)  # type: ignore[arg-type]
    key = c.storage_key("k")
    store.execute("SET", key, MAX64 - 1, "PX", 600_000)
    assert c.incr("k") == MAX64
    with pytest.raises(redcount.ReplyError, match="overflow"):
        c.incr("k")
    assert store.execute("GET", key) == str(MAX64).encode()
    assert c.get("k") == MAX64
    with pytest.raises(redcount.ReplyError):
        c.incr_many({"k": 1})
    assert c.get("k") == MAX64


def test_counter_overflow_with_request_id_leaves_no_id_behind(store: redcount.Store) -> None:
    c = redcount.FixedWindowCounter(store, "ovf", 3600)
    key = c.storage_key("k")
    store.execute("SET", key, MAX64, "PX", 600_000)
    with pytest.raises(redcount.ReplyError, match="overflow"):
        c.incr("k", request_id="r1")
    # The failed increment must not burn its request id, or a retry would be swallowed.
    assert store.execute("EXISTS", key + ":rid:r1") == 0
    store.execute("SET", key, "5", "PX", 600_000)
    assert c.incr("k", request_id="r1") == 6


@pytest.mark.parametrize("mode", MODES)
def test_counter_on_a_non_integer_key_is_a_reply_error(store: redcount.Store, mode: str) -> None:
    c = redcount.FixedWindowCounter(store, "txt", 3600, mode=mode)  # type: ignore[arg-type]
    key = c.storage_key("k")
    store.execute("SET", key, "hello", "PX", 600_000)
    with pytest.raises(redcount.ReplyError, match="not an integer"):
        c.incr("k")
    assert store.execute("GET", key) == b"hello"


@pytest.mark.parametrize("mode", MODES)
def test_counts_beyond_2_53_are_exact(store: redcount.Store, mode: str) -> None:
    # Lua numbers are doubles; the script must still return exact counts.
    c = redcount.FixedWindowCounter(store, "huge", 3600, mode=mode)  # type: ignore[arg-type]
    base = 2**60
    store.execute("SET", c.storage_key("k"), base, "PX", 600_000)
    assert c.incr("k") == base + 1
    assert c.incr("k", 2) == base + 3
    assert c.incr_many({"k": 4}) == {"k": base + 7}
    assert c.get("k") == base + 7
    assert c.incr("fresh", 2**62 + 1) == 2**62 + 1


@pytest.mark.redis_only
@pytest.mark.parametrize("mode", MODES)
def test_counter_sequence_same_on_both_stores(memory_store: redcount.Store, redis_store: redcount.Store,
                                              mode: str) -> None:
    def run(store: redcount.Store) -> list[Any]:
        c = redcount.FixedWindowCounter(store, "cmp", 3600, mode=mode, prefix="p")  # type: ignore[arg-type]
        out: list[Any] = []
        steps: list[Callable[[], Any]] = [
            lambda: c.incr("a"), lambda: c.incr("a", 41), lambda: c.incr(b"b", 7),
            lambda: c.incr_many({"a": 1, "c": 2, "d": 3}), lambda: c.get_many(["a", "b", "c", "zz"]),
            lambda: c.get("d"), lambda: c.ttl("zz"), lambda: c.storage_key("a").rsplit(":", 1)[0],
            lambda: store.execute("SET", c.storage_key("x"), "abc"), lambda: c.incr("x"),
            lambda: store.execute("SET", c.storage_key("y"), "12"), lambda: c.incr("y"),
            lambda: store.execute("PTTL", c.storage_key("y")) > 0, lambda: c.incr("a", 0),
            lambda: sorted(k.rsplit(b":", 1)[0] for k in store.execute("KEYS", "*")),
        ]
        if mode == "script":
            steps += [lambda: c.incr("r", request_id="1"), lambda: c.incr("r", request_id="1"),
                      lambda: c.incr("r", 3, request_id="2")]
        for step in steps:
            try:
                out.append(step())
            except redcount.RedcountError as e:
                out.append(type(e).__name__)
        return out

    mem, red = run(memory_store), run(redis_store)
    assert mem == red
    assert mem[0] == 1 and mem[1] == 42  # and the shared results are the right ones
    assert mem[9] == "ReplyError" and mem[11] == 13 and mem[12] is True and mem[13] == "InvalidInputError"


# --------------------------------------------------------------------------- limiter


def test_limiter_single_limit(store: redcount.Store) -> None:
    lim = redcount.Limiter(store)
    assert lim.strategy == "fixed-window" and lim.prefix == "redcount:lim"
    limit = "3/hour"
    before = store.now()  # each decision's reset_after counts from a later moment
    decisions = [lim.hit(limit, "ip") for _ in range(3)]
    assert [d.allowed for d in decisions] == [True, True, True]
    assert [d.remaining for d in decisions] == [2, 1, 0]
    assert all(d.limit == 3 and d.retry_after == 0 for d in decisions)
    end = (before // 3600 + 1) * 3600
    for d in decisions:
        assert 0 < d.reset_after <= end - before + 0.01
    denied = lim.hit(limit, "ip")
    assert not denied and denied.allowed is False
    assert denied.remaining == 0 and denied.limit == 3
    assert 0 < denied.retry_after <= 3600
    assert abs(denied.retry_after - denied.reset_after) < 0.01
    # Other keys have their own budget.
    assert lim.hit(limit, "other-ip").remaining == 2
    stats = lim.stats(limit, "ip")
    assert len(stats) == 1
    assert (stats[0].count, stats[0].remaining, str(stats[0].limit)) == (3, 0, "3/hour")
    assert 0 < stats[0].reset_after <= 3600
    lim.reset(limit, "ip")
    assert lim.stats(limit, "ip")[0].count == 0
    assert lim.hit(limit, "ip").remaining == 2


def test_limiter_cost(store: redcount.Store) -> None:
    lim = redcount.Limiter(store)
    assert lim.hit("10/hour", "k", 4).remaining == 6
    assert lim.hit("10/hour", "k", 6).remaining == 0
    d = lim.hit("10/hour", "k", 1)
    assert not d
    assert lim.stats("10/hour", "k")[0].count == 10


def test_limiter_multi_limit_fields(store: redcount.Store) -> None:
    wait_for_fresh_window(store, 1.0, 0.5)
    lim = redcount.Limiter(store)
    limits = "5/second;100/hour"
    got = [lim.hit(limits, "ip:203.0.113.9") for _ in range(5)]
    assert all(got)
    assert [d.remaining for d in got] == [4, 3, 2, 1, 0]
    assert all(d.limit == 5 for d in got)  # the per-second limit binds
    assert all(0 < d.reset_after <= 1.0 for d in got)
    before = snapshot(store)
    denied = lim.hit(limits, "ip:203.0.113.9")
    assert not denied
    assert denied.limit == 5 and denied.remaining == 0
    assert 0 < denied.retry_after <= 1.0
    assert snapshot(store) == before  # a denied hit stores nothing
    stats = lim.stats(limits, "ip:203.0.113.9")
    assert [(str(s.limit), s.count, s.remaining) for s in stats] == [("5/second", 5, 0), ("100/hour", 5, 95)]
    # test() decides without charging.
    t = lim.test(limits, "ip:203.0.113.9")
    assert not t and t.retry_after > 0
    assert lim.test(limits, "fresh-ip")
    assert snapshot(store) == before
    # Every limiter key carries a TTL: its window's end plus the limiter's 1 s grace.
    keys = all_keys(store)
    assert len(keys) == 2
    for k in keys:
        now_before = ms(store.now())
        pttl = store.execute("PTTL", k)
        window_ms, index = (int(p) for p in k.split(b":")[-2:])
        deadline = (index + 1) * window_ms + LIMITER_GRACE_MS
        assert 0 < pttl <= deadline - now_before, (k, pttl)
    lim.reset(limits, "ip:203.0.113.9")
    assert all_keys(store) == []


def test_limiter_all_or_nothing_on_the_long_limit(store: redcount.Store) -> None:
    wait_for_fresh_window(store, 1.0, 0.5)  # (the hour is far enough: away_from_hour_boundary)
    lim = redcount.Limiter(store)
    limits = "3/second;4/hour"
    assert lim.hit(limits, "k", 3).remaining == 0
    d = lim.hit(limits, "k", 2)  # refused by both
    assert not d
    assert [s.count for s in lim.stats(limits, "k")] == [3, 3]
    # Another key whose hour is nearly used up: the second limit would allow, the hour refuses.
    assert lim.hit(limits, "j", 3)
    lim.reset("3/second", "j")  # forget the per-second window only
    assert [s.count for s in lim.stats(limits, "j")] == [0, 3]
    before = snapshot(store)
    d = lim.hit(limits, "j", 2)
    assert not d and d.limit == 4 and d.remaining == 1
    assert d.retry_after > 1.0  # waits for the hour, not the second
    assert snapshot(store) == before  # nothing charged to the per-second limit either
    assert lim.hit(limits, "j", 1).remaining == 0


def test_decision_repr_and_limitset(store: redcount.Store) -> None:
    lim = redcount.Limiter(store)
    ls = redcount.parse_limits("2 per hour")
    d = lim.hit(ls, "k")
    assert repr(d).startswith("Decision(allowed=True, limit=2, remaining=1,")
    assert "Limiter(strategy='fixed-window'" in repr(lim)
    assert lim.hit("2/hour", "k").remaining == 0  # the same limit as a string: the same keys
    with pytest.raises(TypeError):
        lim.hit(42, "k")  # type: ignore[arg-type]


def test_limiter_on_a_foreign_value_starts_afresh(store: redcount.Store) -> None:
    # A foreign value that is no count is garbage (test() reads it as
    # nothing, the next hit deletes it), the same on both stores.
    lim = redcount.Limiter(store)
    lim.hit("5/hour", "k")
    (key,) = all_keys(store)
    store.execute("SET", key, "not-a-number")
    assert lim.test("5/hour", "k").remaining == 5
    assert lim.hit("5/hour", "k").remaining == 4
    assert store.execute("GET", key) == b"1"


def test_limiter_with_a_huge_foreign_count(store: redcount.Store) -> None:
    """A foreign write can leave any int64 in a limiter key. count + cost must not
    overflow: such a key denies (test and hit agree), and nothing raises."""
    lim = redcount.Limiter(store)
    lim.hit("5/hour", "k")
    (key,) = all_keys(store)
    for huge in (MAX64, MAX64 - 1, 2**62):
        store.execute("SET", key, huge, "PX", 600_000)
        t = lim.test("5/hour", "k")
        d = lim.hit("5/hour", "k")
        assert (t.allowed, d.allowed) == (False, False), (huge, t, d)
        assert d.remaining == 0 and d.retry_after > 0
        assert lim.stats("5/hour", "k")[0].remaining == 0
        assert store.execute("GET", key) == str(huge).encode()  # a denied hit stores nothing


def test_limiter_with_a_hugely_negative_foreign_count(store: redcount.Store) -> None:
    lim = redcount.Limiter(store)
    lim.hit("5/hour", "k")
    (key,) = all_keys(store)
    store.execute("SET", key, -MAX64 - 1, "PX", 600_000)
    assert lim.test("5/hour", "k")
    d = lim.hit("5/hour", "k")
    assert d
    assert store.execute("GET", key) == str(-MAX64).encode()
    # Far below the limit: at least 4 more hits are allowed, whatever saturates.
    assert d.remaining >= 4, d
    assert lim.stats("5/hour", "k")[0].remaining >= 4


def test_store_basics(store: redcount.Store) -> None:
    assert store.ping() is True
    assert abs(store.now() - time.time()) < 5
    assert store.is_memory == (store.url == "memory://")
    assert repr(store) == f"<redcount.Store:{store.url}>"
