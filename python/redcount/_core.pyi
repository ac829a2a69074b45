"""Type stub for redcount._core, the pybind11 module over the C++ core.

Checked against the compiled module by ``python -m mypy.stubtest redcount._core`` in the
test command, so it cannot drift.
"""

import builtins
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Literal

class RedcountError(Exception):
    """Base class of every error redcount raises."""
class InvalidInputError(RedcountError, ValueError):
    """A bad argument (empty or huge key, non-UTF-8 bytes, window <= 0, bad limit string, bad URL...).
    Raised before anything is sent or stored. Also a ValueError."""
class ConnectionError(RedcountError, builtins.ConnectionError):
    """The store could not be reached: refused, reset, unknown host, closed. Transient. `maybe_applied`
    is True when the request had been sent (it may or may not have run), False when it certainly
    did not run."""
    maybe_applied: bool
    """True when the request had been sent before the failure (it may or may not have run;
    redcount never resends it), False when it certainly did not run."""
    outcomes: list[Value | ReplyError] | None
    """None, or, for a batch spread over Redis Cluster nodes of which some answered and one was
    lost, one entry per request: its reply (a [`ReplyError`][redcount.errors.ReplyError] for an error reply),
    [`Outcome.MAYBE`][redcount.errors.Outcome.MAYBE] (written, unanswered) or [`Outcome.NOT_SENT`][redcount.errors.Outcome.NOT_SENT]; retry only those."""

class StoreClosed(ConnectionError):
    """The store was closed: nothing was sent. Not transient: a retry cannot help."""
class TimeoutError(ConnectionError, builtins.TimeoutError):
    """A connect, command or pool timeout expired. A sent command may or may not have run."""
class Unavailable(ConnectionError):
    """The store could not decide within the budget, or its circuit breaker is open
    ([`redcount.connect`][redcount.store.connect]``(url, budget=..., fallback=...)``). A [`ConnectionError`][redcount.errors.ConnectionError]."""
class ProtocolError(RedcountError):
    """The server's reply was not what the protocol allows."""
class ReplyError(RedcountError):
    """The server answered with an error reply (ERR, WRONGTYPE, READONLY...)."""
class AuthenticationError(ReplyError):
    """AUTH failed or the server needs a password: check the URL."""
class ScriptError(ReplyError):
    """A Lua script failed on the server."""
class RetryQueueFull(RedcountError):
    """The retry queue is full: the increment was neither applied nor queued."""

class ManualClock:
    """A clock that only moves when told to, for the memory store: windows turn over and keys expire
    exactly when you advance it. Thread-safe."""
    def __init__(self, start: float = 1700000000.0) -> None: ...
    def now(self) -> float:
        """Current time in seconds since the epoch."""
    def set(self, t: float) -> None:
        """Jump to `t` seconds since the epoch."""
    def advance(self, seconds: float) -> None:
        """Move forward by `seconds` (millisecond precision)."""

Value = int | bytes | str | None | list["Value"]

class Store:
    """A connection to Redis or the embedded memory store, opened by [`redcount.connect`][redcount.store.connect].

    Every counter and limiter takes one; ``with store:`` closes it at the end of the block.
    Thread-safe.
    """
    def execute(self, *args: str | bytes | int | float) -> Value:
        """Run one command (e.g. execute('PTTL', key)). Bulk strings come back as bytes, status replies
        as str; error replies raise [`ReplyError`][redcount.errors.ReplyError]."""
    def execute_many(self, commands: list[tuple[str | bytes | int | float, ...]]) -> list[Value]:
        """Run several commands in one round trip (a pipeline). Error replies are returned as str."""
    def ping(self) -> bool:
        """Round-trip a PING; raises [`ConnectionError`][redcount.errors.ConnectionError] or
        [`AuthenticationError`][redcount.errors.AuthenticationError] if the store is unusable."""
    def __enter__(self) -> Store: ...
    def __exit__(self, *args: object) -> None: ...
    def now(self) -> float:
        """This store's clock in seconds since the epoch (the [`ManualClock`][redcount.store.ManualClock] for memory:// if given)."""
    @property
    def url(self) -> str:
        """The store's URL, without the password."""
    def nodes(self) -> list[Store]:
        """One store per master of a Redis Cluster, or per member of a client-side ring in the order
        given (execute, execute_many, ping, address), for what is about one node: KEYS,
        SCAN, DBSIZE, INFO, FLUSHALL. A single server is its own only node."""
    def cluster_stats(self) -> dict[str, int]:
        """Redis Cluster replies met since the store opened, counted per request: MOVED, ASK, TRYAGAIN,
        CLUSTERDOWN, and CLUSTER SLOTS refreshes started. All 0 on any other store."""
    @property
    def address(self) -> str:
        """host:port of a Redis server (the socket path for unix://); the URL for any other store."""
    @property
    def is_memory(self) -> bool:
        """True for the embedded memory:// store."""
    def sweep(self) -> int:
        """memory:// only: free expired keys now (a background sweep also does). Returns how many."""
    def stored_keys(self) -> int:
        """memory:// only: keys held in memory, including expired ones not yet swept."""
    def close(self) -> None:
        """Close every connection (or stop the memory store's sweeper). Later calls raise
        ConnectionError."""

