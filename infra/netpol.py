"""Who may open a connection to whom, on which port: the one table (`flows`) the NetworkPolicies
are rendered from.

Every namespace the program creates denies ingress and egress by default; each row of the table
opens one path:
- a workload to each server its code uses (`workloads.Workload.uses`), at the host and port the
  program rendered into its env: a new dependency, or a moved port, follows the env;
- what the edge's and observability's rendered configs dial (`kx.Dial`: Envoy's clusters, the
  limiter's Redis, the collectors' exporters, Prometheus's Alertmanager and remote write,
  Alertmanager's receivers and peers), reported by their components beside the config;
- Prometheus to the metrics port of each pod it scrapes; the load balancer (and Cloudflare) to
  Envoy's listener; the API server to the operators' admission webhooks;
- the datastores' own peer traffic (Redis cluster bus, etcd peers, Kafka's controller and
  replication listeners, Scylla's inter-node port), their setup Jobs, the operators that manage
  them (Strimzi, the Scylla Operator), MirrorMaker 2, the peer regions, the Kubernetes API for
  whatever watches it, and DNS for every pod.

Strimzi's own NetworkPolicy generation is off (infra/platform.py): it opens every listener to every
namespace unless each listener names its peers, and this table already says who may connect.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from ipaddress import IPv4Network
from urllib.parse import urlsplit

import pulumi
import pulumi_kubernetes as k8s

from infra import etcd, exporters, gateway, network, otel_config, platform, schema_registry, scylla
from infra import k8s as kx
from infra import kafka as kafka_infra
from infra import observability as obs
from infra import redis as redis_infra
from infra.config import Peer
from services.contracts import workloads

NS_LABEL = "kubernetes.io/metadata.name"  # every namespace carries it (Kubernetes sets it)
DNS_NAMESPACE = "kube-system"
DNS_LABELS = {"k8s-app": "kube-dns"}  # CoreDNS on EKS
DNS_PORT = 53
INTERNET = "0.0.0.0/0"
PRIVATE = ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16")
KUBE_API_HOST, KUBE_API_PORT = kx.KUBE_API_HOST, kx.KUBE_API_PORT
# Strimzi's fixed ports (KafkaCluster/KafkaConnectCluster in strimzi-kafka-operator): the KRaft
# control plane, replication (also the operators' admin client), the Kafka agent the cluster
# operator polls, the metrics exporter, Kafka Connect's REST API (MirrorMaker 2).
STRIMZI_CONTROL_PLANE = 9090
STRIMZI_REPLICATION = 9091
STRIMZI_AGENT = 8443
STRIMZI_METRICS = exporters.STRIMZI_METRICS_PORT
CONNECT_REST = 8083
KAFKA_PEERS_PORT = kafka_infra.PEER_PORT  # the listener the peer regions' MirrorMaker 2 pulls from
# Scylla: inter-node (plain and TLS), Prometheus metrics, and the manager agent's API, which the
# Scylla Operator calls (scyllaclient's default port).
SCYLLA_INTERNODE = (7000, 7001)
SCYLLA_METRICS = exporters.SCYLLA_METRICS_PORT
SCYLLA_AGENT = 10001
REDIS_CLUSTERS = redis_infra.CLUSTERS  # their nodes replicate and gossip on the bus
OPERATOR_WEBHOOKS = (platform.CERT_MANAGER_WEBHOOK_PORT, platform.SCYLLA_WEBHOOK_PORT)


@dataclass(frozen=True)
class Pods:
    """Pods selected by labels in one namespace (no labels: every pod there)."""

    namespace: str
    labels: tuple[tuple[str, str], ...]
    name: str  # names the policies that select these pods

    @classmethod
    def of(cls, namespace: str, labels: Mapping[str, str], name: str) -> Pods:
        return cls(namespace, tuple(sorted(labels.items())), name)


@dataclass(frozen=True)
class Cidr:
    cidr: str
    except_: tuple[str, ...] = ()


@dataclass(frozen=True)
class Flow:
    src: Pods | Cidr
    dst: Pods | Cidr
    ports: tuple[int, ...]
    why: str
    protocols: tuple[str, ...] = ("TCP",)


@dataclass(frozen=True)
class NetpolArgs:
    apps_namespace: str
    edge_namespace: str
    data_namespace: str
    observability_namespace: str
    operators_namespace: str
    # each workload's env as the program rendered it (workload name -> LIKES_* -> value)
    env: Mapping[str, Mapping[str, object]]
    registry_kafka_bootstrap: str  # what the schema registry stores its schemas through
    kafka_cluster: str
    scylla_cluster: str
    # each peer region and its VPC (peered with ours): where its MirrorMaker 2 pulls from and
    # its Scylla nodes connect from. Never a wider range: this cluster's own pods have VPC
    # addresses too, and a block such as 10.0.0.0/8 would let every one of them in.
    peers: Sequence[Peer]
    scylla_multi_dc: bool  # the peers' data centres replicate with ours
    # this cluster's VPC: its public subnets hold the load balancers, its private ones the
    # nodes, the pods and the API server's network interfaces (network.subnet_plan)
    vpc_cidr: IPv4Network
    zones: int
    # what the components' rendered configs connect to (gateway, observability)
    dials: Sequence[kx.Dial] = ()

    @property
    def namespaces(self) -> tuple[str, ...]:
        return (
            self.apps_namespace,
            self.edge_namespace,
            self.data_namespace,
            self.observability_namespace,
            self.operators_namespace,
        )


def endpoints(value: str) -> list[tuple[str, int]]:
    """(host, port) of each address in a rendered value: `h:p[,h:p]` or a URL."""
    out = []
    for part in (p.strip() for p in value.split(",")):
        if "://" in part:
            u = urlsplit(part)
            port = u.port or (443 if u.scheme == "https" else 80)
            out.append((u.hostname or "", port))
        else:
            host, number = part.rsplit(":", 1)
            out.append((host, int(number)))
    return out


class Table:
    """Builds the flows; `resolve` maps an in-cluster host to the pods behind it."""

    def __init__(self, args: NetpolArgs) -> None:
        self.a = args
        data = args.data_namespace
        self.kafka = Pods.of(
            data,
            {
                "strimzi.io/cluster": args.kafka_cluster,
                "strimzi.io/kind": "Kafka",
                "strimzi.io/name": f"{args.kafka_cluster}-kafka",
            },
            "kafka",
        )
        # the nodes of the broker role (a node pool's pods carry their roles as labels): the
        # only ones with client and peer listeners
        self.brokers = Pods.of(
            data,
            {
                "strimzi.io/cluster": args.kafka_cluster,
                "strimzi.io/kind": "Kafka",
                "strimzi.io/broker-role": "true",
            },
            "kafka-brokers",
        )
        self.scylla = Pods.of(data, {"scylla/cluster": args.scylla_cluster}, "scylla")
        # Services an operator creates, whose selector is not `kx.selector(name)`
        self.operator_services = {
            (data, f"{args.kafka_cluster}-kafka-bootstrap"): self.brokers,
            (data, f"{args.scylla_cluster}-client"): self.scylla,
        }
        private, public = network.subnet_plan(args.vpc_cidr, args.zones)
        self.load_balancers = [str(c) for c in public]
        self.control_plane = [str(c) for c in private]  # the API server's ENIs (and the pods)

    def workload(self, w: workloads.Workload) -> Pods:
        return Pods.of(self.a.apps_namespace, kx.selector(w.name), w.name)

    def app(self, namespace: str, name: str) -> Pods:
        return Pods.of(namespace, kx.selector(name), name)

    @staticmethod
    def every(namespace: str) -> Pods:
        return Pods.of(namespace, {}, "every-pod")

    def resolve(self, host: str) -> Pods | Cidr:
        """`<service>.<namespace>.svc...` (or `<pod>.<service>.<namespace>.svc...`) -> the pods
        behind that Service; the API server -> its endpoint, whose addresses are not known at
        plan time; anything else is outside the cluster (the internet, never a private
        address)."""
        if host == KUBE_API_HOST:
            return Cidr(INTERNET)
        parts = host.split(".")
        if len(parts) >= 4 and parts[3] == "svc":
            parts = parts[1:]  # a pod's own name under its (headless) Service
        if len(parts) >= 3 and parts[2] == "svc":
            svc, ns = parts[0], parts[1]
            return self.operator_services.get((ns, svc)) or self.app(ns, svc)
        return Cidr(INTERNET, PRIVATE)

    def rendered(self, w: workloads.Workload, field: str) -> str:
        """The value of a settings field in the workload's env (its settings default when the
        program renders none, e.g. Cloudflare's public API URL)."""
        cls = w.settings_class()
        value = self.a.env[w.name].get(cls.env_name(field), cls.model_fields[field].default)
        if not isinstance(value, str | int):
            raise TypeError(f"{w.name}: {field} is not a plain value at plan time: {value!r}")
        return str(value)

    def servers(self, w: workloads.Workload, field: str) -> list[tuple[str, int]]:
        port_field = workloads.SERVERS[field]
        if port_field is None:
            return endpoints(self.rendered(w, field))
        port = int(self.rendered(w, port_field))
        return [(h.strip(), port) for h in self.rendered(w, field).split(",")]

    def api(self, src: Pods, why: str) -> Flow:
        return Flow(src, self.resolve(KUBE_API_HOST), (KUBE_API_PORT,), why)

    def flows(self) -> list[Flow]:
        a = self.a
        out: list[Flow] = []
        for w in workloads.ALL:
            for field in w.uses:
                source = workloads.HOTKEY_OPERATOR if field == "hot_pools" else w
                for host, port in self.servers(source, field):
                    out.append(Flow(self.workload(w), self.resolve(host), (port,), field))
        out.append(self.api(self.workload(workloads.HOTKEY_OPERATOR), "Kopf watches its CRs"))
        for ns in a.namespaces:
            dns = Pods.of(DNS_NAMESPACE, DNS_LABELS, "kube-dns")
            out.append(Flow(self.every(ns), dns, (DNS_PORT,), "DNS", ("UDP", "TCP")))
        for d in a.dials:
            for host, port in endpoints(d.address):
                dst = self.resolve(host)
                out.append(Flow(self.app(d.namespace, d.app), dst, (port,), d.why, d.protocols))
        out += self._edge()
        prometheus = self.app(a.observability_namespace, "prometheus")
        # the Deployments infra/services.py renders carry the scrape annotations (the
        # operator's does not): Prometheus discovers them and scrapes their metrics port
        for w in workloads.SERVICES:
            out.append(Flow(prometheus, self.workload(w), (w.ops_port,), "scrape"))
            if w.sidecar is not None:  # the pod-sidecars job, by the port's name
                out.append(Flow(prometheus, self.workload(w), (w.sidecar.ops_port,), "scrape"))
        # Prometheus and Alertmanager carry the scrape annotations too (their own metrics)
        out.append(Flow(prometheus, prometheus, (obs.PROMETHEUS_PORT,), "scrape"))
        alertmanager = self.app(a.observability_namespace, "alertmanager")
        out.append(Flow(prometheus, alertmanager, (obs.ALERTMANAGER_PORT,), "scrape"))
        # the gateway's pods carry them as well: Envoy's stats listener
        envoy = self.app(a.edge_namespace, "envoy")
        out.append(Flow(prometheus, envoy, (gateway.STATS_PORT,), "scrape"))
        # and both collector tiers (their own otelcol_* metrics)
        for tier in (otel_config.COLLECTOR, otel_config.SAMPLER):
            collector = self.app(a.observability_namespace, tier)
            out.append(Flow(prometheus, collector, (otel_config.METRICS_PORT,), "scrape"))
        out += self._datastores(prometheus)
        out += self._operators()
        return out

    def _edge(self) -> Iterable[Flow]:
        envoy = self.app(self.a.edge_namespace, "envoy")
        # The NLB (IP targets) connects from its own addresses in the public subnets, health
        # checks included; were the client IP preserved, it would be Cloudflare's
        # (gateway.CLOUDFLARE_IPV4, the NLB's only allowed sources either way).
        for cidr in (*self.load_balancers, *gateway.CLOUDFLARE_IPV4):
            yield Flow(Cidr(cidr), envoy, (gateway.LISTENER_PORT,), "the public listener")

    def _operators(self) -> Iterable[Flow]:
        # Only our Helm releases' pods run here, and every one of them watches the API (and
        # cert-manager's ACME issuer is on the internet's 443 too); the API server calls their
        # admission webhooks from its network interfaces in the private subnets. Namespace-wide
        # on purpose: a chart's pod labels are its own to change, and a webhook that the API
        # server cannot reach fails every admission it guards.
        ops = self.every(self.a.operators_namespace)
        yield self.api(ops, "the operators watch their resources")
        for cidr in self.control_plane:
            yield Flow(Cidr(cidr), ops, OPERATOR_WEBHOOKS, "the API server's admission calls")

    def _datastores(self, prometheus: Pods) -> Iterable[Flow]:
        a = self.a
        data, ops = a.data_namespace, a.operators_namespace
        for role in REDIS_CLUSTERS:
            nodes = self.app(data, role)
            ports = (redis_infra.PORT, redis_infra.BUS_PORT)
            yield Flow(nodes, nodes, ports, "replication and the cluster bus")
            yield Flow(self.app(data, f"{role}-create"), nodes, (redis_infra.PORT,), "create")
        exporter = self.app(data, exporters.REDIS_EXPORTER)
        yield Flow(prometheus, exporter, (exporters.REDIS_EXPORTER_PORT,), "scrape")
        for component in redis_infra.COMPONENTS:
            servers = Pods.of(data, {redis_infra.ROLE_LABEL: component}, f"redis-{component}")
            yield Flow(exporter, servers, (redis_infra.PORT,), "the exporter's scrapes")
        members = self.app(data, "etcd")
        yield Flow(members, members, (etcd.PEER_PORT,), "raft")
        yield Flow(self.app(data, "etcd-auth"), members, (etcd.CLIENT_PORT,), "auth setup Job")
        yield Flow(prometheus, members, (etcd.METRICS_PORT,), "scrape")
        registry = self.app(data, "schema-registry")
        for host, port in endpoints(a.registry_kafka_bootstrap):
            yield Flow(registry, self.resolve(host), (port,), "the registry's _schemas topic")
        yield Flow(
            self.app(data, "schema-registry-register"),
            registry,
            (schema_registry.PORT,),
            "schema registration Job",
        )
        kafka = self.kafka
        operator = Pods.of(ops, {"strimzi.io/kind": "cluster-operator"}, "strimzi")
        entity_operator = Pods.of(
            data, {"strimzi.io/name": f"{a.kafka_cluster}-entity-operator"}, "entity-operator"
        )
        yield Flow(kafka, kafka, (STRIMZI_CONTROL_PLANE, STRIMZI_REPLICATION), "KRaft")
        # the brokers' init container reads its node's zone (rack awareness)
        yield self.api(kafka, "the broker's rack")
        yield Flow(
            operator,
            kafka,
            (STRIMZI_CONTROL_PLANE, STRIMZI_REPLICATION, STRIMZI_AGENT),
            "Strimzi rolls and checks the brokers",
        )
        yield Flow(entity_operator, kafka, (STRIMZI_REPLICATION,), "topic and user operators")
        yield self.api(entity_operator, "KafkaTopics and KafkaUsers")
        yield Flow(prometheus, kafka, (STRIMZI_METRICS,), "scrape")
        for peer in a.peers:
            mm2 = Pods.of(
                data,
                {
                    "strimzi.io/cluster": f"mirror-{peer.region}",
                    "strimzi.io/kind": "KafkaMirrorMaker2",
                },
                f"mirror-{peer.region}",
            )
            for host, port in endpoints(a.registry_kafka_bootstrap):
                yield Flow(mm2, self.resolve(host), (port,), "MirrorMaker 2 writes here")
            for _, port in endpoints(peer.kafka_bootstrap):
                # the peer's internal NLB, in its VPC
                yield Flow(mm2, Cidr(str(peer.vpc_cidr)), (port,), "MirrorMaker 2 pulls there")
            yield Flow(operator, mm2, (CONNECT_REST,), "Strimzi configures the connectors")
            yield Flow(mm2, mm2, (CONNECT_REST,), "Connect workers forward to the leader")
            yield Flow(prometheus, mm2, (STRIMZI_METRICS,), "scrape")
        nodes = self.scylla
        for peer in a.peers:
            peer_mm2 = Cidr(str(peer.vpc_cidr))
            yield Flow(peer_mm2, self.brokers, (KAFKA_PEERS_PORT,), "the peer's MirrorMaker 2")
            if a.scylla_multi_dc:
                peer_dc = Cidr(str(peer.vpc_cidr))
                yield Flow(peer_dc, nodes, SCYLLA_INTERNODE, "the peer data centre")
                yield Flow(nodes, peer_dc, SCYLLA_INTERNODE, "the peer data centre")
        # the operator's node Jobs (cleanup after a topology change) carry the cluster's label
        # and call the member's agent
        yield Flow(nodes, nodes, (*SCYLLA_INTERNODE, SCYLLA_AGENT), "gossip, replication, Jobs")
        # each member's operator sidecar watches its Service and the ScyllaCluster
        yield self.api(nodes, "the member's sidecar")
        yield Flow(self.app(data, "schema-migration"), nodes, (scylla.CQL_PORT,), "migration Job")
        yield Flow(self.every(ops), nodes, (SCYLLA_AGENT,), "the Scylla Operator")
        yield Flow(prometheus, nodes, (SCYLLA_METRICS,), "scrape")


