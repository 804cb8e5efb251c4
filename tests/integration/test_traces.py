"""Traces end to end on the running stack: a like through the gateway is one trace (Envoy's span,
the write service's server span under it, continued from the caller's traceparent), the Kafka
hop carries it (the aggregator's window span links to it), the collector's tail sampling keeps
it, and the seed's traces SLIs read it from the collector's own metrics.

The collector is local/otelcol.py's build running the rendered sampler tier; Tempo is its file
exporter (OTLP JSON lines), which these tests read."""

from __future__ import annotations

import json
import secrets
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest

from infra import envoy_config
from local.components.observability import OtelCollector
from services.consumer_lag import metrics as consumer_lag
from services.contracts import events, routes, workloads
from services.contracts import metrics as metric_names
from services.relay import core as relay_core
from tests.conftest import Stack
from tests.integration import faults

pytestmark = pytest.mark.stack
T = TypeVar("T")

# the sampler's decision_wait (10 s, as rendered), the services' batch export (5 s) and the
# collector's batch (1 s), with room for a loaded machine
TRACE_DEADLINE_S = 90
SERVER = 2  # OTLP's SPAN_KIND_SERVER
PRODUCER = 4  # OTLP's SPAN_KIND_PRODUCER


def wait_for_value(check: Callable[[], T | None], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout} s")
        time.sleep(1)


def _spans(files: list[Path]) -> Iterator[dict[str, Any]]:
    """Every span the file exporter wrote, each with its resource's service.name as `service`."""
    for f in files:
        for line in f.read_text().splitlines():
            if not line.strip():
                continue
            for rs in json.loads(line).get("resourceSpans", []):
                attrs = {a["key"]: a["value"] for a in rs["resource"].get("attributes", [])}
                service = attrs.get("service.name", {}).get("stringValue")
                for ss in rs.get("scopeSpans", []):
                    for span in ss.get("spans", []):
                        yield {**span, "service": service}


def _trace_files(stack: Stack) -> list[Path]:
    out = OtelCollector(stack.layout).traces_file
    return sorted(out.parent.glob(f"{out.stem}*{out.suffix}"))  # the file and its rotations


def stack_spans(stack: Stack) -> list[dict[str, Any]]:
    """Every span the stack's Tempo stand-in kept so far."""
    return list(_spans(_trace_files(stack)))


def _prom(stack: Stack, expr: str) -> list[Any]:
    r = httpx.get(f"{stack.prometheus_url}/api/v1/query", params={"query": expr}, timeout=10)
    r.raise_for_status()
    result: list[Any] = r.json()["data"]["result"]
    return result


def _traced_like(stack: Stack, token: str, post: str, trace_id: str, parent: str) -> None:
    """A like through the gateway from a caller whose sampled span is `trace_id`/`parent`."""
    r = httpx.post(
        f"{stack.gateway_url}{routes.WRITE_PATH}",
        json={"post_id": post, "action": "like"},
        headers={
            "Authorization": f"Bearer {token}",
            "Idempotency-Key": str(uuid.uuid4()),
            "traceparent": f"00-{trace_id}-{parent}-01",
        },
        timeout=10,
    )
    assert r.status_code == 202, r.text