def open_store(
    url: str,
    connect_timeout: float,
    command_timeout: float,
    max_connections: int,
    keepalive: bool,
    pool_timeout: float,
    clock: ManualClock | None,
    sweep_interval: float,
    connections: int = 1,
    ssl_ca_certs: str | None = None,
    ssl_certfile: str | None = None,
    ssl_keyfile: str | None = None,
    ssl_cert_reqs: str | None = None,
    ssl_check_hostname: bool | None = None,
    ssl_server_name: str | None = None,
    budget: float | None = None,
    breaker: bool = True,
    fallback: str | None = None,
    ring_urls: list[str] | None = None,
    ring_names: list[str] | None = None,
    sentinel_username: str | None = None,
    sentinel_password: str | None = None,
    spin: float | None = None,
) -> Store: ...

class ResilientStore(Store):
    """A Redis store with a latency budget, a circuit breaker and an optional fallback store
    ([`redcount.connect`][redcount.store.connect]``(url, budget=..., fallback=...)``). Thread-safe."""
    @property
    def breaker_state(self) -> str:
        """'closed' (calls go to Redis), 'open' (they fail fast or go to the fallback) or 'half-open'
        (a probe is on its way). Always 'closed' when the breaker is off."""
    @property
    def using_fallback(self) -> bool:
        """True while calls go to the fallback store."""
    @property
    def breaker_open(self) -> bool:
        """True while the breaker is open or half-open (redcount.web.metrics reads it)."""
    @property
    def fallback_active(self) -> bool:
        """The same as using_fallback (redcount.web.metrics reads it)."""
    @property
    def breaker_switches(self) -> int:
        """How many times the breaker opened or closed since the store was opened."""
    @property
    def node_breakers(self) -> dict[str, str]:
        """On a Redis Cluster or a ring (one breaker per node): {node: 'closed' | 'open' | 'half-open'}
        for every node seen so far; breaker_state then sums them up ('open' while any is).
        Empty on a single server."""
    @property
    def budget(self) -> float | None:
        """The latency budget in seconds, or None."""
    @property
    def breaker(self) -> bool:
        """Whether the circuit breaker is on."""
    @property
    def fallback(self) -> str | None:
        """The fallback store's URL, or None."""

def _take_breaker_events() -> list[tuple[int, str]]: ...

class RetryStats:
    """Counts of the retry queue's traffic since the counter was made."""
    @property
    def queued(self) -> int:
        """Increments put in the queue."""
    @property
    def retried(self) -> int:
        """Retry attempts of queued increments."""
    @property
    def delivered(self) -> int:
        """Queued increments that finally landed."""
    @property
    def dropped(self) -> int:
        """Dropped because their window (plus grace) had ended."""
    @property
    def overflowed(self) -> int:
        """Refused because the queue was full."""
    @property
    def failed(self) -> int:
        """Dropped on a non-transient error, or still queued when the counter was closed."""
    @property
    def pending(self) -> int:
        """In the queue now."""
    @property
    def last_error(self) -> str:
        """The most recent transient error, or ''."""

class Calendar:
    def __init__(self, zone: str, at_ms: list[int], offsets_ms: list[int], anchor_day: int = 1) -> None: ...
    @property
    def zone(self) -> str: ...
    @property
    def anchor_day(self) -> int: ...
    def period(self, unit: str, now_ms: int, multiple: int = 1) -> tuple[int, int]: ...
    def offset_at(self, utc_ms: int) -> int: ...

