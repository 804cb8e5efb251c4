"""`python -m services.canary --port P`: take turns on the canary posts until SIGTERM (see
services/canary/core.py), exporting the results on /metrics."""

from __future__ import annotations

import argparse
import uuid
from itertools import cycle

import httpx
import jwt
from opentelemetry import trace

from services.canary import metrics
from services.canary.core import Action, Canary, CanaryError, Turn
from services.canary.settings import CanarySettings
from services.common import heap, observability, worker_http
from services.contracts import clients, routes, workloads
from services.recount import core as recount
from services.recount.probes import EdgeStore

tracer = trace.get_tracer("likes.canary")  # a proxy: follows the provider set at start-up


def post_ids(settings: CanarySettings) -> list[str]:
    """The canary's own posts: nobody else likes them, so the truth is the canary's doing."""
    return [f"canary-{settings.region}-{i}" for i in range(settings.canary_posts)]


def export(turn: Turn) -> None:
    metrics.TURNS.labels(turn.result).inc()
    if turn.action == "like":
        metrics.READS_AFTER_LIKE.inc(sum(c is not None for c in turn.reads))
        metrics.FLICKERS.inc(turn.flickers)


def main() -> None:
    ap = argparse.ArgumentParser(
        description="Like and unlike the canary posts through the gateway and compare the read "
        "path's counts with the edge-store's truth."
    )
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True, help="port of /healthz, /readyz, /metrics")
    args = ap.parse_args()

    settings = CanarySettings()
    log = observability.setup_logging(workloads.CANARY.name, settings.log_level)
    observability.setup_tracing(workloads.CANARY.name, settings.otlp_endpoint)
    if settings.canary_token is None:
        raise SystemExit("LIKES_CANARY_TOKEN is not set: the canary writes as a signed-in user")
    token = settings.canary_token.get_secret_value()
    user = str(jwt.decode(token, options={"verify_signature": False})["sub"])
    cluster, session = clients.cassandra(settings, first_connect_s=clients.FIRST_CONNECT_S)
    edges = EdgeStore(session)
    http = httpx.Client(
        base_url=settings.gateway_url,
        timeout=settings.canary_timeout_s,
        headers={"authorization": f"Bearer {token}"},
    )

    def post_edges(post: str) -> list[recount.Edge]:
        try:
            return edges.edges(post)
        except Exception as e:  # the driver's errors: NoHostAvailable, timeouts
            raise CanaryError("truth", repr(e)) from e

    def write(post: str, action: Action) -> None:
        try:
            r = http.post(
                routes.WRITE_PATH,
                json={"post_id": post, "action": action},
                headers={
                    "idempotency-key": str(uuid.uuid4()),
                    **observability.http_trace_headers(),  # the turn's trace continues
                },
            )
        except httpx.HTTPError as e:
            raise CanaryError("write", repr(e)) from e
        if r.status_code != 202:
            raise CanaryError("write", f"{r.status_code} {r.text[:200]}")

    def read(post: str) -> int | None:
        try:
            r = http.get(routes.read_path(post), headers=observability.http_trace_headers())
        except httpx.HTTPError as e:
            raise CanaryError("read", repr(e)) from e
        if r.status_code != 200:
            raise CanaryError("read", f"{r.status_code} {r.text[:200]}")
        count = r.json().get("count")
        return int(count) if count is not None else None

    stop = worker_http.stop_event()
    canary = Canary(
        liked=lambda p: any(e.user_id == user and e.counts for e in post_edges(p)),
        truth=lambda p: recount.Truth.of(post_edges(p)).count,
        write=write,
        read=read,
        hold_s=settings.canary_hold_s,
        read_interval_s=settings.canary_read_interval_s,
        sleep=stop.wait,  # a stop ends the hold at once
        stopped=stop.is_set,
    )
    # a turn lasts the hold plus a few calls: fresher than that cannot be asked of the loop
    loop = worker_http.LoopHealth((), stale_after_s=2 * settings.canary_hold_s + 30)
    loop.turned()  # ready at once: the first turn takes the whole hold
    server = worker_http.serve(args.host, args.port, loop.checks, loop.alive)
    heap.settle()
    log.info("canary started", extra={"fields": {"user": user, "posts": post_ids(settings)}})
    for post in cycle(post_ids(settings)):
        if stop.is_set():
            break
        with tracer.start_as_current_span("canary turn") as span:
            turn = canary.turn(post)
            span.set_attributes({"likes.post_id": post, "likes.canary.result": turn.result})
            if turn.result in ("drift", "error"):  # tail sampling keeps every error trace
                span.set_status(trace.Status(trace.StatusCode.ERROR, turn.error or turn.result))
        if turn.result == "stopped":  # cut short by a stop: judged nothing, exported nothing
            break
        export(turn)
        loop.turned()
        level = log.warning if turn.result != "match" else log.info
        level(
            "canary turn",
            extra={"fields": {"post": post, "action": turn.action, "result": turn.result,
                              "reads": list(turn.reads), "truth": turn.truth,
                              "flickers": turn.flickers, "error": turn.error}},
        )  # fmt: skip
        if turn.result == "error":
            stop.wait(settings.canary_read_interval_s)  # not a tight loop against an outage
    server.shutdown()
    http.close()
    cluster.shutdown()


if __name__ == "__main__":
    main()
