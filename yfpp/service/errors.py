"""The errors the service answers requests with."""

from __future__ import annotations

from typing import Any

from yfpp.errors import YfppError


class RequestError(YfppError):
    """A request the service refuses: HTTP ``status`` and a JSON ``body``."""

    def __init__(self, status: int, error: str, **extra: Any):
        super().__init__(error)
        self.status = status
        self.body = {"error": error, **extra}
