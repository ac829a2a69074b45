"""The exceptions redcount raises, all under :class:`RedcountError`.

``RedcountError``
    ``InvalidInputError`` (also a ``ValueError``): a bad argument; nothing was sent or stored.
    ``ConnectionError`` (also the builtin ``ConnectionError``): the store could not be reached.
        ``TimeoutError`` (also the builtin ``TimeoutError``): a connect, command or pool timeout.
    ``ProtocolError``: the server's reply broke the protocol.
    ``ReplyError``: the server answered with an error reply.
        ``AuthenticationError``: wrong user name or password, or a password is needed.
        ``ScriptError``: a Lua script failed on the server.
    ``RetryQueueFull``: a queued increment could not be queued; it was not applied.
"""

from __future__ import annotations

from ._core import (
    AuthenticationError,
    ConnectionError,
    InvalidInputError,
    ProtocolError,
    RedcountError,
    ReplyError,
    RetryQueueFull,
    ScriptError,
    TimeoutError,
)

__all__ = [
    "AuthenticationError",
    "ConnectionError",
    "InvalidInputError",
    "ProtocolError",
    "RedcountError",
    "ReplyError",
    "RetryQueueFull",
    "ScriptError",
    "TimeoutError",
]