def test_a_like_is_one_trace_from_the_gateway_through_write_to_the_aggregators_window(
    stack: Stack,
) -> None:
    trace_id = secrets.token_hex(16)
    caller_span = secrets.token_hex(8)
    post = f"traced-{uuid.uuid4().hex[:8]}"
    _traced_like(stack, stack.token("tracer"), post, trace_id, caller_span)

    def traced() -> dict[str, Any] | None:
        spans = stack_spans(stack)
        ours = [s for s in spans if s["traceId"] == trace_id]
        gateway = [s for s in ours if s["service"] == envoy_config.TRACING_SERVICE_NAME]
        write = [s for s in ours if s["service"] == workloads.WRITE.name]
        window = [
            s
            for s in spans
            if s["service"] == workloads.AGGREGATOR.name
            and any(link["traceId"] == trace_id for link in s.get("links", []))
        ]
        if gateway and write and window:
            return {"gateway": gateway, "write": write, "window": window}
        return None

    found = wait_for_value(
        traced, TRACE_DEADLINE_S, f"the like's trace {trace_id} in the traces file"
    )
    # the caller's span -> Envoy's ingress span -> the write service's: one trace, each hop a
    # child (Envoy's other spans, its rate limit call, are children of its ingress span)
    (gw,) = [s for s in found["gateway"] if s.get("parentSpanId") == caller_span]
    assert gw["kind"] == SERVER
    (server,) = found["write"]
    assert (server["parentSpanId"], server["kind"]) == (gw["spanId"], SERVER)
    assert all(s["parentSpanId"] == gw["spanId"] for s in found["gateway"] if s is not gw)
    # the window that counted the like links to the write's span (the context Kafka carried)
    assert any(
        link["spanId"] == server["spanId"]
        for s in found["window"]
        for link in s["links"]
        if link["traceId"] == trace_id
    )
    assert all(s["traceId"] != trace_id for s in found["window"])  # its own trace, linked


def test_a_like_the_outbox_relay_publishes_stays_in_its_writes_trace(stack: Stack) -> None:
    """Kafka refuses the write's own publish (the like is still a 202, its outbox row kept);
    once it accepts again the relay publishes the row in a span that is a child of the write
    request's, and the window that counts the like links to that span."""
    trace_id = secrets.token_hex(16)
    post = f"relayed-{uuid.uuid4().hex[:8]}"
    with faults.records_refused(stack, events.COMMITTED):
        _traced_like(stack, stack.token("tracer"), post, trace_id, secrets.token_hex(8))

    def traced() -> tuple[dict[str, Any], list[dict[str, Any]], list[dict[str, Any]]] | None:
        spans = stack_spans(stack)
        ours = [s for s in spans if s["traceId"] == trace_id]
        write = [s for s in ours if s["service"] == workloads.WRITE.name]
        relay = [s for s in ours if s["service"] == workloads.OUTBOX_RELAY.name]
        window = [
            s
            for s in spans
            if s["service"] == workloads.AGGREGATOR.name
            and any(link["traceId"] == trace_id for link in s.get("links", []))
        ]
        return (write[0], relay, window) if len(write) == 1 and relay and window else None

    server, relay, window = wait_for_value(
        traced, TRACE_DEADLINE_S, f"the relayed like's trace {trace_id}"
    )
    assert [(s["name"], s["parentSpanId"], s["kind"]) for s in relay] == [
        (relay_core.RELAY_PUBLISH_SPAN, server["spanId"], PRODUCER)
    ]
    assert {
        link["spanId"] for s in window for link in s["links"] if link["traceId"] == trace_id
    } == {relay[0]["spanId"]}  # the relay's copy was counted; the write's never reached Kafka


def test_a_callers_sampled_traceparent_cannot_force_a_read_trace(stack: Stack) -> None:
    """Reads are head-sampled at the gateway (READ_TRACE_PERCENT): twenty reads, each with its
    own sampled traceparent, leave (almost) no span, while a write with one, sent after them,
    is traced through (the control: the pipeline is up, and it drained the reads' spans first).
    At 1 %, more than 3 of 20 traced happens once in ~20 000 runs."""
    token = stack.token("head-sampler")
    reads = [secrets.token_hex(16) for _ in range(20)]
    for trace_id in reads:
        r = httpx.get(
            stack.gateway_url + routes.read_path("head-sampled"),
            headers={
                "Authorization": f"Bearer {token}",
                "traceparent": f"00-{trace_id}-{secrets.token_hex(8)}-01",
            },
            timeout=10,
        )
        assert r.status_code == 200, r.text
    control = secrets.token_hex(16)
    _traced_like(stack, token, "head-sampled", control, secrets.token_hex(8))

    def write_traced() -> set[str] | None:
        ids = {s["traceId"] for s in _spans(_trace_files(stack))}
        return ids if control in ids else None

    wait_for_value(write_traced, TRACE_DEADLINE_S, f"the control write's trace {control}")
    time.sleep(3)  # the file exporter's flush of anything decided with it
    traced = set(reads) & {s["traceId"] for s in _spans(_trace_files(stack))}
    assert len(traced) <= 3, f"{len(traced)} of 20 reads traced: the caller's flag forced them"


