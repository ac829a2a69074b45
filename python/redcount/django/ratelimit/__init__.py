"""django-ratelimit's API on redcount: switching is one import.

```python
# from django_ratelimit.decorators import ratelimit
from redcount.django.ratelimit import ratelimit

@ratelimit(key="ip", rate="5/m", block=False)
def login(request):
    if request.limited: ...
```

The module paths mirror django-ratelimit's (``redcount.django.ratelimit.decorators``,
``.core``, ``.exceptions``, ``.middleware``), so ``django_ratelimit`` can be replaced by
``redcount.django.ratelimit`` in every import. The arguments and ``request.limited`` mean
what they mean there; what differs:

- counting is atomic on Redis (or the embedded store), from sync and async views alike;
- ``block=True`` answers 429 with the ``RateLimit``/``RateLimit-Policy`` and ``Retry-After``
  headers and a problem+json body; ``REDCOUNT["RATELIMIT_COMPAT_403"] = True`` raises
  [`Ratelimited`][redcount.django.ratelimit.exceptions.Ratelimited] (a ``PermissionDenied``: 403, or ``RATELIMIT_EXCEPTION_CLASS``) as
  django-ratelimit does;
- ``key="ip"`` is the client address through ``REDCOUNT["TRUSTED_PROXIES"]`` and
  ``IPV6_PREFIX`` (``RATELIMIT_IP_META_KEY`` and the ``RATELIMIT_*_MASK`` settings are not
  read); the store and the failure policy are ``REDCOUNT``'s (``RATELIMIT_USE_CACHE`` and
  ``RATELIMIT_FAIL_OPEN`` are not read); ``RATELIMIT_ENABLE = False`` still turns it off;
- a refused request is not counted (django-ratelimit counts it), and
  ``is_ratelimited(..., increment=False)`` answers whether one more request would be
  refused (django-ratelimit: whether the count is already over the limit);
- a missing ``key`` or an unknown key name is refused when the view is decorated, not on
  its first request.
"""

from __future__ import annotations

from .core import ALL, UNSAFE, aget_usage, ais_ratelimited, get_usage, is_ratelimited
from .decorators import ratelimit
from .exceptions import Ratelimited

__all__ = ["ALL", "UNSAFE", "Ratelimited", "aget_usage", "ais_ratelimited", "get_usage", "is_ratelimited", "ratelimit"]
