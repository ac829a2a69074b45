"""Storages for the ``limits`` library backed by redcount: the switch for limits,
Flask-Limiter and slowapi apps is one import and a new storage URI.

```python
import redcount.contrib.limits  # registers the schemes below with limits
from limits import storage_from_string, strategies, parse

storage = storage_from_string("redcount+redis://localhost:6379/0")
limiter = strategies.MovingWindowRateLimiter(storage)
limiter.hit(parse("10/minute"), "user:42")

astorage = storage_from_string("async+redcount+redis://localhost:6379/0")  # limits.aio
```

limits finds a storage by the scheme of its URI once the class that declares the scheme has
been defined (a metaclass registry), so importing this module is what makes the schemes
known; nothing is installed into other interpreters or import hooks.

========================================  ===================================================
scheme                                    store ([`redcount.connect`][redcount.store.connect] URL)
========================================  ===================================================
``redcount+redis://h:p/db``               ``redis://h:p/db``
``redcount+rediss://h:p/db?...``          ``rediss://h:p/db?...`` (TLS)
``redcount+unix:///path?db=N``            ``unix:///path?db=N`` (``redcount+redis+unix`` too)
``redcount+redis+cluster://h1:p1,h2:p2``  ``redis+cluster://h1:p1,h2:p2``: a Redis Cluster
``redcount+rediss+cluster://h1:p1,...``   ``rediss+cluster://h1:p1,...`` (TLS)
``redcount+memory://``                    the embedded store, private to the storage
``async+redcount+...``                    the same, for ``limits.aio`` strategies
========================================  ===================================================

On a Redis Cluster each method is one round trip to the master of its key (the sliding
window counter's two keys share a ``{hash tag}``, so one slot); [`RedcountStorage.reset`][redcount.contrib.limits.RedcountStorage.reset]
and [`RedcountStorage.check`][redcount.contrib.limits.RedcountStorage.check] are about the whole store and go to every master
([`redcount.Store.nodes`][redcount.store.Store.nodes]).

``redcount+redis+sentinel://[[user]:pw@]s1:p,s2:p/service[/db]`` (``redcount+rediss+sentinel``
for TLS) opens ``redis+sentinel://...``: the master of a Sentinel service, followed through
failovers; the sentinels' credentials are the ``sentinel_username`` and ``sentinel_password``
options (or limits' ``sentinel_kwargs={"username": ..., "password": ...}``). Every call
goes to the master: limits' ``use_replicas=False`` is accepted, ``use_replicas=True`` refused
(a limiter reading a replica's count, which lags, would admit what the master refused).

Semantics are those of limits' own Redis storage, method for method, and so is the data on
Redis: the same keys (``<key_prefix>:<key>``, ``<key_prefix>:{<key>}`` and
``<key_prefix>:{<key>}/-1`` for the sliding window counter) holding the same types (a
counter string, a list of hit times newest first, two counter strings), so a fleet can move
from ``redis://`` to ``redcount+redis://`` (or from ``redis+cluster://`` to
``redcount+redis+cluster://``) one worker at a time and every worker enforces the same limits
meanwhile. Each method is one round trip (a plain command or one Lua script,
called by EVALSHA). The differences that remain are listed in docs/migrating.md ("Switching from
Flask-Limiter, slowapi or limits").

On the memory store the same logic runs in Python over the store's commands, under a lock
per storage (each ``redcount+memory://`` storage has a store of its own), so it is as atomic
as the scripts are on Redis.

The storages are thread-safe. Options (keyword arguments of ``storage_from_string``, or
Flask-Limiter's ``RATELIMIT_STORAGE_OPTIONS``): ``key_prefix`` (default ``"LIMITS"``),
``wrap_exceptions`` (raise `limits.errors.StorageError` instead of redcount's errors),
and the keyword arguments of [`redcount.connect`][redcount.store.connect] (``connect_timeout``,
``command_timeout``, ``clock``, the ``ssl_*`` options, ``budget``, ``breaker``, ``fallback``...); redis-py's ``socket_timeout`` and
``socket_connect_timeout`` are read as ``command_timeout`` and ``connect_timeout``.
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, TypeVar

try:
    from limits.aio.storage import MovingWindowSupport as _AsyncMovingWindowSupport
    from limits.aio.storage import SlidingWindowCounterSupport as _AsyncSlidingWindowCounterSupport
    from limits.aio.storage import Storage as _AsyncStorage
    from limits.storage import MovingWindowSupport, SlidingWindowCounterSupport, Storage
except ImportError as exc:
    raise ImportError(
        f"redcount.contrib.limits needs the limits library ({exc.name} is missing): pip install 'redcount[limits]'"
    ) from exc

from .. import errors
from .._core import ManualClock
from ..aio import AsyncStore
from ..store import Store, connect

__all__ = ["AsyncRedcountStorage", "RedcountStorage", "SCHEMES"]

T = TypeVar("T")

SCHEMES: dict[str, str] = {
    # One Redis server, or the embedded store.
    "redcount+redis": "redis",
    "redcount+rediss": "rediss",
    "redcount+unix": "unix",
    "redcount+redis+unix": "unix",
    "redcount+memory": "memory",
    # A Redis Cluster: every key of one method shares a slot (the sliding window's two keys
    # share a {hash tag}), so each method is still one round trip, to the key's master;
    # reset and check go to every master (Store.nodes()).
    "redcount+redis+cluster": "redis+cluster",
    "redcount+rediss+cluster": "rediss+cluster",
    # Other topologies: one block each, mapping our scheme to its redcount.connect() scheme.
}
"""Our schemes (without ``async+``) and the [`redcount.connect`][redcount.store.connect] scheme each maps to."""

# Redis Sentinel: the store asks the sentinels for the master and follows it.
SCHEMES.update({"redcount+redis+sentinel": "redis+sentinel", "redcount+rediss+sentinel": "rediss+sentinel"})

# redis-py's names for options a limits user may already pass, and ours.
_OPTION_ALIASES = {"socket_timeout": "command_timeout", "socket_connect_timeout": "connect_timeout"}
_CONNECT_OPTIONS = frozenset({
    "connect_timeout", "command_timeout", "max_connections", "connections", "keepalive", "pool_timeout",
    "clock", "sweep_interval", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs",
    "ssl_check_hostname", "ssl_server_name",
    "budget", "breaker", "fallback",
})  # fmt: skip
_CONNECT_OPTIONS |= {"sentinel_username", "sentinel_password"}


class _Script(NamedTuple):
    source: str
    sha: str


def _script(source: str) -> _Script:
    return _Script(source, hashlib.sha1(source.encode()).hexdigest())


# Each script is one of limits' storage methods, atomic on the server. They keep limits'
# data layout so that limits' own storage and ours can share a Redis.

# incr: a counter that gets its TTL when it is created. A counter found without a TTL
# (PERSIST, a foreign SET) gets one back, so a key can never count forever.
_INCR = _script("""
local n = redis.call('INCRBY', KEYS[1], ARGV[2])
if n == tonumber(ARGV[2]) or redis.call('TTL', KEYS[1]) == -1 then
  redis.call('EXPIRE', KEYS[1], ARGV[1])