def test_the_traces_slis_read_the_collectors_metrics(stack: Stack) -> None:
    """traces_kept_per_second above 0 once traces were kept (the stack's own traffic: the
    canary's turns, the test above), and otlp_export_failures at 0 while every span is
    written: read the way the rules record them, so a renamed collector metric fails here."""
    kept = metric_names.TRACES_KEPT_PER_SECOND
    wait_for_value(lambda: _prom(stack, f"{kept} > 0"), 180, f"{kept} > 0")
    failures = wait_for_value(
        lambda: _prom(stack, metric_names.OTLP_EXPORT_FAILURES), 60, "otlp_export_failures"
    )
    assert [float(s["value"][1]) for s in failures] == [0.0]


def test_a_canary_turn_is_one_trace_through_the_gateway(stack: Stack) -> None:
    """The canary's turn opens a trace and its calls carry it: the gateway's ingress span of its
    like or unlike is a child of the turn's span, and the write service's span sits under it
    (the gateway traces every write; the turn's reads are head-sampled like any caller's, at
    READ_TRACE_PERCENT, whatever flag the canary's traceparent carries). A turn that drifted or
    failed is an error span (so the samplers keep it whatever the healthy share); one a stop cut
    short says so in its result and is no error."""

    def traced_turn() -> tuple[dict[str, Any], list[dict[str, Any]]] | None:
        spans = stack_spans(stack)
        for turn in (s for s in spans if s["service"] == workloads.CANARY.name):
            trace = [s for s in spans if s["traceId"] == turn["traceId"]]
            ingress = [
                s
                for s in trace
                if s["service"] == envoy_config.TRACING_SERVICE_NAME
                and s.get("parentSpanId") == turn["spanId"]
            ]
            writes = [
                s
                for s in trace
                if s["service"] == workloads.WRITE.name
                and s.get("parentSpanId") in {g["spanId"] for g in ingress}
            ]
            if ingress and writes:
                return turn, trace
        return None

    # a turn lasts the convergence hold (28 s) and its spans are exported after it ends
    turn, trace = wait_for_value(traced_turn, 180, "a canary turn's trace through the gateway")
    result = {a["key"]: a["value"] for a in turn.get("attributes", [])}["likes.canary.result"]
    is_error = turn.get("status", {}).get("code") == 2  # STATUS_CODE_ERROR
    assert is_error == (result["stringValue"] in ("drift", "error"))  # not match, not stopped
    assert {s["service"] for s in trace} >= {
        workloads.CANARY.name,
        envoy_config.TRACING_SERVICE_NAME,
        workloads.WRITE.name,
    }


def span_attribute(span: dict[str, Any], key: str) -> Any:
    """An OTLP JSON attribute's value: a string, a number, or a list of strings."""
    for a in span.get("attributes", []):
        if a["key"] == key:
            v = a["value"]
            if "arrayValue" in v:
                return [x.get("stringValue") for x in v["arrayValue"].get("values", [])]
            return next(iter(v.values()))
    return None


def test_the_lag_exporters_reads_are_spans(stack: Stack) -> None:
    """Each read of the groups' offsets (every LIKES_LAG_INTERVAL_S) is a span carrying the
    worst lag it saw: a slow or failing read shows in the traces as well as in lag_reads."""

    def worst_lags() -> list[Any] | None:
        worst = [
            span_attribute(s, "likes.lag.max_seconds")
            for s in stack_spans(stack)
            if s["service"] == workloads.CONSUMER_LAG.name
            and s["name"] == consumer_lag.LAG_READ_SPAN
        ]
        # the groups lag a little between two commits: some read saw it (not a constant 0)
        return worst if any(isinstance(w, float) and w > 0 for w in worst) else None

    worst = wait_for_value(worst_lags, TRACE_DEADLINE_S, "a consumer-lag read that saw lag")
    # a whole double is written as a JSON integer (0, not 0.0)
    assert all(isinstance(w, int | float) and w >= 0 for w in worst), worst
