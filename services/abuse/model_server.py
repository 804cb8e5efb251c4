"""The abuse model's gRPC server (the scorer's sidecar) and the client the scorer calls it with.

`likes.abuse.v1.Model/Score` takes `{"rows": [[float, ...], ...], "names": FEATURE_NAMES}` and
answers `{"probabilities": [...], "version": "...", "threshold": ...}`, both JSON bytes (orjson):
a generic handler, so no protoc step and no generated code to keep in step with the features.
`names` is the contract check: a scorer whose feature code differs from the model's (a deploy of
one without the other) gets INVALID_ARGUMENT naming the columns, never probabilities computed
from the wrong columns. A missing value is null (JSON has no NaN): the model reads it as unknown.

The standard gRPC health service (`grpc.health.v1.Health`, so the kubelet's native `grpc:` probe
works) says NOT_SERVING until a model is loaded, and again while the server drains on SIGTERM.
Score answers UNAVAILABLE meanwhile. The server loads the version `current` names in its model
directory and keeps watching it: a new or rolled-back `current` is loaded without a restart (a
version that fails to load is logged and the one serving stays).

`ModelClient` raises `ModelUnavailable` for every failure the scorer should wait out (server
down, deadline, no model yet, a refusal of its rows): the scorer defers, it never skips a like.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import grpc
import orjson
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client import Counter, Gauge, Histogram

from services.abuse import features, model
from services.abuse.settings import MODEL_PORT
from services.contracts import metrics as names
from services.contracts import workloads

SERVICE = "likes.abuse.v1.Model"
SCORE = "Score"
SCORE_METHOD = f"/{SERVICE}/{SCORE}"
EXPECTED = 'expected {"rows": [[float, ...], ...], "names": [feature names]}'
RELOAD_S = 10.0  # how often the server looks at `current`
DRAIN_S = 5.0  # SIGTERM: calls in flight get this long to finish

log = logging.getLogger("abuse.model_server")

CALLS = Counter(names.ABUSE_MODEL_CALLS, "Score calls, by the gRPC code answered", ["code"])
CALLS.labels(grpc.StatusCode.OK.name)  # bound at start: an idle server reads 0, not "No data"
ROWS = Counter(names.ABUSE_MODEL_ROWS, "Rows (likes) given a probability")
SECONDS = Histogram(
    names.ABUSE_MODEL_SECONDS, "Time to answer a Score call",
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0),
)  # fmt: skip
SERVING = Gauge(names.ABUSE_MODEL_SERVING, "1 for the model version being served", ["version"])
TRAINED = Gauge(names.ABUSE_MODEL_TRAINED, "When the model version serving was trained (Unix s)")
LOAD_FAILING = Gauge(
    names.ABUSE_MODEL_LOAD_FAILING,
    "1 while the version `current` names fails to load (the one serving, if any, serves on)",
    ["version"],
)


def mismatch(names: object) -> str | None:
    """Why `names` are not the model's columns, naming them; None when they are."""
    want = list(features.FEATURE_NAMES)
    if names == want:
        return None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return f"names must be the list of feature names {want}"
    missing = [n for n in want if n not in names]
    unexpected = [n for n in names if n not in want]
    if missing or unexpected:
        return (
            f"feature names differ from the model's: missing {missing}, unexpected {unexpected} "
            "(the scorer and the model are from different builds)"
        )
    return f"feature columns out of order: got {names}, the model's are {want}"


