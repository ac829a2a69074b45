"""The exceptions redcount raises, all under [`RedcountError`][redcount.errors.RedcountError].

- ``RedcountError``
    - ``InvalidInputError`` (also a ``ValueError``): a bad argument; nothing was sent or stored.
    - ``ConnectionError`` (also the builtin ``ConnectionError``): the store could not be
      reached. Its ``maybe_applied`` is True when the request had been sent before the failure
      (it may or may not have run; redcount never resends it), False when it certainly did not
      run. Its ``outcomes`` is None, or, for a batch spread over Redis Cluster nodes of which
      some answered and one was lost, one entry per request: its reply (a ``ReplyError``
      instance for an error reply), [`Outcome.MAYBE`][redcount.errors.Outcome.MAYBE] (written, unanswered) or
      [`Outcome.NOT_SENT`][redcount.errors.Outcome.NOT_SENT]; retry only those.
        - ``TimeoutError`` (also the builtin ``TimeoutError``): a connect, command or pool
          timeout.
        - ``StoreClosed``: the store was closed; not transient, so it is never queued for retry.
        - ``Unavailable``: the store could not decide within its ``budget``, or its circuit
          breaker is open ([`redcount.connect`][redcount.store.connect]); fail fast instead of waiting.
    - ``ProtocolError``: the server's reply broke the protocol.
    - ``ReplyError``: the server answered with an error reply.
        - ``AuthenticationError``: wrong user name or password, or a password is needed.
        - ``ScriptError``: a Lua script failed on the server.
    - ``RetryQueueFull``: a queued increment could not be queued; it was not applied.
    - ``RateLimitExceeded``: [`Limiter.lease`][redcount.limiter.Limiter.lease] found every slot taken.
        - ``WaitTimeout``: [`Limiter.wait`][redcount.limiter.Limiter.wait] (or a ``throttle`` decorator) gave up after
          ``max_wait`` seconds; nothing was charged.

``SecurityWarning`` (a ``UserWarning``, not an exception): [`redcount.connect`][redcount.store.connect] was
asked to skip TLS certificate verification (``ssl_cert_reqs="none"``).
"""

from __future__ import annotations

import enum

from ._core import (
    AuthenticationError,
    ConnectionError,
    InvalidInputError,
    ProtocolError,
    RedcountError,
    ReplyError,
    RetryQueueFull,
    ScriptError,
    StoreClosed,
    TimeoutError,
    Unavailable,
)


class Outcome(str, enum.Enum):
    """What became of a request that has no reply, in ``ConnectionError.outcomes``.

    ``MAYBE``: it was written, and the connection was lost before its reply: it may or may
    not have run (retry it only with a request id). ``NOT_SENT``: it was never written, so
    it did not run; retry it freely. A ``str`` subclass equal to ``"maybe"`` and
    ``"not sent"``, so code that compares with those strings keeps working."""

    MAYBE = "maybe"
    """Written, and the connection was lost before its reply: it may or may not have run."""
    NOT_SENT = "not sent"
    """Never written, so it did not run: retry it freely."""

    def __str__(self) -> str:
        return str(self.value)


class SecurityWarning(UserWarning):
    """Warned once by [`redcount.connect`][redcount.store.connect] when ``ssl_cert_reqs="none"`` turns off the
    verification of the server's TLS certificate: the traffic is encrypted, but the server
    is not authenticated. A ``UserWarning``, so it shows by default; filter it by this
    class (``warnings.filterwarnings("ignore", category=redcount.SecurityWarning)``) where
    that is a deliberate choice."""


class RateLimitExceeded(RedcountError):
    """Raised by [`redcount.Limiter.lease`][redcount.limiter.Limiter.lease] when every slot of the key is taken.

    ``key`` and ``limit`` (the max in flight) say which; nothing was stored."""

    def __init__(self, message: str, key: str | bytes, limit: int) -> None:
        super().__init__(message)
        self.key = key
        self.limit = limit


class WaitTimeout(RateLimitExceeded):
    """Raised by [`redcount.Limiter.wait`][redcount.limiter.Limiter.wait] (sync and async, and by the functions a
    ``throttle`` decorator wraps) when the hit could not be admitted within ``max_wait``.

    Nothing was charged. ``key``; ``limit``, the amount of the limit that refused it (the
    smallest amount when it never reached the store); ``waited``, the seconds it waited;
    ``retry_after``, the limiter's last estimate of the seconds until it could be admitted
    (None when it gave up while still queued behind other waiters of this process);
    ``max_wait``. It gives up early, without sleeping to the end, once the limiter says the
    hit cannot be admitted in the time left."""

    def __init__(
        self,
        message: str,
        key: str | bytes,
        limit: int,
        *,
        waited: float,
        retry_after: float | None,
        max_wait: float,
    ) -> None:
        super().__init__(message, key, limit)
        self.waited = waited
        self.retry_after = retry_after
        self.max_wait = max_wait


__all__ = [
    "AuthenticationError",
    "ConnectionError",
    "InvalidInputError",
    "Outcome",
    "ProtocolError",
    "RateLimitExceeded",
    "RedcountError",
    "ReplyError",
    "RetryQueueFull",
    "ScriptError",
    "SecurityWarning",
    "StoreClosed",
    "TimeoutError",
    "Unavailable",
    "WaitTimeout",
]
