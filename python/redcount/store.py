"""Opening stores: :func:`connect`."""

from __future__ import annotations

from . import _core
from ._core import ManualClock, Store

__all__ = ["ManualClock", "Store", "connect"]


def connect(
    url: str | None = None,
    *,
    connect_timeout: float = 2.0,
    command_timeout: float = 2.0,
    max_connections: int = 32,
    keepalive: bool = True,
    pool_timeout: float = 2.0,
    clock: ManualClock | None = None,
    sweep_interval: float = 0.1,
) -> Store:
    """Open a store.

    ``url`` is one of:

    - ``None`` or ``"memory://"``: the embedded in-process store (the default);
    - ``"redis://[[user]:password@]host[:port][/db]"``;
    - ``"unix:///path/to/redis.sock?db=N"``.

    Timeouts are in seconds; 0 means wait forever. ``max_connections`` bounds the pool
    shared by every thread using this store; ``pool_timeout`` is how long a call waits for
    a free connection. ``clock`` replaces the system clock, so tests can step through
    windows: on memory:// it is the store's clock; on Redis it is the client's clock (what
    ``clock="client"`` counters and limiters take as now), while the server keeps its own
    for TTLs and ``clock="server"``; ``sweep_interval`` (memory only) is how often expired keys are freed.

    Nothing is sent until the first command, so a wrong host or password shows up then,
    as :class:`~redcount.ConnectionError` or :class:`~redcount.AuthenticationError`.
    Call :meth:`Store.ping` to check at once.
    """
    if url is None:
        url = "memory://"
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {type(url).__name__}")
    if not isinstance(max_connections, int) or isinstance(max_connections, bool):
        raise TypeError(f"max_connections must be an int, got {type(max_connections).__name__}")
    return _core.open_store(
        url,
        connect_timeout=connect_timeout,
        command_timeout=command_timeout,
        max_connections=max_connections,
        keepalive=keepalive,
        pool_timeout=pool_timeout,
        clock=clock,
        sweep_interval=sweep_interval,
    )
