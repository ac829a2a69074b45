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

[`Screen`][redcount.policies.Screen] puts the two together for [`redcount.Limiter`][redcount.limiter.Limiter], its asyncio twin and
the web integrations. [`Penalty`][redcount.policies.Penalty] blocks a key refused too often ([`Penalties`][redcount.policies.Penalties]
keeps its state in the store). [`Guard`][redcount.policies.Guard] runs the screen and the penalty in front of a
limiter's calls; a limiter without any of them never builds one, so its calls still go
straight to C++. See docs/penalties.md.
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
from .errors import ConnectionError as StoreConnectionError
from .errors import InvalidInputError, ProtocolError

__all__ = [
    "DENIED_RETRY_AFTER",
    "SCREENED",
    "AccessLists",
    "Entry",
    "Guard",
    "Penalties",
    "Penalty",
    "RefusalCache",
    "Screen",
    "check_penalty",
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
        if not PENALTY_MIN_FACTOR <= self.factor <= PENALTY_MAX_FACTOR:
            raise InvalidInputError(
                f"Penalty(factor=) must be between 1 and {PENALTY_MAX_FACTOR:,.0f} (1: every block as long), "
                f"got {self.factor!r}"
            )
        for name in ("within", "block", "max_block"):
            v = getattr(self, name)
            if not 1 <= _whole_ms(v) <= PENALTY_MAX_SPAN_MS:
                raise InvalidInputError(
                    f"Penalty({name}=) must be between 0.001 and {PENALTY_MAX_SPAN_MS / 1000:.3f} seconds "
                    f"(1 ms to 2^42 ms, about 139 years), got {v!r}"
                )
        if _whole_ms(self.max_block) < _whole_ms(self.block):
            raise InvalidInputError(f"Penalty(max_block=) must be >= block ({self.block!r}), got {self.max_block!r}")


PENALTY_MAX_SPAN_MS = 2**42
"""The penalty script's bounds: spans (``within``, ``block``, ``max_block``) are whole
milliseconds from 1 to 2^42 (about 139 years, so every sum it makes stays exact), and
``factor`` is from 1 to a million."""
PENALTY_MIN_FACTOR = 1.0
PENALTY_MAX_FACTOR = 1e6


def _whole_ms(seconds: float) -> int:
    """A span in seconds as the whole milliseconds [`Penalties`][redcount.policies.Penalties] sends the script."""
    return int(seconds * 1000)


def tagged(key: str | bytes) -> str:
    """``key`` as the storage keys carry it: in braces (its hash tag), escaped as the core does."""
    if isinstance(key, bytes):
        key = key.decode("utf-8", "surrogateescape")
    return "{\\" + key + "}" if key[:1] in ("}", "\\") else "{" + key + "}"


class Penalties:
    """The penalty state of a limiter's keys in the store, under the limiter's prefix, every
    key with a TTL: ``<prefix>:pen:{key}:b`` (the block, expiring when it ends), ``:n`` (the
    refusals counted since the first of them, expiring ``within`` after it) and ``:l`` (the
    last block's length, expiring ``within`` after that block's end).

    Two steps: the block check, which goes inside the decision's own script call (the
    limiter core's ``_gated`` calls: no round trip of its own), and, after a refusal only,
    the penalty script (cpp/lua/penalty.lua, with its native twin on memory://), which
    counts the refusal and starts a block atomically. A leased hit, and ``hit_all`` on a
    cluster, still check the block with a PTTL before the decision ([`gate`][redcount.policies.Penalties.gate]).
    Immutable, so thread-safe."""

    def __init__(self, penalty: Penalty, prefix: str) -> None:
        self.penalty = penalty
        self.prefix = prefix
        self.within_ms = _whole_ms(penalty.within)
        self.args = [
            str(penalty.after),
            str(self.within_ms),
            str(_whole_ms(penalty.block)),
            repr(float(penalty.factor)),
            str(_whole_ms(penalty.max_block)),
        ]

    def keys(self, key: str | bytes) -> list[str]:
        base = f"{self.prefix}:pen:{tagged(key)}:"
        return [base + "b", base + "n", base + "l"]

    def block_key(self, key: str | bytes) -> str:
        """The key of ``key``'s block: in the slot of the limit's own keys (same hash tag)."""
        return f"{self.prefix}:pen:{tagged(key)}:b"

    def gate(self, key: str | bytes) -> tuple[str | int, ...]:
        """The block check as a command of its own (where it cannot go in the script)."""
        return ("PTTL", self.block_key(key))

    @staticmethod
    def blocked_for(reply: Any) -> int:
        """The penalty script's reply: the block in force or just started (ms), else 0."""
        if isinstance(reply, list) and reply and isinstance(reply[0], int):
            return reply[0]
        raise ProtocolError(f"the penalty script returned an unexpected reply: {reply!r}")


def blocked_decision(limit: str | LimitSet, ms: int) -> Decision:
    """A key under a penalty block: refused until the block ends."""
    return Decision._local(False, smallest(limit), 0, ms / 1000.0, ms / 1000.0)


def blocked(screen: Screen | None, limit: str | LimitSet, key: str | bytes, ms: int) -> Decision:
    """[`blocked_decision`][redcount.policies.blocked_decision], kept in the refusal cache (if any) until the block ends."""
    d = blocked_decision(limit, ms)
    if screen is not None and screen.cache is not None:
        screen.cache.put(limit, key, 0, d)
    return d


def _glob(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def concurrency_key(prefix: str, key: str | bytes) -> str:
    """The concurrency strategy's key of ``key`` (it has no window after the key)."""
    return f"{prefix}:cc:{tagged(key)}"


def unblock_pattern(prefix: str, key: str | bytes) -> str:
    """Every storage key of ``key`` under ``prefix``: each limit's state and the penalty's."""
    return f"{_glob(prefix)}:*:{_glob(tagged(key))}:*"


class Guard:
    """What runs in front of a limiter's decisions: allow and deny lists, the refusal cache
    (a [`Screen`][redcount.policies.Screen]) and a penalty. Built when one of them is configured, and for a call
    given its own ``penalty=``."""

    def __init__(
        self,
        screen: Screen | None,
        penalties: Penalties | None,
        prefix: str = "redcount:lim",
        unavailable: Callable[[BaseException], Decision] | None = None,
    ) -> None:
        self.screen = screen
        self.penalties = penalties
        self.prefix = prefix
        # What a call whose store failed decides (the limiter's on_unavailable); default: raise.
        self.unavailable = unavailable if unavailable is not None else _reraise
        # With a penalty, every refusal of the store must reach it (to be counted), so the
        # cache keeps only blocks (refusals during a block do not count anyway).
        self.cache_refusals = penalties is None
        self._per_call: dict[Penalty, Penalties] = {}

    def penalties_for(self, penalty: object) -> Penalties | None:
        """A call's penalty state: ``None`` is the limiter's penalty, ``False`` none, a
        [`Penalty`][redcount.policies.Penalty] that one (under the limiter's prefix: the same block and counts
        as the limiter's own penalty for the key)."""
        if penalty is None:
            return self.penalties
        if penalty is False:
            return None
        if not isinstance(penalty, Penalty):
            raise TypeError(
                "penalty must be a redcount.Penalty, None (the limiter's) or False (none for this call), "
                f"got {penalty!r}"
            )
        if self.penalties is not None and self.penalties.penalty == penalty:
            return self.penalties
        found = self._per_call.get(penalty)
        if found is None:
            found = Penalties(penalty, self.prefix)
            if len(self._per_call) >= 64:
                self._per_call.clear()  # bounded; rebuilt on the next call that needs one
            self._per_call[penalty] = found
        return found


def state_key(key: str | bytes, tag: str | None) -> str | bytes:
    """What the refusal cache files a key's state under: the key itself, or for its state
    under a hash tag (``tag=``, a separate state) the key with the tag in front."""
    if tag is None:
        return key
    return f"@{{{tag}}}:" + (key.decode("utf-8", "surrogateescape") if isinstance(key, bytes) else key)


def _reraise(error: BaseException) -> Decision:
    raise error


def check_penalty(penalty: object) -> None:
    """Raises unless ``penalty`` is a per-call ``penalty=`` value: None, False or a Penalty."""
    if penalty is not None and penalty is not False and not isinstance(penalty, Penalty):
        raise TypeError(
            "penalty must be a redcount.Penalty, None (the limiter's) or False (none for this call), "
            f"got {penalty!r}"
        )


def _one_key(
    limit: str | LimitSet, key: str | bytes, cost: int, d: Decision, guard: Guard, pen: Penalties | None
) -> None:
    screen = guard.screen
    if screen is None or screen.cache is None or d.allowed:
        return
    if guard.cache_refusals and pen is None:
        screen.cache.put(limit, key, cost, d)


def _one_slot(store: Any) -> bool:
    """Whether one script call can carry every key of a ``hit_all`` and its block keys:
    true on a single server and on memory://, not on a cluster."""
    try:
        return len(store.nodes()) == 1
    except Exception:  # a store without nodes(): keep the separate check
        return False


def guarded_sync(
    guard: Guard, store: Any, methods: dict[str, Callable[..., Any]], core: Any = None
) -> dict[str, Callable[..., Any]]:
    """The sync limiter's ``hit``, ``test``, ``hit_all``, ``test_all`` and ``reset`` with the
    guard in front (``methods`` are the unguarded ones; ``core`` the limiter's core object,
    whose ``_gated`` calls check a penalty's block in the decision's own round trip)."""
    screen = guard.screen
    execute, execute_many = store.execute, store.execute_many
    unavailable = guard.unavailable
    one_slot = _one_slot(store)

    def one(call: Callable[..., Decision], charge: bool) -> Callable[..., Decision]:
        def guarded(
            limit: str | LimitSet, key: str | bytes, cost: int = 1, *, penalty: object = None, **leased: Any
        ) -> Decision:
            tag = leased.get("tag")
            pen = guard.penalties if penalty is None else guard.penalties_for(penalty)
            if screen is not None:
                d = screen.before(limit, key, cost, tag, pen is not None or guard.cache_refusals)
                if d is not None:
                    return d
            if pen is None:
                d = call(limit, key, cost, **leased)
            elif core is not None and leased.get("lease") is None and tag is None:
                # One round trip: the block check inside the decision's script call.
                try:
                    r = core._gated(limit, key, cost, pen.block_key(key), charge)
                except StoreConnectionError as e:
                    return unavailable(e)
                if r.__class__ is int:
                    return blocked(screen, limit, key, r)
                d = r
            else:
                # A leased hit admits locally, and a state under a tag (tag=) may sit in another
                # slot than the key's block: their block check stays a PTTL of its own.
                try:
                    ms = execute(*pen.gate(key))
                except StoreConnectionError:
                    ms = 0  # the decision itself meets the failure, under on_unavailable
                if isinstance(ms, int) and ms > 0:
                    return blocked(screen, limit, key, ms)
                d = call(limit, key, cost, **leased)
            if d.allowed or d.unavailable:
                return d
            if pen is not None and charge:
                try:
                    ms = pen.blocked_for(_core._penalty(store, pen.keys(key), pen.args))
                except StoreConnectionError:
                    ms = 0  # the refusal stands, uncounted
                if ms > 0:
                    return blocked(screen, limit, key, ms)
            _one_key(limit, state_key(key, tag), cost, d, guard, pen)
            return d

        return guarded

    def many(call: Callable[..., Decision], charge: bool) -> Callable[..., Decision]:
        def guarded(
            items: Iterable[Item],
            cost: int = 1,
            *,
            tag: str | None = None,
            penalty: object = None,
            **leased: int | None,
        ) -> Decision:
            if leased:  # the limiter's own call says what is wrong with them (hit_all refuses lease=)
                return call(items, cost, tag=tag, **leased)
            pen = guard.penalties if penalty is None else guard.penalties_for(penalty)
            rest = list(items)
            if screen is not None:
                d, rest = screen.before_all(rest, cost, tag, pen is not None or guard.cache_refusals)
                if d is not None:
                    return d
            if pen is not None and rest and core is not None and one_slot:
                # One round trip: every key's block checked inside the one script call.
                try:
                    r = core._gated_all(rest, cost, tag, [pen.block_key(k) for _, k in rest], charge)
                except StoreConnectionError as e:
                    return unavailable(e)
                if r.__class__ is int:
                    return blocked_decision(rest[0][0], r)
                d = r
            else:
                if pen is not None and rest:
                    # A cluster decides keys of several slots: the block check is a batch of
                    # its own before the decision.
                    try:
                        waits = execute_many([pen.gate(k) for _, k in rest])
                    except StoreConnectionError:
                        waits = []
                    longest = max((w for w in waits if isinstance(w, int)), default=0)
                    if longest > 0:
                        return blocked_decision(rest[0][0], longest)
                d = call(rest, cost, tag=tag)
            if d.allowed or d.unavailable:
                return d
            if pen is not None and charge and d.refused_by is not None:
                try:
                    ms = pen.blocked_for(_core._penalty(store, pen.keys(d.refused_by[1]), pen.args))
                except StoreConnectionError:
                    ms = 0
                if ms > 0:
                    return blocked_decision(rest[0][0], ms)
            if screen is not None and guard.cache_refusals and pen is None:
                screen.after_all(rest, cost, d, tag)
            return d

        return guarded

    reset = methods["reset"]

    def guarded_reset(limit: str | LimitSet, key: str | bytes, *, tag: str | None = None) -> None:
        if screen is not None:
            screen.drop(state_key(key, tag))
        if tag is None:
            reset(limit, key)
        else:
            reset(limit, key, tag=tag)

    return {
        "hit": one(methods["hit"], True),
        "test": one(methods["test"], False),
        "hit_all": many(methods["hit_all"], True),
        "test_all": many(methods["test_all"], False),
        "reset": guarded_reset,
    }


def guarded_async(
    guard: Guard,
    store: Any,
    methods: dict[str, Callable[..., Any]],
    core: Any = None,
    unavailable: Callable[[BaseException], Decision] | None = None,
) -> dict[str, Callable[..., Any]]:
    """The coroutine twins of [`guarded_sync`][redcount.policies.guarded_sync] (``methods`` are coroutine functions;
    any of the five, each guarded as its sync twin; ``unavailable`` the async limiter's
    on_unavailable, when it differs from the guard's)."""
    from ._aio_runtime import OpFuture, engine_method

    screen = guard.screen
    if unavailable is None:
        unavailable = guard.unavailable
    one_slot = _one_slot(store)
    gated = engine_method(core, "_gated", store) if core is not None else None
    gated_all = engine_method(core, "_gated_all", store) if core is not None else None

    async def execute(*args: Any) -> Any:
        r = _core.execute_async(store, *args)
        return (await r) if r.__class__ is OpFuture else r

    async def execute_many(commands: list[tuple[Any, ...]]) -> Any:
        r = _core.execute_many_async(store, commands)
        return (await r) if r.__class__ is OpFuture else r

    async def penalty_step(pen: Penalties, keys: list[str]) -> Any:
        r = _core._penalty_async(store, keys, pen.args)
        return (await r) if r.__class__ is OpFuture else r

    def one(call: Callable[..., Any], charge: bool) -> Callable[..., Any]:
        async def guarded(
            limit: str | LimitSet, key: str | bytes, cost: int = 1, *, penalty: object = None, **leased: Any
        ) -> Decision:
            tag = leased.get("tag")
            pen = guard.penalties if penalty is None else guard.penalties_for(penalty)
            if screen is not None:
                d = screen.before(limit, key, cost, tag, pen is not None or guard.cache_refusals)
                if d is not None:
                    return d
            got: Decision
            if pen is None:
                got = await call(limit, key, cost, **leased)
            elif gated is not None and leased.get("lease") is None and tag is None:
                try:
                    r = gated(limit, key, cost, pen.block_key(key), charge)
                    if r.__class__ is OpFuture:
                        r = await r
                except StoreConnectionError as e:
                    return unavailable(e)
                if r.__class__ is int:
                    return blocked(screen, limit, key, r)
                got = r
            else:
                try:
                    ms = await execute(*pen.gate(key))
                except StoreConnectionError:
                    ms = 0
                if isinstance(ms, int) and ms > 0:
                    return blocked(screen, limit, key, ms)
                got = await call(limit, key, cost, **leased)
            if got.allowed or got.unavailable:
                return got
            if pen is not None and charge:
                try:
                    ms = pen.blocked_for(await penalty_step(pen, pen.keys(key)))
                except StoreConnectionError:
                    ms = 0
                if ms > 0:
                    return blocked(screen, limit, key, ms)
            _one_key(limit, state_key(key, tag), cost, got, guard, pen)
            return got

        return guarded

    def many(call: Callable[..., Any], charge: bool) -> Callable[..., Any]:
        async def guarded(
            items: Iterable[Item],
            cost: int = 1,
            *,
            tag: str | None = None,
            penalty: object = None,
            **leased: int | None,
        ) -> Decision:
            if leased:  # the limiter's own call says what is wrong with them (hit_all refuses lease=)
                refused: Decision = await call(items, cost, tag=tag, **leased)
                return refused
            pen = guard.penalties if penalty is None else guard.penalties_for(penalty)
            rest = list(items)
            if screen is not None:
                d, rest = screen.before_all(rest, cost, tag, pen is not None or guard.cache_refusals)
                if d is not None:
                    return d
            got: Decision
            if pen is not None and rest and gated_all is not None and one_slot:
                try:
                    r = gated_all(rest, cost, tag, [pen.block_key(k) for _, k in rest], charge)
                    if r.__class__ is OpFuture:
                        r = await r
                except StoreConnectionError as e:
                    return unavailable(e)
                if r.__class__ is int:
                    return blocked_decision(rest[0][0], r)
                got = r
            else:
                if pen is not None and rest:
                    try:
                        waits = await execute_many([pen.gate(k) for _, k in rest])
                    except StoreConnectionError:
                        waits = []
                    longest = max((w for w in waits if isinstance(w, int)), default=0)
                    if longest > 0:
                        return blocked_decision(rest[0][0], longest)
                got = await call(rest, cost, tag=tag)
            if got.allowed or got.unavailable:
                return got
            if pen is not None and charge and got.refused_by is not None:
                try:
                    ms = pen.blocked_for(await penalty_step(pen, pen.keys(got.refused_by[1])))
                except StoreConnectionError:
                    ms = 0
                if ms > 0:
                    return blocked_decision(rest[0][0], ms)
            if screen is not None and guard.cache_refusals and pen is None:
                screen.after_all(rest, cost, got, tag)
            return got

        return guarded

    def reset_of(reset: Callable[..., Any]) -> Callable[..., Any]:
        async def guarded_reset(limit: str | LimitSet, key: str | bytes, *, tag: str | None = None) -> None:
            if screen is not None:
                screen.drop(state_key(key, tag))
            await reset(limit, key, tag=tag)

        return guarded_reset

    makers: dict[str, Callable[[Callable[..., Any]], Callable[..., Any]]] = {
        "hit": lambda m: one(m, True),
        "test": lambda m: one(m, False),
        "hit_all": lambda m: many(m, True),
        "test_all": lambda m: many(m, False),
        "reset": reset_of,
    }
    return {name: makers[name](m) for name, m in methods.items()}


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


def unblock_sync(store: Any, prefix: str, guard: Guard | None, key: str | bytes) -> int:
    """Delete every limit and penalty state of ``key``; the number of keys deleted. One DEL
    on a single server; on a cluster, the keys found on each master are deleted there one
    by one (a ``tag=`` may have put some in a slot of their own)."""
    if guard is not None and guard.screen is not None:
        guard.screen.drop(key)
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


async def unblock_async(store: Any, prefix: str, guard: Guard | None, key: str | bytes) -> int:
    """The coroutine twin of [`unblock_sync`][redcount.policies.unblock_sync]."""
    from ._aio_runtime import OpFuture
    from .errors import ReplyError

    async def execute(*args: Any) -> Any:
        r = _core.execute_async(store, *args)
        return (await r) if r.__class__ is OpFuture else r

    if guard is not None and guard.screen is not None:
        guard.screen.drop(key)
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
