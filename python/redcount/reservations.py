"""Reservations: charge an estimate now, settle on the real use later.

```python
r = limiter.reserve("100000/day", "tenant:acme", cost=2000, request_id=call_id, deadline=300)
if not r:
    raise TooManyTokens(r.retry_after)
usage = call_the_model(...)
r.settle(usage.total_tokens)      # gives back or charges the difference, once
```

From another process (a worker that got the result), the same settlement without the
object: ``limiter.settle("100000/day", "tenant:acme", request_id=call_id, actual=1830)``.
See docs/refunds.md.
"""

from __future__ import annotations

import uuid
from typing import Protocol

from ._core import Adjustment, Decision, LimitSet


class Settles(Protocol):
    """What settles a reservation: [`redcount.Limiter`][redcount.limiter.Limiter]."""

    def settle(
        self, limit: str | LimitSet, key: str | bytes, *, request_id: str | bytes, actual: int, tag: str | None = None
    ) -> Adjustment: ...


class SettlesAsync(Protocol):
    """What settles a reservation on asyncio: [`redcount.aio.Limiter`][redcount.aio.Limiter]."""

    async def settle(
        self, limit: str | LimitSet, key: str | bytes, *, request_id: str | bytes, actual: int, tag: str | None = None
    ) -> Adjustment: ...

__all__ = ["Adjustment", "AsyncReservation", "Reservation", "Settles", "SettlesAsync", "new_request_id"]


def new_request_id() -> str:
    """A fresh request id for a reservation made without one."""
    return uuid.uuid4().hex


class _ReservationBase:
    __slots__ = ("adjustment", "key", "limit", "request_id", "tag")

    def __init__(
        self,
        limit: str | LimitSet,
        key: str | bytes,
        request_id: str | bytes,
        adjustment: Adjustment,
        tag: str | None = None,
    ) -> None:
        self.limit = limit
        self.key = key
        self.request_id = request_id
        self.tag = tag
        """The hash tag the reservation was made under (None: the key's untagged state);
        settle() acts on the same state."""
        self.adjustment = adjustment
        """What reserve() did: status "applied", "duplicate" (already reserved under this
        request_id: nothing charged now) or "refused"."""

    @property
    def allowed(self) -> bool:
        """Whether the estimate is charged (now, or by an earlier reserve() under this id)."""
        return self.adjustment.status != "refused"

    @property
    def duplicate(self) -> bool:
        """True when a reservation under this request_id already existed (this call charged nothing)."""
        return self.adjustment.status == "duplicate"

    @property
    def estimate(self) -> int:
        """The estimate reserved."""
        return self.adjustment.estimate

    @property
    def decision(self) -> Decision:
        """The reservation's [`Decision`][redcount.limiter.Decision] (allowed unless refused)."""
        return self.adjustment.decision

    @property
    def retry_after(self) -> float:
        """0 when allowed; else seconds until the estimate would be allowed."""
        return self.adjustment.decision.retry_after

    @property
    def remaining(self) -> int:
        """Hits of cost 1 still allowed after the reservation."""
        return self.adjustment.decision.remaining

    def __bool__(self) -> bool:
        return self.allowed

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(key={self.key!r}, request_id={self.request_id!r}, "
            f"status={self.adjustment.status!r}, estimate={self.estimate}"
            + ("" if self.tag is None else f", tag={self.tag!r}")
            + ")"
        )


class Reservation(_ReservationBase):
    """What [`redcount.Limiter.reserve`][redcount.limiter.Limiter.reserve] returns: truthy when the estimate was charged.
    [`settle`][redcount.reservations.Reservation.settle] charges or gives back the difference to the actual use, once."""

    __slots__ = ("_limiter",)

    def __init__(
        self,
        limiter: Settles,
        limit: str | LimitSet,
        key: str | bytes,
        request_id: str | bytes,
        adjustment: Adjustment,
        tag: str | None = None,
    ) -> None:
        super().__init__(limit, key, request_id, adjustment, tag)
        self._limiter = limiter

    def settle(self, actual: int) -> Adjustment:
        """Settle at ``actual`` units: see [`redcount.Limiter.settle`][redcount.limiter.Limiter.settle] (under the
        reservation's ``tag``)."""
        return self._limiter.settle(self.limit, self.key, request_id=self.request_id, actual=actual, tag=self.tag)


class AsyncReservation(_ReservationBase):
    """What [`redcount.aio.Limiter.reserve`][redcount.aio.Limiter.reserve] returns; [`settle`][redcount.reservations.AsyncReservation.settle] is a coroutine."""

    __slots__ = ("_limiter",)

    def __init__(
        self,
        limiter: SettlesAsync,
        limit: str | LimitSet,
        key: str | bytes,
        request_id: str | bytes,
        adjustment: Adjustment,
        tag: str | None = None,
    ) -> None:
        super().__init__(limit, key, request_id, adjustment, tag)
        self._limiter = limiter

    async def settle(self, actual: int) -> Adjustment:
        """Settle at ``actual`` units: see [`redcount.Limiter.settle`][redcount.limiter.Limiter.settle] (under the
        reservation's ``tag``)."""
        return await self._limiter.settle(
            self.limit, self.key, request_id=self.request_id, actual=actual, tag=self.tag
        )
