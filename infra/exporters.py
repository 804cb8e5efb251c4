"""The datastores' metrics exporters, defined once for the program and the local stack.

- Kafka: the Prometheus JMX exporter agent. Strimzi runs it in every node of a Kafka CR that has a
  `metricsConfig` (port 9404), with the rule file `jmx/kafka.yaml` from a ConfigMap; the local
  brokers load the same agent jar (from Maven Central) with the same rule file.
- MirrorMaker 2: Strimzi runs the same agent in every pod of a KafkaMirrorMaker2 that has a
  `metricsConfig` (port 9404), with `jmx/mirrormaker2.yaml`; only regions with peers run one, so
  nothing local does (tests/infra/test_exporter_rules.py runs the rules in the real agent).
- Scylla serves Prometheus natively (9180; the Scylla Operator annotates its pods for scraping).
  Locally Cassandra stands in for it and is scraped through the same JMX agent with
  `jmx/cassandra.yaml`. The two speak different metric names: nothing in the rules reads either
  yet, and a rule that does must name both (Scylla's `scylla_*`, the local `cassandra_*`).
- Redis (count-cache, idem-store, feature-store, hot pools): one redis_exporter in multi-target
  mode. The
  `redis` scrape job finds every Redis pod that carries REDIS_SCRAPE_ANNOTATION and asks the
  exporter for it (`/scrape?target=redis://<pod>:<port>`), so a new pool is scraped with no
  exporter change, and a dead Redis is `redis_up 0` from a live exporter, not a missing target.
"""

from __future__ import annotations

from pathlib import Path

JMX_DIR = Path(__file__).resolve().parent / "jmx"
KAFKA_JMX_RULES = JMX_DIR / "kafka.yaml"
CASSANDRA_JMX_RULES = JMX_DIR / "cassandra.yaml"
MM2_JMX_RULES = JMX_DIR / "mirrormaker2.yaml"
# the agent's Maven coordinates (1.0.1 is the newest Maven Central serves here); Strimzi ships
# its own build of the same agent
JMX_AGENT = "io.prometheus.jmx:jmx_prometheus_javaagent:1.0.1"

# Strimzi's fixed metrics port (the agent's, on every node of a Kafka with a metricsConfig)
STRIMZI_METRICS_PORT = 9404
# the ConfigMap (and its key) the Kafka CR's metricsConfig points at
KAFKA_METRICS_CONFIG_MAP = "kafka-metrics"
KAFKA_METRICS_KEY = "kafka-metrics-config.yml"
# ... and the one every KafkaMirrorMaker2's metricsConfig points at (same namespace)
MM2_METRICS_CONFIG_MAP = "mirror-maker-2-metrics"
MM2_METRICS_KEY = "metrics-config.yml"
# Scylla's own Prometheus port
SCYLLA_METRICS_PORT = 9180

REDIS_EXPORTER = "redis-exporter"  # its app.kubernetes.io/name and Service name
REDIS_EXPORTER_PORT = 9121
# the version Debian ships for the local stack (prometheus-redis-exporter 1.45)
REDIS_EXPORTER_IMAGE = "oliver006/redis_exporter:v1.45.0"
# its flags besides the listen address, the same in the program and locally: no default target
# (only what /scrape?target= names), and total_system_memory_bytes for utilization
REDIS_EXPORTER_FLAGS = ("--redis.addr=", "--include-system-metrics")
REDIS_SCRAPE_PATH = "/scrape"  # the multi-target endpoint; /metrics is the exporter's own
# On a Redis pod: "true" makes the `redis` job scrape it, through the exporter, at this port
REDIS_SCRAPE_ANNOTATION = "likes.io/redis-scrape"
REDIS_PORT_ANNOTATION = "likes.io/redis-port"
REDIS_JOB = "redis"


def redis_annotations(port: int) -> dict[str, str]:
    """What a Redis pod carries to be scraped by the `redis` job."""
    return {REDIS_SCRAPE_ANNOTATION: "true", REDIS_PORT_ANNOTATION: str(port)}


def jmx_agent_flag(jar: Path, host: str, port: int, rules: Path) -> str:
    """The JVM flag that loads the JMX exporter agent, serving `rules`' metrics on host:port."""
    return f"-javaagent:{jar}={host}:{port}:{rules}"