class FixedWindowCounter:
    def __init__(
        self,
        store: Store,
        name: str,
        window: float,
        prefix: str,
        grace: float,
        stagger: bool,
        mode: str,
        on_error: str,
        queue_capacity: int,
        retry_backoff: float,
        retry_backoff_max: float,
        calendar: Calendar | None = None,
        calendar_unit: str = "",
    ) -> None: ...
    def incr(self, key: str | bytes, amount: int = 1, *, request_id: str | bytes | None = None) -> int: ...
    def incr_many(self, amounts: dict[str, int] | dict[bytes, int] | dict[str | bytes, int]) -> dict[str | bytes, int]: ...
    def get(self, key: str | bytes) -> int: ...
    def get_many(self, keys: list[str] | list[bytes] | list[str | bytes]) -> dict[str | bytes, int]: ...
    def ttl(self, key: str | bytes) -> float: ...
    def storage_key(self, key: str | bytes) -> str: ...
    def current_window(self, key: str | bytes) -> tuple[float, float]: ...
    def flush(self, timeout: float | None = None) -> int: ...
    def close(self, timeout: float | None = 5.0) -> int: ...
    @property
    def pending(self) -> int: ...
    def stats(self) -> RetryStats: ...
    @property
    def name(self) -> str: ...
    @property
    def prefix(self) -> str: ...
    @property
    def window(self) -> float: ...
    @property
    def grace(self) -> float: ...
    @property
    def mode(self) -> str: ...
    @property
    def on_error(self) -> str: ...
    @property
    def store(self) -> Store: ...
    # The *_async twins: the result when the call completed inline, else a redcount._aio_runtime.OpFuture of it.
    def incr_async(self, key: str | bytes, amount: int = 1, *, request_id: str | bytes | None = None) -> Any: ...
    def incr_many_async(self, amounts: dict[str, int] | dict[bytes, int] | dict[str | bytes, int]) -> Any: ...
    def get_async(self, key: str | bytes) -> Any: ...
    def get_many_async(self, keys: list[str] | list[bytes] | list[str | bytes]) -> Any: ...
    def ttl_async(self, key: str | bytes) -> Any: ...

class SlidingWindowCounter:
    def __init__(self, store: Store, name: str | bytes, window: float, prefix: str | bytes, clock: str) -> None: ...
    def add(self, key: str | bytes, amount: int = 1) -> int: ...
    def count(self, key: str | bytes) -> int: ...
    def add_unique(self, key: str | bytes, item: str | bytes) -> int: ...
    def count_unique(self, key: str | bytes) -> int: ...
    def clear(self, key: str | bytes) -> None: ...
    def storage_keys(self, key: str | bytes) -> tuple[str, str, str]: ...
    @property
    def name(self) -> str: ...
    @property
    def prefix(self) -> str: ...
    @property
    def window(self) -> float: ...
    @property
    def clock(self) -> str: ...
    @property
    def store(self) -> Store: ...
    # The *_async twins: the result when the call completed inline, else a redcount._aio_runtime.OpFuture of it.
    def add_async(self, key: str | bytes, amount: int) -> Any: ...
    def count_async(self, key: str | bytes) -> Any: ...
    def add_unique_async(self, key: str | bytes, item: str | bytes) -> Any: ...
    def count_unique_async(self, key: str | bytes) -> Any: ...
    def clear_async(self, key: str | bytes) -> Any: ...

class RateLimit:
    """One parsed limit, e.g. 100 per 5 minutes."""
    @property
    def amount(self) -> int:
        """How many units the limit allows per window (100 in ``100/5 minutes``)."""
    @property
    def multiple(self) -> int:
        """How many units of time make the window (5 in ``100/5 minutes``; 1 when not given)."""
    @property
    def unit(self) -> str:
        """The unit of time, singular: ``"second"``, ``"minute"``, ``"hour"``, ``"day"``..."""
    @property
    def burst(self) -> int:
        """The 'burst N' given, or 0 (then the capacity is the amount)."""
    @property
    def window(self) -> float:
        """Window in seconds."""

