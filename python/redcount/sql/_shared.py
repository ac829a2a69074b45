"""Checks and small conversions that the SQL modules (snapshots, flusher, reconciliation,
restoration) share."""

from __future__ import annotations

from typing import Any

from ..errors import InvalidInputError

MAX_NAME = 255
"""Longest counter name the tables hold (MySQL's index limit keeps keys short)."""


def check_name(name: str) -> None:
    """Raise [`InvalidInputError`][redcount.errors.InvalidInputError] unless ``name`` fits the tables."""
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        raise InvalidInputError(f"counter name must be 1..{MAX_NAME} characters, got {name!r}")


def first_line(exc: BaseException) -> str:
    """The first line of a database error (the driver's own, when SQLAlchemy wraps one): enough
    for a message without the SQL statement and parameters that follow it."""
    text = str(getattr(exc, "orig", None) or exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def as_text(v: Any) -> str:
    """A Redis reply field as str (bulk strings come back as bytes)."""
    return v.decode() if isinstance(v, bytes) else str(v)
