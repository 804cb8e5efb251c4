"""Machine-readable errors, RED metrics per route, and the health/readiness/metrics routes."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fastapi import APIRouter, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from opentelemetry import trace
from prometheus_client import CONTENT_TYPE_LATEST, Counter, Histogram, generate_latest
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.common import observability
from services.contracts import metrics as metric_names
from services.contracts import workloads

REQUESTS = Counter(
    metric_names.HTTP_REQUESTS, "HTTP requests by route and status", ["service", "route", "status"]
)
DURATION = Histogram(
    metric_names.HTTP_DURATION,
    "HTTP request duration by route",
    ["service", "route"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0),
)


class ApiError(Exception):
    """An answer other than success: HTTP status, a stable code, a message, optional headers."""

    def __init__(
        self, status: int, code: str, message: str, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = headers or {}


def error_body(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, **extra}}


class BodyTooLarge(Exception):
    pass


class BodyLimit:
    """Refuse a request body over `max_bytes` with 413, whether or not it says its length: a
    Content-Length over the limit is refused before reading, and a chunked body is counted as it
    streams and cut off at the limit (trusting Content-Length alone let a chunked body through)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_bytes):
            await self._refuse(send)
            return
        seen = 0
        started = False

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge
            return message

        async def tracked(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counted, tracked)
        except BodyTooLarge:
            if not started:
                await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        body = json.dumps(
            error_body("body_too_large", f"the body exceeds {self.max_bytes} bytes")
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})


_tracer = trace.get_tracer("likes.http")  # a proxy: follows the provider set at start-up
# the kubelet's probes and Prometheus's scrapes: a trace each would be noise the samplers keep
UNTRACED_PATHS = frozenset({workloads.HEALTH_PATH, workloads.READY_PATH, workloads.METRICS_PATH})


class RedMetrics:
    """Rate, errors and duration per route template: a pure ASGI middleware (Starlette's
    BaseHTTPMiddleware costs a task and a stream per request on the hottest path we have).

    Until observability.install_tracer_provider runs, no span is opened at all: even
    OpenTelemetry's no-op span (its context managers, context attach and detach) was 7 % of an
    anonymous read's CPU in a py-spy profile. Label children are bound once per route and status
    (`labels()` validates, hashes and locks on every call)."""

    def __init__(self, app: ASGIApp, service: str, fastapi_app: FastAPI) -> None:
        self.app = app
        self.service = service
        self.fastapi_app = fastapi_app
        self._durations: dict[str, Any] = {}
        self._requests: dict[tuple[str, int], Any] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        if (
            not observability.tracing_on()
            or scope["path"] in UNTRACED_PATHS
            or observability.unsampled(scope.get("headers"))
        ):
            try:
                await self.app(scope, receive, send_status)
            finally:
                self._record(scope, status, t0)
            return
        with _tracer.start_as_current_span(
            f"{scope['method']} {scope['path']}",
            context=observability.context_from(scope.get("headers")),  # the gateway's span
            kind=trace.SpanKind.SERVER,
        ) as span:
            try:
                await self.app(scope, receive, send_status)
            finally:
                route = self._record(scope, status, t0)
                if span.is_recording():
                    span.update_name(f"{scope['method']} {route}")
                    span.set_attribute("http.route", route)
                    span.set_attribute("http.response.status_code", status)
                    span.set_attribute("likes.service", self.service)
                    if status >= 500:
                        span.set_status(trace.Status(trace.StatusCode.ERROR))

    def _record(self, scope: Scope, status: int, t0: float) -> str:
        """Observe the request; its route label, which the router records in the scope
        (unmatched paths have none)."""
        route = getattr(scope.get("route"), "path", None) or "unmatched"
        duration = self._durations.get(route)
        if duration is None:
            duration = self._durations[route] = DURATION.labels(self.service, route)
        duration.observe(time.perf_counter() - t0)
        requests = self._requests.get((route, status))
        if requests is None:
            requests = self._requests[(route, status)] = REQUESTS.labels(
                self.service, route, str(status)
            )
        requests.inc()
        return route


def install(
    app: FastAPI, service: str, ready: Callable[[], Awaitable[dict[str, bool]]] | None = None
) -> None:
    """Errors as JSON, RED metrics middleware, /healthz, /readyz and /metrics."""

    @app.exception_handler(ApiError)
    async def _api_error(_request: Request, exc: ApiError) -> JSONResponse:
        return JSONResponse(
            error_body(exc.code, exc.message), status_code=exc.status, headers=exc.headers
        )

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        details = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "")} for e in exc.errors()]
        return JSONResponse(
            error_body("invalid_request", "the request is not valid", details=details),
            status_code=422,
        )

    app.add_middleware(RedMetrics, service=service, fastapi_app=app)

    ops = APIRouter(tags=["ops"])

    @ops.get(workloads.HEALTH_PATH)
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @ops.get(workloads.READY_PATH)
    async def readyz() -> JSONResponse:
        checks = await ready() if ready else {}
        ok = all(checks.values())
        return JSONResponse({"ready": ok, "checks": checks}, status_code=200 if ok else 503)

    @ops.get(workloads.METRICS_PATH)
    async def metrics() -> Response:
        return Response(generate_latest(), media_type=CONTENT_TYPE_LATEST)

    app.include_router(ops)