def _selector(p: Pods) -> kx.meta_v1.LabelSelectorArgs:
    return kx.meta_v1.LabelSelectorArgs(match_labels=dict(p.labels) or None)


def _peer(end: Pods | Cidr) -> k8s.networking.v1.NetworkPolicyPeerArgs:
    net = k8s.networking.v1
    if isinstance(end, Cidr):
        return net.NetworkPolicyPeerArgs(
            ip_block=net.IPBlockArgs(cidr=end.cidr, except_=list(end.except_) or None)
        )
    return net.NetworkPolicyPeerArgs(
        namespace_selector=kx.meta_v1.LabelSelectorArgs(match_labels={NS_LABEL: end.namespace}),
        pod_selector=_selector(end),
    )


def _ports(f: Flow) -> list[k8s.networking.v1.NetworkPolicyPortArgs]:
    net = k8s.networking.v1
    return [net.NetworkPolicyPortArgs(port=p, protocol=pr) for p in f.ports for pr in f.protocols]


class NetworkPolicies(pulumi.ComponentResource):
    """Default-deny both ways in every namespace of ours, plus one policy per selected pod group
    and direction, rendered from `Table.flows`."""

    flows: list[Flow]

    def __init__(
        self, name: str, args: NetpolArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("likes:infra:NetworkPolicies", name, None, opts)
        self.flows = Table(args).flows()
        ours = args.namespaces
        for ns in ours:
            every = Table.every(ns)
            self._policy(ns, "default-deny-ingress", every, ingress=[])
            self._policy(ns, "default-deny-egress", every, egress=[])
        net = k8s.networking.v1
        by_dst: dict[Pods, list[Flow]] = {}
        by_src: dict[Pods, list[Flow]] = {}
        for f in self.flows:
            if isinstance(f.dst, Pods) and f.dst.namespace in ours:
                by_dst.setdefault(f.dst, []).append(f)
            if isinstance(f.src, Pods) and f.src.namespace in ours:
                by_src.setdefault(f.src, []).append(f)
        for dst, flows in by_dst.items():
            ingress = [
                net.NetworkPolicyIngressRuleArgs(from_=[_peer(f.src)], ports=_ports(f))
                for f in flows
            ]
            self._policy(dst.namespace, f"{dst.name}-ingress", dst, ingress=ingress)
        for src, flows in by_src.items():
            egress = [
                net.NetworkPolicyEgressRuleArgs(to=[_peer(f.dst)], ports=_ports(f)) for f in flows
            ]
            self._policy(src.namespace, f"{src.name}-egress", src, egress=egress)
        self.register_outputs({"flows": len(self.flows)})

    def _policy(
        self,
        ns: str,
        name: str,
        pods: Pods,
        *,
        ingress: list[k8s.networking.v1.NetworkPolicyIngressRuleArgs] | None = None,
        egress: list[k8s.networking.v1.NetworkPolicyEgressRuleArgs] | None = None,
    ) -> None:
        types = (["Ingress"] if ingress is not None else []) + (
            ["Egress"] if egress is not None else []
        )
        k8s.networking.v1.NetworkPolicy(
            f"netpol-{ns}-{name}",
            metadata=kx.meta(name, ns, kx.labels("likes", "network-policy", "app")),
            spec=k8s.networking.v1.NetworkPolicySpecArgs(
                pod_selector=_selector(pods),
                policy_types=types,
                ingress=ingress,
                egress=egress,
            ),
            opts=pulumi.ResourceOptions(parent=self),
        )
