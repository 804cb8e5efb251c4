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
    a = FastAPI(telemetry=observability.FASTAPI_TELEMETRY_OFF)  # as the services build theirs

    @a.get("/v1/posts/{post_id}/likes")
    async def likes(post_id: str) -> dict[str, str]:
        if post_id == "down":
            raise http.ApiError(503, "unavailable", "down")
        return {"post_id": post_id}

    @a.get("/v1/span")
    async def span() -> dict[str, bool]:  # what the handler runs under
        return {"in_a_span": trace.get_current_span().get_span_context().is_valid}

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
    spans = [s for s in exporter.get_finished_spans() if (s.attributes or {}).get("likes.service")]
    named = [(s.name, (s.attributes or {}).get("http.response.status_code")) for s in spans]
    assert named == [
        ("GET /v1/posts/{post_id}/likes", 200),
        ("GET /v1/posts/{post_id}/likes", 503),
    ]
    assert spans[1].status.status_code == trace.StatusCode.ERROR


def test_a_caller_that_did_not_sample_gets_no_span_and_one_that_did_is_continued(
    no_provider: None,
) -> None:
    """The gateway's head sampling decides: flags 00 open no span (not even a non-recording
    one), flags 01 continue the caller's trace, and a malformed header starts a new one."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    observability.install_tracer_provider(provider)
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    with TestClient(app()) as c:
        for flags in ("00", "01"):
            r = c.get(
                "/v1/posts/p1/likes", headers={"traceparent": f"00-{trace_id}-{parent}-{flags}"}
            )
            assert r.status_code == 200
        assert c.get("/v1/posts/p2/likes", headers={"traceparent": "00-junk"}).status_code == 200
        # flags 00: the handler runs outside any span (the SDK would give it a non-recording
        # one, with the caller's context); 01: inside ours
        for flags, inside in (("00", False), ("01", True)):
            h = {"traceparent": f"00-{trace_id}-{parent}-{flags}"}
            assert c.get("/v1/span", headers=h).json() == {"in_a_span": inside}
    spans = [
        s
        for s in exporter.get_finished_spans()
        if (s.attributes or {}).get("http.route") == "/v1/posts/{post_id}/likes"
    ]
    assert len(spans) == 2, [s.name for s in spans]
    continued, fresh = spans
    assert format(continued.context.trace_id, "032x") == trace_id
    assert continued.parent is not None and format(continued.parent.span_id, "016x") == parent
    assert format(fresh.context.trace_id, "032x") != trace_id and fresh.parent is None


def test_unsampled_reads_only_a_well_formed_traceparent() -> None:
    tp = b"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-"
    assert observability.unsampled([(b"traceparent", tp + b"00")])
    assert observability.unsampled([(b"traceparent", tp + b"02")])  # only bit 0 is "sampled"
    assert not observability.unsampled([(b"traceparent", tp + b"01")])
    assert not observability.unsampled([(b"traceparent", tp + b"zz")])
    assert not observability.unsampled([(b"traceparent", b"01" + tp[2:] + b"00")])  # version
    assert not observability.unsampled([(b"host", b"x")])
    assert not observability.unsampled(None)


def test_a_stored_traceparent_is_continued_by_a_producer_span_or_forwarded_as_it_is(
    no_provider: None,
) -> None:
    """What the outbox relay sends with an event it republishes: the write's trace."""
    parent = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    assert observability.continued_hop("hop", None, {}) == (None, None)
    # tracing off: the write's own context, so the consumer links to the write
    assert observability.continued_hop("hop", parent, {}) == (
        None,
        [("traceparent", parent.encode())],
    )
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    observability.install_tracer_provider(provider)
    span, headers = observability.continued_hop("hop", parent, {"messaging.destination.name": "t"})
    observability.end_hop(span, RuntimeError("refused"))
    (done,) = exporter.get_finished_spans()
    assert done.context.trace_id == int("ab" * 16, 16)
    assert done.parent is not None and done.parent.span_id == int("cd" * 8, 16)
    assert done.kind == trace.SpanKind.PRODUCER and not done.status.is_ok
    assert dict(done.attributes or {}) == {"messaging.destination.name": "t"}
    assert [e.name for e in done.events] == ["exception"]
    sent = dict(headers or [])
    assert sent["traceparent"] == f"00-{'ab' * 16}-{done.context.span_id:016x}-01".encode()
