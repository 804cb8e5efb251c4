"""The local OpenTelemetry Collector: built from Go modules with the collector builder at the
release the program deploys (infra/otel_config.COLLECTOR_VERSION), running the tail-sampling
tier's rendered config through the changes listed in `collector_config`. The same binary plays
Tempo (`tempo_config`): it receives what the sampler exports and writes it to a file the tests
read, and stopping it is a Tempo outage.

`python -m local.otelcol manifest FILE` writes the builder's manifest (local/setup.sh builds it
into .cache/bin); the component list is what the rendered config names, so a component the
program starts using without a module here fails `collector_config`, not a late start-up.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path
from typing import Any

import yaml

from infra import otel_config
from local.layout import HOST
from local.observability_transforms import scaled

__all__ = [
    "BINARY",
    "MODULES",
    "TRACES_FILE",
    "CollectorTransformError",
    "collector_config",
    "manifest",
    "tempo_config",
]

BINARY = "otelcol-likes"
_CORE = "go.opentelemetry.io/collector"
_CONTRIB = "github.com/open-telemetry/opentelemetry-collector-contrib"

# component kind -> type (as a config names it, before any "/name") -> its Go module
MODULES: dict[str, dict[str, str]] = {
    "receivers": {"otlp": f"{_CORE}/receiver/otlpreceiver"},
    "processors": {
        "memory_limiter": f"{_CORE}/processor/memorylimiterprocessor",
        "batch": f"{_CORE}/processor/batchprocessor",
        "tail_sampling": f"{_CONTRIB}/processor/tailsamplingprocessor",
    },
    "exporters": {
        "otlp_grpc": f"{_CORE}/exporter/otlpexporter",
        "file": f"{_CONTRIB}/exporter/fileexporter",  # the Tempo stand-in's store
    },
    "extensions": {
        "health_check": f"{_CONTRIB}/extension/healthcheckextension",
        "file_storage": f"{_CONTRIB}/extension/storage/filestorage",
    },
}
LOCAL_TEMPO = "file/tempo"
TRACES_FILE = "traces.jsonl"  # in the collector's data folder: what Tempo received
# the exporter's retry durations (how long a batch is retried before it is dropped and counted
# in otelcol_exporter_send_failed_spans, which TraceExportFailing reads)
RETRY_DURATIONS = ("initial_interval", "max_interval", "max_elapsed_time")


class CollectorTransformError(Exception):
    """The rendered collector config has something the local build or translation lacks."""


def manifest(output_path: str = "./dist") -> dict[str, Any]:
    """The collector builder's manifest: every module at the one release."""
    v = f"v{otel_config.COLLECTOR_VERSION}"
    out: dict[str, Any] = {
        "dist": {
            "name": BINARY,
            "description": "the like platform's local OpenTelemetry Collector",
            "version": otel_config.COLLECTOR_VERSION,  # what `--version` prints
            "output_path": output_path,
        }
    }
    for kind, modules in MODULES.items():
        out[kind] = [{"gomod": f"{module} {v}"} for module in modules.values()]
    return out


def _type(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def collector_config(
    rendered: dict[str, Any],
    *,
    grpc_port: int,
    http_port: int,
    health_port: int,
    metrics_port: int,
    tempo_port: int,
    data_dir: Path,
) -> dict[str, Any]:
    """The sampler tier's rendered config as the local collector runs it. The changes:

    1. every listener binds loopback at the stack's port (OTLP gRPC and HTTP, health, metrics);
    2. Tempo's exporter dials the local Tempo stand-in (`tempo_config`) at `tempo_port`, its
       retry durations scaled by the alerts' one TIME_SCALE (local/observability_transforms.py
       transform 6): a batch Tempo refused is dropped after 10 s instead of 10 min, as the
       TraceExportFailing alert that counts the drops waits 10 s instead of 10 min;
    3. the buffer directory -> <data>/buffer;
    4. the front tier (routing each trace by id to one sampler) does not run: with one
       collector every span already reaches the same sampler, and its `loadbalancing` exporter
       needs a Go module this machine's proxy refuses. Every exporter dials this collector.
    """
    cfg = copy.deepcopy(rendered)
    for kind, components in cfg.items():
        if kind not in MODULES:
            continue
        for cid in components:
            if cid != otel_config.TEMPO_EXPORTER and _type(cid) not in MODULES[kind]:
                raise CollectorTransformError(f"{kind} {cid!r}: not in the local build (MODULES)")
    protocols = cfg["receivers"]["otlp"]["protocols"]
    ports = {"grpc": grpc_port, "http": http_port}
    for name, proto in protocols.items():
        if name not in ports:
            raise CollectorTransformError(f"otlp protocol {name!r} has no local port")
        proto["endpoint"] = f"{HOST}:{ports[name]}"
    cfg["extensions"]["health_check"]["endpoint"] = f"{HOST}:{health_port}"
    buffer = data_dir / "buffer"
    storage = cfg["extensions"][otel_config.BUFFER_EXTENSION]
    storage["directory"] = str(buffer)
    if "compaction" in storage:
        storage["compaction"]["directory"] = str(buffer)
    if otel_config.TEMPO_EXPORTER not in cfg["exporters"]:
        raise CollectorTransformError(f"the render has no {otel_config.TEMPO_EXPORTER} exporter")
    tempo = cfg["exporters"][otel_config.TEMPO_EXPORTER]
    tempo["endpoint"] = f"{HOST}:{tempo_port}"
    retry = tempo.get("retry_on_failure") or {}
    for key in RETRY_DURATIONS:
        if key in retry:
            retry[key] = scaled(retry[key])
    for reader in cfg["service"]["telemetry"]["metrics"]["readers"]:
        reader["pull"]["exporter"]["prometheus"].update(host=HOST, port=metrics_port)
    return cfg


def tempo_config(*, grpc_port: int, health_port: int, data_dir: Path) -> dict[str, Any]:
    """The Tempo stand-in: an OTLP/gRPC receiver (what Tempo's distributor speaks) writing what
    arrives as OTLP JSON lines to <data>/traces.jsonl, rotated at 64 MB with 2 backups (the
    tests read them). No metrics of its own: it plays a backend, not a collector."""
    return {
        "extensions": {"health_check": {"endpoint": f"{HOST}:{health_port}"}},
        "receivers": {"otlp": {"protocols": {"grpc": {"endpoint": f"{HOST}:{grpc_port}"}}}},
        "exporters": {
            LOCAL_TEMPO: {
                "path": str(data_dir / TRACES_FILE),
                "rotation": {"max_megabytes": 64, "max_backups": 2},
            }
        },
        "service": {
            "extensions": ["health_check"],
            "pipelines": {"traces": {"receivers": ["otlp"], "exporters": [LOCAL_TEMPO]}},
            "telemetry": {"metrics": {"level": "none"}},
        },
    }


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "manifest":
        print("usage: python -m local.otelcol manifest FILE", file=sys.stderr)
        return 2
    out = Path(argv[1])
    out.write_text(yaml.safe_dump(manifest(str(out.parent / "dist")), sort_keys=False))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
