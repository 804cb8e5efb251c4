"""The OpenTelemetry Collector's config (the gateway tier in front of Tempo), as a dict.

Tail sampling keeps every error trace, the latency outliers and a small share of the rest (the
seed's 100% errors + p99 outliers + 1% healthy); the exporter queue lives on disk so a Tempo outage
or a collector restart does not drop what was already accepted.

Every span of a trace must reach the same collector replica for tail sampling to see the whole
trace: the tier in front routes by trace ID (the `loadbalancing` exporter) to a headless Service.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "BUFFER_EXTENSION",
    "COLLECTOR",
    "COLLECTOR_VERSION",
    "HEALTH_PORT",
    "METRICS_PORT",
    "OTLP_TRACES_PATH",
    "READ_TRACE_PERCENT",
    "SAMPLER",
    "TEMPO_EXPORTER",
    "collector_config",
    "telemetry",
]

# the collector release: the program's contrib image and the local build (local/otelcol.py)
# both take it; every collector module is built at this one release
COLLECTOR_VERSION = "0.161.0"
# the two tiers' workload names: the front (COLLECTOR, where every exporter sends) routes each
# trace by its id to one tail sampler (SAMPLER), which exports to Tempo
COLLECTOR = "otel-collector"
SAMPLER = "otel-sampler"
OTLP_TRACES_PATH = "/v1/traces"  # OTLP/HTTP's traces path, what the services' exporter posts to
METRICS_PORT = 8888  # the collector's own metrics (otelcol_*), scraped by Prometheus
HEALTH_PORT = 13133  # the health_check extension: the tiers' probes
BUFFER_EXTENSION = "file_storage/buffer"
# Reads are head-sampled at the gateway (this share of those whose caller sent no sampled
# traceparent): tens of millions a second, each a span in Envoy and one in the read service, are
# more than tail sampling should be asked to buffer, and tracing every one cost the read service
# a third of its CPU (bench/cpu_read.py --no-traces). Writes are all traced; tail sampling keeps
# their errors and outliers. A degraded read shows in the read SLI, traced or not.
READ_TRACE_PERCENT = 1.0
# `otlp_grpc` is the exporter's name from v0.144 on (`otlp` is its deprecated alias)
TEMPO_EXPORTER = "otlp_grpc/tempo"


def _sampling_policies(
    error_sampling: bool, latency_threshold_ms: int, healthy_percent: float
) -> list[dict[str, Any]]:
    # any policy that samples keeps the trace, so these add up rather than compete
    policies: list[dict[str, Any]] = []
    if error_sampling:
        policies.append(
            {"name": "errors", "type": "status_code", "status_code": {"status_codes": ["ERROR"]}}
        )
    policies.append(
        {"name": "slow", "type": "latency", "latency": {"threshold_ms": latency_threshold_ms}}
    )
    policies.append(
        {
            "name": "healthy-sample",
            "type": "probabilistic",
            "probabilistic": {"sampling_percentage": healthy_percent},
        }
    )
    return policies


def collector_config(
    tempo_endpoint: str,
    error_sampling: bool = True,
    latency_threshold_ms: int = 500,
    healthy_percent: float = 1.0,
    buffer_dir: str = "/var/lib/otelcol/buffer",
    *,
    tempo_insecure: bool = True,
) -> dict[str, Any]:
    """The collector config: OTLP in (gRPC 4317, HTTP 4318), tail sampling, Tempo out through a
    disk-backed queue. `tempo_insecure`: plaintext gRPC to Tempo inside the cluster (the
    NetworkPolicy is the boundary); set False when Tempo terminates TLS."""
    host, sep, port = tempo_endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"tempo_endpoint: {tempo_endpoint!r} is not host:port")
    if latency_threshold_ms <= 0:
        raise ValueError(f"latency_threshold_ms: {latency_threshold_ms} must be positive")
    if not 0.0 <= healthy_percent <= 100.0:
        raise ValueError(f"healthy_percent: {healthy_percent} is not within 0..100")
    if not buffer_dir.startswith("/"):
        raise ValueError(f"buffer_dir: {buffer_dir!r} must be an absolute path")

    return {
        "extensions": {
            "health_check": {"endpoint": f"0.0.0.0:{HEALTH_PORT}"},
            BUFFER_EXTENSION: {
                "directory": buffer_dir,
                "create_directory": True,
                "timeout": "1s",
                # reclaim space after an outage drained, and on restart
                "compaction": {"directory": buffer_dir, "on_start": True, "on_rebound": True},
            },
        },
        "receivers": {
            "otlp": {
                "protocols": {
                    "grpc": {"endpoint": "0.0.0.0:4317"},
                    "http": {"endpoint": "0.0.0.0:4318"},
                }
            }
        },
        "processors": {
            # first in the pipeline: refuse data (the SDKs retry) before the pod is OOM-killed
            "memory_limiter": {
                "check_interval": "1s",
                "limit_percentage": 80,
                "spike_limit_percentage": 20,
            },
            "tail_sampling": {
                # a like's synchronous path ends well within this; late spans of a decided
                # trace follow the cached decision
                "decision_wait": "10s",
                "num_traces": 200_000,
                "expected_new_traces_per_sec": 20_000,
                "policies": _sampling_policies(
                    error_sampling, latency_threshold_ms, healthy_percent
                ),
            },
            "batch": {"send_batch_size": 8192, "send_batch_max_size": 16384, "timeout": "1s"},
        },
        "exporters": {
            TEMPO_EXPORTER: {
                "endpoint": tempo_endpoint,
                "tls": {"insecure": tempo_insecure},
                "sending_queue": {
                    "enabled": True,
                    # on disk: survives a collector restart and rides out a Tempo outage until
                    # the volume fills (the seed's "buffers up to disk limit")
                    "storage": BUFFER_EXTENSION,
                    "queue_size": 50_000,
                    "num_consumers": 10,
                },
                "retry_on_failure": {
                    "enabled": True,
                    "initial_interval": "1s",
                    "max_interval": "30s",
                    # a batch is dropped (and counted in otelcol_exporter_send_failed_spans,
                    # which alerts) after 10 minutes of failing
                    "max_elapsed_time": "10m",
                },
            }
        },
        "service": {
            "extensions": ["health_check", BUFFER_EXTENSION],
            "pipelines": {
                "traces": {
                    "receivers": ["otlp"],
                    "processors": ["memory_limiter", "tail_sampling", "batch"],
                    "exporters": [TEMPO_EXPORTER],
                }
            },
            "telemetry": telemetry(),
        },
    }


def telemetry() -> dict[str, Any]:
    """The collector's own metrics on METRICS_PORT, scraped by Prometheus: the traces SLIs and
    the TraceExportFailing alert read them (infra/alert_rules.py). Every tier serves them."""
    reader = {"pull": {"exporter": {"prometheus": {"host": "0.0.0.0", "port": METRICS_PORT}}}}
    return {"metrics": {"level": "normal", "readers": [reader]}}