class ModelServer:
    """The gRPC server: Score and Health on one port (0: an ephemeral one, see `port`)."""

    def __init__(
        self, model_dir: Path, port: int = MODEL_PORT, host: str = "0.0.0.0", workers: int = 4
    ) -> None:
        self.model_dir = model_dir
        self.model: model.Model | None = None
        self.health = health.HealthServicer()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers))
        score = grpc.unary_unary_rpc_method_handler(self._score)  # bytes in, bytes out
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, {SCORE: score}),)
        )
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        self.port = self.server.add_insecure_port(f"{host}:{port}")
        if not self.port:
            raise OSError(f"cannot listen on {host}:{port}")
        self._set_serving(False)

    def _set_serving(self, serving: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if serving else (
            health_pb2.HealthCheckResponse.NOT_SERVING
        )  # fmt: skip
        for name in ("", SERVICE):  # the server as a whole (the kubelet's default) and Score
            self.health.set(name, status)

    def start(self) -> ModelServer:
        self.server.start()
        return self

    def load(self, version: str | None = None) -> model.Model:
        """Load a version (the current one by default) and serve it. NoModel, IncompatibleModel:
        nothing changed."""
        m = model.load(self.model_dir, version)
        self.model = m
        SERVING.clear()
        SERVING.labels(m.version).set(1)
        trained = m.meta.get("trained_at")  # none: an age unknown reads as too old
        TRAINED.set(float(trained) if isinstance(trained, int | float) else 0.0)
        self._set_serving(True)
        log.info("model loaded", extra={"fields": {"version": m.version, "threshold": m.threshold}})
        return m

    def reload_if_changed(self) -> bool:
        """Load the version `current` names if it is not the one serving; True when it did."""
        wanted = model.current_version(self.model_dir)
        if wanted is None or (self.model is not None and self.model.version == wanted):
            LOAD_FAILING.clear()  # `current` rolled back to the version serving, or removed
            return False
        try:
            self.load(wanted)
        except (model.NoModel, model.IncompatibleModel, OSError, ValueError) as e:
            serving = self.model.version if self.model else None
            log.warning("model not loaded", extra={"fields": {"version": wanted, "error": str(e),
                                                              "serving": serving}})  # fmt: skip
            LOAD_FAILING.clear()  # one series: the version `current` names now
            LOAD_FAILING.labels(wanted).set(1)  # AbuseModelErrors (reason load-failed)
            return False
        LOAD_FAILING.clear()
        return True

    def ready(self) -> dict[str, bool]:
        """/readyz's checks (the ops port): serving once a model is loaded."""
        return {"model": self.model is not None}

    def stop(self, grace: float = DRAIN_S) -> None:
        """NOT_SERVING at once, then let calls in flight finish for up to `grace` seconds."""
        self.health.enter_graceful_shutdown()
        self.server.stop(grace).wait()

    def _score(self, request: bytes, context: grpc.ServicerContext) -> bytes:
        started = time.perf_counter()
        code = grpc.StatusCode.OK
        try:
            answer, rows = self._answer(request, context)
            ROWS.inc(rows)
            return answer
        except Exception:
            code = context.code() or grpc.StatusCode.UNKNOWN  # the abort's, when it was one
            raise
        finally:
            CALLS.labels(code.name).inc()
            SECONDS.observe(time.perf_counter() - started)

    def _answer(self, request: bytes, context: grpc.ServicerContext) -> tuple[bytes, int]:
        m = self.model
        if m is None:
            _abort(context, grpc.StatusCode.UNAVAILABLE, "no model loaded yet")
        try:
            body = orjson.loads(request)
        except orjson.JSONDecodeError as e:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"the request is not JSON: {e}")
        if not isinstance(body, dict) or not isinstance(body.get("rows"), list):
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, EXPECTED)
        if (why := mismatch(body.get("names"))) is not None:
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, why)
        try:
            p = m.probabilities(body["rows"])
        except (ValueError, TypeError) as e:  # ragged rows, strings, wrong widths
            _abort(context, grpc.StatusCode.INVALID_ARGUMENT, f"rows: {e}")
        return orjson.dumps({"probabilities": p.tolist(), "version": m.version,
                             "threshold": m.threshold}), len(p)  # fmt: skip


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    context.abort(code, message)  # raises
    raise AssertionError("unreachable")


