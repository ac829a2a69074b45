"""Charging by outcome (``deduct_when=``), shared by the Flask and FastAPI integrations.

A limit with ``deduct_when`` is *tested* before the view (a request over it is refused,
nothing is charged) and *charged* after it, only when ``deduct_when(response)`` (or
``deduct_when(request, response)``) is true: ``lambda r: r.status_code >= 400`` counts
failed logins only. Testing and charging are two steps, so requests of one key that are
in flight together were all tested against the same count: with N of them running at once,
up to N - 1 more than the limit may run (e.g. a limit of 5 failed logins with 4 used and 10
attempts sent at once: all 10 are tested at 4 and run). Their charges are hits: the ones
past the limit are refused and record nothing, so the count never exceeds the limit and
the next request is refused until the window frees up. See docs/refunds.md.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..errors import InvalidInputError
from .engine import Verdict
from .spec import Check

__all__ = ["Deduct", "deduct_predicate", "merge_charged", "split_checks"]


class Deduct:
    """A checked ``deduct_when`` predicate: ``matches(request, response)``."""

    __slots__ = ("arity", "fn")

    def __init__(self, fn: Callable[..., Any], arity: int) -> None:
        self.fn = fn
        self.arity = arity

    def matches(self, request: Any, response: Any) -> bool:
        return bool(self.fn(request, response) if self.arity == 2 else self.fn(response))


def deduct_predicate(fn: Callable[..., Any] | None, where: str) -> Deduct | None:
    """``fn`` checked at start-up: a callable of the response, or of the request and the
    response; None stays None. Raises [`InvalidInputError`][redcount.errors.InvalidInputError] naming ``where``."""
    if fn is None:
        return None
    if not callable(fn):
        raise InvalidInputError(
            f"deduct_when on {where} must be callable(response) or callable(request, response), got {type(fn).__name__}"
        )
    try:
        params = [
            p
            for p in inspect.signature(fn).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
        arity = 2 if len(params) >= 2 else 1
    except (TypeError, ValueError):  # a builtin without a signature: called with the response
        arity = 1
    return Deduct(fn, arity)


def split_checks(checks: Sequence[Check], deducts: Mapping[int, Deduct]) -> tuple[list[Check], list[Check]]:
    """(checks charged now, checks tested now and charged by outcome), in their order."""
    now: list[Check] = []
    later: list[Check] = []
    for c in checks:
        (later if id(c.spec) in deducts else now).append(c)
    return now, later


def merge_charged(verdict: Verdict, charged: Verdict) -> None:
    """After the charge by outcome: each allowed charge's outcome replaces its check's test
    outcome in the request's verdict, so the headers tell the count after the charge. (A
    charge the limit refused, others having charged in between, leaves the test's outcome:
    the response was already decided.)"""
    for o in charged.outcomes:
        if o.decision.allowed:
            verdict.outcomes = [x for x in verdict.outcomes if x.check is not o.check]
            verdict.outcomes.append(o)
