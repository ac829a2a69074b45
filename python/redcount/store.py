"""Opening stores: [`connect`][redcount.store.connect]."""

from __future__ import annotations

import logging
import math
import os
import sys
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Union

from . import _core
from ._core import ManualClock, ResilientStore, Store
from .hot_keys import HotKeys
from .telemetry import attach_hot_keys

if TYPE_CHECKING:
    import ssl

__all__ = ["ManualClock", "ResilientStore", "Store", "connect"]

_log = logging.getLogger("redcount")

_PathArg = Union[str, "os.PathLike[str]", None]


def _store_repr(store: Store) -> str:
    """``<redcount.Store:redis://127.0.0.1:6379/0>``, ``<redcount.Store:memory://>``: the URL
    without its password, and no space, so that tools which shorten or wrap reprs in tables
    (rich, as in Flask-Limiter's ``flask limiter limits``) keep it whole. Every store class
    (resilient, hot-keys) inherits it."""
    return f"<redcount.Store:{store.url}>"


setattr(Store, "__repr__", _store_repr)  # noqa: B010 - a method of the extension's class


def _verify_mode_name(value: object) -> str | None:
    """``"required"``, ``"optional"`` or ``"none"`` for an ``ssl.VerifyMode`` (redis-py passes
    ssl_cert_reqs as one too; we accept both spellings), else None. TLS is the core's own, on
    the OpenSSL the extension links: Python's ``ssl`` module is never imported here (a caller
    holding a VerifyMode has imported it), so redcount works where ``import ssl`` cannot."""
    ssl_module = sys.modules.get("ssl")
    if ssl_module is None or not isinstance(value, ssl_module.VerifyMode):
        return None
    names = {ssl_module.CERT_REQUIRED: "required", ssl_module.CERT_OPTIONAL: "optional", ssl_module.CERT_NONE: "none"}
    return names[value]


def _tls_path(name: str, value: _PathArg) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (str or os.PathLike), got {type(value).__name__}")
    path = os.fspath(value)
    if not isinstance(path, str):
        raise TypeError(f"{name} must be a text path, got {type(path).__name__}")
    return path


DEFAULT_THREAD_CONNECTIONS = 16
"""Thread connections a store may open by default, on top of its ``connections``."""


def _spin_seconds(spin: object) -> float | None:
    if spin is None:
        return None
    if isinstance(spin, bool) or not isinstance(spin, (int, float)):
        raise TypeError(f"spin must be a number of seconds or None, got {type(spin).__name__}")
    if not math.isfinite(spin) or not 0 <= spin <= 0.001:
        raise _core.InvalidInputError(
            f"spin must be None (automatic) or a number of seconds from 0 to 0.001 (a poll before sleeping), got {spin!r}"
        )
    return float(spin)