class LimitSet:
    """A parsed limit string; all of its limits must hold."""
    def __init__(self, text: str | bytes) -> None: ...
    @property
    def text(self) -> str:
        """The limit string, normalized (``"100/5 minutes;10/second burst 20"``)."""
    @property
    def limits(self) -> list[RateLimit]:
        """One [`RateLimit`][redcount.RateLimit] per limit of the string, in the order written."""
    def __len__(self) -> int: ...

class Decision:
    """The outcome of a rate-limit check. Truthy when allowed."""
    @property
    def allowed(self) -> bool:
        """Whether the hit is (or would be) allowed."""
    @property
    def limit(self) -> int:
        """The amount of the binding limit."""
    @property
    def remaining(self) -> int:
        """Hits of cost 1 still allowed under every limit."""
    @property
    def reset_after(self) -> float:
        """Seconds until the binding limit's window resets."""
    @property
    def retry_after(self) -> float:
        """0 when allowed; else seconds until the same hit would be allowed."""
    @property
    def unavailable(self) -> bool:
        """True when the store was unavailable and the limiter's on_unavailable policy ('allow' or
        'deny') decided without it."""
    @property
    def refused_by(self) -> tuple[str, str] | None:
        """hit_all()/test_all(), when refused: (limit, key) of the refusing limit (the one that frees
        up last when several refuse), e.g. ('100/minute', 'user:42'); None otherwise."""
    @property
    def charged_at(self) -> float | None:
        """An allowed hit(): where its units were charged (seconds on the limiter's clock), which
        [`Limiter.refund`][redcount.limiter.Limiter.refund] takes as `decision=` to credit only
        the state that still holds the charge; None for a refused hit, test(), hit_all() and a
        decision made without the store."""
    @property
    def bound_by(self) -> tuple[str, str] | None:
        """hit_all()/test_all(): (limit, key) of the binding limit: the refusing one when refused, else
        the one with the fewest hits left. None from hit() and test()."""
    @property
    def per_key(self) -> list[tuple[int, int]] | None:
        """hit_all()/test_all(): for each (limit, key) item, in order, (limit, remaining) of its
        tightest limit as decided (when refused, what the call saw; nothing of it was kept).
        None from hit() and test()."""
    @staticmethod
    def _without_store(allowed: bool, retry_after: float = 0.0) -> Decision: ...
    @staticmethod
    def _local(allowed: bool, limit: int, remaining: int, reset_after: float, retry_after: float) -> Decision: ...
    def __bool__(self) -> bool: ...

class LimitStats:
    """The state of one limit for one key."""
    @property
    def limit(self) -> RateLimit:
        """The limit these figures are about."""
    @property
    def count(self) -> int:
        """Units counted against it for the key in its current window."""
    @property
    def remaining(self) -> int:
        """Hits of cost 1 it still allows for the key."""
    @property
    def reset_after(self) -> float:
        """Seconds until its window resets for the key."""

class Lease:
    """A slot taken by [`Limiter.acquire`][redcount.limiter.Limiter.acquire] under ``strategy='concurrency'``. Give it back with
    [`Limiter.release`][redcount.limiter.Limiter.release]; if it is never released it expires after its lease_timeout."""
    @property
    def key(self) -> str:
        """The business key the slot belongs to."""
    @property
    def id(self) -> str:
        """The lease's unique id."""
    @property
    def max_in_flight(self) -> int:
        """The slot count the lease was taken under (``acquire(max_in_flight, key)``)."""
    @property
    def expires_at(self) -> float:
        """When the lease expires by itself, in seconds since the epoch (limiter clock)."""
    @property
    def released(self) -> bool:
        """Whether release() was called."""

class Adjustment:
    """What [`Limiter.refund`][redcount.limiter.Limiter.refund], [`reserve`][redcount.limiter.Limiter.reserve] and [`settle`][redcount.limiter.Limiter.settle] did. Truthy when it was applied now."""
    @property
    def status(self) -> Literal["applied", "duplicate", "refused", "expired"]:
        """'applied' (done now), 'duplicate' (already done under this request_id: nothing changed),
        'refused' (reserve(): a limit refused the estimate; nothing charged) or 'expired'
        (settle(): no reservation under that request_id, never made, refused or past its
        deadline, where it settled at the estimate; nothing changed)."""
    @property
    def applied(self) -> bool:
        """``status == "applied"``: it was done now."""
    @property
    def duplicate(self) -> bool:
        """``status == "duplicate"``: it was already done under this ``request_id``."""
    @property
    def units(self) -> int:
        """refund(): units given back (the fewest over the limits). reserve(): the estimate charged.
        settle(): estimate - actual (> 0 given back, < 0 charged)."""
    @property
    def estimate(self) -> int:
        """reserve()/settle(): the reservation's estimate (0 if none)."""
    @property
    def decision(self) -> Decision:
        """The key's state afterwards (what hit(limit, key, 1) would decide); reserve(): the
        reservation's own decision."""
    def __bool__(self) -> bool: ...
