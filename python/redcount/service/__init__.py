"""The counter HTTP service: redcount's sharded counters as a ready ASGI app.

```python
import redcount
from redcount.service import create_app

store = redcount.connect("redis://127.0.0.1:6379/0")
app = create_app(store, sql_url="sqlite:///counters.db", token="s3cret")
# serve it with any ASGI server, e.g. uvicorn.run(app, host="127.0.0.1", port=8080),
# or from the shell: redcount serve --url redis://127.0.0.1:6379/0 --token-file token.txt
```

Needs FastAPI and uvicorn: ``pip install 'redcount[serve]'``. See [`redcount.service.app`][redcount.service.app]
for the endpoints, their limits and their errors.
"""

from __future__ import annotations

from .app import ServiceLimits, create_app

__all__ = ["ServiceLimits", "create_app"]
