"""The framework-free part of redcount's web integrations ([`redcount.flask`][redcount.flask],
[`redcount.fastapi`][redcount.fastapi]): limit specs, client identity, headers, the failure policy and
metrics. The integrations only translate between their framework and this layer.

```text
redcount/web/spec.py       LimitSpec (checked at start-up), key functions, Check
redcount/web/identity.py   ClientIdentity, TrustedProxies (X-Forwarded-For / Forwarded)
redcount/web/engine.py     decide / decide_async, FailurePolicy (fail open / closed), Verdict
redcount/web/headers.py    HeaderSets, render (RateLimit-Policy, RateLimit, X-RateLimit-*, Retry-After)
redcount/web/metrics.py    PrometheusMetrics (optional: prometheus_client)
redcount/web/problem.py    the JSON bodies of 429 and 503
```

Key functions for ``key=``: [`remote_address`][redcount.web.spec.remote_address] (the default), [`api_key`][redcount.web.spec.api_key],
[`by_header`][redcount.web.spec.by_header], [`by_route`][redcount.web.spec.by_route], or any callable of the framework's request returning a
str (a user id, a tenant).
"""

from __future__ import annotations

from .engine import FailurePolicy, StoreUnavailable, Verdict
from .headers import HeaderSets, render
from .identity import ClientIdentity, TrustedProxies
from .spec import KeyFunc, KeyFunctionError, LimitSpec, RequestKey, RequestView, api_key, by_header, by_route, remote_address

__all__ = [
    "ClientIdentity",
    "FailurePolicy",
    "HeaderSets",
    "KeyFunc",
    "KeyFunctionError",
    "LimitSpec",
    "RequestKey",
    "RequestView",
    "StoreUnavailable",
    "TrustedProxies",
    "Verdict",
    "api_key",
    "by_header",
    "by_route",
    "remote_address",
    "render",
]