def _penalty(store: Store, keys: list[str], args: list[str]) -> Value: ...
def _check_penalty(after: int, within: float, block: float, factor: float, max_block: float) -> None: ...

class LimiterCore:
    def __init__(
        self,
        store: Store,
        strategy: str,
        prefix: str | bytes,
        clock: str,
        sub_buckets: int,
        calendar: Calendar | None = None,
    ) -> None: ...
    @property
    def clock(self) -> str: ...
    def hit(
        self,
        limit: str | LimitSet,
        key: str | bytes,
        cost: int = 1,
        *,
        lease: int | None = None,
        tag: str | None = None,
        penalty: object = None,
    ) -> Decision: ...
    # What runs in front of the decisions (cpp/include/redcount/limiters/policies.h).
    def _set_guard(
        self,
        allow: list[str | bytes],
        deny: list[str | bytes],
        refusal_cache: int,
        penalty: Any,
        on_unavailable: str,
    ) -> None: ...
    @property
    def _guarded(self) -> bool: ...
    @property
    def _refusal_cache(self) -> tuple[int, int] | None: ...
    def _forget(self, key: str | bytes, tag: str | None = None) -> None: ...
    def _decide_locally(
        self, limit: str | LimitSet, key: str | bytes, cost: int, tag: str | None, penalty: object
    ) -> Decision | None: ...
    def _block_check_async(self, limit: str | LimitSet, key: str | bytes, penalty: object) -> Any: ...
    def _after_async(
        self,
        limit: str | LimitSet,
        key: str | bytes,
        cost: int,
        tag: str | None,
        penalty: object,
        decision: Decision,
        charge: bool,
    ) -> Any: ...
    def return_leases(self) -> int: ...
    @property
    def leased_units(self) -> int: ...
    @property
    def lease_ttl(self) -> float: ...
    @lease_ttl.setter
    def lease_ttl(self, ttl: float) -> None: ...
    def test(
        self,
        limit: str | LimitSet,
        key: str | bytes,
        cost: int = 1,
        *,
        lease: int | None = None,
        tag: str | None = None,
    ) -> Decision: ...
    def hit_all(
        self,
        items: Iterable[tuple[str | LimitSet, str | bytes]],
        cost: int = 1,
        *,
        tag: str | None = None,
        penalty: object = None,
    ) -> Decision: ...
    def test_all(
        self, items: Iterable[tuple[str | LimitSet, str | bytes]], cost: int = 1, *, tag: str | None = None
    ) -> Decision: ...
    def stats(self, limit: str | LimitSet, key: str | bytes, *, tag: str | None = None) -> list[LimitStats]: ...
    def reset(self, limit: str | LimitSet, key: str | bytes, *, tag: str | None = None) -> None: ...
    def acquire(self, max_in_flight: int, key: str | bytes, *, lease_timeout: float = 60.0) -> Lease | None: ...
    def release(self, lease: Lease) -> bool: ...
    def in_flight(self, key: str | bytes) -> int: ...
    def refund(
        self,
        limit: str | LimitSet,
        key: str | bytes,
        cost: int = 1,
        *,
        request_id: str | bytes | None = None,
        tag: str | None = None,
        decision: Decision | None = None,
    ) -> Adjustment: ...
    def reserve(
        self,
        limit: str | LimitSet,
        key: str | bytes,
        cost: int,
        *,
        request_id: str | bytes,
        deadline: float,
        tag: str | None = None,
    ) -> Adjustment: ...
    def settle(
        self, limit: str | LimitSet, key: str | bytes, *, request_id: str | bytes, actual: int, tag: str | None = None
    ) -> Adjustment: ...
    # The *_async twins: the result when the call completed inline, else a redcount._aio_runtime.OpFuture of it.
    def hit_async(
        self,
        limit: str | LimitSet,
        key: str | bytes,
        cost: int = 1,
        *,
        lease: int | None = None,
        tag: str | None = None,
        penalty: object = None,
    ) -> Any: ...
    def test_async(
        self,
        limit: str | LimitSet,
        key: str | bytes,
        cost: int = 1,
        *,
        lease: int | None = None,
        tag: str | None = None,
    ) -> Any: ...
    def hit_all_async(
        self,
        items: Iterable[tuple[str | LimitSet, str | bytes]],
        cost: int = 1,
        *,
        tag: str | None = None,
        penalty: object = None,
    ) -> Any: ...
    def test_all_async(
        self, items: Iterable[tuple[str | LimitSet, str | bytes]], cost: int = 1, *, tag: str | None = None
    ) -> Any: ...
    def stats_async(self, limit: str | LimitSet, key: str | bytes, *, tag: str | None = None) -> Any: ...
    def reset_async(self, limit: str | LimitSet, key: str | bytes, *, tag: str | None = None) -> Any: ...
    def acquire_async(self, max_in_flight: int, key: str | bytes, *, lease_timeout: float = 60.0) -> Any: ...
    def release_async(self, lease: Lease) -> Any: ...
    def in_flight_async(self, key: str | bytes) -> Any: ...
    def refund_async(
        self,
        limit: str | LimitSet,
        key: str | bytes,
        cost: int = 1,
        *,
        request_id: str | bytes | None = None,
        tag: str | None = None,
        decision: Decision | None = None,
    ) -> Any: ...
    def reserve_async(
        self,
        limit: str | LimitSet,
        key: str | bytes,
        cost: int,
        *,
        request_id: str | bytes,
        deadline: float,
        tag: str | None = None,
    ) -> Any: ...
    def settle_async(
        self, limit: str | LimitSet, key: str | bytes, *, request_id: str | bytes, actual: int, tag: str | None = None
    ) -> Any: ...

