"""Settings of the end-to-end project, from the environment the test gives the server:

- ``E2E_REDIS_URL``: the Redis of redcount's limits; ``E2E_CACHE_URL``: the Redis of Django's
  cache (django-redis), which DRF's own throttles and django-ratelimit count in;
- ``E2E_PREFIX``, ``E2E_STRATEGY``, ``E2E_LIMIT`` (e.g. ``25/minute``), ``E2E_ROUTE_LIMIT``
  (the own limit of the views under ``/mw/deco/``, on top of the middleware's);
- ``E2E_FAIL`` (``open``/``closed``), ``E2E_BUDGET`` (seconds), ``E2E_TRUSTED_PROXIES``
  (empty: trust no forwarding header; else comma-separated CIDRs).
"""

from __future__ import annotations

import os

SECRET_KEY = "redcount-e2e-not-secret"
DEBUG = False
ALLOWED_HOSTS = ["*"]
ROOT_URLCONF = "e2e_project.urls"
USE_TZ = True
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "rest_framework", "redcount.django"]
DATABASES: dict[str, object] = {}
LOGGING_CONFIG = None

LIMIT = os.environ.get("E2E_LIMIT", "25/minute")
ROUTE_LIMIT = os.environ.get("E2E_ROUTE_LIMIT", "4/minute")
_trusted = os.environ.get("E2E_TRUSTED_PROXIES", "")

MIDDLEWARE = ["e2e_project.middleware.WorkerHeader", "redcount.django.RateLimitMiddleware"]

REDCOUNT = {
    "URL": os.environ.get("E2E_REDIS_URL", "memory://"),
    "PREFIX": os.environ.get("E2E_PREFIX", "e2e"),
    "STRATEGY": os.environ.get("E2E_STRATEGY", "fixed-window"),
    "HEADERS": "all",
    "FAIL": os.environ.get("E2E_FAIL", "open"),
    "BUDGET": float(os.environ.get("E2E_BUDGET", "5")),
    "TRUSTED_PROXIES": [c for c in _trusted.split(",") if c] or None,
    # The middleware limits every view under /mw/ (one counter for all of them, per client);
    # the views under /deco/ and /drf/ carry their own limits, the others none.
    "PATHS": {"/mw/": LIMIT},
}

CACHES = {
    "default": {
        "BACKEND": "django_redis.cache.RedisCache",
        "LOCATION": os.environ.get("E2E_CACHE_URL", "redis://127.0.0.1:6379/1"),
    }
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_THROTTLE_RATES": {"anon": LIMIT, "user": LIMIT},
}
