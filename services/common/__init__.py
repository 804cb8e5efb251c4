"""What every FastAPI service shares: error bodies, RED metrics, health routes, logs, tracing."""

from services.common import http, observability

__all__ = ["http", "observability"]
