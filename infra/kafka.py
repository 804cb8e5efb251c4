"""Kafka through Strimzi (`kafka.strimzi.io/v1`): a KRaft cluster of node pools over the three
zones, the event topics, and MirrorMaker 2 pulling the peer regions' events into this one.

Every client logs in: the client listener requires SASL/SCRAM-SHA-512, and Strimzi's simple
authorization admits each KafkaUser to what services/contracts/kafka.py grants it. The services'
and the registry's passwords come from the stack's secrets (a Secret the KafkaUser reads);
MirrorMaker 2's come from the Secret the User Operator generates for its KafkaUser.

The client listener serves TLS with a certificate from the platform's CA (infra/tls.py, Strimzi's
`brokerCertChainAndKey`), so every client verifies the brokers against the one CA file every
workload mounts, not against Strimzi's own cluster CA.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pulumi_kubernetes as k8s

from infra import exporters, observability
from infra import k8s as kx
from infra import tls as tls_infra
from infra.config import Peer
from services.contracts import events, tls
from services.contracts import kafka as kafka_contract

API = "kafka.strimzi.io/v1"
CLUSTER_LABEL = "strimzi.io/cluster"
INTERNAL_LB = {"service.beta.kubernetes.io/aws-load-balancer-scheme": "internal"}
# the app.kubernetes.io/name Strimzi gives every Kafka node pod (the scrape labels workload=kafka)
KAFKA_APP = "kafka"
MIRROR_MAKER_APP = "kafka-mirror-maker-2"  # Strimzi's app.kubernetes.io/name on MirrorMaker 2 pods
DAY_MS = 24 * 3600 * 1000
# the topics are the services' (defined once, services/contracts/events.py)
EVENT_TOPICS = events.EVENT_TOPICS
DEAD_LETTER = events.DEAD_LETTER
RACK_AWARE_SELECTOR = "org.apache.kafka.common.replica.RackAwareReplicaSelector"
CLIENT_LISTENER = "clients"
CLIENT_PORT = 9092
PEER_LISTENER = "peers"  # the peer regions' MirrorMaker 2 (their likes:peers[].kafkaBootstrap)
PEER_PORT = 9094


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    replicas: int
    config: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class KafkaArgs:
    namespace: str
    region: str
    zones: tuple[str, ...]
    version: str
    controllers: int
    brokers_per_zone: int
    broker_storage_gi: int
    broker_cpu: str
    broker_memory_gi: int
    partitions: int
    dead_letter_partitions: int
    dead_letter_retention_days: int
    retention_hours: int
    replication_factor: int
    min_insync_replicas: int
    mirror_maker_replicas: int
    service_password: pulumi.Input[str]  # kafka_contract.SERVICE_USER's
    registry_password: pulumi.Input[str]  # kafka_contract.REGISTRY_USER's
    peers: Sequence[Peer] = ()
    cluster_name: str = "likes"
    storage_class: str = "gp3"
    depends_on: Sequence[pulumi.Resource] = ()
    cert_depends_on: Sequence[pulumi.Resource] = ()  # the internal CA's issuer


def topic_specs(args: KafkaArgs) -> list[TopicSpec]:
    """The platform's topics. Pure, so tests check the numbers without a cluster."""
    durable = {
        "min.insync.replicas": args.min_insync_replicas,
        "unclean.leader.election.enable": False,
    }
    event_topics = [
        TopicSpec(
            name,
            args.partitions,
            args.replication_factor,
            {**durable, "retention.ms": args.retention_hours * 3600 * 1000},
        )
        for name in EVENT_TOPICS
    ]
    dead_letter = TopicSpec(
        DEAD_LETTER,
        args.dead_letter_partitions,
        args.replication_factor,
        {**durable, "retention.ms": args.dead_letter_retention_days * DAY_MS},
    )
    return [*event_topics, dead_letter]


def mirror_user(peer_region: str) -> str:
    """The user this region's MirrorMaker 2 writes the peer's events here as."""
    return f"mirror-{peer_region}"


def mirror_acls(peer_region: str) -> tuple[kafka_contract.Acl, ...]:
    """MirrorMaker 2 (target side, here): the peer's mirrored topics, its own Connect topics
    and group, the heartbeats and checkpoints it writes beside them."""
    every = ("All",)
    return (
        kafka_contract.Acl("topic", f"{peer_region}.", "prefix", every),
        kafka_contract.Acl("topic", f"mirror-{peer_region}-", "prefix", every),
        kafka_contract.Acl("topic", "heartbeats", "literal", every),
        kafka_contract.Acl("topic", "mm2-", "prefix", every),
        kafka_contract.Acl("group", f"mirror-{peer_region}", "literal", every),
        kafka_contract.Acl("cluster", "", "literal", ("Describe", "DescribeConfigs")),
    )