def limiter_strategies() -> list[str]: ...
def _return_all_leases(ending: bool = True) -> int: ...
def _leased_units() -> int: ...
def _sigterm_returns_leases() -> bool: ...

class CompletionQueue:
    def __init__(self, loop: object) -> None: ...
    @property
    def fd(self) -> int: ...
    def drain(self) -> None: ...
    def close(self) -> None: ...
    @property
    def closed(self) -> bool: ...
    def use_call_soon_threadsafe(self) -> None: ...
    @property
    def uses_call_soon_threadsafe(self) -> bool: ...
    @property
    def signals(self) -> int: ...
    @property
    def wakeups(self) -> int: ...
    @property
    def delivered(self) -> int: ...

# Each returns the result when the call completed inline, else a redcount._aio_runtime.OpFuture of it.
def execute_async(store: Store, *args: str | bytes | int | float) -> Any: ...
def execute_many_async(store: Store, commands: list[tuple[str | bytes | int | float, ...]]) -> Any: ...
def ping_async(store: Store) -> Any: ...
def _aio_setup(future_type: type, queue_provider: Callable[[], CompletionQueue]) -> None: ...
def _aio_cancel(future: object) -> bool: ...

# Built with -DREDCOUNT_TEST_HOOKS=ON only (the test build), and so not declared here: the
# submodule redcount._core._testing (bindings/register_testing.cpp), with DeferredStore (a
# store that completes batches on a worker thread), inflight(), echo_async() and
# sentinel_state() (the master a Sentinel store uses and how many switches it saw) and
# sentinel_holds() (its failover holds and early switches).

class Reading:
    """A counter value and how old it may be (read())."""
    @property
    def value(self) -> int:
        """The counter's value."""
    @property
    def staleness_ms(self) -> int:
        """The value reflects the store at some moment within the last staleness_ms milliseconds."""
    def __iter__(self) -> Iterator[int]: ...
    def __eq__(self, other: object) -> bool: ...

