"""What runs in front of a limiter's decisions: allow and deny lists and a cache of refusals
the store made (decided in this process, before any round trip), and escalating penalties
(state in the store).

```python
limiter = redcount.Limiter(store, allow=["10.0.0.0/8", "user:admin"], deny=["203.0.113.0/24"],
                           refusal_cache=10_000)
limiter.hit("100/minute", "10.1.2.3")        # allowed, the store untouched
limiter.hit("100/minute", "203.0.113.9")     # refused, the store untouched
```

[`AccessLists`][redcount.policies.AccessLists] match a key exactly or, when the key is an IP address (or
``"<prefix>:<address>"``, such as ``"ip:2001:db8::1"``, or an IPv6 network the web layer
groups clients into), by IPv4 and IPv6 CIDR. The most specific matching entry wins (an
exact key, then the longest prefix); between an allow and a deny entry of the same
specificity, deny wins.

[`RefusalCache`][redcount.policies.RefusalCache] remembers, per key, the last refusal the store made (limit, cost and
until when), and refuses the same or a larger cost under the same limit locally until then.
It only ever repeats a refusal the store made; it never admits. It is bounded (oldest
entries go first) and thread-safe.

[`Screen`][redcount.policies.Screen] puts the two together for the web integrations. A limiter's own lists,
cache and [`Penalty`][redcount.policies.Penalty] (which blocks a key refused too often, its state in the store)
run in the C++ core, in front of every decision, sync and asyncio alike (the same matching
and caching as here). See docs/penalties.md.
"""

from __future__ import annotations

import ipaddress
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Union

from . import _core
from ._core import Decision, LimitSet
from .errors import InvalidInputError

__all__ = [
    "DENIED_RETRY_AFTER",
    "SCREENED",
    "AccessLists",
    "Entry",
    "Penalty",
    "RefusalCache",
    "access_entries",
    "Screen",
    "config_list",
    "config_penalty",
    "config_size",
]

DENIED_RETRY_AFTER = 86400.0
"""What a deny-listed key is told to wait, in seconds (one day). The lists do not change
while the process runs, so no wait admits it; a finite day keeps ``Retry-After`` a valid
header and tells a well-behaved client to stay away rather than retry at once."""

# One part of a decision across several keys (as in redcount.limiter).
Item = tuple[Union[str, LimitSet], Union[str, bytes]]

Network = Union[ipaddress.IPv4Network, ipaddress.IPv6Network]
Entry = Union[str, bytes, ipaddress.IPv4Address, ipaddress.IPv6Address, ipaddress.IPv4Network, ipaddress.IPv6Network]
"""One entry of an allow or deny list: a key (str or bytes), an IP address or a network."""

SCREENED = ("hit", "test", "hit_all", "test_all", "reset")
"""The limiter methods a screen goes in front of."""


