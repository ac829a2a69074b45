"""Rate-limit response headers: the IETF fields, the legacy ``X-RateLimit-*`` ones and
``Retry-After``, rendered from one request's decisions.

```python
sets = HeaderSets.parse("ietf,retry-after")        # or ("ietf", "legacy"), "all", "none"
for name, value in render(verdict, sets):
    response.headers[name] = value                  # set, never add: no duplicates
```

The IETF fields follow draft-ietf-httpapi-ratelimit-headers-11 (structured fields, RFC 9651):

- ``RateLimit-Policy: "api";q=100;w=60, "default";q=1000;w=3600`` lists every policy that
  applied to the request (app-wide and route limits alike), each once;
- ``RateLimit: "api";r=0;t=12`` speaks for the binding policy only: the one that refused the
  request, else the one with the fewest hits left (ties: the longer wait).

``RateLimit-Undecided: timeout`` (or ``breaker-open``, ``unavailable``) marks a request that
some limit decided without the store, by the failure policy (see
[`redcount.web.engine.UNDECIDED_REASONS`][redcount.web.engine.UNDECIDED_REASONS]): it was not counted against that limit. It is
sent whenever any header set is on, alone when no limit decided the request.

``X-RateLimit-Limit``/``-Remaining``/``-Reset`` give the binding limit's amount, remaining hits
and reset time as epoch seconds (Flask-Limiter's and slowapi's convention, so clients written
for them keep working). ``Retry-After`` (delay-seconds, at least 1) goes on refusals only and is
never earlier than ``t``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass

from ..errors import InvalidInputError
from .engine import Outcome, Verdict

__all__ = ["HeaderSets", "render"]

_KNOWN = ("ietf", "legacy", "retry-after")


@dataclass(frozen=True)
class HeaderSets:
    """Which header sets are sent: ``ietf`` (``RateLimit-Policy``, ``RateLimit``), ``legacy``
    (``X-RateLimit-*``) and ``retry-after``. Immutable, so thread-safe."""

    ietf: bool = True
    legacy: bool = False
    retry_after: bool = True

    @property
    def any(self) -> bool:
        """True when at least one set is sent."""
        return self.ietf or self.legacy or self.retry_after

    @classmethod
    def parse(cls, value: HeaderSets | str | Iterable[str] | None) -> HeaderSets:
        """``"all"``, ``"none"``, a comma-separated string or a list of set names; None is
        the default (``ietf`` and ``retry-after``). An unknown name raises
        [`InvalidInputError`][redcount.errors.InvalidInputError] (at start-up)."""
        if value is None:
            return cls()
        if isinstance(value, HeaderSets):
            return value
        if isinstance(value, str):
            names = [v.strip().lower() for v in value.split(",") if v.strip()]
        else:
            names = []
            for v in value:
                if not isinstance(v, str):
                    raise InvalidInputError(f"header set names must be strings, got {v!r}")
                names.append(v.strip().lower())
        if names == ["all"]:
            return cls(True, True, True)
        if names == ["none"]:
            return cls(False, False, False)
        unknown = [n for n in names if n not in _KNOWN]
        if unknown:
            raise InvalidInputError(
                f"unknown header set {unknown[0]!r}: choose from {', '.join(_KNOWN)}, or 'all' or 'none'"
            )
        return cls("ietf" in names, "legacy" in names, "retry-after" in names)


def _sf_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _binding(outcomes: list[Outcome]) -> Outcome | None:
    enforced = [o for o in outcomes if not o.shadow]
    if not enforced:
        return None
    refused = [o for o in enforced if not o.decision.allowed]
    if refused:
        return refused[0]
    return min(enforced, key=lambda o: (o.decision.remaining, -o.decision.reset_after))


def render(verdict: Verdict, sets: HeaderSets, *, now: float | None = None) -> list[tuple[str, str]]:
    """The headers for one request's verdict, each field once. Shadow limits and limits the
    store could not decide are left out; a request no enforced limit decided gets none of
    the limit fields, and a request decided without the store gets ``RateLimit-Undecided``."""
    if not (sets.ietf or sets.legacy or sets.retry_after):
        return []
    out: list[tuple[str, str]] = []
    if verdict.undecided is not None:
        out.append(("RateLimit-Undecided", verdict.undecided))
    binding = _binding(verdict.outcomes)
    if binding is None:
        return out
    d = binding.decision
    refused = not d.allowed
    t = math.ceil(d.retry_after if refused else d.reset_after)
    retry = max(1, math.ceil(d.retry_after), t) if refused else 0
    if sets.ietf:
        seen: dict[str, None] = {}
        parts = []
        for check in verdict.planned:
            if verdict.is_shadow(check):
                continue
            for p in check.policies:
                if p.name not in seen:
                    seen[p.name] = None
                    parts.append(f"{_sf_string(p.name)};q={p.quota};w={p.window}")
        out.append(("RateLimit-Policy", ", ".join(parts)))
        out.append(("RateLimit", f"{_sf_string(binding.policy.name)};r={d.remaining};t={t}"))
    if sets.legacy:
        now = time.time() if now is None else now
        out.append(("X-RateLimit-Limit", str(d.limit)))
        out.append(("X-RateLimit-Remaining", str(d.remaining)))
        out.append(("X-RateLimit-Reset", str(math.ceil(now + (d.retry_after if refused else d.reset_after)))))
    if refused and sets.retry_after:
        out.append(("Retry-After", str(retry)))
    return out


HEADER_NAMES = frozenset(
    n.lower()
    for n in ("RateLimit-Policy", "RateLimit", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset",
              "Retry-After", "RateLimit-Undecided")
)
"""Every field [`render`][redcount.web.headers.render] may set, lower case: integrations drop these from a response
before adding the rendered ones, so a field is never duplicated."""
