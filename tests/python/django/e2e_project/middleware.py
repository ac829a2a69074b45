"""Says which worker process answered, on every response (refusals included): the tests
check that every worker took part in a burst."""

from __future__ import annotations

import os
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction


class WorkerHeader:
    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Any) -> None:
        self.get_response = get_response
        self._async = iscoroutinefunction(get_response)
        if self._async:
            markcoroutinefunction(self)

    def __call__(self, request: Any) -> Any:
        if self._async:
            return self._acall(request)
        response = self.get_response(request)
        response["X-Worker"] = str(os.getpid())
        return response

    async def _acall(self, request: Any) -> Any:
        response = await self.get_response(request)
        response["X-Worker"] = str(os.getpid())
        return response
