"""The settings both integrations share, validated once at start-up.

```python
s = Settings.build(key=None, headers="ietf,legacy", trusted_proxies=["10.0.0.0/8"],
                   ipv6_prefix=64, fail="open", shadow=False, metrics=None, budget=0.1)
```
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Union

from ..errors import InvalidInputError
from ..policies import Entry, Screen
from .engine import DEFAULT_BUDGET, FailMode, FailurePolicy, MetricsSink, check_budget
from .headers import HeaderSets
from .identity import ClientIdentity, TrustedProxies
from .spec import KeyFunc, as_key, remote_address

__all__ = ["Settings", "TrustedArg"]

TrustedArg = Union[TrustedProxies, int, str, Sequence[str], None]
"""What the trusted-proxies setting accepts: a [`TrustedProxies`][redcount.web.identity.TrustedProxies], a proxy count, or
proxy addresses and networks (one string or several)."""


@dataclass
class Settings:
    """Key, identity, header sets, failure policy, shadow mode, metrics and budget (seconds
    one check may wait for the store; None: none) of one rate limiter.
    Built once; read-only afterwards, so thread-safe."""

    key: KeyFunc
    identity: ClientIdentity
    headers: HeaderSets
    policy: FailurePolicy
    shadow: bool
    metrics: MetricsSink | None
    budget: float | None = DEFAULT_BUDGET
    # Allow and deny lists and a refusal cache, applied before any round trip (None: none).
    screen: Screen | None = None

    @classmethod
    def build(
        cls,
        *,
        key: KeyFunc | None,
        headers: HeaderSets | str | Iterable[str] | None,
        trusted_proxies: TrustedArg,
        ipv6_prefix: int,
        fail: FailMode,
        shadow: bool,
        metrics: MetricsSink | None,
        where: str,
        budget: float | None = DEFAULT_BUDGET,
        allow: Iterable[Entry] | None = None,
        deny: Iterable[Entry] | None = None,
        refusal_cache: int | None = 0,
    ) -> Settings:
        """Validate everything, raising [`InvalidInputError`][redcount.errors.InvalidInputError] on bad input.

        ``allow``/``deny``: keys, IP addresses and CIDRs matched against each check's
        identity (the client address by default); ``refusal_cache``: how many refused keys
        to answer locally until their ``retry_after`` (0: off). See docs/penalties.md."""
        if not isinstance(shadow, bool):
            raise InvalidInputError(f"shadow must be True or False, got {shadow!r}")
        if metrics is not None and not (hasattr(metrics, "decision") and hasattr(metrics, "store_error")):
            raise InvalidInputError(f"metrics must be a redcount.web.metrics.PrometheusMetrics or similar, got {metrics!r}")
        return cls(
            key=as_key(key, where) if key is not None else remote_address,
            identity=ClientIdentity(TrustedProxies.coerce(trusted_proxies), ipv6_prefix=ipv6_prefix),
            headers=HeaderSets.parse(headers),
            policy=FailurePolicy(fail),
            shadow=shadow,
            metrics=metrics,
            budget=check_budget(budget, "budget"),
            screen=Screen.build(allow, deny, refusal_cache, time.time),
        )
