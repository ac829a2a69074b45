"""Django settings for the redcount.django tests (configured by this folder's conftest.py).
No database: users come from the test-only ``X-Test-User`` header."""

from __future__ import annotations

SECRET_KEY = "redcount-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
DATABASES: dict[str, object] = {}
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "rest_framework",
    "redcount.django",
]
MIDDLEWARE = [
    "redcount_django_auth.FakeAuthMiddleware",
    "redcount.django.RateLimitMiddleware",
]
ROOT_URLCONF = "redcount_django_app"
REDCOUNT = {"URL": "memory://"}
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["redcount_django_auth.HeaderAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_THROTTLE_RATES": {"anon": "3/minute", "user": "5/minute", "burst": "2/minute", "uploads": "4/hour"},
}
LOGGING_CONFIG = None
