from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("health", views.health),
    path("mw/sync", views.mw_sync),
    path("mw/async", views.mw_async),
    path("unlimited", views.unlimited),
    path("deco/sync", views.deco_sync),
    path("deco/async", views.deco_async),
    path("lag", views.lag),
    path("blocking", views.blocking),
    path("drf/builtin", views.DrfBuiltin.as_view()),
    path("drf/redcount", views.DrfRedcount.as_view()),
]
