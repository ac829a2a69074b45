from __future__ import annotations

from django.urls import path

from . import views

urlpatterns = [
    path("health", views.health),
    path("mw/sync", views.mw_sync),
    path("mw/async", views.mw_async),
    path("mw/deco/sync", views.mw_deco_sync),
    path("mw/deco/async", views.mw_deco_async),
    path("unlimited", views.unlimited),
    path("deco/sync", views.deco_sync),
    path("deco/async", views.deco_async),
    path("dropin/sync", views.dropin_sync),
    path("dropin/async", views.dropin_async),
    path("lag", views.lag),
    path("blocking", views.blocking),
    path("drf/anon/builtin", views.DrfAnonBuiltin.as_view()),
    path("drf/anon/redcount", views.DrfAnonRedcount.as_view()),
    path("drf/user/builtin", views.DrfUserBuiltin.as_view()),
    path("drf/user/redcount", views.DrfUserRedcount.as_view()),
]