end
return n
""")

# acquire_entry: the moving window is a list of hit times, newest first, at most `limit`
# long. `amount` more fit when the hit that would then be the oldest counted one (index
# limit - amount) is missing or older than the window.
_ACQUIRE_MOVING = _script("""
local now, limit, amount = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[4])
if amount > limit then return false end
local edge = redis.call('LINDEX', KEYS[1], limit - amount)
if edge and tonumber(edge) >= now - tonumber(ARGV[3]) then return false end
local chunk = {}
for i = 1, math.min(amount, 4096) do chunk[i] = ARGV[1] end
local left = amount
while left > 0 do
  local n = math.min(left, 4096)
  redis.call('LPUSH', KEYS[1], unpack(chunk, 1, n))
  left = left - n
end
redis.call('LTRIM', KEYS[1], 0, limit - 1)
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
""")

# get_moving_window: the hits since ARGV[1] among the newest `limit` are a prefix of the
# list (it is sorted newest first); binary search for its end. Returns {oldest, count}.
_MOVING_WINDOW = _script("""
local since = tonumber(ARGV[1])
local lo, hi, last, oldest = 0, tonumber(ARGV[2]) - 1, -1, nil
while lo <= hi do
  local mid = math.floor((lo + hi) / 2)
  local t = redis.call('LINDEX', KEYS[1], mid)
  if t and tonumber(t) >= since then
    last, oldest, lo = mid, t, mid + 1
  else
    hi = mid - 1
  end
