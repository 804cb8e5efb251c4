"""The local collector: its build holds every component the rendered sampler tier names, at the
program's release, and the local config differs from the render only by the listed changes."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from infra import observability as obs
from infra import otel_config
from local import otelcol

TEMPO = "tempo.likes-observability.svc.cluster.local:4317"
PORTS = {
    "grpc_port": 5317,
    "http_port": 5318,
    "health_port": 14133,
    "metrics_port": 9888,
    "tempo_port": 5319,
}


def _rendered() -> dict[str, Any]:
    return otel_config.collector_config(TEMPO, buffer_dir=obs.BUFFER_DIR)


def _local(rendered: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    return otelcol.collector_config(rendered, data_dir=tmp_path, **PORTS)


def _ids(cfg: dict[str, Any]) -> set[tuple[str, str]]:
    return {(kind, cid) for kind in otelcol.MODULES for cid in cfg.get(kind, {})}


def test_the_manifest_builds_every_module_at_the_programs_release() -> None:
    m = otelcol.manifest()
    listed = [e["gomod"] for kind in otelcol.MODULES for e in m[kind]]
    assert {g.rsplit(" ", 1)[1] for g in listed} == {f"v{otel_config.COLLECTOR_VERSION}"}
    assert len(listed) == sum(len(v) for v in otelcol.MODULES.values())
    assert m["dist"]["name"] == otelcol.BINARY
    assert obs.COLLECTOR_IMAGE.endswith(f":{otel_config.COLLECTOR_VERSION}")  # the same release


def test_every_component_the_local_config_names_is_built(tmp_path: Path) -> None:
    cfg = _local(_rendered(), tmp_path)
    for kind, cid in _ids(cfg):
        assert cid.split("/")[0] in otelcol.MODULES[kind], (kind, cid)
    used = set(cfg["service"]["extensions"])
    for pipeline in cfg["service"]["pipelines"].values():
        used |= {*pipeline["receivers"], *pipeline["processors"], *pipeline["exporters"]}
    assert used <= {cid for _, cid in _ids(cfg)}  # every pipeline member is configured


def test_only_the_listed_changes_are_made(tmp_path: Path) -> None:
    rendered = _rendered()
    before = copy.deepcopy(rendered)
    cfg = _local(rendered, tmp_path)
    assert rendered == before  # the render itself is untouched
    # 1. loopback listeners at the stack's ports
    protocols = cfg["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"] == f"127.0.0.1:{PORTS['grpc_port']}"
    assert protocols["http"]["endpoint"] == f"127.0.0.1:{PORTS['http_port']}"
    assert cfg["extensions"]["health_check"]["endpoint"] == f"127.0.0.1:{PORTS['health_port']}"
    (reader,) = cfg["service"]["telemetry"]["metrics"]["readers"]
    assert reader["pull"]["exporter"]["prometheus"] == {
        "host": "127.0.0.1",
        "port": PORTS["metrics_port"],
    }
    # 2. Tempo -> the local stand-in, its retries on the alerts' time scale (10 min -> 10 s)
    tempo, rendered_tempo = (c["exporters"][otel_config.TEMPO_EXPORTER] for c in (cfg, before))
    assert tempo["endpoint"] == f"127.0.0.1:{PORTS['tempo_port']}"
    assert rendered_tempo["retry_on_failure"]["max_elapsed_time"] == "10m"
    assert tempo["retry_on_failure"] == {
        **rendered_tempo["retry_on_failure"],
        "initial_interval": "1s",
        "max_interval": "1s",
        "max_elapsed_time": "10s",
    }
    # the disk queue and everything else of the exporter as rendered
    assert {k: v for k, v in tempo.items() if k not in ("endpoint", "retry_on_failure")} == {
        k: v for k, v in rendered_tempo.items() if k not in ("endpoint", "retry_on_failure")
    }
    assert cfg["service"]["pipelines"]["traces"]["exporters"] == [otel_config.TEMPO_EXPORTER]
    # 3. the buffer under the stack's data
    storage = cfg["extensions"][otel_config.BUFFER_EXTENSION]
    assert storage["directory"] == storage["compaction"]["directory"] == str(tmp_path / "buffer")
    # everything else runs as rendered: the sampling policies, the processors, their order
    assert cfg["processors"] == before["processors"]
    p, q = cfg["service"]["pipelines"]["traces"], before["service"]["pipelines"]["traces"]
    assert (p["receivers"], p["processors"]) == (q["receivers"], q["processors"])


def test_a_component_the_build_lacks_is_refused_by_name(tmp_path: Path) -> None:
    rendered = _rendered()
    rendered["processors"]["k8sattributes"] = {}
    with pytest.raises(otelcol.CollectorTransformError, match="k8sattributes"):
        _local(rendered, tmp_path)


def test_a_render_without_tempo_is_refused(tmp_path: Path) -> None:
    rendered = _rendered()
    rendered["exporters"]["otlp_grpc/elsewhere"] = rendered["exporters"].pop(
        otel_config.TEMPO_EXPORTER
    )
    with pytest.raises(otelcol.CollectorTransformError, match="tempo"):
        _local(rendered, tmp_path)


def test_the_tempo_stand_in_writes_what_it_receives_to_the_traces_file(tmp_path: Path) -> None:
    cfg = otelcol.tempo_config(grpc_port=5319, health_port=14134, data_dir=tmp_path)
    assert cfg["receivers"]["otlp"]["protocols"] == {"grpc": {"endpoint": "127.0.0.1:5319"}}
    (exporter,) = cfg["service"]["pipelines"]["traces"]["exporters"]
    assert cfg["exporters"][exporter]["path"] == str(tmp_path / otelcol.TRACES_FILE)
    assert exporter.split("/")[0] in otelcol.MODULES["exporters"]  # in the one build
    assert cfg["service"]["telemetry"]["metrics"]["level"] == "none"  # no port of its own
