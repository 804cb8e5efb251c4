"""The OTel Collector config: the tail-sampling policies, the disk buffer's wiring, and that every
component a pipeline names is defined."""

from __future__ import annotations

from typing import Any

import pytest
import yaml

from infra.otel_config import collector_config

TEMPO = "tempo-distributor.observability.svc.cluster.local:4317"


def _policies(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {p["type"]: p for p in config["processors"]["tail_sampling"]["policies"]}


def test_tail_sampling_keeps_errors_outliers_and_one_percent() -> None:
    policies = _policies(collector_config(TEMPO))
    assert policies["status_code"]["status_code"] == {"status_codes": ["ERROR"]}
    assert policies["latency"]["latency"] == {"threshold_ms": 500}
    assert policies["probabilistic"]["probabilistic"] == {"sampling_percentage": 1.0}
    assert len(policies) == 3


def test_sampling_knobs_are_honoured() -> None:
    config = collector_config(
        TEMPO, error_sampling=False, latency_threshold_ms=800, healthy_percent=5.0
    )
    policies = _policies(config)
    assert "status_code" not in policies
    assert policies["latency"]["latency"]["threshold_ms"] == 800
    assert policies["probabilistic"]["probabilistic"]["sampling_percentage"] == 5.0


def test_exporter_is_otlp_grpc_to_tempo_with_retries() -> None:
    exporters = collector_config(TEMPO)["exporters"]
    (name,) = exporters
    # `otlp` is the deprecated alias from v0.144 on
    assert name.split("/")[0] == "otlp_grpc"
    assert exporters[name]["endpoint"] == TEMPO
    retry = exporters[name]["retry_on_failure"]
    assert retry["enabled"] is True and retry["max_elapsed_time"]


def test_every_exporter_queue_is_on_a_listed_storage_extension() -> None:
    config = collector_config(TEMPO, buffer_dir="/data/otel-buffer")
    service_extensions = config["service"]["extensions"]
    queued = [e for e in config["exporters"].values() if "sending_queue" in e]
    assert queued, "no exporter has a sending queue"
    for exporter in queued:
        storage = exporter["sending_queue"]["storage"]
        assert storage.split("/")[0] == "file_storage"
        assert storage in config["extensions"]
        assert storage in service_extensions
        assert config["extensions"][storage]["directory"] == "/data/otel-buffer"


def _defined(config: dict[str, Any], section: str, component: str) -> bool:
    return component in config.get(section, {})


@pytest.mark.parametrize("error_sampling", [True, False])
def test_every_pipeline_component_is_defined(error_sampling: bool) -> None:
    config = collector_config(TEMPO, error_sampling=error_sampling)
    for name, pipeline in config["service"]["pipelines"].items():
        for section in ("receivers", "processors", "exporters"):
            assert pipeline[section], f"{name}: no {section}"
            for component in pipeline[section]:
                assert _defined(config, section, component), f"{name}: {component} undefined"
    for extension in config["service"]["extensions"]:
        assert _defined(config, "extensions", extension)


def test_traces_pipeline_order() -> None:
    traces = collector_config(TEMPO)["service"]["pipelines"]["traces"]
    # memory_limiter first (refuse before OOM); batch after sampling (it would split traces)
    assert traces["processors"] == ["memory_limiter", "tail_sampling", "batch"]


def test_otlp_receives_on_grpc_and_http() -> None:
    protocols = collector_config(TEMPO)["receivers"]["otlp"]["protocols"]
    assert protocols["grpc"]["endpoint"].endswith(":4317")
    assert protocols["http"]["endpoint"].endswith(":4318")


def test_config_survives_yaml() -> None:
    config = collector_config(TEMPO)
    assert yaml.safe_load(yaml.safe_dump(config)) == config


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"tempo_endpoint": "tempo"}, "tempo_endpoint"),
        ({"latency_threshold_ms": 0}, "latency_threshold_ms"),
        ({"healthy_percent": 150.0}, "healthy_percent"),
        ({"buffer_dir": "relative/dir"}, "buffer_dir"),
    ],
)
def test_bad_arguments_fail_naming_the_argument(kwargs: dict[str, Any], key: str) -> None:
    args: dict[str, Any] = {"tempo_endpoint": TEMPO, **kwargs}
    with pytest.raises(ValueError, match=key):
        collector_config(**args)
