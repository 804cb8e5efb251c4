"""Structured (JSON) logs and OpenTelemetry tracing that is off unless an exporter is configured."""

from __future__ import annotations

import json
import logging
import sys
import time
from typing import Any

from fastapi.telemetry import TelemetryConfig


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            out.update(fields)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(service: str, level: str = "INFO") -> logging.Logger:
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("cassandra", "httpx", "httpx2", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return logging.getLogger(service)


# FastAPI's native OpenTelemetry (FastAPI(telemetry=...), 0.165) stays off: our RED middleware
# (services/common/http.py) makes the server span and prometheus-client the metrics. Left on, it
# asked OpenTelemetry for its global providers on every request, and with none installed each
# ask reads os.environ: 5 % of the read service's CPU in a py-spy profile under load.
FASTAPI_TELEMETRY_OFF: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}


_tracing = False  # set by install_tracer_provider; read per request by the RED middleware


def tracing_on() -> bool:
    """True once install_tracer_provider ran: the RED middleware opens request spans only then
    (asking OpenTelemetry for its provider reads os.environ each time while none is set)."""
    return _tracing


def install_tracer_provider(provider: Any) -> None:
    """Make `provider` the process's tracer provider (OpenTelemetry takes one per process) and
    turn request spans on. The one way to install a provider: setup_tracing and tests use it."""
    global _tracing
    from opentelemetry import trace

    trace.set_tracer_provider(provider)
    _tracing = True


def setup_tracing(service: str, otlp_endpoint: str | None) -> bool:
    """Install an OTLP exporter when an endpoint is configured; otherwise tracing stays off and
    costs nothing (no span is opened, not even the OpenTelemetry API's no-op one)."""
    if not otlp_endpoint:
        return False
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_endpoint)))
    install_tracer_provider(provider)
    return True


# --- trace context across hops: W3C traceparent in HTTP and Kafka headers ---------------------
# Only while tracing is on: with no provider, none of this runs (no parse, no header).
TRACE_HEADERS = ("traceparent", "tracestate")
MAX_LINKS = 128  # the SDK's default link limit per span: a window links to its first events


def context_from(headers: Any) -> Any:
    """The trace context a caller sent, from HTTP (ASGI: bytes pairs) or Kafka headers
    (str, bytes pairs); None when there is none. Only the W3C headers are decoded."""
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    for k, v in headers or ():
        name = k.decode("latin-1") if isinstance(k, bytes) else k
        if name.lower() in TRACE_HEADERS and v is not None:
            carrier[name.lower()] = v.decode("latin-1") if isinstance(v, bytes) else v
    if "traceparent" not in carrier:
        return None
    return TraceContextTextMapPropagator().extract(carrier)


def unsampled(headers: Any) -> bool:
    """Whether the caller's W3C traceparent (ASGI bytes pairs) says "not sampled": the gateway
    head-samples reads, so most arrive so, and the middleware then opens no span at all (the
    SDK's non-recording span, its context attach and the header parse cost an anonymous read
    about a fifth of its CPU, bench/cpu_read.py). Such a request's events carry no trace
    context either: nothing downstream would have kept it. A malformed header is not an
    unsampled one (the propagator decides)."""
    for k, v in headers or ():
        if k == b"traceparent":
            # version 00: 00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>
            if len(v) != 55 or v[:3] != b"00-":
                return False
            try:
                return not int(v[53:55], 16) & 1
            except ValueError:
                return False
    return False


def span_context_from(headers: Any) -> Any:
    """The remote span a message's headers name (for a span link), or None."""
    from opentelemetry import trace

    ctx = context_from(headers)
    if ctx is None:
        return None
    sc = trace.get_current_span(ctx).get_span_context()
    return sc if sc.is_valid else None


def http_trace_headers() -> dict[str, str]:
    """The current span's context as HTTP headers (empty while tracing is off)."""
    return {k: v.decode() for k, v in trace_headers() or () if isinstance(v, bytes)}


def traceparent() -> str | None:
    """The current span's W3C traceparent (None while tracing is off or outside a span): what
    an outbox row keeps so the event's later publish carries the trace of the write."""
    for k, v in trace_headers() or ():
        if k == "traceparent" and isinstance(v, bytes):
            return v.decode()
    return None


def continued_hop(
    name: str, parent: str | None, attributes: dict[str, str]
) -> tuple[Any, list[tuple[str, str | bytes | None]] | None]:
    """A PRODUCER span continuing the trace `parent` (a stored traceparent) and the Kafka
    headers to send with the message: the span's context while tracing, else `parent` as it
    is, so the consumer still links to the request that made the event. (None, None) without
    a parent. The caller ends the span (end_hop) when the broker answers."""
    if parent is None:
        return None, None
    if not _tracing:
        return None, [("traceparent", parent.encode())]
    from opentelemetry import trace

    ctx = context_from([("traceparent", parent)])
    span = trace.get_tracer(__name__).start_span(
        name, context=ctx, kind=trace.SpanKind.PRODUCER, attributes=attributes
    )
    with trace.use_span(span, end_on_exit=False):
        return span, trace_headers()


def end_hop(span: Any, error: BaseException | None) -> None:
    """End a continued_hop span, marked as failed when the publish was."""
    if span is None:
        return
    if error is not None:
        from opentelemetry.trace import Status, StatusCode

        span.record_exception(error)
        span.set_status(Status(StatusCode.ERROR, str(error)))
    span.end()


def record_span(
    name: str, start_ns: int, attributes: dict[str, Any], error: BaseException | str | None = None
) -> None:
    """A span for work already done, from `start_ns` (time.time_ns()) to now: for a loop whose
    passes are worth a span only once they turned out to do something (nothing while tracing is
    off). `error` marks it failed, which the tail samplers always keep."""
    if not _tracing:
        return
    from opentelemetry import trace
    from opentelemetry.trace import Status, StatusCode

    span = trace.get_tracer(__name__).start_span(name, start_time=start_ns, attributes=attributes)
    if isinstance(error, BaseException):
        span.record_exception(error)
    if error is not None:
        span.set_status(Status(StatusCode.ERROR, str(error)))
    span.end()


def trace_headers() -> list[tuple[str, str | bytes | None]] | None:
    """The current span's context as Kafka headers (None while tracing is off or outside a
    span): the consumer links its work to the request that produced the event."""
    if not _tracing:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier: dict[str, str] = {}
    TraceContextTextMapPropagator().inject(carrier)
    headers: list[tuple[str, str | bytes | None]] = [(k, v.encode()) for k, v in carrier.items()]
    return headers or None