end
if last < 0 then return false end
return {oldest, last + 1}
""")

# The sliding window counter: KEYS[1] the previous window's count, KEYS[2] the current
# one's, which is created to live two windows. Once less than a window of its life is left
# it has become the previous window: it moves there (keeping its TTL, which is then the
# weight of its count) and a new empty current window starts.
_SLIDING_PRELUDE = """
local window_ms = tonumber(ARGV[1]) * 1000
local ttl = redis.call('PTTL', KEYS[2])
if ttl > 0 and ttl < window_ms then
  redis.call('RENAME', KEYS[2], KEYS[1])
  redis.call('SET', KEYS[2], 0, 'PX', ttl + window_ms)
end
local prev = tonumber(redis.call('GET', KEYS[1])) or 0
local prev_ttl = math.max(redis.call('PTTL', KEYS[1]), 0)
local cur = tonumber(redis.call('GET', KEYS[2])) or 0
local cur_ttl = math.max(redis.call('PTTL', KEYS[2]), 0)
"""

# get_sliding_window: {previous count, its TTL in ms, current count, its TTL in ms}.
_SLIDING_WINDOW = _script(_SLIDING_PRELUDE + "return {prev, prev_ttl, cur, cur_ttl}\n")

# acquire_sliding_window_entry (ARGV: expiry, limit, amount): the previous count weighted
# by the part of it still in the window, plus the current count, plus amount, must fit.
_ACQUIRE_SLIDING = _script("""
local limit, amount = tonumber(ARGV[2]), tonumber(ARGV[3])
if amount > limit then return false end
""" + _SLIDING_PRELUDE + """
if math.floor(prev * prev_ttl / window_ms) + cur + amount > limit then return false end
if redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call('INCRBY', KEYS[2], amount)
else
  redis.call('SET', KEYS[2], amount, 'PX', window_ms * 2)