def peer_source_acls() -> tuple[kafka_contract.Acl, ...]:
    """A peer region's MirrorMaker 2 pulling from here: read our event topics, keep its offset
    syncs beside them (MirrorMaker 2 writes them to the source cluster)."""
    return (
        kafka_contract.Acl(
            "topic", kafka_contract.TOPIC_PREFIX, "prefix", ("Read", "Describe", "DescribeConfigs")
        ),
        kafka_contract.Acl("topic", "mm2-offset-syncs.", "prefix", ("All",)),
        kafka_contract.Acl("cluster", "", "literal", ("Describe",)),
    )


def _zone_affinity(zone: str) -> dict[str, Any]:
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": kx.ZONE_KEY, "operator": "In", "values": [zone]}]}
                ]
            }
        }
    }


def _tolerations() -> list[dict[str, str]]:
    return [
        {"key": kx.WORKLOAD_LABEL, "operator": "Equal", "value": "kafka", "effect": "NoSchedule"}
    ]


class Kafka(pulumi.ComponentResource):
    bootstrap_servers: str
    topics: list[str]

    def __init__(
        self, name: str, args: KafkaArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("likes:infra:Kafka", name, None, opts)
        ns, cluster = args.namespace, args.cluster_name
        after_operator = pulumi.ResourceOptions(parent=self, depends_on=list(args.depends_on))
        pool_labels = {CLUSTER_LABEL: cluster, kx.TIER_LABEL: "datastore"}
        pools: list[pulumi.Resource] = []
        controller_match = {"strimzi.io/pool-name": "controllers"}
        pools.append(
            self._pool(
                "controllers",
                ns,
                pool_labels,
                {
                    "replicas": args.controllers,
                    "roles": ["controller"],
                    "storage": {
                        "type": "jbod",
                        "volumes": [
                            {
                                "id": 0,
                                "type": "persistent-claim",
                                "size": "50Gi",
                                "class": args.storage_class,
                                "deleteClaim": False,
                                "kraftMetadata": "shared",
                            }
                        ],
                    },
                    "resources": {
                        "requests": {"cpu": "1", "memory": "4Gi"},
                        "limits": {"cpu": "2", "memory": "4Gi"},
                    },
                    "template": {
                        "pod": {
                            "tolerations": _tolerations(),
                            # One controller per zone: a zone loss leaves a Raft majority.
                            "topologySpreadConstraints": [
                                {
                                    "maxSkew": 1,
                                    "topologyKey": kx.ZONE_KEY,
                                    "whenUnsatisfiable": "DoNotSchedule",
                                    "labelSelector": {"matchLabels": controller_match},
                                }
                            ],
                        }
                    },
                },
                after_operator,
            )
        )
        for zone in args.zones:
            heap = f"{max(1, args.broker_memory_gi // 2)}g"  # the rest is page cache
            pools.append(
                self._pool(
                    f"brokers-{zone}",
                    ns,
                    pool_labels,
                    {
                        "replicas": args.brokers_per_zone,
                        "roles": ["broker"],
                        "storage": {
                            "type": "jbod",
                            "volumes": [
                                {
                                    "id": 0,
                                    "type": "persistent-claim",
                                    "size": f"{args.broker_storage_gi}Gi",
                                    "class": args.storage_class,
                                    "deleteClaim": False,
                                }
                            ],
                        },
                        "resources": {
                            "requests": {
                                "cpu": args.broker_cpu,
                                "memory": f"{args.broker_memory_gi}Gi",
                            },
                            "limits": {
                                "cpu": args.broker_cpu,
                                "memory": f"{args.broker_memory_gi}Gi",
                            },
                        },
                        "jvmOptions": {"-Xms": heap, "-Xmx": heap},
                        "template": {
                            "pod": {"affinity": _zone_affinity(zone), "tolerations": _tolerations()}
                        },
                    },
                    after_operator,
                )
            )
        listener_cert = tls_infra.certificate(
            f"{name}-listener-tls",
            tls.KAFKA.secret,
            ns,
            [
                *tls_infra.service_names(f"{cluster}-kafka-bootstrap", ns),
                f"*.{cluster}-kafka-brokers.{ns}.svc",
                f"*.{cluster}-kafka-brokers.{ns}.svc.cluster.local",
            ],
            pulumi.ResourceOptions(parent=self, depends_on=list(args.cert_depends_on)),
        )
        listeners: list[dict[str, Any]] = [
            # the clients' listener: TLS from the platform's CA, and every client logs in
            {
                "name": CLIENT_LISTENER,
                "port": CLIENT_PORT,
                "type": "internal",
                "tls": True,
                "authentication": {"type": kafka_contract.STRIMZI_AUTH},
                "configuration": {
                    "brokerCertChainAndKey": {
                        "secretName": tls.KAFKA.secret,
                        "certificate": tls.CERT_KEY,
                        "key": tls.KEY_KEY,
                    }
                },
            },
            {
                "name": "tls",
                "port": 9093,
                "type": "internal",
                "tls": True,
                "authentication": {"type": "tls"},
            },
        ]
        if args.peers:
            # Peer regions' MirrorMaker 2 reach this cluster over an internal NLB (VPC peering).
            listeners.append(
                {
                    "name": PEER_LISTENER,
                    "port": PEER_PORT,
                    "type": "loadbalancer",
                    "tls": True,
                    "authentication": {"type": "scram-sha-512"},
                }
            )
        metrics_rules = self._jmx_rules(
            f"{name}-metrics",
            ns,
            exporters.KAFKA_METRICS_CONFIG_MAP,
            exporters.KAFKA_METRICS_KEY,
            exporters.KAFKA_JMX_RULES,
        )
        kafka = k8s.apiextensions.CustomResource(
            f"{name}-cluster",
            api_version=API,
            kind="Kafka",
            metadata=kx.meta(cluster, ns, {kx.TIER_LABEL: "datastore"}),
            spec={
                "kafka": {
                    "version": args.version,
                    "listeners": listeners,
                    # each KafkaUser may do what its ACLs say and nothing else; Strimzi's own
                    # operators and the brokers use their TLS identities (super users)
                    "authorization": {"type": "simple"},
                    "rack": {"topologyKey": kx.ZONE_KEY},
                    "config": {
                        "default.replication.factor": args.replication_factor,
                        "min.insync.replicas": args.min_insync_replicas,
                        "offsets.topic.replication.factor": args.replication_factor,
                        "transaction.state.log.replication.factor": args.replication_factor,
                        "transaction.state.log.min.isr": args.min_insync_replicas,
                        "unclean.leader.election.enable": False,
                        "auto.create.topics.enable": False,
                        # Consumers fetch from the replica in their own zone (no cross-AZ bytes).
                        "replica.selector.class": RACK_AWARE_SELECTOR,
                    },
                    # the Prometheus JMX exporter agent in every node, on port 9404
                    "metricsConfig": {
                        "type": "jmxPrometheusExporter",
                        "valueFrom": {
                            "configMapKeyRef": {
                                "name": exporters.KAFKA_METRICS_CONFIG_MAP,
                                "key": exporters.KAFKA_METRICS_KEY,
                            }
                        },
                    },
                    "template": {
                        "externalBootstrapService": {"metadata": {"annotations": INTERNAL_LB}},
                        "perPodService": {"metadata": {"annotations": INTERNAL_LB}},
                    },
                },
                "entityOperator": {"topicOperator": {}, "userOperator": {}},
            },
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[*args.depends_on, *pools, listener_cert, metrics_rules]
            ),
        )
        after_kafka = pulumi.ResourceOptions(parent=self, depends_on=[kafka])
        for spec in topic_specs(args):
            k8s.apiextensions.CustomResource(
                f"topic-{spec.name}",
                api_version=API,
                kind="KafkaTopic",
                metadata=kx.meta(spec.name, ns, {CLUSTER_LABEL: cluster}),
                spec={
                    "partitions": spec.partitions,
                    "replicas": spec.replicas,
                    "config": spec.config,
                },
                opts=after_kafka,
            )
        self._users(name, args, after_kafka)
        mirror_opts = after_kafka
        if args.peers:
            mirror_rules = self._jmx_rules(
                f"{name}-mirror-metrics",
                ns,
                exporters.MM2_METRICS_CONFIG_MAP,
                exporters.MM2_METRICS_KEY,
                exporters.MM2_JMX_RULES,
            )
            mirror_opts = pulumi.ResourceOptions(parent=self, depends_on=[kafka, mirror_rules])
        for peer in args.peers:
            self._mirror(name, args, peer, mirror_opts)
        self.bootstrap_servers = f"{cluster}-kafka-bootstrap.{ns}.svc.cluster.local:{CLIENT_PORT}"
        self.topics = [t.name for t in topic_specs(args)]
        self.register_outputs({"bootstrap_servers": self.bootstrap_servers, "topics": self.topics})

    def _jmx_rules(
        self, resource: str, ns: str, config_map: str, key: str, rules: Path
    ) -> k8s.core.v1.ConfigMap:
        """The ConfigMap a Strimzi `metricsConfig` points at: one JMX exporter rule file."""
        return k8s.core.v1.ConfigMap(
            resource,
            metadata=kx.meta(config_map, ns, kx.labels(config_map, "metrics", "datastore")),
            data={key: rules.read_text()},
            opts=pulumi.ResourceOptions(parent=self),
        )

    def _users(self, name: str, args: KafkaArgs, opts: pulumi.ResourceOptions) -> None:
        """The services' and the registry's users, each with the password of its Secret."""
        ns, cluster = args.namespace, args.cluster_name
        key = kafka_contract.PASSWORD_KEY
        registry_secret_data = {
            key: args.registry_password,
            # Confluent's registry takes its Kafka login as one JAAS line
            kafka_contract.JAAS_KEY: pulumi.Output.from_input(args.registry_password).apply(
                lambda pw: kafka_contract.jaas_config(
                    kafka_contract.Credentials(kafka_contract.REGISTRY_USER, pw)
                )
            ),
        }
        for user, secret, data, acls in (
            (
                kafka_contract.SERVICE_USER,
                kafka_contract.AUTH_SECRET,
                {key: args.service_password},
                kafka_contract.service_acls(tuple(p.region for p in args.peers)),
            ),
            (
                kafka_contract.REGISTRY_USER,
                kafka_contract.REGISTRY_SECRET,
                registry_secret_data,
                kafka_contract.REGISTRY_ACLS,
            ),
        ):
            sec = k8s.core.v1.Secret(
                f"{name}-{secret}",
                metadata=kx.meta(secret, ns, kx.labels(name, secret, "datastore")),
                type="Opaque",
                string_data=data,
                opts=pulumi.ResourceOptions(parent=self),
            )
            self._user(
                f"{name}-user-{user}",
                user,
                ns,
                cluster,
                {
                    "type": kafka_contract.STRIMZI_AUTH,
                    "password": {"valueFrom": {"secretKeyRef": {"name": secret, "key": key}}},
                },
                acls,
                pulumi.ResourceOptions.merge(opts, pulumi.ResourceOptions(depends_on=[sec])),
                # the User Operator re-reads the Secret on its timer; a changed digest is an
                # event on the KafkaUser, so a rotated password reaches Kafka at once
                {kx.CREDENTIALS_ANNOTATION: kx.credentials_digest({secret: data[key]})},
            )

    def _user(
        self,
        resource: str,
        user: str,
        ns: str,
        cluster: str,
        authentication: dict[str, Any],
        acls: Sequence[kafka_contract.Acl],
        opts: pulumi.ResourceOptions,
        annotations: Mapping[str, pulumi.Input[str]] | None = None,
    ) -> None:
        k8s.apiextensions.CustomResource(
            resource,
            api_version=API,
            kind="KafkaUser",
            metadata=kx.meta(user, ns, {CLUSTER_LABEL: cluster}, annotations),
            spec={
                "authentication": authentication,
                "authorization": {"type": "simple", "acls": [a.strimzi() for a in acls]},
            },
            opts=opts,
        )

    def _pool(
        self,
        pool: str,
        ns: str,
        lbls: dict[str, str],
        spec: dict[str, Any],
        opts: pulumi.ResourceOptions,
    ) -> k8s.apiextensions.CustomResource:
        # every node serves the JMX exporter's metrics (the Kafka CR's metricsConfig); the pods
        # job scrapes them by these annotations. Strimzi names its node pods `kafka` already: the
        # label is repeated so the render says which workload the scrape labels them as.
        spec["template"]["pod"]["metadata"] = {
            "labels": {observability.NAME_LABEL: KAFKA_APP},
            "annotations": observability.scrape_annotations(exporters.STRIMZI_METRICS_PORT),
        }
        return k8s.apiextensions.CustomResource(
            f"pool-{pool}",
            api_version=API,
            kind="KafkaNodePool",
            metadata=kx.meta(pool, ns, lbls),
            spec=spec,
            opts=opts,
        )

    def _mirror(self, name: str, args: KafkaArgs, peer: Peer, opts: pulumi.ResourceOptions) -> None:
        """Pull the peer region's events into `<peer>.likes.*` topics here.

        DefaultReplicationPolicy (prefixed remote topics), not IdentityReplicationPolicy: with
        identity names, two regions mirroring each other loop events forever, and the local
        aggregator would count the peer's events into this region's cells a second time.
        """
        ns, cluster = args.namespace, args.cluster_name
        user = f"mm2-{args.region}"
        secret = f"kafka-peer-{peer.region}"  # created out of band: see infra/README.md
        k8s.apiextensions.CustomResource(
            f"{name}-mm2-{peer.region}",
            api_version=API,
            kind="KafkaMirrorMaker2",
            metadata=kx.meta(f"mirror-{peer.region}", ns, {kx.TIER_LABEL: "datastore"}),
            spec={
                "version": args.version,
                "replicas": args.mirror_maker_replicas,
                "target": {
                    "alias": args.region,
                    "bootstrapServers": (
                        f"{cluster}-kafka-bootstrap.{ns}.svc.cluster.local:{CLIENT_PORT}"
                    ),
                    # the target's client listener serves TLS from the platform's CA and
                    # requires a login: the User Operator's Secret for mirror_user (same
                    # namespace)
                    "tls": {
                        "trustedCertificates": [
                            {"secretName": tls.KAFKA.secret, "certificate": tls.CA_KEY}
                        ]
                    },
                    "authentication": {
                        "type": kafka_contract.STRIMZI_AUTH,
                        "username": mirror_user(peer.region),
                        "passwordSecret": {
                            "secretName": mirror_user(peer.region),
                            "password": kafka_contract.PASSWORD_KEY,
                        },
                    },
                    "groupId": f"mirror-{peer.region}",
                    "configStorageTopic": f"mirror-{peer.region}-config",
                    "offsetStorageTopic": f"mirror-{peer.region}-offsets",
                    "statusStorageTopic": f"mirror-{peer.region}-status",
                },
                "mirrors": [
                    {
                        "source": {
                            "alias": peer.region,
                            "bootstrapServers": peer.kafka_bootstrap,
                            "tls": {
                                "trustedCertificates": [
                                    {"secretName": secret, "certificate": "ca.crt"}
                                ]
                            },
                            "authentication": {
                                "type": "scram-sha-512",
                                "username": user,
                                "passwordSecret": {"secretName": secret, "password": "password"},
                            },
                        },
                        "sourceConnector": {
                            "tasksMax": 16,
                            "config": {
                                "replication.factor": args.replication_factor,
                                "offset-syncs.topic.replication.factor": args.replication_factor,
                                "sync.topic.acls.enabled": "false",
                            },
                        },
                        "checkpointConnector": {
                            "tasksMax": 1,
                            "config": {
                                "checkpoints.topic.replication.factor": args.replication_factor
                            },
                        },
                        # Only the peer's own topics: never its mirrors of a third region.
                        "topicsPattern": r"likes\.(committed|voided|unvoided)",
                        "groupsPattern": "^$",
                    }
                ],
                "resources": {
                    "requests": {"cpu": "1", "memory": "2Gi"},
                    "limits": {"cpu": "2", "memory": "2Gi"},
                },
                # the JMX exporter agent in every pod, on port 9404: the cross-region
                # replication SLO reads its replication latency; the pods job scrapes it by
                # these annotations (the label is Strimzi's own, repeated as for the brokers)
                "metricsConfig": {
                    "type": "jmxPrometheusExporter",
                    "valueFrom": {
                        "configMapKeyRef": {
                            "name": exporters.MM2_METRICS_CONFIG_MAP,
                            "key": exporters.MM2_METRICS_KEY,
                        }
                    },
                },
                "template": {
                    "pod": {
                        "metadata": {
                            "labels": {observability.NAME_LABEL: MIRROR_MAKER_APP},
                            "annotations": observability.scrape_annotations(
                                exporters.STRIMZI_METRICS_PORT
                            ),
                        }
                    }
                },
            },
            opts=opts,
        )
        scram = {"type": kafka_contract.STRIMZI_AUTH}  # the User Operator makes the password
        # The user this region's MirrorMaker 2 writes the peer's events here as.
        self._user(
            f"{name}-user-{mirror_user(peer.region)}",
            mirror_user(peer.region),
            ns,
            cluster,
            scram,
            mirror_acls(peer.region),
            opts,
        )
        # The user the peer region's MirrorMaker 2 authenticates as when it pulls from here.
        self._user(
            f"{name}-user-mm2-{peer.region}",
            f"mm2-{peer.region}",
            ns,
            cluster,
            scram,
            peer_source_acls(),
            opts,
        )
