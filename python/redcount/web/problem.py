"""The JSON bodies (RFC 9457 problem details, with the problem types of
draft-ietf-httpapi-ratelimit-headers-11) of the responses the integrations produce.

```python
body = json.dumps(too_many_requests(verdict)).encode()   # 429
body = json.dumps(store_unavailable()).encode()          # 503, fail="closed"
```
"""

from __future__ import annotations

import math
from typing import Any

from .engine import Verdict

__all__ = ["CONTENT_TYPE", "store_unavailable", "too_many_requests"]

CONTENT_TYPE = "application/problem+json"
"""The media type of the 429 and 503 bodies (RFC 9457 problem details)."""


def too_many_requests(verdict: Verdict) -> dict[str, Any]:
    """The 429 body: which policies refused and when to retry."""
    refusal = verdict.refusal
    retry = max(1, math.ceil(refusal.decision.retry_after)) if refusal is not None else 1
    violated = [refusal.policy.name] if refusal is not None else []
    return {
        "type": "https://iana.org/assignments/http-problem-types#quota-exceeded",
        "title": "Too Many Requests",
        "status": 429,
        "detail": f"rate limit exceeded; retry in {retry} s",
        "violated-policies": violated,
        "retry_after": retry,
    }


def store_unavailable() -> dict[str, Any]:
    """The 503 body when the store is down and the policy is ``fail="closed"``."""
    return {
        "type": "https://iana.org/assignments/http-problem-types#temporary-reduced-capacity",
        "title": "Service Unavailable",
        "status": 503,
        "detail": "the rate limiter cannot decide right now; retry shortly",
    }