end
return 1
""")

# reset: every key under the prefix (a KEYS pattern), deleted in slices; the count deleted.
_RESET = _script("""
local keys = redis.call('KEYS', ARGV[1])
local n = 0
for i = 1, #keys, 4096 do
  n = n + redis.call('DEL', unpack(keys, i, math.min(i + 4095, #keys)))
end
return n
""")

_GLOB_SPECIAL = re.compile(r"([*?\[\]\\])")

# The memory store keeps a moving window as one string of (time, count) runs, newest first,
# in the field "runs" of a hash (a hash, so that a counter command on it is WRONGTYPE, as a
# list is on Redis): a hit of cost n is one run, not n entries, so a window of a million
# hits stays small.
_RUN = struct.Struct("<dq")


def _decode_runs(blob: object) -> list[tuple[float, int]]:
    if not isinstance(blob, bytes):
        return []
    return [_RUN.unpack_from(blob, i) for i in range(0, len(blob), _RUN.size)]


def _encode_runs(runs: Sequence[tuple[float, int]]) -> bytes:
    return b"".join(_RUN.pack(t, n) for t, n in runs)


def _nth_time(runs: Sequence[tuple[float, int]], index: int) -> float | None:
    """The time of the hit at ``index`` (0 = newest), None past the end."""
    for t, n in runs:
        if index < n:
            return t
        index -= n
    return None


def _int(value: object) -> int:
    return int(value) if isinstance(value, (bytes, int)) else 0


_RESET_SLICE = 4096  # keys deleted per round trip by a reset on a cluster


def _one_key_dels(keys: list[Any]) -> Iterator[list[tuple[str | bytes | int | float, ...]]]:
    """``DEL key`` for each key (bytes, as KEYS answers), in batches of one round trip."""
    for i in range(0, len(keys), _RESET_SLICE):
        yield [("DEL", k) for k in keys[i : i + _RESET_SLICE]]


def _deleted(replies: Sequence[object]) -> int:
    """The keys a batch of one-key DELs deleted. A key whose slot moved away since KEYS listed
    it answers MOVED (an error string here): its new master's reset deletes it."""
    return sum(r for r in replies if isinstance(r, int))


def _store_url(uri: str) -> str:
    scheme, sep, rest = uri.partition("://")
    scheme = scheme.removeprefix("async+")
    if not sep or scheme not in SCHEMES:
        known = ", ".join(f"{s}://" for s in SCHEMES)
        raise errors.InvalidInputError(f"not a redcount storage scheme: {scheme!r}; use one of {known}")
    return f"{SCHEMES[scheme]}://{rest}"


def _open_store(uri: str, options: dict[str, Any]) -> Store:
    kwargs: dict[str, Any] = {}
    options = dict(options)
    # limits' own Sentinel storage takes the sentinels' credentials as redis-py's
    # sentinel_kwargs; only those two keys mean anything here.
    sentinel_kwargs = options.pop("sentinel_kwargs", None)
    if sentinel_kwargs is not None:
        unknown = set(sentinel_kwargs) - {"username", "password"}
        if unknown:
            raise errors.InvalidInputError(
                f"sentinel_kwargs takes username and password only, got {', '.join(sorted(map(str, unknown)))}"
            )
        for key in ("username", "password"):
            if key in sentinel_kwargs:
                options.setdefault(f"sentinel_{key}", sentinel_kwargs[key])
    # limits' Sentinel storage may read from a replica (use_replicas, default True there).
    # Every call here goes to the master: False is what the storage does, True is refused,
    # since a limiter deciding on a replica's count admits what the master already refused.
    if "use_replicas" in options:
        use_replicas = options.pop("use_replicas")
        if not _store_url(uri).partition("://")[0].endswith("+sentinel"):
            raise errors.InvalidInputError(
                "use_replicas is an option of the Sentinel schemes only "
                "(redcount+redis+sentinel://, redcount+rediss+sentinel://)"
            )
        if not isinstance(use_replicas, bool):
            raise errors.InvalidInputError(f"use_replicas must be True or False, got {use_replicas!r}")
        if use_replicas:
            raise errors.InvalidInputError(
                "use_replicas=True is not supported: every call goes to the master, since a count read "
                "from a replica can be stale (replication lags) and a limiter deciding on it admits "
                "hits the master already counted; pass use_replicas=False or leave it out"
            )
    for name, value in options.items():
        name = _OPTION_ALIASES.get(name, name)
        if name not in _CONNECT_OPTIONS:
            known = ", ".join(sorted(_CONNECT_OPTIONS | _OPTION_ALIASES.keys()))
            raise errors.InvalidInputError(
                f"unknown option {name!r} for a redcount limits storage; it takes key_prefix, wrap_exceptions and "
                f"redcount.connect()'s options: {known}"
            )
        kwargs[name] = value
    return connect(_store_url(uri), **kwargs)


class _Op(NamedTuple):
    """One storage method: how Redis runs it (a script or a plain command, then ``finish`` on
    the reply) and how the memory store does (``memory``, under the storage's lock)."""

    script: _Script | None
    args: tuple[str | bytes | int | float, ...]  # the script's (numkeys, keys..., argv...) or a command
    finish: Callable[[Any], Any]
    memory: Callable[[], Any]


def _same(reply: Any) -> Any:
    return reply


class _Core:
    """What the sync and async storages share: the store, the key layout, and each method
    as an `_Op`. Thread-safe."""

    def __init__(self, uri: str, key_prefix: str, options: dict[str, Any]) -> None:
        if not isinstance(key_prefix, str):
            raise TypeError(f"key_prefix must be a str, got {type(key_prefix).__name__}")
        self.store = _open_store(uri, options)
        self.astore = AsyncStore(self.store)
        self.key_prefix = key_prefix
        self.memory = self.store.is_memory
        # A cluster node runs no script that touches keys it was not given (_RESET's KEYS and
        # DEL), so there reset reads each master's keys and deletes them one per command.
        self.cluster = self.store.url.partition("://")[0].endswith("+cluster")
        self.lock = threading.Lock()
        # Hit times as limits takes them: time.time() to the µs (the store's now() counts
        # whole ms, which moves a hit across a window's edge), or a ManualClock's time.
        self.clock: ManualClock | None = options.get("clock")

    def now(self) -> float:
        """The time of a hit: the ``clock=`` option's, else ``time.time()`` read at each call
        (not a reference kept from start-up), so that a clock patched later by a test
        (``mock.patch("time.time")``, freezegun, time-machine, hiro) is the one used, as by
        limits' own storages."""
        clock = self.clock
        return clock.now() if clock is not None else time.time()

    # Keys, as limits' Redis storage names them.
    def key(self, key: str) -> str:
        return f"{self.key_prefix}:{key}"

    def sliding_keys(self, key: str) -> tuple[str, str]:
        return f"{self.key_prefix}:{{{key}}}/-1", f"{self.key_prefix}:{{{key}}}"

    # Running an op.
    def run(self, op: _Op) -> Any:
        if self.memory:
            with self.lock:
                return op.memory()
        return self._run_on(self.store, op)

    def run_each(self, op: _Op) -> list[Any]:
        """``op`` on each master ([`Store.nodes`][redcount.store.Store.nodes]: every master of a Redis Cluster, the store
        itself otherwise), for what is about the whole store rather than one key: a PING to a
        cluster store reaches only one of its nodes."""
        if self.memory:
            with self.lock:
                return [op.memory()]
        return [self._run_on(node, op) for node in self.store.nodes()]

    @staticmethod
    def _run_on(store: Store, op: _Op) -> Any:
        if op.script is None:
            return op.finish(store.execute(*op.args))
        try:
            reply = store.execute("EVALSHA", op.script.sha, *op.args)
        except errors.ReplyError as e:
            if not str(e).startswith("NOSCRIPT"):
                raise
            # NOSCRIPT: the script did not run (a restart, SCRIPT FLUSH, a failover); EVAL
            # runs it and caches it again.
            reply = store.execute("EVAL", op.script.source, *op.args)
        return op.finish(reply)

    async def run_async(self, op: _Op) -> Any:
        if self.memory:
            # The memory store answers inline: nothing to wait for, so the loop is not held.
            with self.lock:
                return op.memory()
        return await self._run_on_async(self.astore, op)

    async def run_each_async(self, op: _Op) -> list[Any]:
        """`run_each` for ``limits.aio``: the masters are asked concurrently."""
        if self.memory:
            with self.lock:
                return [op.memory()]
        nodes = [AsyncStore(n) for n in self.store.nodes()]
        return list(await asyncio.gather(*(self._run_on_async(node, op) for node in nodes)))

    @staticmethod
    async def _run_on_async(astore: AsyncStore, op: _Op) -> Any:
        if op.script is None:
            return op.finish(await astore.execute(*op.args))
        try:
            reply = await astore.execute("EVALSHA", op.script.sha, *op.args)
        except errors.ReplyError as e:
            if not str(e).startswith("NOSCRIPT"):
                raise
            reply = await astore.execute("EVAL", op.script.source, *op.args)
        return op.finish(reply)

    def reset_all(self) -> int:
        """Deletes every key under the prefix on every master; the number deleted."""
        if not self.cluster:
            return sum(self.run_each(self.reset()))
        pattern, n = self.reset_pattern(), 0
        for node in self.store.nodes():
            keys = node.execute("KEYS", pattern)
            assert isinstance(keys, list)
            for dels in _one_key_dels(keys):
                n += _deleted(node.execute_many(dels))
        return n

    async def reset_all_async(self) -> int:
        """`reset_all` for ``limits.aio``: the masters are cleared concurrently."""
        if not self.cluster:
            return sum(await self.run_each_async(self.reset()))
        pattern = self.reset_pattern()

        async def clear(node: AsyncStore) -> int:
            keys = await node.execute("KEYS", pattern)
            assert isinstance(keys, list)
            n = 0
            for dels in _one_key_dels(keys):
                n += _deleted(await node.execute_many(dels))
            return n

        return sum(await asyncio.gather(*(clear(AsyncStore(n)) for n in self.store.nodes())))

    # The methods of limits' Storage.
    def incr(self, key: str, expiry: int, amount: int) -> _Op:
        k = self.key(key)

        def memory() -> int:
            n = self.store.execute("INCRBY", k, amount)
            assert isinstance(n, int)
            if n == amount or self.store.execute("TTL", k) == -1:
                self.store.execute("EXPIRE", k, expiry)
            return n

        return _Op(_INCR, (1, k, expiry, amount), int, memory)

    def get(self, key: str) -> _Op:
        k = self.key(key)
        return _Op(None, ("GET", k), _int, lambda: _int(self.store.execute("GET", k)))

    def get_expiry(self, key: str) -> _Op:
        k = self.key(key)

        def finish(ttl: Any) -> float:
            return max(int(ttl), 0) + self.now()

        return _Op(None, ("TTL", k), finish, lambda: finish(self.store.execute("TTL", k)))

    def clear(self, *keys: str) -> _Op:
        ks = [self.key(k) for k in keys]
        return _Op(None, ("DEL", *ks), lambda _: None, lambda: self.store.execute("DEL", *ks) and None)

    def reset_pattern(self) -> str:
        return _GLOB_SPECIAL.sub(r"\\\1", self.key_prefix) + ":*"

    def reset(self) -> _Op:
        pattern = self.reset_pattern()

        def memory() -> int:
            keys = self.store.execute("KEYS", pattern)
            assert isinstance(keys, list)
            n = 0
            for i in range(0, len(keys), 4096):
                deleted = self.store.execute("DEL", *keys[i : i + 4096])  # type: ignore[arg-type]
                assert isinstance(deleted, int)
                n += deleted
            return n

        return _Op(_RESET, (0, pattern), int, memory)

    def ping(self) -> _Op:
        return _Op(None, ("PING",), lambda _: True, lambda: self.store.execute("PING") and True)

    # MovingWindowSupport.
    def acquire_entry(self, key: str, limit: int, expiry: int, amount: int) -> _Op:
        k = self.key(key)
        now = self.now()

        def memory() -> bool:
            if amount > limit:
                return False
            runs = _decode_runs(self.store.execute("HGET", k, "runs"))
            edge = _nth_time(runs, limit - amount)
            if edge is not None and edge >= now - expiry:
                return False
            runs.insert(0, (now, amount))
            kept: list[tuple[float, int]] = []
            room = limit
            for t, n in runs:
                if room <= 0:
                    break
                kept.append((t, min(n, room)))
                room -= n
            self.store.execute("HSET", k, "runs", _encode_runs(kept))
            self.store.execute("EXPIRE", k, expiry)
            return True

        return _Op(_ACQUIRE_MOVING, (1, k, now, limit, expiry, amount), bool, memory)

    def get_moving_window(self, key: str, limit: int, expiry: int) -> _Op:
        k = self.key(key)
        now = self.now()

        def finish(reply: Any) -> tuple[float, int]:
            if not reply:
                return now, 0
            return float(reply[0]), int(reply[1])

        def memory() -> tuple[float, int]:
            count, oldest, room = 0, now, limit
            for t, n in _decode_runs(self.store.execute("HGET", k, "runs")):
                if room <= 0 or t < now - expiry:
                    break
                taken = min(n, room)
                count, oldest, room = count + taken, t, room - taken
            return oldest, count

        return _Op(_MOVING_WINDOW, (1, k, now - expiry, limit), finish, memory)

    # SlidingWindowCounterSupport.
    def _sliding_state(self, previous: str, current: str, window_ms: int) -> tuple[int, int, int, int]:
        """The memory twin of _SLIDING_PRELUDE: shift an expired current window, then read."""
        ex = self.store.execute
        ttl = ex("PTTL", current)
        assert isinstance(ttl, int)
        if 0 < ttl < window_ms:
            ex("SET", previous, _int(ex("GET", current)), "PX", ttl)  # as RENAME: value and TTL
            ex("SET", current, 0, "PX", ttl + window_ms)
        prev_ttl, cur_ttl = ex("PTTL", previous), ex("PTTL", current)
        assert isinstance(prev_ttl, int) and isinstance(cur_ttl, int)
        return _int(ex("GET", previous)), max(prev_ttl, 0), _int(ex("GET", current)), max(cur_ttl, 0)

    def acquire_sliding_window_entry(self, key: str, limit: int, expiry: int, amount: int) -> _Op:
        previous, current = self.sliding_keys(key)
        window_ms = expiry * 1000

        def memory() -> bool:
            if amount > limit:
                return False
            prev, prev_ttl, cur, _ = self._sliding_state(previous, current, window_ms)
            if prev * prev_ttl // window_ms + cur + amount > limit:
                return False
            if self.store.execute("EXISTS", current):
                self.store.execute("INCRBY", current, amount)
            else:
                self.store.execute("SET", current, amount, "PX", window_ms * 2)
            return True

        return _Op(_ACQUIRE_SLIDING, (2, previous, current, expiry, limit, amount), bool, memory)

    def get_sliding_window(self, key: str, expiry: int) -> _Op:
        previous, current = self.sliding_keys(key)

        def finish(reply: Any) -> tuple[int, float, int, float]:
            prev, prev_ttl, cur, cur_ttl = (int(v) for v in reply)
            return prev, prev_ttl / 1000, cur, cur_ttl / 1000

        return _Op(
            _SLIDING_WINDOW,
            (2, previous, current, expiry),
            finish,
            lambda: finish(self._sliding_state(previous, current, expiry * 1000)),
        )

    def clear_sliding_window(self, key: str) -> _Op:
        ks = list(self.sliding_keys(key))
        return _Op(None, ("DEL", *ks), lambda _: None, lambda: self.store.execute("DEL", *ks) and None)


class RedcountStorage(Storage, MovingWindowSupport, SlidingWindowCounterSupport):
    """A limits storage on a redcount store (Redis or memory): fixed window, moving window
    and sliding window counter strategies. ``storage`` is the [`redcount.Store`][redcount.store.Store].
    Thread-safe."""

    STORAGE_SCHEME = list(SCHEMES)

    def __init__(
        self,
        uri: str,
        wrap_exceptions: bool = False,
        key_prefix: str = "LIMITS",
        **options: Any,
    ) -> None:
        """A storage for the URL ``uri``.

        Args:
            uri: one of [`SCHEMES`][redcount.contrib.limits.SCHEMES] (``redcount+redis://``, ``redcount+rediss://``,
                ``redcount+unix://``, ``redcount+redis+cluster://``, ``redcount+memory://``...) and the
                rest of a [`redcount.connect`][redcount.store.connect] URL.
            wrap_exceptions: raise `limits.errors.StorageError` (with the redcount error as
                ``storage_error``) instead of the redcount error.
            key_prefix: the prefix of every key, as in limits' Redis storage.
            options: keyword arguments of [`redcount.connect`][redcount.store.connect].
        """
        super().__init__(uri, wrap_exceptions=wrap_exceptions)
        self._core = _Core(uri, key_prefix, options)
        self.storage: Store = self._core.store
        self.key_prefix = key_prefix

    @property
    def base_exceptions(self) -> type[Exception] | tuple[type[Exception], ...]:
        return errors.RedcountError

    def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        return int(self._core.run(self._core.incr(key, expiry, amount)))

    def get(self, key: str) -> int:
        return int(self._core.run(self._core.get(key)))

    def get_expiry(self, key: str) -> float:
        return float(self._core.run(self._core.get_expiry(key)))

    def check(self) -> bool:
        """True when every master answers a PING."""
        try:
            return all(self._core.run_each(self._core.ping()))
        except Exception:  # a health check answers, it does not raise
            return False

    def reset(self) -> int | None:
        """Deletes every key under ``key_prefix``, on every master; the number deleted."""
        return self._core.reset_all()

    def clear(self, key: str) -> None:
        self._core.run(self._core.clear(key))

    def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        return bool(self._core.run(self._core.acquire_entry(key, limit, expiry, amount)))

    def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:
        result: tuple[float, int] = self._core.run(self._core.get_moving_window(key, limit, expiry))
        return result

    def acquire_sliding_window_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        return bool(self._core.run(self._core.acquire_sliding_window_entry(key, limit, expiry, amount)))

    def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        result: tuple[int, float, int, float] = self._core.run(self._core.get_sliding_window(key, expiry))
        return result

    def clear_sliding_window(self, key: str, expiry: int) -> None:
        self._core.run(self._core.clear_sliding_window(key))

    def __repr__(self) -> str:
        return f"RedcountStorage({self.storage.url!r}, key_prefix={self.key_prefix!r})"


class AsyncRedcountStorage(_AsyncStorage, _AsyncMovingWindowSupport, _AsyncSlidingWindowCounterSupport):
    """The ``limits.aio`` twin of [`RedcountStorage`][redcount.contrib.limits.RedcountStorage] (schemes ``async+redcount+...``).
    On Redis no call blocks the event loop: each is one request handed to the store's I/O
    thread. ``storage`` is the [`redcount.Store`][redcount.store.Store]. Thread-safe."""

    STORAGE_SCHEME = [f"async+{s}" for s in SCHEMES]

    def __init__(
        self,
        uri: str,
        wrap_exceptions: bool = False,
        key_prefix: str = "LIMITS",
        implementation: str | None = None,
        **options: Any,
    ) -> None:
        """The arguments of [`RedcountStorage`][redcount.contrib.limits.RedcountStorage]. ``implementation`` (limits' choice of
        async Redis client) is accepted and ignored: redcount is the client."""
        super().__init__(uri, wrap_exceptions=wrap_exceptions)
        self._core = _Core(uri, key_prefix, options)
        self.storage: Store = self._core.store
        self.key_prefix = key_prefix

    @property
    def base_exceptions(self) -> type[Exception] | tuple[type[Exception], ...]:
        return errors.RedcountError

    async def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        return int(await self._core.run_async(self._core.incr(key, expiry, amount)))

    async def get(self, key: str) -> int:
        return int(await self._core.run_async(self._core.get(key)))

    async def get_expiry(self, key: str) -> float:
        return float(await self._core.run_async(self._core.get_expiry(key)))

    async def check(self) -> bool:
        """True when every master answers a PING."""
        try:
            return all(await self._core.run_each_async(self._core.ping()))
        except Exception:  # a health check answers, it does not raise
            return False

    async def reset(self) -> int | None:
        """Deletes every key under ``key_prefix``, on every master; the number deleted."""
        return await self._core.reset_all_async()

    async def clear(self, key: str) -> None:
        await self._core.run_async(self._core.clear(key))

    async def acquire_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        return bool(await self._core.run_async(self._core.acquire_entry(key, limit, expiry, amount)))

    async def get_moving_window(self, key: str, limit: int, expiry: int) -> tuple[float, int]:
        result: tuple[float, int] = await self._core.run_async(self._core.get_moving_window(key, limit, expiry))
        return result

    async def acquire_sliding_window_entry(self, key: str, limit: int, expiry: int, amount: int = 1) -> bool:
        return bool(await self._core.run_async(self._core.acquire_sliding_window_entry(key, limit, expiry, amount)))

    async def get_sliding_window(self, key: str, expiry: int) -> tuple[int, float, int, float]:
        result: tuple[int, float, int, float] = await self._core.run_async(self._core.get_sliding_window(key, expiry))
        return result

    async def clear_sliding_window(self, key: str, expiry: int) -> None:
        await self._core.run_async(self._core.clear_sliding_window(key))

    def __repr__(self) -> str:
        return f"AsyncRedcountStorage({self.storage.url!r}, key_prefix={self.key_prefix!r})"
