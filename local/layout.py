"""Where the local stack keeps its files and which loopback ports it listens on.

One place for both, so that a second stack (the test session's) can live beside a developer's
by setting LIKES_HOME and LIKES_PORT_OFFSET.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"


@dataclass(frozen=True)
class Ports:
    """Loopback ports; every one is shifted by the same offset."""

    offset: int = 0

    def every(self) -> set[int]:
        """Every port a stack at this offset listens on (two stacks must not share one)."""
        found: set[int] = set()
        for name, attr in vars(Ports).items():
            if isinstance(attr, property):
                value = getattr(self, name)
                found.update(value if isinstance(value, list) else [value])
        return found

    def _p(self, port: int) -> int:
        return port + self.offset

    @property
    def count_cache(self) -> list[int]:
        return [self._p(7001 + i) for i in range(6)]

    @property
    def idem_store(self) -> list[int]:
        return [self._p(6390 + i) for i in range(6)]

    @property
    def feature_store(self) -> list[int]:
        # the cluster bus is each port + 10000 (16590..): clear of every stack's ports too
        return [self._p(6590 + i) for i in range(6)]

    @property
    def etcd_client(self) -> int:
        return self._p(2379)

    @property
    def etcd_peer(self) -> int:
        return self._p(2380)

    @property
    def etcd_metrics(self) -> int:
        """/health and /metrics, plain HTTP in both profiles (as the program's METRICS_PORT)."""
        return self._p(2381)

    @property
    def kafka_brokers(self) -> list[int]:
        return [self._p(29092 + i) for i in range(3)]

    @property
    def kafka_controllers(self) -> list[int]:
        return [self._p(29192 + i) for i in range(3)]

    @property
    def cassandra_native(self) -> int:
        return self._p(9042)

    @property
    def cassandra_storage(self) -> int:
        # Not 7000: with the test stack's offset 1000 it would land on the default stack's gateway.
        return self._p(7050)

    @property
    def cassandra_jmx(self) -> int:
        # Loopback-only (cassandra.jmx.local.port), for nodetool; Cassandra's own default is 7199.
        return self._p(7249)

    @property
    def cassandra_metrics(self) -> int:
        return self._p(9180)  # the JMX exporter agent's; Scylla's own metrics port in production

    @property
    def kafka_metrics(self) -> list[int]:
        return [self._p(9404 + i) for i in range(3)]  # each broker's JMX exporter agent

    @property
    def redis_exporter(self) -> int:
        return self._p(9121)  # one redis_exporter, multi-target, for every Redis of the stack

    @property
    def schema_registry(self) -> int:
        return self._p(8081)

    @property
    def write(self) -> int:
        return self._p(8100)

    @property
    def read(self) -> int:
        return self._p(8200)

    @property
    def write_ops(self) -> int:
        return self._p(8170)  # /healthz, /readyz, /metrics (the program's ops port)

    @property
    def read_ops(self) -> int:
        return self._p(8270)

    @property
    def hotkey_sampler_ops(self) -> int:
        return self._p(8570)

    @property
    def relay(self) -> int:
        return self._p(8300)  # metrics/health only

    @property
    def aggregator(self) -> int:
        return self._p(8400)  # metrics/health only

    @property
    def hotkey_sampler(self) -> int:
        return self._p(8500)

    @property
    def hotkey_operator(self) -> int:
        return self._p(8600)  # the local reconcile loop's health/metrics

    @property
    def hot_pools(self) -> list[int]:
        return [self._p(7101 + i) for i in range(4)]

    @property
    def consumer_lag(self) -> int:
        return self._p(8800)  # metrics/health only

    @property
    def canary(self) -> int:
        return self._p(8900)  # metrics/health only

    @property
    def abuse_scorer(self) -> int:
        return self._p(8950)  # metrics/health only

    @property
    def abuse_model(self) -> int:
        return self._p(8960)  # the scorer's sidecar: gRPC (its pod's loopback in a cluster)

    @property
    def abuse_model_ops(self) -> int:
        return self._p(8970)

    @property
    def issuer(self) -> int:
        return self._p(8700)  # the local identity provider (JWKS)

    @property
    def gateway(self) -> int:
        return self._p(8000)  # Envoy's listener: the API as clients reach it

    @property
    def gateway_admin(self) -> int:
        # Not 8001: count-cache-1 (7001) of a stack at offset 1000 would land on it.
        return self._p(8009)

    @property
    def gateway_stats(self) -> int:
        return self._p(8008)  # Envoy's stats listener: /stats/prometheus only, for Prometheus

    @property
    def ratelimit_http(self) -> int:
        return self._p(8010)  # envoyproxy/ratelimit: /healthcheck and the JSON API

    @property
    def ratelimit_grpc(self) -> int:
        return self._p(8011)  # what Envoy's rate limit filter calls

    @property
    def ratelimit_debug(self) -> int:
        return self._p(8012)  # /rlconfig, /stats

    @property
    def ratelimit_redis(self) -> int:
        return self._p(6480)

    @property
    def otel_grpc(self) -> int:
        return self._p(4317)  # the OTel Collector: OTLP gRPC and HTTP, health, its metrics

    @property
    def otel_http(self) -> int:
        return self._p(4318)

    @property
    def otel_health(self) -> int:
        return self._p(13133)

    @property
    def otel_metrics(self) -> int:
        return self._p(8888)

    @property
    def tempo_grpc(self) -> int:
        return self._p(4319)  # the local Tempo stand-in the collector exports to; its health

    @property
    def tempo_health(self) -> int:
        return self._p(13134)

    @property
    def prometheus(self) -> int:
        return self._p(9090)

    @property
    def alertmanager(self) -> int:
        return self._p(9093)

    @property
    def webhook_sink(self) -> int:
        return self._p(9095)  # where the local Alertmanager's receivers post

    # The --faults profile: Toxiproxy's API, and one proxy per node that clients reach after
    # bootstrap (the nodes announce these; Layout.proxies). Reserved in every profile, so a
    # stack switched to it never lands on another stack's port.
    @property
    def toxiproxy(self) -> int:
        return self._p(8474)

    @property
    def count_cache_proxies(self) -> list[int]:
        return [self._p(7301 + i) for i in range(6)]

    @property
    def idem_store_proxies(self) -> list[int]:
        return [self._p(6490 + i) for i in range(6)]

    @property
    def feature_store_proxies(self) -> list[int]:
        return [self._p(6690 + i) for i in range(6)]

    @property
    def kafka_broker_proxies(self) -> list[int]:
        return [self._p(29292 + i) for i in range(3)]

    @property
    def cassandra_native_proxy(self) -> int:
        return self._p(9142)


@dataclass(frozen=True)
class Layout:
    """Folders of one local stack: `home` holds data, configs, logs and the pid state."""

    home: Path
    ports: Ports
    kafka_brokers: int = 3
    stack: str = "staging"  # the Pulumi stack whose render the workloads run
    # the --tls profile: etcd, Kafka, Cassandra and the registry serve TLS from a local CA, as
    # the program's servers do (local/tls.py); off: plaintext (quick starts, benchmarks)
    tls: bool = False
    # the --faults profile: every Redis Cluster node, Kafka broker and the Cassandra node is
    # reached through its own Toxiproxy proxy (local/components/toxiproxy.py), which the
    # servers announce, so the game days' network faults reach what clients really connect to
    faults: bool = False

    def proxies(self) -> dict[str, tuple[int, int]]:
        """The --faults profile's proxies: the proxied server's name (as `likes local status`
        lists it) -> (the port the proxy listens on, the server's own port)."""
        p = self.ports
        out: dict[str, tuple[int, int]] = {}
        for name, listens, upstreams in (
            ("count-cache", p.count_cache_proxies, p.count_cache),
            ("idem-store", p.idem_store_proxies, p.idem_store),
            ("feature-store", p.feature_store_proxies, p.feature_store),
            ("kafka", p.kafka_broker_proxies[: self.kafka_brokers], p.kafka_brokers),
        ):
            for i, (listen, upstream) in enumerate(zip(listens, upstreams, strict=False)):
                out[f"{name}-{i + 1}"] = (listen, upstream)
        out["cassandra"] = (p.cassandra_native_proxy, p.cassandra_native)
        return out

    def announced(self, port: int) -> int:
        """The port a server tells its clients to use for its own `port`: its proxy's in the
        --faults profile, else the port itself."""
        if not self.faults:
            return port
        return {upstream: listen for listen, upstream in self.proxies().values()}.get(port, port)

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def abuse_models(self) -> Path:
        """The abuse model's versions and `current` (`likes abuse train|use`; the model server
        reads them for the program's models claim)."""
        return self.home / "abuse-models"

    @property
    def conf(self) -> Path:
        return self.home / "conf"

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    @property
    def state_file(self) -> Path:
        return self.home / "state.json"

    @property
    def cache(self) -> Path:
        """Shared across stacks: Maven classpaths survive `down --wipe`."""
        return REPO_ROOT / ".cache"

    def log_file(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def ensure(self) -> None:
        for d in (self.data, self.conf, self.logs):
            d.mkdir(parents=True, exist_ok=True)


PROFILE = "profile.json"


DEFAULT_STACK = "staging"


def _profile(home: Path) -> dict[str, object]:
    try:
        data: dict[str, object] = json.loads((home / PROFILE).read_text())
        return data
    except (FileNotFoundError, ValueError):
        return {}


def default_home(stack: str) -> Path:
    """`.stack` for the default stack; another stack gets its own data folder."""
    return REPO_ROOT / (".stack" if stack == DEFAULT_STACK else f".stack-{stack}")


def from_env(
    kafka_brokers: int | None = None,
    stack: str | None = None,
    tls: bool | None = None,
    faults: bool | None = None,
) -> Layout:
    """The stack named by LIKES_HOME / LIKES_PORT_OFFSET (and LIKES_STACK); what an existing
    stack was created with (broker count, Pulumi stack) wins over defaults, so `status` and
    `down` see the same servers as `up`."""
    stack = stack or os.environ.get("LIKES_STACK") or None
    env_home = os.environ.get("LIKES_HOME")
    home = Path(env_home or default_home(stack or DEFAULT_STACK)).resolve()
    offset = int(os.environ.get("LIKES_PORT_OFFSET", "0"))
    profile = _profile(home)
    if kafka_brokers is None:
        try:
            kafka_brokers = int(str(profile["kafka_brokers"]))
        except (KeyError, ValueError):
            kafka_brokers = int(os.environ.get("LIKES_KAFKA_BROKERS", "3"))
    stack = stack or str(profile.get("stack") or DEFAULT_STACK)
    if tls is None:
        tls = bool(profile.get("tls", False))
    if faults is None:
        faults = bool(profile.get("faults", False))
    return Layout(
        home=home, ports=Ports(offset), kafka_brokers=kafka_brokers, stack=stack, tls=tls,
        faults=faults,
    )  # fmt: skip


def recorded_brokers(home: Path) -> int | None:
    try:
        return int(str(_profile(home)["kafka_brokers"]))
    except (KeyError, ValueError):
        return None


def recorded_stack(home: Path) -> str | None:
    value = _profile(home).get("stack")
    return str(value) if value else None


def recorded_tls(home: Path) -> bool | None:
    value = _profile(home).get("tls")
    return None if value is None else bool(value)


def recorded_faults(home: Path) -> bool | None:
    value = _profile(home).get("faults")
    return None if value is None else bool(value)


def record_profile(layout: Layout) -> None:
    layout.home.mkdir(parents=True, exist_ok=True)
    (layout.home / PROFILE).write_text(
        json.dumps(
            {
                "kafka_brokers": layout.kafka_brokers,
                "stack": layout.stack,
                "tls": layout.tls,
                "faults": layout.faults,
            }
        )
    )


def for_benchmark() -> Layout:
    """The stack a benchmark measures (from_env), refused in the --faults profile: a proxy in
    front of every node would put its hop into every figure, and the baselines run without."""
    lay = from_env()
    if lay.faults:
        raise SystemExit(
            f"the stack at {lay.home} runs the --faults profile (Toxiproxy in front of every "
            "node): benchmarks measure the stores' own paths. Run `likes local down`, then "
            "`likes local up --no-faults`, or point LIKES_HOME at a stack without it."
        )
    return lay
