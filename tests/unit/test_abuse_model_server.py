"""The abuse model's gRPC server and client (services/abuse/model_server.py), in process on an
ephemeral port of 127.0.0.1, with a real (small) trained model; and `python -m
services.abuse.model_server` stopping on SIGTERM."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import httpx
import orjson
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from services.abuse import features, generator, model, model_server

HOST = "127.0.0.1"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture(scope="module")
def small_model() -> model.Model:
    return model.train(model.TrainParams(traffic=generator.Traffic(users=600, seed=0)))


@pytest.fixture(scope="module")
def rows() -> list[tuple[float, ...]]:
    f = features.Features()
    out = [f.observe(o) for o in generator.generate(generator.Traffic(users=100, seed=9))]
    return [*out[:300], tuple([math.nan] * len(features.FEATURE_NAMES))]  # all unknown


@pytest.fixture
def server(tmp_path: Path) -> Iterator[model_server.ModelServer]:
    s = model_server.ModelServer(tmp_path, port=0, host=HOST).start()
    yield s
    s.stop(grace=0)


def _health(port: int, service: str = "") -> int:
    with grpc.insecure_channel(f"{HOST}:{port}") as ch:
        req = health_pb2.HealthCheckRequest(service=service)
        status: int = health_pb2_grpc.HealthStub(ch).Check(req, timeout=5).status
        return status


def test_health_is_not_serving_until_a_model_is_loaded(
    server: model_server.ModelServer, small_model: model.Model, rows: list[tuple[float, ...]]
) -> None:
    assert _health(server.port) == NOT_SERVING
    assert _health(server.port, model_server.SERVICE) == NOT_SERVING
    with model_server.ModelClient(f"{HOST}:{server.port}", timeout=5) as client:
        with pytest.raises(model_server.ModelUnavailable, match="no model loaded") as e:
            client.score(rows[:3])
        assert e.value.code == grpc.StatusCode.UNAVAILABLE
        assert server.reload_if_changed() is False  # nothing to load yet
        model.save(small_model, server.model_dir)
        assert server.reload_if_changed() is True
        assert server.reload_if_changed() is False  # already serving it
        assert _health(server.port) == SERVING
        assert _health(server.port, model_server.SERVICE) == SERVING
        assert len(client.score(rows[:3])) == 3


def test_score_answers_the_models_own_probabilities(
    server: model_server.ModelServer, small_model: model.Model, rows: list[tuple[float, ...]]
) -> None:
    model.save(small_model, server.model_dir)
    server.load()
    with model_server.ModelClient(f"{HOST}:{server.port}", timeout=5) as client:
        got = client.verdicts(rows)
        assert client.score([]) == []
    assert got.probabilities == small_model.probabilities(rows).tolist()  # exact: JSON floats
    assert all(0.0 <= p <= 1.0 for p in got.probabilities)
    assert got.version == small_model.version and got.threshold == small_model.threshold


def _raw_score(port: int, body: bytes) -> grpc.RpcError:
    with grpc.insecure_channel(f"{HOST}:{port}") as ch:
        with pytest.raises(grpc.RpcError) as e:
            ch.unary_unary(model_server.SCORE_METHOD)(body, timeout=5)
        return e.value


def test_wrong_feature_names_are_invalid_argument_naming_the_columns(
    server: model_server.ModelServer, small_model: model.Model, rows: list[tuple[float, ...]]
) -> None:
    model.save(small_model, server.model_dir)
    server.load()
    names = [*features.FEATURE_NAMES[1:], "likes_1d"]
    e = _raw_score(server.port, orjson.dumps({"rows": [list(rows[0])], "names": names}))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "missing ['likes_10s']" in e.details() and "unexpected ['likes_1d']" in e.details()
    swapped = [features.FEATURE_NAMES[1], features.FEATURE_NAMES[0], *features.FEATURE_NAMES[2:]]
    e = _raw_score(server.port, orjson.dumps({"rows": [list(rows[0])], "names": swapped}))
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT and "out of order" in e.details()
    names = list(features.FEATURE_NAMES)
    for body in (b"not json", orjson.dumps({"rows": [[1.0, 2.0]], "names": names}),
                 orjson.dumps({"rows": [["a"] * len(names)], "names": names})):  # fmt: skip
        assert _raw_score(server.port, body).code() == grpc.StatusCode.INVALID_ARGUMENT


def _sample(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_the_servers_metrics_count_calls_rows_codes_and_the_version_serving(
    server: model_server.ModelServer, small_model: model.Model, rows: list[tuple[float, ...]]
) -> None:
    from services.contracts import metrics as names

    calls = names.ABUSE_MODEL_CALLS.removesuffix("_total")
    before = {code: _sample(f"{calls}_total", code=code)
              for code in ("OK", "UNAVAILABLE", "INVALID_ARGUMENT")}  # fmt: skip
    scored, timed = _sample(names.ABUSE_MODEL_ROWS), _sample(f"{names.ABUSE_MODEL_SECONDS}_count")
    with model_server.ModelClient(f"{HOST}:{server.port}", timeout=5) as client:
        with pytest.raises(model_server.ModelUnavailable):
            client.score(rows[:3])  # no model yet
        model.save(small_model, server.model_dir)
        server.load()
        client.score(rows[:7])
    _raw_score(server.port, b"not json")
    assert _sample(f"{calls}_total", code="OK") - before["OK"] == 1
    assert _sample(f"{calls}_total", code="UNAVAILABLE") - before["UNAVAILABLE"] == 1
    assert _sample(f"{calls}_total", code="INVALID_ARGUMENT") - before["INVALID_ARGUMENT"] == 1
    assert _sample(names.ABUSE_MODEL_ROWS) - scored == 7
    assert _sample(f"{names.ABUSE_MODEL_SECONDS}_count") - timed == 3
    assert _sample(names.ABUSE_MODEL_SERVING, version=small_model.version) == 1
    # AbuseModelErrors (reason stale) reads the serving version's training time
    assert _sample(names.ABUSE_MODEL_TRAINED) == small_model.meta["trained_at"] > 0


def test_a_version_that_does_not_say_when_it_was_trained_reads_as_trained_at_0(
    server: model_server.ModelServer, small_model: model.Model
) -> None:
    """An age unknown is an age too old (AbuseModelErrors, reason stale), not a fresh model."""
    import json

    from services.contracts import metrics as names

    model.save(small_model, server.model_dir)
    server.load()
    assert _sample(names.ABUSE_MODEL_TRAINED) == small_model.meta["trained_at"]
    meta_file = server.model_dir / small_model.version / model.META_FILE
    meta = json.loads(meta_file.read_text())
    del meta["trained_at"]
    meta_file.write_text(json.dumps(meta))
    server.load()
    assert _sample(names.ABUSE_MODEL_TRAINED) == 0


@pytest.mark.parametrize("garbage", [b"not a model at all", b"\x80\x04garbage", b""])
def test_a_current_version_that_does_not_load_is_reported_and_the_previous_serves_on(
    server: model_server.ModelServer,
    small_model: model.Model,
    rows: list[tuple[float, ...]],
    garbage: bytes,
) -> None:
    """A broken publish (a truncated or foreign model file) named current: the server keeps
    serving the version it had (no crash: unpickling garbage raised a KeyError that took the
    reload loop down) and says so on likes_abuse_model_load_failing, which AbuseModelErrors
    (reason load-failed) reads; `current` rolled back clears it."""
    import shutil

    from services.contracts import metrics as names

    model.save(small_model, server.model_dir)
    server.load()
    bad = f"{small_model.version}-broken"
    shutil.copytree(server.model_dir / small_model.version, server.model_dir / bad)
    (server.model_dir / bad / model.MODEL_FILE).write_bytes(garbage)
    model.set_current(server.model_dir, bad)
    assert server.reload_if_changed() is False
    assert server.reload_if_changed() is False  # retried each interval, still one series
    assert _sample(names.ABUSE_MODEL_LOAD_FAILING, version=bad) == 1
    assert _sample(names.ABUSE_MODEL_SERVING, version=small_model.version) == 1
    with model_server.ModelClient(f"{HOST}:{server.port}", timeout=5) as client:
        assert client.verdicts(rows[:2]).version == small_model.version
    model.set_current(server.model_dir, small_model.version)  # the rollback
    assert server.reload_if_changed() is False  # already serving it
    assert _sample(names.ABUSE_MODEL_LOAD_FAILING, version=bad) == 0  # the series is gone


def test_a_stopped_server_is_model_unavailable(
    server: model_server.ModelServer, small_model: model.Model, rows: list[tuple[float, ...]]
) -> None:
    model.save(small_model, server.model_dir)
    server.load()
    client = model_server.ModelClient(f"{HOST}:{server.port}", timeout=2)
    assert len(client.score(rows[:5])) == 5
    server.stop(grace=0)
    started = time.monotonic()
    with pytest.raises(model_server.ModelUnavailable, match=r"UNAVAILABLE|DEADLINE_EXCEEDED"):
        client.score(rows[:5])
    assert time.monotonic() - started < 3  # the deadline bounds the wait
    client.close()
    never = model_server.ModelClient(f"{HOST}:1", timeout=1)  # nothing listens on port 1
    with pytest.raises(model_server.ModelUnavailable) as e:
        never.score(rows[:1])
    assert e.value.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    never.close()


def test_main_serves_the_current_model_and_stops_on_sigterm(
    tmp_path: Path, small_model: model.Model
) -> None:
    model.save(small_model, tmp_path)
    proc = subprocess.Popen(
        [sys.executable, "-m", "services.abuse.model_server", "--host", HOST, "--port", "0",
         "--ops-port", "0", "--model-dir", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("LIKES_")},
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        listening: dict[str, int] = {}
        lines = []
        while not listening:
            line = proc.stdout.readline()
            assert line, f"exited before listening: {''.join(lines)}"
            lines.append(line)
            if '"listening"' in line:
                listening = json.loads(line)
        port, ops_port = listening["port"], listening["ops_port"]
        deadline = time.monotonic() + 30
        while _health(port) != SERVING:
            assert time.monotonic() < deadline, "never SERVING"
            time.sleep(0.1)
        ready = httpx.get(f"http://{HOST}:{ops_port}/readyz", timeout=5)
        assert ready.status_code == 200 and ready.json()["checks"] == {"model": True}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=15) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
