"""The ASGI application uvicorn serves: Django's, with the lag probe started in each worker
by its first HTTP request."""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "e2e_project.settings")

from django.core.asgi import get_asgi_application  # noqa: E402

from . import lagprobe  # noqa: E402

django_application = get_asgi_application()


async def application(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "http":
        lagprobe.ensure_started()
    await django_application(scope, receive, send)
