"""Rate limiting for Django: a middleware, a view decorator, a drop-in for django-ratelimit
and Django REST framework throttles, all on one ``REDCOUNT`` setting.

```python
# settings.py
INSTALLED_APPS = [..., "redcount.django"]            # validates REDCOUNT at start-up
MIDDLEWARE = [..., "redcount.django.RateLimitMiddleware"]
REDCOUNT = {"URL": "redis://cache:6379/0", "DEFAULT_LIMITS": ["1000/hour"]}

# views.py
from redcount.django import limit

@limit("10/minute", key="user")
def search(request): ...
```

- [`RateLimitMiddleware`][redcount.django.middleware.RateLimitMiddleware]: the site's default and per-path limits, and the rate-limit
  headers on every response; sync and async (under ASGI it awaits [`redcount.aio`][redcount.aio]).
- [`exempt`][redcount.django.middleware.exempt]: takes a view out of the middleware's limits.
- [`limit`][redcount.django.decorators.limit]: a limit on one view (function, async or class-based): key, cost, methods,
  scope, exemption, charge by outcome (``deduct_when``).
- [`redcount.django.ratelimit`][redcount.django.ratelimit]: django-ratelimit's API (``ratelimit``,
  ``is_ratelimited``, ``get_usage``, ``Ratelimited``, ``ALL``, ``UNSAFE``) on redcount.
- [`redcount.django.drf`][redcount.django.drf]: ``UserRateThrottle``, ``AnonRateThrottle``,
  ``ScopedRateThrottle`` twins of Django REST framework's, atomic.
- [`redcount.django.conf`][redcount.django.conf]: the settings ([`DEFAULTS`][redcount.django.conf.DEFAULTS] lists them).

Refusals are 429 with the IETF ``RateLimit``/``RateLimit-Policy`` fields, ``Retry-After`` and
an ``application/problem+json`` body (RFC 9457), or ``REDCOUNT["VIEW"]``'s answer.
"""

from __future__ import annotations

try:
    import django  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised without Django installed
    raise ImportError(f"redcount.django needs Django ({exc.name} is missing): pip install 'redcount[django]'") from exc

from ._http import RateLimitExceeded, verdict
from .conf import ConfigurationError, get_state, reset_state
from .decorators import limit
from .keys import header, ip, user, user_or_ip
from .middleware import RateLimitMiddleware, exempt

__all__ = [
    "ConfigurationError",
    "RateLimitExceeded",
    "RateLimitMiddleware",
    "exempt",
    "get_state",
    "header",
    "ip",
    "limit",
    "reset_state",
    "user",
    "user_or_ip",
    "verdict",
]
