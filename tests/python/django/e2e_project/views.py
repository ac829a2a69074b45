"""Views of the end-to-end project: sync and async views under redcount's middleware,
decorator and django-ratelimit drop-in, DRF views under DRF's own throttle and under redcount's twin, the lag probe's
read-out and its control."""

from __future__ import annotations

import os

import redcount
from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from rest_framework import throttling
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

import redcount.django
import redcount.django.drf
from redcount.django.ratelimit import ratelimit

from . import lagprobe


def health(request: HttpRequest) -> HttpResponse:
    return HttpResponse(str(os.getpid()))


def mw_sync(request: HttpRequest) -> HttpResponse:
    return HttpResponse(str(os.getpid()))


async def mw_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse(str(os.getpid()))


async def unlimited(request: HttpRequest) -> HttpResponse:
    """No limit: what the server costs without redcount."""
    return HttpResponse(str(os.getpid()))


@redcount.django.limit(settings.LIMIT, name="deco")
def deco_sync(request: HttpRequest) -> HttpResponse:
    return HttpResponse(str(os.getpid()))


@redcount.django.limit(settings.LIMIT, name="deco")
async def deco_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse(str(os.getpid()))


@redcount.django.limit(settings.ROUTE_LIMIT, name="route")
def mw_deco_sync(request: HttpRequest) -> HttpResponse:
    """Under /mw/: the middleware's limit, then this view's own (two checks per request)."""
    return HttpResponse(str(os.getpid()))


@redcount.django.limit(settings.ROUTE_LIMIT, name="route")
async def mw_deco_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse(str(os.getpid()))


@ratelimit(key="ip", rate=settings.LIMIT.replace("/minute", "/m"))
def dropin_sync(request: HttpRequest) -> HttpResponse:
    return HttpResponse(str(os.getpid()))


@ratelimit(key="ip", rate=settings.LIMIT.replace("/minute", "/m"))
async def dropin_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse(str(os.getpid()))


async def lag(request: HttpRequest) -> JsonResponse:
    """The lag probe's samples between ``since`` and ``until`` (time.monotonic())."""
    return JsonResponse(lagprobe.samples(float(request.GET["since"]), float(request.GET["until"])))


_blocking_store: redcount.Store | None = None


async def blocking(request: HttpRequest) -> HttpResponse:
    """The control of the lag probe: a synchronous Redis round trip on the loop's thread, the
    mistake an async middleware must not make. The probe must see it."""
    global _blocking_store
    if _blocking_store is None:
        _blocking_store = redcount.connect(settings.REDCOUNT["URL"])
    _blocking_store.execute("PING")
    return HttpResponse(str(os.getpid()))


class HeaderUser(BaseAuthentication):  # type: ignore[misc]
    """The user whose id is in the ``X-User`` header (no database in this project)."""

    def authenticate(self, request: Request) -> tuple[object, None] | None:
        from django.contrib.auth.models import User

        uid = request.headers.get("X-User")
        return (User(pk=int(uid), username=f"user{uid}"), None) if uid else None


class _Pid(APIView):
    authentication_classes = [HeaderUser]

    def get(self, request: Request) -> Response:
        return Response({"pid": os.getpid()})


class DrfAnonBuiltin(_Pid):
    """DRF's own AnonRateThrottle, counting in Django's cache (django-redis)."""

    throttle_classes = [throttling.AnonRateThrottle]


class DrfAnonRedcount(_Pid):
    """redcount's twin of AnonRateThrottle, reading the same DEFAULT_THROTTLE_RATES."""

    throttle_classes = [redcount.django.drf.AnonRateThrottle]


class DrfUserBuiltin(_Pid):
    throttle_classes = [throttling.UserRateThrottle]


class DrfUserRedcount(_Pid):
    throttle_classes = [redcount.django.drf.UserRateThrottle]