# -- the client ----------------------------------------------------------------------------------
class ModelUnavailable(Exception):
    """The model server gave no probabilities: down, too slow, no model loaded, or it refused the
    rows (`code` says which). Every one is waited out: the scorer defers, it never skips."""

    def __init__(self, message: str, code: grpc.StatusCode | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Verdicts:
    """Score's whole answer: a probability per row, the model version and its threshold."""

    probabilities: list[float]
    version: str
    threshold: float


class ModelClient:
    """Score calls with one deadline each; one channel, reconnecting by itself."""

    def __init__(self, target: str, timeout: float = 2.0) -> None:
        self.target, self.timeout = target, timeout
        self.channel = grpc.insecure_channel(target)
        self._score = self.channel.unary_unary(SCORE_METHOD)  # bytes in, bytes out

    def verdicts(self, rows: Sequence[Sequence[float]]) -> Verdicts:
        names = list(features.FEATURE_NAMES)
        body = orjson.dumps({"rows": [list(r) for r in rows], "names": names})
        try:
            raw = self._score(body, timeout=self.timeout)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            detail = e.details() if hasattr(e, "details") else str(e)
            name = code.name if code is not None else "error"
            raise ModelUnavailable(f"model server {self.target}: {name}: {detail}", code) from e
        answer: dict[str, Any] = orjson.loads(raw)
        probabilities = [float(p) for p in answer["probabilities"]]
        if len(probabilities) != len(rows):
            raise ModelUnavailable(
                f"model server {self.target} answered {len(probabilities)} probabilities "
                f"for {len(rows)} rows"
            )
        return Verdicts(probabilities, str(answer["version"]), float(answer["threshold"]))

    def score(self, rows: Sequence[Sequence[float]]) -> list[float]:
        """P(bot) of each row (`features.FEATURE_NAMES` columns)."""
        return self.verdicts(rows).probabilities

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> ModelClient:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def parser() -> argparse.ArgumentParser:
    """The flags the program renders into the sidecar's command (tests parse them with this)."""
    ap = argparse.ArgumentParser(
        prog=f"python -m {workloads.ABUSE_MODEL.module}",
        description="Serve the abuse model over gRPC (likes.abuse.v1.Model/Score, grpc.health.v1) "
        "until SIGTERM.",
    )
    ap.add_argument("--host", default="0.0.0.0")
    ap.add_argument("--port", type=int, default=MODEL_PORT, help="gRPC (0: any free port)")
    ap.add_argument("--ops-port", type=int, default=None,
                    help="/healthz, /readyz (a model is loaded) and /metrics over HTTP "
                    "(default: none; the kubelet can probe the gRPC health service)")  # fmt: skip
    ap.add_argument("--model-dir", type=Path, default=None,
                    help="the versions and `current` (default: abuse-models in the local stack's "
                    "home)")  # fmt: skip
    ap.add_argument("--reload-s", type=float, default=RELOAD_S, help="how often to look at current")
    return ap


def main(argv: Sequence[str] | None = None) -> None:
    from services.common import observability, worker_http

    args = parser().parse_args(argv)

    observability.setup_logging(workloads.ABUSE_MODEL.name)
    stop = worker_http.stop_event()
    server = ModelServer(args.model_dir or model.default_dir(), args.port, args.host).start()
    ops = None
    if args.ops_port is not None:
        ops = worker_http.serve(args.host, args.ops_port, server.ready)
    where = {"port": server.port, "ops_port": ops.server_address[1] if ops else None,
             "model_dir": str(server.model_dir)}  # fmt: skip
    log.info("listening", extra={"fields": where})
    try:
        while not stop.is_set():
            server.reload_if_changed()  # NOT_SERVING until a model loads
            stop.wait(args.reload_s)
        log.info("stopping: draining calls in flight")
        server.stop()
    finally:
        if ops is not None:
            ops.shutdown()


if __name__ == "__main__":
    main()
