"""Key functions for Django requests: who a limit counts.

```text
@redcount.django.limit("5/minute", key="user")            # by name
@redcount.django.limit("5/minute", key=keys.header("X-Tenant"))
@redcount.django.limit("5/minute", key=lambda request: request.session["org"])
```

By name: ``"ip"`` (the client address, through ``REDCOUNT["TRUSTED_PROXIES"]``; the
default), ``"user"`` and ``"user_or_ip"`` (the authenticated user's primary key, else the
client address), ``"header:<name>"`` (a header's value, else the client address). Any
[`redcount.web.RequestKey`][redcount.web.spec.RequestKey] ([`redcount.web.api_key`][redcount.web.spec.api_key], [`redcount.web.by_header`][redcount.web.spec.by_header])
or callable of the Django request returning a str works too, as does a dotted path to one.
"""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import import_string

from ..errors import InvalidInputError
from ..web.spec import KeyFunc, RequestKey, RequestView, as_key as _web_as_key, by_header, remote_address

__all__ = ["as_key", "header", "ip", "user", "user_or_ip"]

ip = remote_address
"""The client address: the socket peer, or what trusted proxies forwarded for."""


def _user(view: RequestView) -> str:
    u = view.user  # type: ignore[attr-defined]
    if u is not None and getattr(u, "is_authenticated", False):
        return f"user:{u.pk}"
    return view.client


user = RequestKey(_user, "user")
"""The authenticated user's primary key (``user:<pk>``); anonymous requests are counted by
client address. In async views the user is loaded with ``await request.auser()``, never a
blocking database call on the event loop."""

user_or_ip = user
"""The same as [`user`][redcount.django.keys.user] (the name django-ratelimit users know)."""


def header(name: str) -> RequestKey:
    """The value of request header ``name``; requests without it fall back to the client
    address."""
    return by_header(name)


def needs_user(key: Any) -> bool:
    """Whether ``key`` reads ``request.user`` (async code loads it first)."""
    return key is user


def as_key(value: Any, where: str) -> KeyFunc:
    """A ``key=`` argument or ``REDCOUNT["KEY"]`` as a key function; bad values raise
    [`InvalidInputError`][redcount.errors.InvalidInputError] naming ``where``."""
    if isinstance(value, str):
        if value == "ip":
            return ip
        if value in ("user", "user_or_ip"):
            return user
        if value.startswith("header:") and value[len("header:"):]:
            return header(value[len("header:"):])
        if "." in value:
            try:
                value = import_string(value)
            except ImportError as e:
                raise InvalidInputError(f"key on {where}: cannot import {value!r}: {e}") from None
        else:
            raise InvalidInputError(
                f"key on {where} must be 'ip', 'user', 'user_or_ip', 'header:<name>', a callable or its dotted path, "
                f"got {value!r}"
            )
    if not callable(value):
        raise InvalidInputError(f"key on {where} must be a str name, a callable or a dotted path, got {value!r}")
    return _web_as_key(value, where)
