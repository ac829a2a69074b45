"""Keeping passwords out of what the tools print and of other processes' command lines.

A store URL may carry a password (``redis://user:PASSWORD@host/0``,
``unix:///run/redis.sock?password=PASSWORD``). The tools print URLs in their errors and
start ``redis-benchmark``; neither may show the password: process arguments are readable by
every local user (``/proc/<pid>/cmdline``), and error output ends up in logs and bug reports.

    mask_url("redis://app:hunter2@db:6379/0")   # -> "redis://app:***@db:6379/0"
    redact("cannot reach redis://:hunter2@db/0", "redis://:hunter2@db/0")
"""

from __future__ import annotations

import re
import urllib.parse

__all__ = ["MASK", "mask_url", "redact", "url_password"]

MASK = "***"

# user:password@ in the authority part, however the rest of the URL looks (it may not parse).
_USERINFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://[^/?#@:]*:)([^/?#@]*)(@)")
_QUERY_PASSWORD = re.compile(r"([?&](?:password|pass|auth|requirepass)=)([^&#]*)", re.IGNORECASE)


def mask_url(url: str) -> str:
    """``url`` with its password (in the user info or a ``password=`` query) replaced by ``***``."""
    masked = _USERINFO.sub(lambda m: m.group(1) + MASK + m.group(3), url, count=1)
    return _QUERY_PASSWORD.sub(lambda m: m.group(1) + MASK, masked)


def url_password(url: str) -> str:
    """The password ``url`` carries (decoded), or ``""``."""
    m = _USERINFO.match(url)
    if m and m.group(2):
        return urllib.parse.unquote(m.group(2))
    q = _QUERY_PASSWORD.search(url)
    return urllib.parse.unquote_plus(q.group(2)) if q else ""


def redact(text: str, *urls: str | None) -> str:
    """``text`` with every one of ``urls`` masked, and their passwords (raw or percent-encoded)
    replaced by ``***`` wherever else they appear (an error may quote only a part of a URL)."""
    for url in urls:
        if not url:
            continue
        text = text.replace(url, mask_url(url))
        pw = url_password(url)
        for form in {pw, urllib.parse.quote(pw, safe=""), urllib.parse.quote_plus(pw)}:
            if form:
                text = text.replace(form, MASK)
    return text