class ShardedCounter:
    def __init__(
        self,
        store: Store,
        name: str,
        shards: int,
        idempotency_ttl: float,
        route: str,
        prefix: str,
        log_maxlen: int,
        on_error: str,
        queue_capacity: int,
        retry_backoff: float,
        retry_backoff_max: float,
    ) -> None: ...
    def incr(self, amount: int = 1, *, request_id: str | bytes | None = None) -> bool: ...
    def decr(self, amount: int = 1, *, request_id: str | bytes | None = None) -> bool: ...
    def adjust(self, delta: int, reason: str, *, request_id: str | bytes | None = None) -> bool: ...
    def adjust_async(self, delta: int, reason: str, *, request_id: str | bytes | None = None) -> Any: ...
    def incr_many(self, items: Iterable[tuple[str, int] | tuple[str, int, str | bytes | None]]) -> list[bool]: ...
    def value(self) -> int: ...
    def shard_values(self) -> list[int]: ...
    def values(self, names: list[str]) -> dict[str, int]: ...
    def read(self, max_staleness: float = 0.25) -> Reading: ...
    def shard_of(self, request_id: str | bytes) -> int: ...
    def key_of(self, shard: int, suffix: str = "") -> str: ...
    def flush(self, timeout: float | None = None) -> int: ...
    def close(self, timeout: float | None = 5.0) -> int: ...
    @property
    def pending(self) -> int: ...
    def stats(self) -> RetryStats: ...
    @property
    def name(self) -> str: ...
    @property
    def prefix(self) -> str: ...
    @property
    def shards(self) -> int: ...
    @property
    def idempotency_ttl(self) -> float: ...
    @property
    def route(self) -> str: ...
    @property
    def log_maxlen(self) -> int: ...
    @property
    def on_error(self) -> str: ...
    @property
    def store(self) -> Store: ...
    def incr_async(self, amount: int = 1, *, request_id: str | bytes | None = None) -> Any: ...
    def decr_async(self, amount: int = 1, *, request_id: str | bytes | None = None) -> Any: ...
    def incr_many_async(self, items: Iterable[tuple[str, int] | tuple[str, int, str | bytes | None]]) -> Any: ...
    def value_async(self) -> Any: ...
    def shard_values_async(self) -> Any: ...
    def values_async(self, names: list[str]) -> Any: ...
    def read_async(self, max_staleness: float = 0.25) -> Any: ...
    def reshard(self, new_shards: int) -> ShardLayout: ...
    def layout(self) -> ShardLayout: ...
    @property
    def cached_layout(self) -> ShardLayout: ...
    @property
    def layout_key(self) -> str: ...
    def reshard_async(self, new_shards: int) -> Any: ...
    def layout_async(self) -> Any: ...

class ShardGeneration:
    """One generation of a sharded counter's shards (see reshard)."""
    @property
    def first(self) -> int:
        """Its first shard index."""
    @property
    def count(self) -> int:
        """How many shards it has."""
    @property
    def retired_ms(self) -> int:
        """When a reshard replaced it (ms since the epoch, store clock); 0 for the current one."""
    @property
    def shards(self) -> list[int]:
        """Its shard indices."""

class ShardLayout:
    """A sharded counter's shard generations, oldest first."""
    @property
    def version(self) -> int:
        """1 = as created; +1 per reshard."""
    @property
    def generations(self) -> list[ShardGeneration]:
        """Every generation, oldest first; the last one takes the writes."""
    @property
    def current(self) -> ShardGeneration:
        """The generation that takes the writes."""
    @property
    def total(self) -> int:
        """Shard indices over all generations (0 .. total-1), which every read sums."""

class QuotaResult:
    """What a quota call did; true when it was applied (bool(result) == result.applied)."""
    @property
    def applied(self) -> bool:
        """Whether the call changed the value (a refused or duplicate call did not)."""
    @property
    def value(self) -> int:
        """The value after the call (the current value when refused)."""
    @property
    def duplicate(self) -> bool:
        """A repeat of a request id already applied."""
    @property
    def soft_exceeded(self) -> bool:
        """The value is below the soft threshold."""
    @property
    def replicas(self) -> int:
        """Replicas that acknowledged the write; -1 when not asked."""
    @property
    def durable_ok(self) -> bool:
        """False when fewer than `durable` replicas acknowledged a write within durable_timeout (the
        write is applied on the master all the same)."""
    def __bool__(self) -> bool: ...

