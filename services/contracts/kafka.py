"""Kafka access: the users every client logs in as (SASL/SCRAM-SHA-512), the Secrets that hold
their passwords, what each user may touch (Strimzi's simple authorization renders these ACLs),
and the one builder of a client's connection settings. Light on purpose: no client library.

The program's client listener requires SCRAM (infra/kafka.py); so does the local stack's
(local/components/kafka.py): a client without credentials, or with wrong ones, is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from services.contracts import events
from services.contracts.logins import Credentials as Credentials
from services.contracts.settings import Settings

SECURITY_PROTOCOL = "SASL_SSL"  # the client listener: TLS (contracts/tls.py) and SCRAM
PLAINTEXT_PROTOCOL = "SASL_PLAINTEXT"  # the local quick profile (no TLS)
SASL_MECHANISM = "SCRAM-SHA-512"
STRIMZI_AUTH = "scram-sha-512"  # the same mechanism as Strimzi spells it

SERVICE_USER = "likes"  # every workload (write, relay, aggregator, recount)
REGISTRY_USER = "schema-registry"  # the registry's own store (the `_schemas` topic)
REGISTRY_TOPIC = "_schemas"
REGISTRY_GROUP = "schema-registry"
OFFSETS_TOPIC = "__consumer_offsets"  # Kafka's own: where the groups' offset commits go
# Kubernetes Secrets (played locally by the stack's secrets file), key PASSWORD_KEY in each
AUTH_SECRET = "kafka-auth"  # SERVICE_USER's: the workloads' namespace and the data one
REGISTRY_SECRET = "kafka-registry-auth"  # REGISTRY_USER's: the data namespace only
PASSWORD_KEY = "password"
JAAS_KEY = "sasl.jaas.config"  # in REGISTRY_SECRET: the registry takes its login as JAAS
# the local stack only: the brokers' own login (inter-broker) and the super user that creates
# topics and users; in production Strimzi's operators use their own TLS identities
ADMIN_USER = "admin"
ADMIN_SECRET = "kafka-admin"

ResourceType = Literal["topic", "group", "cluster"]
Pattern = Literal["literal", "prefix"]


@dataclass(frozen=True)
class Acl:
    """One allow rule, in Strimzi's KafkaUser terms (`spec.authorization.acls[]`)."""

    type: ResourceType
    name: str
    pattern: Pattern
    operations: tuple[str, ...]

    def strimzi(self) -> dict[str, Any]:
        resource: dict[str, Any] = {"type": self.type}
        if self.type != "cluster":
            resource |= {"name": self.name, "patternType": self.pattern}
        return {"resource": resource, "operations": list(self.operations)}


# the platform's topics all start with this (events.EVENT_TOPICS and the dead letter)
TOPIC_PREFIX = "likes."
GROUP_PREFIX = "likes-"  # the aggregator's group, the recount sampler's
AGGREGATOR_GROUP = f"{GROUP_PREFIX}aggregator"  # the one that counts; the lag exporter watches it
ABUSE_GROUP = f"{GROUP_PREFIX}abuse-scorer"  # reads likes.committed at its own pace (the seed)
# the consumer-lag exporter's fetcher: assigns partitions to read timestamps, never joins or commits
LAG_READER_GROUP = f"{GROUP_PREFIX}consumer-lag"


def service_acls(peer_regions: tuple[str, ...] = ()) -> tuple[Acl, ...]:
    """The services may produce and consume the platform's topics (and read the peers' mirrors
    of them) in the platform's groups; no topic creation, no config change, nothing else."""
    data = ("Read", "Write", "Describe", "DescribeConfigs")
    acls = [Acl("topic", TOPIC_PREFIX, "prefix", data)]
    acls += [
        Acl("topic", events.mirrored(p, TOPIC_PREFIX), "prefix", ("Read", "Describe"))
        for p in peer_regions
    ]
    acls.append(Acl("group", GROUP_PREFIX, "prefix", ("Read", "Describe")))
    return tuple(acls)


REGISTRY_ACLS = (
    # Confluent's registry creates its one-partition compacted topic at first start
    Acl(
        "topic",
        REGISTRY_TOPIC,
        "literal",
        ("Create", "Read", "Write", "Describe", "DescribeConfigs"),
    ),
    Acl("group", REGISTRY_GROUP, "literal", ("Read", "Describe")),
    Acl("cluster", "", "literal", ("Describe",)),
)


def credentials(settings: Settings) -> Credentials | None:
    """The settings' Kafka login; None when they name no user (a bare broker)."""
    if settings.kafka_user is None or settings.kafka_password is None:
        return None
    return Credentials(settings.kafka_user, settings.kafka_password.get_secret_value())


def protocol(tls: bool) -> str:
    """The client listener's security.protocol: TLS (the program, the local --tls profile) or
    not (the local quick profile); SCRAM either way."""
    return SECURITY_PROTOCOL if tls else PLAINTEXT_PROTOCOL


def client_config(
    bootstrap: str, creds: Credentials | None, ca_file: str | None = None
) -> dict[str, Any]:
    """librdkafka's connection settings for any Producer, Consumer or AdminClient: TLS verified
    against `ca_file` (the broker's name included, librdkafka's default) when it is set."""
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap}
    if creds is not None:
        conf |= {
            "security.protocol": protocol(ca_file is not None),
            "sasl.mechanism": SASL_MECHANISM,
            "sasl.username": creds.user,
            "sasl.password": creds.password,
        }
    elif ca_file is not None:
        conf["security.protocol"] = "SSL"
    if ca_file is not None:
        conf["ssl.ca.location"] = ca_file
    return conf


def from_settings(settings: Settings) -> dict[str, Any]:
    return client_config(settings.kafka_bootstrap, credentials(settings), settings.tls_ca_file)


def jaas_config(creds: Credentials) -> str:
    """A Java client's login line (`sasl.jaas.config`): the brokers' own, Confluent's registry."""
    quoted = [v.replace("\\", "\\\\").replace('"', '\\"') for v in (creds.user, creds.password)]
    return (
        "org.apache.kafka.common.security.scram.ScramLoginModule required "
        f'username="{quoted[0]}" password="{quoted[1]}";'
    )