def connect(
    url: str | Sequence[str] | None = None,
    *,
    routing: str | None = None,
    names: Sequence[str] | None = None,
    connect_timeout: float = 2.0,
    command_timeout: float = 2.0,
    max_connections: int | None = None,
    connections: int = 1,
    keepalive: bool = True,
    pool_timeout: float = 2.0,
    clock: ManualClock | None = None,
    sweep_interval: float = 0.1,
    ssl_ca_certs: _PathArg = None,
    ssl_certfile: _PathArg = None,
    ssl_keyfile: _PathArg = None,
    ssl_cert_reqs: str | ssl.VerifyMode | None = None,
    ssl_check_hostname: bool | None = None,
    ssl_server_name: str | None = None,
    budget: float | None = None,
    breaker: bool = True,
    fallback: str | None = None,
    hot_keys: HotKeys | None = None,
    sentinel_username: str | None = None,
    sentinel_password: str | None = None,
    spin: float | None = None,
) -> Store:
    """Open a store.

    ``url`` is one of:

    - ``None`` or ``"memory://"``: the embedded in-process store (the default);
    - ``"redis://[[user]:password@]host[:port][/db]"``;
    - ``"rediss://[[user]:password@]host[:port][/db][?ssl_ca_certs=...&...]"``: TLS;
    - ``"unix:///path/to/redis.sock?db=N"``;
    - ``"redis+cluster://[[user]:password@]host1:port1,host2:port2"``: a Redis Cluster (any
      of its nodes as seeds; ``rediss+cluster://`` for TLS). Batches are split per node and
      their replies put back in order; MOVED and ASK are followed. What is about one node
      (KEYS, SCAN, DBSIZE, INFO, FLUSHALL) goes through [`Store.nodes`][redcount.store.Store.nodes], one store per
      master;
    - ``"redis+sentinel://[[user]:password@]s1:port,s2:port/service[/db]"``: the master of a
      Redis Sentinel ``service`` (``rediss+sentinel://`` for TLS to the sentinels and the
      master, with the ``ssl_*`` options below). The credentials in front are the master's; the
      sentinels' own are ``sentinel_username`` and ``sentinel_password`` (keywords, or URL
      query parameters; a keyword wins). The first call asks the sentinels for the master;
      every connection checks ``ROLE`` in its handshake; the store follows ``+switch-master``
      and re-asks on READONLY, NOREPLICAS or a lost connection; new calls go to the new
      master and the old connections close when idle. From Sentinel's selection of the replica
      to promote until that replica is master (at most 2 s), new calls are held rather than
      sent to the old master, so a failover does not lose what it would have acknowledged; a
      call held past ``command_timeout`` raises ``ConnectionError`` with ``maybe_applied``
      false. A call that did not run (the old master is gone) waits up to
      ``command_timeout`` for the new master and is sent there. See docs/scaling-out.md,
      "Redis Sentinel".

    A list of ``redis://`` / ``rediss://`` URLs with ``routing="ring"`` opens a client-side
    hash ring over those servers: each key goes, by its hash slot (CRC16 with the
    ``{hash tag}`` rule, as on a cluster), to the server that a table computed by rendezvous
    hashing over ``names`` gives it (default: ``"host:port"`` of each URL). Names, not
    addresses, decide where keys live: keep a server's name when it moves, and adding a
    fourth server to three moves about a quarter of the slots, all to it. Each URL keeps its
    own credentials, database and TLS settings; the keyword options apply to every server.
    [`Store.nodes`][redcount.store.Store.nodes] gives one store per server, in the order given. A server that is down
    is not replaced: calls for its slots fail (with ``budget`` or ``fallback``, fast, through
    its own circuit breaker; see below) while the others keep serving. A member may also be
    a Sentinel group (a ``redis+sentinel://`` URL): its slots go to the master its sentinels
    name, followed through failovers as a Sentinel store follows it, and
    ``sentinel_username`` / ``sentinel_password`` apply to every such member.

    Timeouts are in seconds; 0 means wait forever. On Redis, one I/O thread per store
    multiplexes every caller (threads and event loops) over ``connections`` sockets (1 to 4,
    default 1), writing whatever is queued in one system call (auto-pipelining);
    ``pool_timeout`` is how long a call waits when the store's queue of unsent requests is
    full. ``max_connections`` (default: ``connections`` + 16) caps the sockets in all; above
    ``connections``, synchronous calls from several threads at once each borrow a thread
    connection of their own, which the I/O thread opens on demand (at most 256), so up to
    16 threads calling together each wait for their own reply in ``recv()`` instead of a hop
    through the I/O thread and a wake-up per call; ``max_connections=connections`` keeps a
    fixed number of sockets. ``spin`` (seconds, 0 to 0.001; default ``None``: 100 µs on a
    machine with two or more CPUs, 0 on one) is how long a synchronous caller that is the
    store's only caller at that moment polls its socket before it sleeps on its reply: on a
    virtual machine a sleeping thread's wake-up costs tens of microseconds, more than a
    loopback round trip. It costs that CPU time when the reply is slower, and turns itself off
    while replies take longer than twice ``spin`` (a distant server); ``spin=0`` never polls.
    ``clock`` replaces the system clock, so tests can step through
    windows: on memory:// it is the store's clock; on Redis it is the client's clock (what
    ``clock="client"`` counters and limiters take as now), while the server keeps its own
    for TTLs and ``clock="server"``; ``sweep_interval`` (memory only) is how often expired keys are freed.

    TLS (``rediss://`` only; a TLS option with any other URL is a ``ValueError``), with
    redis-py's names, as keywords or as URL query parameters (a keyword wins):
    ``ssl_ca_certs`` the CA bundle that signed the server's certificate (default: the
    system trust store); ``ssl_certfile`` and ``ssl_keyfile`` a client certificate and its
    unencrypted key, for servers that require one (mutual TLS); ``ssl_cert_reqs``
    ``"required"`` (default), ``"optional"`` (the same for a client: a TLS server always
    presents a certificate) or ``"none"`` (no verification at all: warns
    [`SecurityWarning`][redcount.errors.SecurityWarning]); ``ssl_check_hostname`` (default true) whether the
    certificate must name the host (or ``ssl_server_name``, which is also sent as SNI).

    When Redis fails (see docs/failures.md, "When Redis fails: budget, breaker, fallback"):
    ``budget`` (seconds, > 0) caps every round trip, waiting for a connection and the store's
    own retries included (the command and pool timeouts become at most ``budget``; a
    connection slower than that to set up goes on in the background); a call that
    cannot decide in time raises [`Unavailable`][redcount.errors.Unavailable] (a
    [`ConnectionError`][redcount.errors.ConnectionError]), as does every connection-level failure.
    ``breaker`` (on by default, active only with ``budget`` or ``fallback``): three
    consecutive connection failures or timeouts open it; while open, calls do not touch Redis
    (they fail fast with ``Unavailable`` or go to the fallback), and the first call after a
    jittered pause (50 ms doubling to 500 ms) sends a PING in the background, which closes it
    when answered. Error replies (WRONGTYPE, script errors) and bad input never count.
    ``fallback="memory://"``: while the breaker is open, calls go to an embedded store (every
    counter and limiter works there), and back to Redis when it closes; counts made on the
    fallback are not merged back. On a Redis Cluster or a ring there is one breaker per node
    (``node_breakers``): a node's failures open its breaker only, and only the calls for its
    slots fail fast or go to the fallback, while the other nodes keep serving. The store is then a [`ResilientStore`][redcount.store.ResilientStore], whose
    ``breaker_state``, ``using_fallback`` and ``breaker_switches`` tell where calls go; each
    switch is logged once on the ``"redcount"`` logger (WARNING), by a daemon thread
    (within 0.1 s).
    On ``memory://`` a budget changes nothing (it never waits on a network).

    ``hot_keys``: a [`HotKeys`][redcount.hot_keys.HotKeys] that observes the storage key of every request
    sent through the store (sync and [`redcount.aio`][redcount.aio] alike), when it is submitted: a
    script call's first key, every key a data command names (GET, INCRBY, PEXPIREAT, MGET,
    HGETALL, XADD...), none for keyless commands (PING, WAIT); a MULTI ... EXEC transaction
    counts each key it names once, like the script it stands in for. The store is then
    a ``HotKeysStore`` in front of the one opened (whose attributes, e.g. a ResilientStore's
    ``breaker_state``, read through). Without it, nothing is added to any call.

    Nothing is sent until the first command, so a wrong host or password shows up then,
    as [`ConnectionError`][redcount.errors.ConnectionError] or [`AuthenticationError`][redcount.errors.AuthenticationError].
    Call [`Store.ping`][redcount.store.Store.ping] to check at once.
    """
    ring_urls, ring_names = _ring_arguments(url, routing, names)
    if url is None:
        url = "memory://"
    if ring_urls is not None:
        url = ring_urls[0]
    if not isinstance(url, str):
        raise TypeError(f"url must be a str or, with routing='ring', a list of str; got {type(url).__name__}")
    if not isinstance(connections, int) or isinstance(connections, bool):
        raise TypeError(f"connections must be an int, got {type(connections).__name__}")
    if max_connections is None:
        max_connections = max(connections, 1) + DEFAULT_THREAD_CONNECTIONS
    if not isinstance(max_connections, int) or isinstance(max_connections, bool):
        raise TypeError(f"max_connections must be an int or None, got {type(max_connections).__name__}")
    cert_reqs = _verify_mode_name(ssl_cert_reqs)
    if cert_reqs is None and ssl_cert_reqs is not None:
        if not isinstance(ssl_cert_reqs, str):
            raise TypeError(f"ssl_cert_reqs must be a str or ssl.VerifyMode, got {type(ssl_cert_reqs).__name__}")
        cert_reqs = ssl_cert_reqs
    if ssl_check_hostname is not None and not isinstance(ssl_check_hostname, bool):
        raise TypeError(f"ssl_check_hostname must be a bool, got {type(ssl_check_hostname).__name__}")
    if ssl_server_name is not None and not isinstance(ssl_server_name, str):
        raise TypeError(f"ssl_server_name must be a str, got {type(ssl_server_name).__name__}")
    if budget is not None:
        if isinstance(budget, bool) or not isinstance(budget, (int, float)):
            raise TypeError(f"budget must be a number of seconds or None, got {type(budget).__name__}")
        if not math.isfinite(budget) or budget <= 0:
            raise _core.InvalidInputError(f"budget must be a finite number of seconds > 0, got {budget!r}")
    if not isinstance(breaker, bool):
        raise TypeError(f"breaker must be a bool, got {type(breaker).__name__}")
    if fallback is not None and not isinstance(fallback, str):
        raise TypeError(f"fallback must be 'memory://' or None, got {type(fallback).__name__}")
    for name, value in (("sentinel_username", sentinel_username), ("sentinel_password", sentinel_password)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{name} must be a str or None, got {type(value).__name__}")
    if hot_keys is not None and not isinstance(hot_keys, HotKeys):
        raise TypeError(f"hot_keys must be a redcount.HotKeys or None, got {type(hot_keys).__name__}")
    store = _core.open_store(
        url,
        connect_timeout=connect_timeout,
        command_timeout=command_timeout,
        max_connections=max_connections,
        keepalive=keepalive,
        pool_timeout=pool_timeout,
        clock=clock,
        sweep_interval=sweep_interval,
        connections=connections,
        ssl_ca_certs=_tls_path("ssl_ca_certs", ssl_ca_certs),
        ssl_certfile=_tls_path("ssl_certfile", ssl_certfile),
        ssl_keyfile=_tls_path("ssl_keyfile", ssl_keyfile),
        ssl_cert_reqs=cert_reqs,
        ssl_check_hostname=ssl_check_hostname,
        ssl_server_name=ssl_server_name,
        budget=budget,
        breaker=breaker,
        fallback=fallback,
        ring_urls=ring_urls,
        ring_names=ring_names,
        sentinel_username=sentinel_username,
        sentinel_password=sentinel_password,
        spin=_spin_seconds(spin),
    )
    if isinstance(store, ResilientStore):
        _start_breaker_log()
    if hot_keys is not None:
        store = _core.observe_hot_keys(store, hot_keys._core)
        attach_hot_keys(hot_keys)
    return store


def _ring_arguments(
    url: object, routing: object, names: object
) -> tuple[list[str] | None, list[str] | None]:
    """The ring's URLs and names from connect()'s arguments (None, None: not a ring); every
    combination that does not make sense is refused here, naming what to pass instead."""
    if routing is not None and not isinstance(routing, str):
        raise TypeError(f"routing must be 'ring' or None, got {type(routing).__name__}")
    if routing is not None and routing != "ring":
        raise _core.InvalidInputError(f"routing must be 'ring' or None, got {routing!r}")
    if routing is None:
        if names is not None:
            raise _core.InvalidInputError("names applies to routing='ring' only")
        if isinstance(url, (list, tuple)):
            raise _core.InvalidInputError(
                "a list of URLs needs routing='ring' (a client-side hash ring); for a Redis Cluster pass one "
                "'redis+cluster://host1:port1,host2:port2' URL"
            )
        return None, None
    if isinstance(url, str) or not isinstance(url, (list, tuple)):
        raise _core.InvalidInputError(
            "routing='ring' takes a list of server URLs, e.g. ['redis://a:6379', 'redis://b:6379'], "
            f"got {type(url).__name__}"
        )
    urls = list(url)
    if not urls:
        raise _core.InvalidInputError("routing='ring' needs at least one server URL")
    for i, u in enumerate(urls):
        if not isinstance(u, str):
            raise TypeError(f"ring server #{i + 1} must be a URL str, got {type(u).__name__}")
    if names is None:
        return urls, None
    if isinstance(names, str) or not isinstance(names, (list, tuple)):
        raise TypeError(f"names must be a list of str, got {type(names).__name__}")
    name_list = list(names)
    for i, n in enumerate(name_list):
        if not isinstance(n, str):
            raise TypeError(f"ring name #{i + 1} must be a str, got {type(n).__name__}")
    if len(name_list) != len(urls):
        raise _core.InvalidInputError(f"names must give one name per server: got {len(name_list)} names for {len(urls)} URLs")
    return urls, name_list


def _log_breaker_events() -> None:
    """Logs the circuit-breaker switches recorded so far, each once (whoever takes an event
    logs it: the watcher thread, or a read of a ResilientStore's state)."""
    for level, message in _core._take_breaker_events():
        _log.log(level, "%s", message)


# Why a thread and not a callback from C++: a switch happens on the store's I/O thread,
# which must never wait for the GIL (that can deadlock at interpreter shutdown). Why
# polling: a thread blocked in C++ with the GIL released must take it back when it wakes,
# which aborts the process if it wakes during interpreter shutdown; time.sleep() is safe
# there. Ten cheap polls a second, and only once a resilient store was opened.
_POLL_INTERVAL = 0.1
_watcher_lock = threading.Lock()
_watcher: threading.Thread | None = None


def _watch() -> None:
    while True:
        time.sleep(_POLL_INTERVAL)
        _log_breaker_events()


def _start_breaker_log() -> None:
    global _watcher
    with _watcher_lock:
        if _watcher is None or not _watcher.is_alive():
            _watcher = threading.Thread(target=_watch, name="redcount-breaker-log", daemon=True)
            _watcher.start()


def _forget_watcher() -> None:
    # A forked child has no watcher thread; the next resilient connect() starts one, and a
    # store inherited from the parent gets one too.
    global _watcher, _watcher_lock
    _watcher_lock = threading.Lock()  # another thread may have held it at the fork
    had = _watcher is not None
    _watcher = None
    if had:
        _start_breaker_log()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_watcher)
