"""Tracing is off unless an exporter is configured; when it is, every request is a span named
by its route template, errors marked."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.util._once import Once

from services.common import http, observability


def app() -> FastAPI:
    a = FastAPI()

    @a.get("/v1/posts/{post_id}/likes")
    async def likes(post_id: str) -> dict[str, str]:
        if post_id == "down":
            raise http.ApiError(503, "unavailable", "down")
        return {"post_id": post_id}

    http.install(a, "trace-test")
    return a


@pytest.fixture
def no_provider() -> Iterator[None]:
    """OpenTelemetry takes one provider per process, and in a full run an in-process app of the
    stack tests (whose rendered settings name the local collector) installed one already: this
    test starts from none and leaves what it found (the way OpenTelemetry's own test utilities
    reset the globals). The middleware's proxy tracer caches the first real tracer it resolved,
    so it gets a fresh proxy too."""
    saved = (trace._TRACER_PROVIDER_SET_ONCE, trace._TRACER_PROVIDER, observability._tracing)
    saved_tracer = http._tracer
    trace._TRACER_PROVIDER_SET_ONCE = Once()
    trace._TRACER_PROVIDER = None
    observability._tracing = False
    http._tracer = trace.get_tracer("likes.http")
    try:
        yield
    finally:
        trace._TRACER_PROVIDER_SET_ONCE, trace._TRACER_PROVIDER, observability._tracing = saved
        http._tracer = saved_tracer


def test_tracing_is_off_without_an_endpoint_and_spans_requests_with_one(no_provider: None) -> None:
    assert observability.setup_tracing("trace-test", None) is False
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # before any provider: the default no-op tracer records nothing
    assert not trace.get_tracer("x").start_span("probe").is_recording()
    observability.install_tracer_provider(provider)
    with TestClient(app()) as c:
        assert c.get("/v1/posts/p1/likes").status_code == 200
        assert c.get("/v1/posts/down/likes").status_code == 503
    # ours are the request spans (FastAPI adds child spans of its own)
    spans = [s for s in exporter.get_finished_spans() if (s.attributes or {}).get("likes.service")]
    named = [(s.name, (s.attributes or {}).get("http.response.status_code")) for s in spans]
    assert named == [
        ("GET /v1/posts/{post_id}/likes", 200),
        ("GET /v1/posts/{post_id}/likes", 503),
    ]
    assert spans[1].status.status_code == trace.StatusCode.ERROR
