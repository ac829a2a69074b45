"""The views, URLs and test-only auth of the redcount.django tests."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse, JsonResponse
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View
from rest_framework.response import Response
from rest_framework.views import APIView

import redcount.django.drf as rdrf
from redcount.django import exempt, limit
from redcount.django.ratelimit import ALL, UNSAFE, ratelimit


def ok(request: Any, *args: Any, **kwargs: Any) -> HttpResponse:
    return HttpResponse("ok")


async def aok(request: Any) -> HttpResponse:
    return HttpResponse("ok")


def login_view(request: Any) -> HttpResponse:
    return HttpResponse("welcome" if request.GET.get("pw") == "right" else "no", status=200 if request.GET.get("pw") == "right" else 401)


async def alogin_view(request: Any) -> HttpResponse:
    return login_view(request)


def limited_flag(request: Any) -> JsonResponse:
    return JsonResponse({"limited": getattr(request, "limited", None)})


async def alimited_flag(request: Any) -> JsonResponse:
    return limited_flag(request)


def flag(name: str) -> Any:
    """A view of its own (django-ratelimit names the default group after the function)."""

    def view(request: Any) -> JsonResponse:
        return limited_flag(request)

    view.__name__ = view.__qualname__ = name
    return view


def aflag(name: str) -> Any:
    async def view(request: Any) -> JsonResponse:
        return limited_flag(request)

    view.__name__ = view.__qualname__ = name
    return view


def plan_of(request: Any) -> str:
    return "5/minute" if request.headers.get("X-Plan") == "pro" else "2/minute"


def tenant_key(request: Any) -> str:
    return "tenant:" + request.headers.get("X-Tenant", "none")


def group_tenant_key(group: str, request: Any) -> str:
    return request.headers.get("X-Tenant", "none")


def group_rate(group: str, request: Any) -> str | None:
    return None if request.headers.get("X-Plan") == "unlimited" else "2/m"


# -- redcount.django.limit ------------------------------------------------------------------

sync_view = limit("3/minute")(ok)
async_view = limit("3/minute")(aok)
user_view = limit("2/minute", key="user")(ok)
auser_view = limit("2/minute", key="user")(aok)
header_view = limit("2/minute", key="header:X-Api-Key")(ok)
callable_view = limit("2/minute", key=tenant_key)(ok)
dotted_view = limit("2/minute", key="redcount_django_app.tenant_key")(ok)
cost_view = limit("5/minute", cost=2)(ok)
cost_callable_view = limit("5/minute", cost=lambda r: int(r.GET.get("n", "1")))(ok)
post_only_view = limit("1/minute", methods=["POST"])(ok)
per_method_view = limit("1/minute", per_method=True)(ok)
shared_a = limit("3/minute", scope="reports")(ok)
shared_b = limit("3/minute", scope="reports")(ok)
exempt_view = limit("1/minute", exempt_when=lambda r: r.headers.get("X-Internal") == "yes")(ok)
login = limit("2/minute", deduct_when=lambda response: response.status_code == 401)(login_view)
alogin = limit("2/minute", deduct_when=lambda request, response: response.status_code == 401)(alogin_view)
plan_view = limit(plan_of)(ok)
stacked_view = limit("5/minute", name="burst")(limit("10/hour", name="hourly")(ok))
shadow_view = limit("1/minute", shadow=True)(ok)


@method_decorator(limit("2/minute"), name="dispatch")
class CBV(View):
    def get(self, request: Any) -> HttpResponse:
        return HttpResponse("cbv")


@limit("2/minute", key="user")
class DecoratedCBV(View):
    def get(self, request: Any) -> HttpResponse:
        return HttpResponse("cbv2")


class AsyncCBV(View):
    @method_decorator(limit("2/minute"))
    async def get(self, request: Any) -> HttpResponse:
        return HttpResponse("acbv")


# -- views the middleware leaves alone -----------------------------------------------------


@exempt
def exempt_ok(request: Any) -> HttpResponse:
    return HttpResponse("exempt")


@exempt
async def exempt_aok(request: Any) -> HttpResponse:
    return HttpResponse("exempt")


@exempt
@limit("2/minute")
def exempt_limited(request: Any) -> HttpResponse:
    return HttpResponse("exempt, own limit")


@exempt
class ExemptCBV(View):
    def get(self, request: Any) -> HttpResponse:
        return HttpResponse("exempt cbv")


@exempt
class ExemptAPI(APIView):
    throttle_classes = [rdrf.AnonRateThrottle]

    def get(self, request: Any) -> Response:
        return Response({"ok": True})


# -- redcount.django.ratelimit (django-ratelimit's API) -------------------------------------

rl_ip = ratelimit(key="ip", rate="2/m")(flag("rl_ip"))
rl_ip_noblock = ratelimit(key="ip", rate="2/m", block=False)(flag("rl_ip_noblock"))
rl_user = ratelimit(key="user", rate="2/m", block=False)(flag("rl_user"))
rl_user_or_ip = ratelimit(key="user_or_ip", rate="2/m", block=False)(flag("rl_user_or_ip"))
rl_header = ratelimit(key="header:x-api-key", rate="2/m", block=False)(flag("rl_header"))
rl_get = ratelimit(key="get:q", rate="2/m", block=False)(flag("rl_get"))
rl_post = ratelimit(key="post:q", rate="2/m", block=False)(flag("rl_post"))
rl_callable = ratelimit(key=group_tenant_key, rate="2/m", block=False)(flag("rl_callable"))
rl_dotted = ratelimit(key="redcount_django_app.group_tenant_key", rate="redcount_django_app.group_rate", block=False)(flag("rl_dotted"))
rl_rate_callable = ratelimit(key="ip", rate=group_rate, block=False)(flag("rl_rate_callable"))
rl_tuple = ratelimit(key="ip", rate=(2, 60), block=False)(flag("rl_tuple"))
rl_multi = ratelimit(key="ip", rate="2/5m", block=False)(flag("rl_multi"))
rl_post_method = ratelimit(key="ip", rate="1/m", method="POST", block=False)(flag("rl_post_method"))
rl_unsafe = ratelimit(key="ip", rate="1/m", method=UNSAFE, block=False)(flag("rl_unsafe"))
rl_all = ratelimit(key="ip", rate="1/m", method=ALL, block=False)(flag("rl_all"))
rl_group_a = ratelimit(group="shared", key="ip", rate="2/m", block=False)(flag("rl_group_a"))
rl_group_b = ratelimit(group="shared", key="ip", rate="2/m", block=False)(flag("rl_group_b"))
rl_stacked = ratelimit(key="ip", rate="1/m", block=False)(ratelimit(key="header:x-api-key", rate="100/m", block=False)(flag("rl_stacked")))
rl_async = ratelimit(key="ip", rate="2/m")(aflag("rl_async"))
rl_async_user = ratelimit(key="user", rate="2/m", block=False)(aflag("rl_async_user"))


class RLView(View):
    @method_decorator(ratelimit(key="ip", rate="1/m", method="POST"))
    def post(self, request: Any) -> HttpResponse:
        return HttpResponse("posted")

    def get(self, request: Any) -> HttpResponse:
        return HttpResponse("got")


# -- Django REST framework ------------------------------------------------------------------


class AnonAPI(APIView):
    throttle_classes = [rdrf.AnonRateThrottle]

    def get(self, request: Any) -> Response:
        return Response({"ok": True})


class UserAPI(APIView):
    throttle_classes = [rdrf.UserRateThrottle]

    def get(self, request: Any) -> Response:
        return Response({"ok": True})


class ScopedAPI(APIView):
    throttle_classes = [rdrf.ScopedRateThrottle]
    throttle_scope = "burst"

    def get(self, request: Any) -> Response:
        return Response({"ok": True})


class ScopedAPI2(ScopedAPI):
    pass


class UnscopedAPI(APIView):
    throttle_classes = [rdrf.ScopedRateThrottle]

    def get(self, request: Any) -> Response:
        return Response({"ok": True})


class DecoratedAPI(APIView):
    @method_decorator(limit("2/minute", key="user"))
    def get(self, request: Any) -> Response:
        return Response({"ok": True})

    @method_decorator(ratelimit(key="ip", rate="1/m", method="POST"))
    def post(self, request: Any) -> Response:
        return Response({"posted": True})


class BothAPI(APIView):
    throttle_classes = [rdrf.AnonRateThrottle, rdrf.UserRateThrottle]

    def get(self, request: Any) -> Response:
        return Response({"ok": True})


_views = {k: v for k, v in list(globals().items()) if callable(v) and (k.endswith("_view") or k.startswith("rl_"))}
urlpatterns = [path(f"{name}/", view) for name, view in _views.items()] + [
    path("shared_a/", shared_a),
    path("shared_b/", shared_b),
    path("login/", login),
    path("alogin/", alogin),
    path("cbv/", CBV.as_view()),
    path("cbv2/", DecoratedCBV.as_view()),
    path("acbv/", AsyncCBV.as_view()),
    path("rlview/", RLView.as_view()),
    path("plain/", ok),
    path("exempt/", exempt_ok),
    path("aexempt/", exempt_aok),
    path("exempt_limited/", exempt_limited),
    path("exemptcbv/", ExemptCBV.as_view()),
    path("api/exempt/", ExemptAPI.as_view()),
    path("aplain/", aok),
    path("api/anon/", AnonAPI.as_view()),
    path("api/user/", UserAPI.as_view()),
    path("api/scoped/", ScopedAPI.as_view()),
    path("api/scoped2/", ScopedAPI2.as_view()),
    path("api/unscoped/", UnscopedAPI.as_view()),
    path("api/both/", BothAPI.as_view()),
    path("api/decorated/", DecoratedAPI.as_view()),
    path("health/", ok),
    path("health/deep/", ok),
]