def _network(entry: object, where: str) -> Network | str:
    """One list entry: a network (an address is a /32 or /128) or an exact key."""
    if isinstance(entry, (ipaddress.IPv4Network, ipaddress.IPv6Network)):
        return entry
    if isinstance(entry, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
        return ipaddress.ip_network(entry)
    if isinstance(entry, bytes):
        try:
            entry = entry.decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInputError(f"{where}: entry {entry!r} is not UTF-8") from None
    if not isinstance(entry, str):
        raise InvalidInputError(f"{where}: entry {entry!r} must be a key (str), an IP address or a CIDR like '10.0.0.0/8'")
    if not entry:
        raise InvalidInputError(f"{where}: an empty entry matches no key; remove it")
    head, slash, _ = entry.partition("/")
    try:
        ipaddress.ip_address(head)
    except ValueError:
        return entry  # a key, matched exactly
    try:
        return ipaddress.ip_network(entry, strict=True) if slash else ipaddress.ip_network(head)
    except ValueError as e:
        raise InvalidInputError(f"{where}: entry {entry!r} is not a valid CIDR ({e})") from None


@lru_cache(maxsize=4096)
def _address_of(key: str) -> Network | None:
    """The address (or network) a key names, if it names one: ``"203.0.113.9"``,
    ``"ip:203.0.113.9"``, ``"2001:db8::/64"``."""
    for text in (key, key.partition(":")[2]):
        if not text:
            continue
        try:
            if "/" in text:
                return ipaddress.ip_network(text, strict=False)
            return ipaddress.ip_network(ipaddress.ip_address(text))
        except ValueError:
            continue
    return None


class AccessLists:
    """Allow and deny lists by key and by CIDR. Immutable after construction, so
    thread-safe. Bad entries raise [`InvalidInputError`][redcount.errors.InvalidInputError] naming the entry."""

    def __init__(self, allow: Iterable[Entry] | None = None, deny: Iterable[Entry] | None = None) -> None:
        self.keys: dict[str, bool] = {}
        self.networks: list[tuple[Network, bool]] = []
        for entries, allowed, where in ((deny, False, "deny"), (allow, True, "allow")):
            if entries is None:
                continue
            if isinstance(entries, (str, bytes)):
                raise InvalidInputError(f"{where} must be a list of keys and CIDRs, got the single string {entries!r}")
            for e in entries:
                n = _network(e, where)
                if isinstance(n, str):
                    self.keys.setdefault(n, allowed)  # deny was added first: it wins a tie
                elif (n, not allowed) not in self.networks:
                    self.networks.append((n, allowed))
                elif allowed:
                    continue  # the same network denied already: deny wins
        # Most specific first, deny before allow at one length.
        self.networks.sort(key=lambda na: (-na[0].prefixlen, na[1]))
        # What keys matched by CIDR (the lists never change; the same clients come back).
        self._seen: dict[str, bool | None] = {}

    def __bool__(self) -> bool:
        return bool(self.keys or self.networks)

    def lookup(self, key: str | bytes) -> bool | None:
        """True when ``key`` is allowed, False when denied, None when no entry matches."""
        if isinstance(key, bytes):
            key = key.decode("utf-8", "surrogateescape")
        found = self.keys.get(key)
        if found is not None or not self.networks:
            return found
        seen = self._seen
        if key in seen:
            return seen[key]
        net = _address_of(key)
        found = None
        if net is not None:
            for n, allowed in self.networks:
                if n.version == net.version and net.subnet_of(n):  # type: ignore[arg-type]
                    found = allowed
                    break
        if len(seen) >= 4096:
            seen.clear()  # bounded; a racing thread at worst computes a key again
        seen[key] = found
        return found

    def __repr__(self) -> str:
        return f"AccessLists(keys={len(self.keys)}, networks={len(self.networks)})"


_LIMITS: dict[str, LimitSet] = {}


def limit_set(limit: str | LimitSet) -> LimitSet:
    """``limit`` parsed (cached: the same few strings come back on every call)."""
    if isinstance(limit, LimitSet):
        return limit
    found = _LIMITS.get(limit)
    if found is None:
        found = LimitSet(limit)
        if len(_LIMITS) >= 1024:
            _LIMITS.clear()
        _LIMITS[limit] = found
    return found


def limit_text(limit: str | LimitSet) -> str:
    return limit.text if isinstance(limit, LimitSet) else limit


_SMALLEST: dict[str, int] = {}


def smallest(limit: str | LimitSet) -> int:
    """The amount a decision made without the store reports: the tightest limit's."""
    text = limit_text(limit)
    n = _SMALLEST.get(text)
    if n is None:
        n = min(lim.burst or lim.amount for lim in limit_set(limit).limits)
        if len(_SMALLEST) >= 1024:
            _SMALLEST.clear()
        _SMALLEST[text] = n
    return n


def allowed_decision(limit: str | LimitSet) -> Decision:
    """An allow-listed key: allowed, ``remaining == limit`` (nothing was charged)."""
    n = smallest(limit)
    return Decision._local(True, n, n, 0.0, 0.0)


def denied_decision(limit: str | LimitSet) -> Decision:
    """A deny-listed key: refused, ``remaining`` 0, ``retry_after`` [`DENIED_RETRY_AFTER`][redcount.policies.DENIED_RETRY_AFTER]."""
    return Decision._local(False, smallest(limit), 0, DENIED_RETRY_AFTER, DENIED_RETRY_AFTER)


class RefusalCache:
    """Refusals the store made, per key: ``(limit, cost, until, reset_until, amount)``.

    [`get`][redcount.policies.RefusalCache.get] answers a refusal for the same limit and a cost at least as large until
    ``until`` (the store's ``retry_after`` from when it refused): the store would refuse
    that too, since only time frees units and it was counted in. A different limit for the
    key (a limit change made in this process) drops the entry. At most ``size`` keys; when
    full, expired entries go first, then the oldest. Thread-safe (one lock, held for a dict
    operation, never across a store call)."""

    def __init__(self, size: int, now: Callable[[], float]) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise InvalidInputError(f"refusal_cache must be a number of entries >= 0 (0: off), got {size!r}")
        self.size = size
        self.now = now
        self._map: dict[str | bytes, tuple[str, int, float, float, int]] = {}
        self._lock = threading.Lock()
        self.hits = 0  # refusals answered from the cache (for tests and the bench)

    def __len__(self) -> int:
        return len(self._map)

    def get(self, limit: str | LimitSet, key: str | bytes, cost: int) -> Decision | None:
        """The cached refusal of ``cost`` under ``limit`` for ``key``, if one holds now."""
        entry = self._map.get(key)
        if entry is None:
            return None
        text, refused_cost, until, reset_until, amount = entry
        now = self.now()
        if text != limit_text(limit) or now >= until:
            with self._lock:
                if self._map.get(key) is entry:
                    del self._map[key]
            return None
        if cost < refused_cost:
            return None
        self.hits += 1
        return Decision._local(False, amount, 0, max(reset_until - now, until - now), until - now)

    def put(self, limit: str | LimitSet, key: str | bytes, cost: int, d: Decision) -> None:
        """Remember a refusal the store made (not one decided without it)."""
        if d.allowed or d.unavailable or d.retry_after <= 0:
            return
        now = self.now()
        entry = (limit_text(limit), cost, now + d.retry_after, now + d.reset_after, d.limit)
        with self._lock:
            m = self._map
            if key not in m and len(m) >= self.size:
                for k in [k for k, e in m.items() if e[2] <= now]:
                    del m[k]
                while len(m) >= self.size:
                    del m[next(iter(m))]
            m[key] = entry

    def drop(self, key: str | bytes) -> None:
        """Forget ``key``'s refusal (its state changed in this process: reset, unblock)."""
        with self._lock:
            self._map.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._map.clear()


class Screen:
    """Allow and deny lists and a refusal cache, in front of a limiter's calls.

    ``before`` answers a call without the store when it can; ``after`` records a refusal
    the store made. Thread-safe (both parts are)."""

    def __init__(self, access: AccessLists | None, cache: RefusalCache | None) -> None:
        self.access = access if access else None
        self.cache = cache if cache is not None and cache.size > 0 else None

    def __bool__(self) -> bool:
        return self.access is not None or self.cache is not None

    @classmethod
    def build(
        cls,
        allow: Iterable[Entry] | None,
        deny: Iterable[Entry] | None,
        refusal_cache: int | None,
        now: Callable[[], float],
    ) -> Screen | None:
        """A screen, or None when neither list nor a cache is configured."""
        access = AccessLists(allow, deny) if allow is not None or deny is not None else None
        cache = RefusalCache(0 if refusal_cache is None else refusal_cache, now)  # validates the size
        screen = cls(access, cache)
        return screen if screen else None

    def before(
        self, limit: str | LimitSet, key: str | bytes, cost: int, tag: str | None = None, cached: bool = True
    ) -> Decision | None:
        """A decision without the store, if one can be made (``tag``: the call's, whose state
        the cache files apart; ``cached``: from the refusal cache too)."""
        access = self.access
        if access is not None:
            listed = access.lookup(key)
            if listed is not None:
                return allowed_decision(limit) if listed else denied_decision(limit)
        cache = self.cache
        if cache is not None and cached:
            return cache.get(limit, key if tag is None else state_key(key, tag), cost)
        return None

    def before_all(
        self, items: list[Item], cost: int, tag: str | None = None, cached: bool = True
    ) -> tuple[Decision | None, list[Item]]:
        """For ``hit_all``: a local decision, or the items still to ask the store about
        (allow-listed keys left out). ``tag``: the call's, whose states the cache files apart;
        ``cached``: from the refusal cache too."""
        access, cache = self.access, self.cache if cached else None
        rest: list[Item] = []
        for limit, key in items:
            if access is not None:
                listed = access.lookup(key)
                if listed is False:
                    return denied_decision(limit), []
                if listed:
                    continue
            if cache is not None:
                d = cache.get(limit, key if tag is None else state_key(key, tag), cost)
                if d is not None:
                    return d, []
            rest.append((limit, key))
        if not rest:
            return allowed_decision(items[0][0]) if items else None, []
        return None, rest

    def after_all(self, items: list[Item], cost: int, d: Decision, tag: str | None = None) -> None:
        if self.cache is None or d.allowed or d.unavailable:
            return
        by = d.refused_by
        if by is None:
            return
        text, key = by
        for limit, k in items:
            kt = k.decode("utf-8", "surrogateescape") if isinstance(k, bytes) else k
            if kt == key and any(str(lim) == text for lim in limit_set(limit).limits):
                self.cache.put(limit, k if tag is None else state_key(k, tag), cost, d)
                return

    def drop(self, key: str | bytes) -> None:
        if self.cache is not None:
            self.cache.drop(key)


@dataclass(frozen=True)
class Penalty:
    """An escalating penalty: after ``after`` refusals within ``within`` seconds, the key is
    blocked for ``block`` seconds; a block that starts within ``within`` seconds of the end
    of the key's previous block lasts ``factor`` times as long as that one, up to
    ``max_block``.

    ```python
    limiter = redcount.Limiter(store, penalty=redcount.Penalty(after=5, within=60, block=60))
    ```

    A blocked key is refused (``retry_after``: until the block ends) without being charged;
    refusals during a block do not count, and the count restarts when a block starts.
    [`redcount.Limiter.unblock`][redcount.limiter.Limiter.unblock] lifts a block. Only refusals of ``hit`` count
    (``test`` never charges or counts). Immutable."""

    after: int = 5
    within: float = 60.0
    block: float = 60.0
    factor: float = 2.0
    max_block: float = 3600.0

    def __post_init__(self) -> None:
        # The bounds are those the penalty script (cpp/lua/penalty.lua and its twin) accepts,
        # checked here so that a bad setting fails when it is made, naming the field, not at
        # the first refusal (as a script error under abuse).
        if isinstance(self.after, bool) or not isinstance(self.after, int) or self.after < 1:
            raise InvalidInputError(f"Penalty(after=) must be an int >= 1 (refusals), got {self.after!r}")
        for name in ("within", "block", "factor", "max_block"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v == v or v == float("inf"):
                raise InvalidInputError(f"Penalty({name}=) must be a finite number, got {v!r}")
        # The ranges: the core's PenaltyConfig, which every decision under this penalty uses.
        _core._check_penalty(self.after, self.within, self.block, self.factor, self.max_block)


PENALTY_MAX_SPAN_MS = 2**42
"""The penalty script's bounds: spans (``within``, ``block``, ``max_block``) are whole
milliseconds from 1 to 2^42 (about 139 years, so every sum it makes stays exact), and
``factor`` is from 1 to a million."""
PENALTY_MIN_FACTOR = 1.0
PENALTY_MAX_FACTOR = 1e6


def tagged(key: str | bytes) -> str:
    """``key`` as the storage keys carry it: in braces (its hash tag), escaped as the core does."""
    if isinstance(key, bytes):
        key = key.decode("utf-8", "surrogateescape")
    return "{\\" + key + "}" if key[:1] in ("}", "\\") else "{" + key + "}"


def _glob(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def concurrency_key(prefix: str, key: str | bytes) -> str:
    """The concurrency strategy's key of ``key`` (it has no window after the key)."""
    return f"{prefix}:cc:{tagged(key)}"


def unblock_pattern(prefix: str, key: str | bytes) -> str:
    """Every storage key of ``key`` under ``prefix``: each limit's state and the penalty's."""
    return f"{_glob(prefix)}:*:{_glob(tagged(key))}:*"


def state_key(key: str | bytes, tag: str | None) -> str | bytes:
    """What the refusal cache files a key's state under: the key itself, or for its state
    under a hash tag (``tag=``, a separate state) the key with the tag in front."""
    if tag is None:
        return key
    return f"@{{{tag}}}:" + (key.decode("utf-8", "surrogateescape") if isinstance(key, bytes) else key)


def find_keys_sync(store: Any, pattern: str) -> list[Any]:
    """Every key matching ``pattern`` on every node of ``store`` (each master of a cluster):
    SCAN where the store has it, else KEYS (memory://, where it walks one in-process map)."""
    from .errors import ReplyError

    out: list[Any] = []
    for node in store.nodes():
        try:
            cursor: Any = b"0"
            while True:
                cursor, batch = node.execute("SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
                out.extend(batch)
                if cursor in (b"0", "0", 0):
                    break
        except ReplyError:
            out.extend(node.execute("KEYS", pattern))
    return out


def unblock_sync(store: Any, prefix: str, core: Any, key: str | bytes) -> int:
    """Delete every limit and penalty state of ``key``; the number of keys deleted. One DEL
    on a single server; on a cluster, the keys found on each master are deleted there one
    by one (a ``tag=`` may have put some in a slot of their own)."""
    core._forget(key)  # its refusal in the cache, if any
    pattern = unblock_pattern(prefix, key)
    nodes = store.nodes()
    if len(nodes) == 1:
        n = store.execute("DEL", *find_keys_sync(store, pattern), concurrency_key(prefix, key))
        return n if isinstance(n, int) else 0
    deleted = 0
    for node in nodes:
        found = find_keys_sync(node, pattern)
        if found:
            deleted += sum(r for r in node.execute_many([("DEL", k) for k in found]) if isinstance(r, int))
    n = store.execute("DEL", concurrency_key(prefix, key))
    return deleted + (n if isinstance(n, int) else 0)


async def unblock_async(store: Any, prefix: str, core: Any, key: str | bytes) -> int:
    """The coroutine twin of [`unblock_sync`][redcount.policies.unblock_sync]."""
    from ._aio_runtime import OpFuture
    from .errors import ReplyError

    async def execute(*args: Any) -> Any:
        r = _core.execute_async(store, *args)
        return (await r) if r.__class__ is OpFuture else r

    core._forget(key)  # its refusal in the cache, if any
    pattern = unblock_pattern(prefix, key)
    nodes = store.nodes()
    per_node: list[tuple[Any, list[Any]]] = []
    for node in nodes:  # each master of a cluster; the store itself otherwise
        found: list[Any] = []
        try:
            cursor: Any = b"0"
            while True:
                r = _core.execute_async(node, "SCAN", cursor, "MATCH", pattern, "COUNT", 1000)
                cursor, batch = (await r) if r.__class__ is OpFuture else r
                found.extend(batch)
                if cursor in (b"0", "0", 0):
                    break
        except ReplyError:
            r = _core.execute_async(node, "KEYS", pattern)
            found.extend((await r) if r.__class__ is OpFuture else r)
        per_node.append((node, found))
    if len(nodes) == 1:
        n = await execute("DEL", *per_node[0][1], concurrency_key(prefix, key))
        return n if isinstance(n, int) else 0
    deleted = 0
    for node, found in per_node:
        if found:
            r = _core.execute_many_async(node, [("DEL", k) for k in found])
            deleted += sum(x for x in ((await r) if r.__class__ is OpFuture else r) if isinstance(x, int))
    n = await execute("DEL", concurrency_key(prefix, key))
    return deleted + (n if isinstance(n, int) else 0)


def access_entries(value: object, where: str) -> list[str | bytes]:
    """An allow or deny list as the core takes it: keys (str or bytes) and addresses or CIDRs
    as text. The core checks each entry (empty, not UTF-8, a bad CIDR) and matches them."""
    if value is None:
        return []
    if isinstance(value, (str, bytes)):
        raise InvalidInputError(f"{where} must be a list of keys and CIDRs, got the single string {value!r}")
    out: list[str | bytes] = []
    for e in value:  # type: ignore[attr-defined]
        if isinstance(e, (str, bytes)):
            out.append(e)
        elif isinstance(e, (ipaddress.IPv4Address, ipaddress.IPv6Address)):
            out.append(str(e))
        elif isinstance(e, (ipaddress.IPv4Network, ipaddress.IPv6Network)):
            out.append(e.with_prefixlen)
        else:
            raise InvalidInputError(
                f"{where}: entry {e!r} must be a key (str), an IP address or a CIDR like '10.0.0.0/8'"
            )
    return out


def config_list(value: object, where: str) -> list[Entry] | None:
    """An allow or deny list from configuration: a list, or (environment style) one string
    of entries separated by commas or whitespace."""
    if value is None:
        return None
    if isinstance(value, str):
        return [e for e in value.replace(",", " ").split()]
    if isinstance(value, (list, tuple, set, frozenset)):
        return list(value)
    raise InvalidInputError(f"{where} must be a list of keys and CIDRs (or one comma-separated string), got {value!r}")


def config_size(value: object, where: str) -> int:
    """A refusal cache size from configuration: an int >= 0 or a string of digits."""
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidInputError(f"{where} must be a number of entries >= 0 (0: off), got {value!r}")
    return value


def config_penalty(value: object, where: str) -> Penalty | None:
    """A penalty from configuration: a [`Penalty`][redcount.policies.Penalty], a dict of its arguments, or None."""
    if value is None or isinstance(value, Penalty):
        return value
    if isinstance(value, dict):
        try:
            return Penalty(**value)
        except TypeError as e:
            raise InvalidInputError(f"{where}: {e} (Penalty takes after, within, block, factor, max_block)") from None
        except InvalidInputError as e:
            raise InvalidInputError(f"{where}: {e}") from None
    raise InvalidInputError(f"{where} must be a redcount.Penalty or a dict of its arguments, got {value!r}")
