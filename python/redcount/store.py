"""Opening stores: :func:`connect`."""

from __future__ import annotations

import os
import ssl
from typing import Union

from . import _core
from ._core import ManualClock, Store

__all__ = ["ManualClock", "Store", "connect"]

_PathArg = Union[str, "os.PathLike[str]", None]

# redis-py passes ssl_cert_reqs as ssl.VerifyMode too; we accept both spellings.
_CERT_REQS = {ssl.CERT_REQUIRED: "required", ssl.CERT_OPTIONAL: "optional", ssl.CERT_NONE: "none"}


def _tls_path(name: str, value: _PathArg) -> str | None:
    if value is None:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (str or os.PathLike), got {type(value).__name__}")
    path = os.fspath(value)
    if not isinstance(path, str):
        raise TypeError(f"{name} must be a text path, got {type(path).__name__}")
    return path


def connect(
    url: str | None = None,
    *,
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
) -> Store:
    """Open a store.

    ``url`` is one of:

    - ``None`` or ``"memory://"``: the embedded in-process store (the default);
    - ``"redis://[[user]:password@]host[:port][/db]"``;
    - ``"rediss://[[user]:password@]host[:port][/db][?ssl_ca_certs=...&...]"``: TLS;
    - ``"unix:///path/to/redis.sock?db=N"``.

    Timeouts are in seconds; 0 means wait forever. On Redis, one I/O thread per store
    multiplexes every caller (threads and event loops) over ``connections`` sockets (1 to 4,
    default 1), writing whatever is queued in one system call (auto-pipelining);
    ``pool_timeout`` is how long a call waits when the store's queue of unsent requests is
    full. ``max_connections`` (default: ``connections``, so a fixed number of sockets) caps
    the sockets in all; above ``connections``, synchronous calls from several threads at
    once may each borrow a thread connection of their own, which the I/O thread opens on
    demand (at most 256). ``clock`` replaces the system clock, so tests can step through
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
    :class:`~redcount.SecurityWarning`); ``ssl_check_hostname`` (default true) whether the
    certificate must name the host (or ``ssl_server_name``, which is also sent as SNI).

    Nothing is sent until the first command, so a wrong host or password shows up then,
    as :class:`~redcount.ConnectionError` or :class:`~redcount.AuthenticationError`.
    Call :meth:`Store.ping` to check at once.
    """
    if url is None:
        url = "memory://"
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {type(url).__name__}")
    if not isinstance(connections, int) or isinstance(connections, bool):
        raise TypeError(f"connections must be an int, got {type(connections).__name__}")
    if max_connections is None:
        max_connections = max(connections, 1)
    if not isinstance(max_connections, int) or isinstance(max_connections, bool):
        raise TypeError(f"max_connections must be an int or None, got {type(max_connections).__name__}")
    cert_reqs: str | None
    if isinstance(ssl_cert_reqs, ssl.VerifyMode):
        cert_reqs = _CERT_REQS[ssl_cert_reqs]
    elif ssl_cert_reqs is None or isinstance(ssl_cert_reqs, str):
        cert_reqs = ssl_cert_reqs
    else:
        raise TypeError(f"ssl_cert_reqs must be a str or ssl.VerifyMode, got {type(ssl_cert_reqs).__name__}")
    if ssl_check_hostname is not None and not isinstance(ssl_check_hostname, bool):
        raise TypeError(f"ssl_check_hostname must be a bool, got {type(ssl_check_hostname).__name__}")
    if ssl_server_name is not None and not isinstance(ssl_server_name, str):
        raise TypeError(f"ssl_server_name must be a str, got {type(ssl_server_name).__name__}")
    return _core.open_store(
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
    )
