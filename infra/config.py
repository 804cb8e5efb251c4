"""Stack configuration: read once from Pulumi config into a typed, validated, frozen object.

Every key lives under the `likes:` namespace; structured values (objects, lists) arrive from Pulumi
as JSON strings. A missing or bad value raises `ConfigError` naming the full key
(`likes:kafka.partitions`) before any resource is declared.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping
from ipaddress import IPv4Network
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.alias_generators import to_camel

from services.contracts.workloads import MODEL_MAX_AGE_S

NAMESPACE = "likes"
# Keys whose values must be Pulumi config secrets (`pulumi config set --secret`).
SECRET_FIELDS = frozenset(
    {
        "redisPassword",
        "ratelimitRedisPassword",
        "pagerdutyRoutingKey",
        "abusePagerdutyRoutingKey",
        "cdnPurgeToken",
        "canaryToken",
        "etcdRootPassword",
        "etcdPassword",
        "scyllaAdminPassword",
        "scyllaPassword",
        "kafkaPassword",
        "kafkaRegistryPassword",
        "schemaRegistryPassword",
    }
)
# Any other key whose name looks like one of these is a secret put in the wrong place.
_SECRETISH = re.compile(r"(password|passwd|secret|token|api[_-]?key|private[_-]?key)", re.I)
# EKS versions this program is written and validated for (kubernetes-validate ships their schemas).
SUPPORTED_KUBERNETES = ("1.32", "1.33", "1.34", "1.35")

Count = Annotated[int, Field(ge=1)]
NonNegative = Annotated[int, Field(ge=0)]
# a CronJob's schedule: five cron fields or a macro (the time zone is the CronJob's, not a field)
_CRON_FIELD = r"[0-9A-Za-z*/,?-]+"
CronSchedule = Annotated[
    str,
    Field(pattern=rf"^(@(yearly|annually|monthly|weekly|daily|midnight|hourly)|{_CRON_FIELD}"
                  rf"( {_CRON_FIELD}){{4}})$"),
]  # fmt: skip


class ConfigError(Exception):
    """One or more stack config values are missing or invalid; each entry names its key."""

    def __init__(self, problems: list[tuple[str, str]]) -> None:
        self.problems = problems
        super().__init__("; ".join(f"{key}: {msg}" for key, msg in problems))


class _Model(BaseModel):
    model_config = ConfigDict(
        frozen=True, extra="forbid", alias_generator=to_camel, populate_by_name=True
    )


class NetworkConfig(_Model):
    vpc_cidr: IPv4Network

    @model_validator(mode="after")
    def _big_enough(self) -> NetworkConfig:
        # Three /19 private subnets (the VPC CNI gives every pod a VPC address) + three /22.
        if self.vpc_cidr.prefixlen > 16:
            raise ValueError("vpcCidr must be /16 or larger")
        return self


class NodeGroupConfig(_Model):
    instance_types: Annotated[list[str], Field(min_length=1)]
    min_size: NonNegative
    desired_size: NonNegative
    max_size: Count
    disk_gib: Annotated[int, Field(ge=20)] = 50
    # Datastores get one node group per zone so the autoscaler adds nodes where a volume lives.
    per_zone: bool = False

    @model_validator(mode="after")
    def _ordered(self) -> NodeGroupConfig:
        if not self.min_size <= self.desired_size <= self.max_size:
            raise ValueError("need minSize <= desiredSize <= maxSize")
        return self


WORKLOAD_CLASSES = ("system", "gateway", "services", "redis", "scylla", "kafka")


class Peer(_Model):
    """Another region of the same environment: where MirrorMaker 2 and Scylla reach it."""

    region: Annotated[str, Field(pattern=r"^[a-z]{2}-[a-z]+-\d$")]
    kafka_bootstrap: Annotated[str, Field(pattern=r"^[A-Za-z0-9.\-]+:\d+$")]
    scylla_seeds: list[str] = []
    # the peer's VPC (peered with this one): the only source its MirrorMaker 2 and Scylla nodes
    # may connect from (infra/netpol.py); the peer stack's likes:network.vpcCidr
    vpc_cidr: IPv4Network


class KafkaConfig(_Model):
    version: str = "4.1.0"
    controllers: Count = 3
    brokers_per_zone: Count
    broker_storage_gi: Count
    broker_cpu: str = "4"
    broker_memory_gi: Count = 16
    partitions: Count
    dead_letter_partitions: Count = 32
    dead_letter_retention_days: Count = 30
    retention_hours: Count = 168
    replication_factor: Count = 3
    min_insync_replicas: Count = 2
    mirror_maker_replicas: Count = 2

    @model_validator(mode="after")
    def _durable(self) -> KafkaConfig:
        if self.min_insync_replicas >= self.replication_factor:
            # minISR == RF means one broker loss stops every producer using acks=all.
            raise ValueError("minInsyncReplicas must be below replicationFactor")
        if self.replication_factor > 3 * self.brokers_per_zone:
            raise ValueError("replicationFactor exceeds the number of brokers")
        if self.controllers % 2 == 0:
            raise ValueError("controllers must be odd (KRaft quorum)")
        return self


class RedisConfig(_Model):
    version: str = "7.4"
    count_cache_shards: Annotated[int, Field(ge=3)]
    replicas_per_shard: Count = 1
    count_cache_memory_gi: Count
    hot_pools: Count = 4
    idem_store_shards: Annotated[int, Field(ge=3)] = 3
    idem_store_memory_gi: Count
    idem_store_storage_gi: Count
    # The abuse scorer's shared feature state (services/abuse/shared_features.py): 152 B a like
    # of the last hour, ~51 GB at the seed's 93 K likes/s held for the hour; maxmemory is 80 %
    # of a node's memory (infra/redis.py), and it evicts beyond that (keys.EVICTION_POLICY).
    feature_store_shards: Annotated[int, Field(ge=3)] = 3
    feature_store_memory_gi: Count


class ScyllaConfig(_Model):
    version: str = "2025.1.2"
    members_per_rack: Count
    storage_gi: Count
    cpu: str
    memory_gi: Count
    replication_factor: Literal[3] = 3
    # Data centres (other regions) the keyspace also replicates to; they must exist first.
    peer_datacenters: list[str] = []


class EtcdConfig(_Model):
    members: Count = 5
    storage_gi: Count = 8
    version: str = "v3.5.17"

    @model_validator(mode="after")
    def _odd(self) -> EtcdConfig:
        if self.members < 3 or self.members % 2 == 0:
            raise ValueError("members must be odd and at least 3 (Raft quorum)")
        return self


class GatewayConfig(_Model):
    min_replicas: Count
    max_replicas: Count
    per_user_writes_per_min: Count = 100
    per_ip_writes_per_min: Count = 1000
    per_ip_batch_reads_per_min: Count = 600  # feed pages: a batch read fans out to 50 posts
    mirror_percent: Annotated[float, Field(gt=0, le=100)] = 1.0
    jwt_issuer: str
    jwks_uri: Annotated[str, Field(pattern=r"^https://")]
    jwt_audience: str = "likes"  # the `aud` the gateway and the services require


class CdnConfig(_Model):
    zone_id: Annotated[str, Field(pattern=r"^[0-9a-f]{32}$")]
    hostname: str
    # Edge TTL when the origin sends none; the origin sends 5-30 s by heat.
    fallback_ttl_seconds: Annotated[int, Field(ge=1, le=30)] = 30
    # Exactly one stack per zone owns the zone's rulesets (infra/cdn.py says why) and lists
    # every API hostname routed through the zone, its own and the other stacks'; the others
    # declare only their own DNS record.
    owns_zone: bool
    zone_hostnames: list[str] = []

    @model_validator(mode="after")
    def _owner_covers_its_zone(self) -> CdnConfig:
        if self.owns_zone and self.hostname not in self.zone_hostnames:
            raise ValueError("the zone's owner lists every hostname of the zone, its own too")
        if not self.owns_zone and self.zone_hostnames:
            raise ValueError("zoneHostnames belongs to the zone's owner (ownsZone: true) only")
        return self


class ContainerSize(_Model):
    cpu: str = "500m"
    memory_mi: Count = 512


class ServiceScale(ContainerSize):
    min_replicas: Count
    max_replicas: Count


class ServicesConfig(_Model):
    image_repository: str
    image_tag: str
    write: ServiceScale
    read: ServiceScale
    outbox_relay: ServiceScale
    aggregator: ServiceScale
    hotkey_sampler: ServiceScale
    # one replica reads every group's offsets (a second would only export the same series)
    consumer_lag: ServiceScale = ServiceScale(
        min_replicas=1, max_replicas=1, cpu="100m", memory_mi=256
    )
    # one canary user per region: a second replica would flip the same likes
    canary: ServiceScale = ServiceScale(min_replicas=1, max_replicas=1, cpu="100m", memory_mi=256)
    # likes.committed is keyed by post, so each scorer replica reads a share of every user's
    # likes; with max_replicas > 1 the program renders the shared feature store
    # (abuse_settings.feature_store_for), and the replicas rely on two shared things: the
    # features' state in the feature-store (its own Redis Cluster, evicting when full:
    # services/abuse/shared_features.py, likes:redis featureStore*), which gives the rows one
    # process would, and the storm watch in the idem-store beside the degraded key the write
    # path reads (services/abuse/scorer.StormWatch), which counts a user's voids whatever the
    # replica. Sized for the seed's peak: one process scores ~1,550 likes/s with the shared
    # store (bench/bench_abuse.py --feature-store shared), so 93 K likes/s needs ~60; max 64,
    # which still gives every replica 4 of likes.committed's 256 prod partitions (a replica
    # past the partition count would idle). min 2: a pod lost or rolled leaves one scoring.
    # Staging (stacks/Pulumi.staging.yaml) runs a few, > 1, so the shared store is what it runs.
    abuse_scorer: ServiceScale = ServiceScale(
        min_replicas=2, max_replicas=64, cpu="1", memory_mi=1024
    )
    abuse_model: ContainerSize = ContainerSize(cpu="1", memory_mi=512)  # its sidecar
    # the abuse model's versions, shared by every scorer pod and by the training job that
    # publishes them: a ReadWriteMany class (EFS on EKS)
    abuse_models_storage_class: str = "efs-sc"
    # When the publishing job (`likes abuse train --gate`, infra/services.py) runs, in UTC.
    # Weekly, early Monday: the model learns from the repository's traffic generator, so a run
    # changes it only once the image has (new features, a scikit-learn whose pickles the servers
    # refuse), and the program runs it once per image at deploy too (MODELS_PUBLISHER_AT_DEPLOY).
    abuse_model_publish_schedule: CronSchedule = "0 3 * * 1"
    # ~400 MiB at the default 4000 users; minutes on one core (OMP threads follow the limit)
    abuse_model_publish: ContainerSize = ContainerSize(cpu="1", memory_mi=1024)
    operator_image: str

    @field_validator("abuse_model_publish_schedule")
    @classmethod
    def _publishes_weekly(cls, value: str) -> str:
        if not runs_weekly(value):
            raise ValueError(
                f"{value!r} publishes less often than weekly: AbuseModelErrors (reason stale) "
                f"files a ticket once the model serving is {MODEL_MAX_AGE_S // 86_400} days old"
            )
        return value


def runs_weekly(schedule: str) -> bool:
    """A cron schedule that fires at least once in every week: a macro of a week or less, or
    every month with every day of the month, or with some days of the week (cron fires on
    either of the two day fields when both are set)."""
    if schedule.startswith("@"):
        return schedule in ("@weekly", "@daily", "@midnight", "@hourly")
    _minute, _hour, dom, month, dow = schedule.split()
    return month == "*" and (dom in ("*", "?") or dow not in ("*", "?"))


HttpUrl = Annotated[str, Field(pattern=r"^https?://")]


class ObservabilityConfig(_Model):
    mimir_remote_write_url: HttpUrl
    prometheus_retention: str = "15d"
    prometheus_storage_gi: Count = 100
    tempo_storage_gi: Count = 50
    collector_replicas: Count = 3
    latency_threshold_ms: Count = 500
    healthy_percent: Annotated[float, Field(gt=0, le=100)] = 1.0
    # Alertmanager posts ticket alerts here (and pages too when the stack has no PagerDuty key).
    ticket_webhook_url: HttpUrl
    # The dead man's switch: Alertmanager posts the always-firing Watchdog here every 5 minutes
    # and the switch pages when the posts stop. Required in prod; without it a stack has none.
    heartbeat_url: Annotated[HttpUrl | None, Field(validate_default=True)] = None

    @field_validator("heartbeat_url")
    @classmethod
    def _heartbeat_in_prod(cls, value: str | None, info: ValidationInfo) -> str | None:
        # the environment arrives as validation context from parse(): a field of the parent
        if value is None and (info.context or {}).get("environment") == "prod":
            raise ValueError("is required in prod (nothing notices a dead alerting path otherwise)")
        return value


class StackConfig(_Model):
    environment: Literal["prod", "staging"]
    region: Annotated[str, Field(pattern=r"^[a-z]{2}-[a-z]+-\d$")]
    zones: tuple[str, str, str]
    kubernetes_version: str
    domain: str
    network: NetworkConfig
    node_groups: dict[str, NodeGroupConfig]
    peers: list[Peer] = []
    kafka: KafkaConfig
    redis: RedisConfig
    scylla: ScyllaConfig
    etcd: EtcdConfig
    gateway: GatewayConfig
    cdn: CdnConfig
    services: ServicesConfig
    observability: ObservabilityConfig
    redis_password: SecretStr
    # the gateway's limiter counters (edge namespace): its own, so the edge holds no datastore's
    ratelimit_redis_password: SecretStr
    etcd_root_password: SecretStr  # etcd's root user: the auth Job only
    etcd_password: SecretStr  # the services' etcd user
    # the same value in every region of an environment: one multi-DC cluster, one set of roles
    scylla_admin_password: SecretStr  # the schema Job's admin role
    scylla_password: SecretStr  # the services' role
    kafka_password: SecretStr  # the services' Kafka user (SCRAM)
    kafka_registry_password: SecretStr  # the schema registry's own Kafka user
    schema_registry_password: SecretStr  # the services' registry login (basic auth)
    # a Cloudflare API token allowed to purge the zone's cache by tag (the aggregator's purger)
    cdn_purge_token: SecretStr
    # the canary user's bearer token from the identity provider (services/canary), rotated out
    # of band: `pulumi config set --secret likes:canaryToken`
    canary_token: SecretStr
    pagerduty_routing_key: SecretStr | None = None
    # the abuse team's own PagerDuty service (their pages reach the platform's pager without it)
    abuse_pagerduty_routing_key: SecretStr | None = None

    @model_validator(mode="after")
    def _coherent(self) -> StackConfig:
        if len(set(self.zones)) != 3 or not all(z.startswith(self.region) for z in self.zones):
            raise ValueError(f"zones must be three distinct zones of {self.region}")
        if self.kubernetes_version not in SUPPORTED_KUBERNETES:
            raise ValueError(f"kubernetesVersion must be one of {', '.join(SUPPORTED_KUBERNETES)}")
        missing = [c for c in WORKLOAD_CLASSES if c not in self.node_groups]
        if missing:
            raise ValueError(f"nodeGroups lacks workload classes {missing}")
        if self.environment == "prod" and self.pagerduty_routing_key is None:
            raise ValueError("pagerdutyRoutingKey is required in prod (pages go nowhere otherwise)")
        return self

    @property
    def name_prefix(self) -> str:
        return f"likes-{self.environment}-{self.region}"


def _key(loc: Iterable[int | str]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, str) and "_" in part:
            part = to_camel(part)  # a defaulted field's error names the field, not its alias
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return f"{NAMESPACE}:{out}" if out else NAMESPACE


def _secretish_paths(value: Any, path: str) -> list[str]:
    """Keys under a structured value whose names look like secrets."""
    found: list[str] = []
    if isinstance(value, Mapping):
        for k, v in value.items():
            sub = f"{path}.{k}"
            if _SECRETISH.search(str(k)):
                found.append(sub)
            found.extend(_secretish_paths(v, sub))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            found.extend(_secretish_paths(v, f"{path}[{i}]"))
    return found


def parse(raw: Mapping[str, str], secret_keys: Iterable[str]) -> StackConfig:
    """Validate the flat Pulumi config map (`{"likes:kafka": "{...json...}", ...}`).

    Pure: the plan, the tests and the Pulumi program all come through here.
    """
    secrets = set(secret_keys)
    problems: list[tuple[str, str]] = []
    data: dict[str, Any] = {}
    prefix = NAMESPACE + ":"
    for full_key, text in raw.items():
        if not full_key.startswith(prefix):
            continue
        key = full_key[len(prefix) :]
        value: Any = text
        if isinstance(text, str) and text[:1] in "[{":
            try:
                value = json.loads(text)
            except json.JSONDecodeError as exc:
                problems.append((full_key, f"not valid JSON: {exc.msg}"))
                continue
        if key in SECRET_FIELDS or _SECRETISH.search(key):
            if full_key not in secrets:
                problems.append(
                    (full_key, f"must be a secret: pulumi config set --secret {full_key} …")
                )
        elif full_key not in secrets:
            problems.extend(
                (_key([p]), "looks like a secret in plain config; make it a secret key")
                for p in _secretish_paths(value, key)
            )
        data[key] = value
    region = raw.get("aws:region")
    if region is not None and "region" in data and region != data["region"]:
        problems.append(("aws:region", f"is {region} but likes:region is {data['region']}"))
    # Validate even when secrets were misplaced, so one run reports every bad key.
    try:
        parsed = StackConfig.model_validate(data, context={"environment": data.get("environment")})
    except ValidationError as exc:
        problems += [
            (_key(err["loc"]), err["msg"].removeprefix("Value error, ")) for err in exc.errors()
        ]
    if problems:
        raise ConfigError(problems)
    return parsed


def from_pulumi(
    get: Callable[[str], str | None] | None = None,
    is_secret: Callable[[str], bool] | None = None,
) -> StackConfig:
    """Read every known key from the running Pulumi program's config and validate it."""
    import pulumi.runtime as rt

    get = get or rt.get_config
    env_secrets = set(rt.get_config_secret_keys_env())
    is_secret = is_secret or (lambda k: rt.is_config_secret(k) or k in env_secrets)
    names = [f.alias or n for n, f in StackConfig.model_fields.items()]
    raw: dict[str, str] = {}
    for full in [f"{NAMESPACE}:{n}" for n in names] + ["aws:region"]:
        value = get(full)
        if value is not None:
            raw[full] = value
    return parse(raw, [k for k in raw if is_secret(k)])