class Quota:
    def __init__(
        self,
        store: Store,
        name: str,
        floor: int,
        ceiling: int | None,
        soft: int | None,
        idempotency_ttl: float,
        durable: int,
        durable_timeout: float,
        prefix: str,
        calendar: Calendar | None = None,
        reset: str = "",
        reset_to: int = 0,
        grace: float = 1.0,
    ) -> None: ...
    def take(self, n: int = 1, *, request_id: str | bytes | None = None) -> QuotaResult: ...
    def give(self, n: int = 1, *, request_id: str | bytes | None = None) -> QuotaResult: ...
    def set(self, value: int) -> QuotaResult: ...
    def value(self) -> int: ...
    def storage_key(self) -> str: ...
    def current_period(self) -> tuple[float, float] | None: ...
    @property
    def reset_to(self) -> int: ...
    @property
    def name(self) -> str: ...
    @property
    def prefix(self) -> str: ...
    @property
    def floor(self) -> int: ...
    @property
    def ceiling(self) -> int | None: ...
    @property
    def soft(self) -> int | None: ...
    @property
    def durable(self) -> int: ...
    @property
    def store(self) -> Store: ...
    def take_async(self, n: int = 1, *, request_id: str | bytes | None = None) -> Any: ...
    def give_async(self, n: int = 1, *, request_id: str | bytes | None = None) -> Any: ...
    def set_async(self, value: int) -> Any: ...
    def value_async(self) -> Any: ...

class PNCounter:
    def __init__(self, store: Store, name: str, region: str, prefix: str) -> None: ...
    def incr(self, amount: int = 1) -> int: ...
    def decr(self, amount: int = 1) -> int: ...
    def value(self) -> int: ...
    def components(self) -> dict[str, tuple[int, int]]: ...
    def merge_components(self, components: dict[str, tuple[int, int]]) -> int: ...
    def merge(self, other: Store) -> int: ...
    @property
    def p_key(self) -> str: ...
    @property
    def n_key(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def region(self) -> str: ...
    @property
    def prefix(self) -> str: ...
    @property
    def store(self) -> Store: ...
    def incr_async(self, amount: int = 1) -> Any: ...
    def decr_async(self, amount: int = 1) -> Any: ...
    def value_async(self) -> Any: ...
    def components_async(self) -> Any: ...
    def merge_components_async(self, components: dict[str, tuple[int, int]]) -> Any: ...

class BufferedStats:
    """Counts of a [`BufferedCounter`][redcount.sharded.BufferedCounter]'s flushes since it was made."""
    @property
    def flushes(self) -> int:
        """Batches the store acknowledged."""
    @property
    def flushed_units(self) -> int:
        """Their net amount."""
    @property
    def retries(self) -> int:
        """Failed flush attempts that were retried."""
    @property
    def failed_units(self) -> int:
        """Net amount given up: a non-transient error, an id that would expire, or close()."""
    @property
    def pending(self) -> int:
        """Net amount not yet acknowledged by the store."""
    @property
    def last_error(self) -> str:
        """The most recent transient error, or ``""``."""

class BufferedCounter:
    def __init__(self, counter: ShardedCounter, flush_every: float, max_pending: int) -> None: ...
    def incr(self, amount: int = 1) -> None: ...
    def flush(self, timeout: float | None = None) -> int: ...
    def close(self, timeout: float | None = 5.0) -> int: ...
    @property
    def pending(self) -> int: ...
    def stats(self) -> BufferedStats: ...
    @property
    def flush_every(self) -> float: ...
    @property
    def max_pending(self) -> int: ...

# Hot keys and process metrics (register_hot_keys.cpp).
class HotKey:
    """One key of [`HotKeys.top`][redcount.hot_keys.HotKeys.top]: its estimated count and error bound."""
    @property
    def key(self) -> str:
        """The key, as observed."""
    @property
    def count(self) -> int:
        """An upper bound of the key's true count."""
    @property
    def error(self) -> int:
        """The true count is in [count - error, count]."""
    def __eq__(self, other: object) -> bool: ...

class HotKeys:
    def __init__(self, capacity: int = 1000) -> None: ...
    def observe(self, key: str | bytes, n: int = 1) -> None: ...
    def top(self, n: int = 10) -> list[HotKey]: ...
    def reset(self) -> None: ...
    @property
    def total(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    def __len__(self) -> int: ...

class HotKeysStore(Store):
    @property
    def hot_keys(self) -> HotKeys: ...
    @property
    def inner(self) -> Store: ...
    def __getattr__(self, name: str) -> Any: ...

def observe_hot_keys(store: Store, hot_keys: HotKeys) -> Store: ...
def _metrics_counts() -> tuple[int, int, int, int, int, int]: ...
def _reset_metrics() -> None: ...
