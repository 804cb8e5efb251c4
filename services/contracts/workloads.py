"""Our workloads, defined once: name, entry point, port, probe paths and settings class.

The Pulumi program renders each Deployment from this table (infra/services.py, infra/operator.py)
and the local stack runs what the program rendered (local/rendered.py); the services serve the
paths named here and label their metrics with `name`. Nothing here imports a service module, so
the program can read it without pulling in the stores' client libraries.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from services.contracts import tls

if TYPE_CHECKING:
    from services.contracts.settings import Settings

HEALTH_PATH = "/healthz"  # liveness: the process turns
READY_PATH = "/readyz"  # readiness: it can do its job now (503 with named checks when not)
METRICS_PATH = "/metrics"
HTTP_PORT = 8080  # HTTP services: the API, mTLS from the gateway (services/common/serve.py)
OPS_PORT = 9100  # every workload: probes and metrics only, plain HTTP (kubelet, Prometheus)
SERVE_MODULE = "services.common.serve"  # runs an HTTP service's API and ops servers
BIND_ALL = "0.0.0.0"  # a pod's probes and scrapes arrive on its pod IP
NAMESPACE = "likes"  # where the program runs them (the names their certificates carry)

Kind = Literal["http", "worker", "operator"]
MODELS_MOUNT = "/models"  # the abuse model's versions and `current` (services/abuse/model.py)
# How old the abuse model serving may be (since training) before AbuseModelErrors (reason stale)
# files a ticket: its publishing job runs weekly (infra/config.py refuses a schedule that runs
# less often), so an older one means a run failed or its gate refused the model, a day ago.
MODEL_MAX_AGE_S = 8 * 86_400

# Settings fields that name a server a workload connects to, each with the field that holds the
# port when the address carries none. A workload lists in `uses` the ones its code reads (a test
# scans the code for them), and the NetworkPolicies (infra/netpol.py) allow exactly those, at the
# addresses the program rendered into its env.
SERVERS: dict[str, str | None] = {
    "count_cache_nodes": None,
    "idem_store_nodes": None,
    "feature_store_nodes": None,
    "hot_pools": None,
    "cassandra_hosts": "cassandra_port",
    "kafka_bootstrap": None,
    "schema_registry_url": None,
    "etcd_host": "etcd_port",
    "jwks_url": None,
    "otlp_endpoint": None,
    "cloudflare_api_url": None,
    "gateway_url": None,  # the canary: the public API, as users reach it
}


# The name of a sidecar's ops port in its container: the pod's scrape annotations name one port
# (the workload's), so the `pod-sidecars` scrape job (infra/observability.py) keeps the
# container ports so named, and labels their series with the container's name as `workload`.
SIDECAR_METRICS_PORT = "sidecar-metrics"


@dataclass(frozen=True)
class Sidecar:
    """A second container of a workload's pod, which the workload calls on localhost (the pod's
    own network: no Service, no NetworkPolicy between them). Probed and served like a worker:
    /healthz, /readyz and /metrics on its own ops port (SIDECAR_METRICS_PORT), plain HTTP."""

    name: str  # container name; the local stack's server name
    module: str  # the `python -m` module
    port: int  # what the workload calls, on 127.0.0.1
    ops_port: int
    args: tuple[str, ...] = ()  # its other flags, as the container runs them

    def command(self, host: str = BIND_ALL) -> list[str]:
        return ["python", "-m", self.module, "--host", host, "--port", str(self.port),
                "--ops-port", str(self.ops_port), *self.args]  # fmt: skip

    @property
    def target(self) -> str:
        """host:port the workload dials (the same pod)."""
        return f"127.0.0.1:{self.port}"


@dataclass(frozen=True)
class Workload:
    name: str  # Deployment, Service, app label, local server name and `service` metric label
    kind: Kind
    module: str  # http: the module of `create_app`; worker: the `python -m` module
    settings: str  # "module:Class" of its settings; the program renders env from this class
    port: int  # http: the API (mTLS); worker, operator: the ops port
    uses: tuple[str, ...] = ()  # keys of SERVERS: the servers it connects to
    ops_port: int = OPS_PORT  # /healthz, /readyz, /metrics: plain HTTP, never the API
    sidecar: Sidecar | None = None  # a second container of its pod

    def command(self, host: str = BIND_ALL, port: int | None = None) -> list[str]:
        """The container command (the local stack transforms interpreter, host, ports and the
        certificate folder)."""
        p = str(self.port if port is None else port)
        if self.kind == "http":
            # the API requires the gateway's client certificate (tls.MOUNT_DIR holds this
            # workload's own certificate and the CA the client's must chain to)
            return ["python", "-m", SERVE_MODULE, self.module, "--host", host, "--port", p,
                    "--ops-port", str(self.ops_port), "--tls-dir", tls.MOUNT_DIR]  # fmt: skip
        if self.kind == "worker":
            return ["python", "-m", self.module, "--host", host, "--port", p]
        # the operator in a cluster: Kopf, with its liveness endpoint on the ops port
        return ["kopf", "run", "--all-namespaces", "--standalone",
                f"--liveness=http://{host}:{p}{HEALTH_PATH}", "-m", self.module]  # fmt: skip

    def settings_class(self) -> type[Settings]:
        mod, _, cls = self.settings.partition(":")
        return getattr(importlib.import_module(mod), cls)

    @property
    def ready_path(self) -> str:
        # Kopf serves only its liveness endpoint; the reconcile pass reports through the CR
        return HEALTH_PATH if self.kind == "operator" else READY_PATH


BASE = "services.contracts.settings:Settings"
# `uses`: what the code reads (tests/unit/test_workload_uses.py checks it against the code)
TRACES = "otlp_endpoint"
WRITE = Workload(
    "write",
    "http",
    "services.write.main",
    BASE,
    HTTP_PORT,
    uses=("idem_store_nodes", "count_cache_nodes", "cassandra_hosts", "kafka_bootstrap",
          "schema_registry_url", "etcd_host", "jwks_url", TRACES),
)  # fmt: skip
READ = Workload(
    "read",
    "http",
    "services.read.main",
    "services.contracts.settings:HotPoolSettings",
    HTTP_PORT,
    # hot_pools: its own settings (always-replicate, a post this pod finds hot) and the
    # addresses the operator publishes in etcd (the same pools)
    uses=("count_cache_nodes", "hot_pools", "cassandra_hosts", "etcd_host", "jwks_url", TRACES),
)
HOTKEY_SAMPLER = Workload(
    "hotkey-sampler",
    "http",
    "services.hotkey_sampler.main",
    "services.hotkey_sampler.settings:SamplerSettings",
    HTTP_PORT,
    uses=("etcd_host", TRACES),
)
OUTBOX_RELAY = Workload(
    "outbox-relay",
    "worker",
    "services.relay",
    "services.relay.settings:RelaySettings",
    OPS_PORT,
    # the outbox (edge-store), Kafka, and the writers' notes of events already published
    uses=("cassandra_hosts", "kafka_bootstrap", "idem_store_nodes", TRACES),
)
AGGREGATOR = Workload(
    "aggregator",
    "worker",
    "services.aggregator",
    "services.aggregator.settings:AggregatorSettings",
    OPS_PORT,
    uses=("count_cache_nodes", "hot_pools", "cassandra_hosts", "kafka_bootstrap",
          "schema_registry_url", "etcd_host", "cloudflare_api_url", TRACES),
)  # fmt: skip
CONSUMER_LAG = Workload(
    "consumer-lag",
    "worker",
    "services.consumer_lag",
    "services.consumer_lag.settings:LagSettings",
    OPS_PORT,
    uses=("kafka_bootstrap", TRACES),
)
CANARY = Workload(
    "canary",
    "worker",
    "services.canary",
    "services.canary.settings:CanarySettings",
    OPS_PORT,
    # the API as a user calls it, and the edge-store for the reconciler's truth; each turn is
    # a trace (kept whatever the sampling when it drifts or fails: its span is an error)
    uses=("gateway_url", "cassandra_hosts", TRACES),
)
HOTKEY_OPERATOR = Workload(
    "hotkey-operator",
    "operator",
    "operators.hotkeys.handlers",
    "operators.hotkeys.settings:OperatorSettings",
    OPS_PORT,
    uses=("count_cache_nodes", "hot_pools", "etcd_host", TRACES),
)

# The abuse model server (services/abuse/model_server.py): gRPC likes.abuse.v1.Model/Score and
# grpc.health.v1 on `port`, the versions read from MODELS_MOUNT (re-read every few seconds, so
# `likes abuse use` needs no restart).
ABUSE_MODEL = Sidecar(
    "abuse-model",
    "services.abuse.model_server",
    50051,
    OPS_PORT + 1,
    args=("--model-dir", MODELS_MOUNT),
)
ABUSE_SCORER = Workload(
    "abuse-scorer",
    "worker",
    "services.abuse",
    "services.abuse.settings:ScorerSettings",
    OPS_PORT,
    # likes.committed and likes.voided; the edges it voids; the storm watch and the
    # degraded-account list (idem-store); the shared features (feature-store)
    uses=("idem_store_nodes", "feature_store_nodes", "cassandra_hosts", "kafka_bootstrap",
          "schema_registry_url", TRACES),
    sidecar=ABUSE_MODEL,
)  # fmt: skip

SERVICES: tuple[Workload, ...] = (
    WRITE, READ, HOTKEY_SAMPLER, OUTBOX_RELAY, AGGREGATOR, CONSUMER_LAG, CANARY, ABUSE_SCORER
)  # fmt: skip
ALL: tuple[Workload, ...] = (*SERVICES, HOTKEY_OPERATOR)
BY_NAME = {w.name: w for w in ALL}
