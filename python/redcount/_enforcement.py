"""One process-wide switch that turns off the limits of every integration at once.

The web integrations (Flask, FastAPI and Starlette, Django, Django REST framework, the
django-ratelimit drop-in) decide through `redcount.web.engine.decide` and its async
twin, which read `suspended` before anything else;
`redcount.celery.LimitedTask` and `redcount.jobs.throttle` read it too. While
it is set, every request and task start is admitted without asking the store: nothing is
counted and no rate-limit header is sent. A `Limiter` called directly is not
affected: the switch is about the integrations that sit in front of an app.

The public handle is `redcount.testing.disable_limits`. The switch is process-wide on
purpose, not per thread or per context: a test client may run the app on another thread
(Starlette's ``TestClient``, a live server), and that thread must see it too.
"""

from __future__ import annotations

import threading

suspended = False
"""True while at least one `suspend` has not been resumed: the integrations
admit everything. Read on every request, so it is a plain module attribute."""

_holds = 0
_lock = threading.Lock()


def suspend() -> None:
    """Turn every integration's limits off until the matching `resume`. Holds
    nest: the limits come back when the last one is resumed."""
    global suspended, _holds
    with _lock:
        _holds += 1
        suspended = True


def resume() -> None:
    """Undo one `suspend`."""
    global suspended, _holds
    with _lock:
        if _holds == 0:
            raise RuntimeError("redcount: resume() without a matching suspend(): the limits are already on")
        _holds -= 1
        suspended = _holds > 0
