"""The rendered NetworkPolicies, evaluated as Kubernetes would (tests/infra/netpol_eval.py) over a
model of each stack's pods: the plan's own pod templates, plus the pods the operators create
(Strimzi's Kafka nodes, entity operator and MirrorMaker 2, Scylla's members) and the cluster's own
(CoreDNS, the operators), labelled as their documentation says.

- every workload reaches every server it is configured with, and nothing else in the datastores'
  namespace, on no other port;
- the edge namespace reaches no datastore;
- the platform's own paths (peers, setup Jobs, operators, MirrorMaker 2, Prometheus, DNS) work;
- in every namespace of ours, a connection nobody declared is denied (a pod nobody selects gets
  DNS only, nothing reaches it; from outside, only the load balancer, the API server's webhook
  calls and the peer regions get in), and every connection the rendered configs imply is allowed
  (`implied`: Envoy's clusters, Prometheus's discovery and targets, Alertmanager's receivers and
  peers, the collectors' exporters, the API for every pod with a token, the workloads' env);
- the edge and observability pods allow exactly what their configs imply, in and out.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from ipaddress import IPv4Network, ip_address
from typing import Any

import pytest
import yaml

from infra import (
    config,
    exporters,
    gateway,
    netpol,
    network,
    observability,
    plan,
    platform,
    redis,
    services,
)
from services.contracts import workloads
from tests.infra.conftest import STACKS, by_kind, named
from tests.infra.netpol_eval import Address, Cluster, Pod

APPS, EDGE, DATA = platform.NS_APPS, platform.NS_EDGE, platform.NS_DATA
OBS, OPS = platform.NS_OBSERVABILITY, platform.NS_OPERATORS
NAME = "app.kubernetes.io/name"
PUBLIC = Address("203.0.113.10", "a public API (JWKS, Cloudflare)")
KUBE_API = Address("10.10.0.20", "the EKS API endpoint's address in the VPC")
TCP = "TCP"


@dataclass
class Model:
    cluster: Cluster
    pods: list[Pod]
    services: dict[tuple[str, str], dict[str, str]]  # (namespace, name) -> selector
    env: dict[str, dict[str, str]]  # workload -> LIKES_* -> value (plain values only)
    tokens: set[Pod] = dataclasses.field(default_factory=set)  # pods that carry an API token
    annotations: dict[Pod, dict[str, str]] = dataclasses.field(default_factory=dict)
    metrics: dict[Pod, set[int]] = dataclasses.field(default_factory=dict)  # ports serving metrics
    # each pod's named container ports (name -> port): a scrape job may keep ports by name
    port_names: dict[Pod, dict[str, int]] = dataclasses.field(default_factory=dict)

    def where(self, namespace: str, **labels: str) -> list[Pod]:
        found = [
            p
            for p in self.pods
            if p.namespace == namespace and all(p.labels.get(k) == v for k, v in labels.items())
        ]
        assert found, f"no pod in {namespace} with {labels}"
        return found

    def one(self, namespace: str, **labels: str) -> Pod:
        return self.where(namespace, **labels)[0]

    def workload(self, name: str) -> Pod:
        return self.one(APPS, **{NAME: name})

    def behind(self, host: str) -> list[Pod] | Address:
        """The pods a host name reaches (through its Service, or a pod's own name under its
        headless Service), or a public address."""
        parts = host.split(".")
        if len(parts) >= 4 and parts[3] == "svc":
            parts = parts[1:]
        if len(parts) < 3 or parts[2] != "svc":
            return PUBLIC
        selector = self.services[(parts[1], parts[0])]
        return self.where(parts[1], **selector)


def _ips() -> Iterator[str]:
    for i in itertools.count(1):
        yield f"10.99.{i // 250}.{i % 250 + 1}"


def _tcp(*ports: int) -> frozenset[tuple[int, str]]:
    return frozenset((p, TCP) for p in ports)


def model(p: plan.Plan) -> Model:
    ips = _ips()
    pods: list[Pod] = []
    services: dict[tuple[str, str], dict[str, str]] = {}
    env: dict[str, dict[str, str]] = {}
    tokens: set[Pod] = set()
    annotations: dict[Pod, dict[str, str]] = {}
    metrics: dict[Pod, set[int]] = {}
    port_names: dict[Pod, dict[str, int]] = {}
    # a pod mounts an API token unless it or its ServiceAccount says not to
    sa_automount = {
        (r.inputs["metadata"]["namespace"], r.inputs["metadata"]["name"]): r.inputs.get(
            "automountServiceAccountToken"
        )
        for r in by_kind(p, "ServiceAccount")
    }
    for r in p.resources:
        kind, md = r.inputs.get("kind"), r.inputs.get("metadata", {})
        if kind in ("Deployment", "StatefulSet", "Job", "CronJob"):
            spec = r.inputs["spec"]
            t = (spec["jobTemplate"]["spec"] if kind == "CronJob" else spec)["template"]
            containers = t["spec"]["containers"]
            ports = _tcp(*(q["containerPort"] for c in containers for q in c.get("ports", [])))
            pod = Pod(md["namespace"], t["metadata"]["labels"], next(ips), md["name"], ports)
            pods.append(pod)
            automount = t["spec"].get("automountServiceAccountToken")
            if automount is None:
                account = t["spec"].get("serviceAccountName", "default")
                automount = sa_automount.get((md["namespace"], account))
            if automount is not False:
                tokens.add(pod)
            annotations[pod] = t["metadata"].get("annotations") or {}
            metrics[pod] = {
                q["containerPort"]
                for c in containers
                for q in c.get("ports", [])
                if q.get("name") == "metrics"
            }
            port_names[pod] = {
                q["name"]: q["containerPort"]
                for c in containers
                for q in c.get("ports", [])
                if "name" in q
            }
            if md["namespace"] == APPS and md["name"] in workloads.BY_NAME:
                c = t["spec"]["containers"][0]  # the workload's own (a sidecar comes after)
                env[md["name"]] = {e["name"]: e["value"] for e in c["env"] if "value" in e}
        elif kind == "Service":
            services[(md["namespace"], md["name"])] = r.inputs["spec"]["selector"]
    # what the operators create, labelled as Strimzi and the Scylla Operator label them
    (kafka,) = by_kind(p, "Kafka")
    cluster = kafka.inputs["metadata"]["name"]
    listeners = [x["port"] for x in kafka.inputs["spec"]["kafka"]["listeners"]]
    strimzi = {"strimzi.io/cluster": cluster, "strimzi.io/kind": "Kafka"}
    for pool in by_kind(p, "KafkaNodePool"):
        roles = pool.inputs["spec"]["roles"]
        labels = {
            **strimzi,
            "strimzi.io/name": f"{cluster}-kafka",
            "strimzi.io/pool-name": pool.inputs["metadata"]["name"],
            **{f"strimzi.io/{role}-role": "true" for role in roles},
        }
        ports = _tcp(9090, 9091, 8443, 9404, *(listeners if "broker" in roles else []))
        node = Pod(DATA, labels, next(ips), f"kafka {pool.inputs['metadata']['name']}", ports)
        pods.append(node)
        tokens.add(node)  # rack awareness: the init container reads the node's zone
        metrics[node] = {9404}
    services[(DATA, f"{cluster}-kafka-bootstrap")] = {**strimzi, "strimzi.io/broker-role": "true"}
    eo = {**strimzi, "strimzi.io/name": f"{cluster}-entity-operator"}
    pods.append(Pod(DATA, eo, next(ips), "entity operator"))
    tokens.add(pods[-1])  # it watches KafkaTopics and KafkaUsers
    for mm2 in by_kind(p, "KafkaMirrorMaker2"):
        name = mm2.inputs["metadata"]["name"]
        labels = {
            "strimzi.io/cluster": name,
            "strimzi.io/kind": "KafkaMirrorMaker2",
            "strimzi.io/name": f"{name}-mirrormaker2",
        }
        pods.append(Pod(DATA, labels, next(ips), f"mirror maker {name}", _tcp(8083, 9404)))
        metrics[pods[-1]] = {9404}
    for sc in by_kind(p, "ScyllaCluster"):
        name = sc.inputs["metadata"]["name"]
        labels = {
            "scylla/cluster": name,
            NAME: "scylla",
            "app.kubernetes.io/managed-by": "scylla-operator",
        }
        ports = _tcp(9042, 19042, 7000, 7001, 7199, 9180, 10001)
        pods.append(Pod(DATA, labels, next(ips), f"scylla {name}", ports))
        tokens.add(pods[-1])  # the operator's sidecar in each member
        metrics[pods[-1]] = {9180}
        services[(DATA, f"{name}-client")] = {"scylla/cluster": name, NAME: "scylla"}
    # the operators' pods as their charts label them; each watches the API
    co = {"name": "strimzi-cluster-operator", "strimzi.io/kind": "cluster-operator"}
    pods.append(Pod(OPS, co, next(ips), "strimzi cluster operator"))
    pods.append(Pod(OPS, {NAME: "scylla-operator"}, next(ips), "scylla operator"))
    # the Scylla Operator's chart fixes its webhook server's port; cert-manager's is a value
    scylla_webhook = {NAME: "webhook-server", "app.kubernetes.io/instance": "webhook-server"}
    pods.append(Pod(OPS, scylla_webhook, next(ips), "scylla webhook server", _tcp(5000)))
    (cert_manager,) = [r for r in p.resources if r.name == "op-cert-manager"]
    webhook_port = cert_manager.inputs["values"]["webhook"]["securePort"]
    for component, ports in (("controller", _tcp(9402)), ("webhook", _tcp(webhook_port, 6080))):
        labels = {
            NAME: "cert-manager" if component == "controller" else component,
            "app.kubernetes.io/instance": "cert-manager",
            "app.kubernetes.io/component": component,
        }
        pods.append(Pod(OPS, labels, next(ips), f"cert-manager {component}", ports))
    tokens.update(pod for pod in pods if pod.namespace == OPS)
    dns = frozenset({(53, "UDP"), (53, TCP), (9153, TCP)})
    pods.append(Pod("kube-system", {"k8s-app": "kube-dns"}, next(ips), "coredns", dns))
    pods.append(Pod("kube-system", {"k8s-app": "metrics-server"}, next(ips), "metrics", _tcp(443)))
    namespaces = {
        r.inputs["metadata"]["name"]: r.inputs["metadata"].get("labels", {})
        for r in by_kind(p, "Namespace")
    }
    namespaces["kube-system"] = {}
    policies = [r.inputs for r in by_kind(p, "NetworkPolicy")]
    return Model(
        Cluster(policies, namespaces), pods, services, env, tokens, annotations, metrics,
        port_names,
    )  # fmt: skip


@pytest.fixture(scope="module")
def models(plans: dict[str, plan.Plan]) -> dict[str, Model]:
    return {name: model(p) for name, p in plans.items()}


def configured(m: Model, w: workloads.Workload) -> list[tuple[list[Pod] | Address, int, str]]:
    """(where, port, field) of every server the workload is configured with and uses."""
    cls = w.settings_class()
    out = []
    for field in w.uses:
        # the read service follows the hot pools the operator publishes: the operator's list
        source = workloads.HOTKEY_OPERATOR.name if field == "hot_pools" else w.name
        src_cls = workloads.BY_NAME[source].settings_class()
        value = m.env[source].get(src_cls.env_name(field), src_cls.model_fields[field].default)
        port_field = workloads.SERVERS[field]
        if port_field:
            port = int(m.env[w.name][cls.env_name(port_field)])
            addresses = [(h, port) for h in value.split(",")]
        else:
            addresses = []
            for part in value.split(","):
                if "://" in part:
                    scheme, rest = part.split("://", 1)
                    hostport = rest.split("/", 1)[0]
                    host, _, p = hostport.partition(":")
                    addresses.append((host, int(p) if p else (443 if scheme == "https" else 80)))
                else:
                    host, p = part.rsplit(":", 1)
                    addresses.append((host, int(p)))
        out += [(m.behind(h), port, field) for h, port in addresses]
    return out


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("w", workloads.ALL, ids=lambda w: w.name)
def test_each_workload_reaches_every_server_it_uses(
    models: dict[str, Model], stack: str, w: workloads.Workload
) -> None:
    m = models[stack]
    src = m.workload(w.name)
    for where, port, field in configured(m, w):
        targets = where if isinstance(where, list) else [where]
        for dst in targets:
            assert m.cluster.allowed(src, dst, port), f"{w.name} -> {dst.name}:{port} ({field})"


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("w", workloads.ALL, ids=lambda w: w.name)
def test_each_workload_reaches_no_other_datastore_port(
    models: dict[str, Model], stack: str, w: workloads.Workload
) -> None:
    m = models[stack]
    src = m.workload(w.name)
    wanted = {
        (dst.name, port)
        for where, port, _ in configured(m, w)
        if isinstance(where, list)
        for dst in where
    }
    for dst in (p for p in m.pods if p.namespace == DATA):
        for port, proto in sorted(dst.ports):
            got = m.cluster.allowed(src, dst, port, proto)
            assert got == ((dst.name, port) in wanted), f"{w.name} -> {dst.name}:{port}: {got}"


@pytest.mark.parametrize("stack", STACKS)
def test_the_edge_reaches_no_datastore(models: dict[str, Model], stack: str) -> None:
    m = models[stack]
    for src in (p for p in m.pods if p.namespace == EDGE):
        for dst in (p for p in m.pods if p.namespace == DATA):
            for port, proto in dst.ports:
                assert not m.cluster.allowed(src, dst, port, proto), (
                    f"{src.name} -> {dst.name}:{port}"
                )


@pytest.mark.parametrize("stack", STACKS)
def test_the_services_reach_nothing_else(models: dict[str, Model], stack: str) -> None:
    m = models[stack]
    kube = m.one("kube-system", **{"k8s-app": "metrics-server"})
    dns = m.one("kube-system", **{"k8s-app": "kube-dns"})
    for w in workloads.ALL:
        src = m.workload(w.name)
        assert m.cluster.allowed(src, dns, 53, "UDP") and m.cluster.allowed(src, dns, 53)
        assert not m.cluster.allowed(src, dns, 9153), "only DNS on CoreDNS"
        # The operator's API traffic: the EKS endpoint's addresses sit in the VPC's own subnets
        # and are not known at plan time, so its 443 egress cannot tell them from a pod's
        is_operator = w.kind == "operator"
        got = m.cluster.allowed(src, kube, 443)
        assert got == is_operator, f"{w.name} -> a kube-system pod"
        assert not m.cluster.allowed(src, PUBLIC, 80)
        public = any(isinstance(where, Address) for where, _, _ in configured(m, w))
        got = m.cluster.allowed(src, PUBLIC, 443)
        assert got == (public or is_operator), f"{w.name} -> the internet"
        # the cluster's API (Kopf) is for the operator only
        assert m.cluster.allowed(src, KUBE_API, 443) == is_operator, f"{w.name} -> the API"
        for other in workloads.ALL:
            dst = m.workload(other.name)
            assert not m.cluster.allowed(src, dst, other.port), f"{w.name} -> {other.name}"


@pytest.mark.parametrize("stack", STACKS)
def test_the_models_publisher_reaches_nothing_and_nothing_reaches_it(
    models: dict[str, Model], configs: dict[str, config.StackConfig], stack: str
) -> None:
    """It trains on the generator and writes to its volume: no policy selects its pods, so the
    namespace's default deny leaves them DNS only (a new dependency of the training command
    would fail here, in its first run, not in a cluster)."""
    m = models[stack]
    (job,) = [p for p in m.pods if p.name == services.MODELS_PUBLISHER]
    assert job.namespace == APPS
    for dst, port, proto in _probes(m):
        dns = dst.labels.get("k8s-app") == "kube-dns" and port == 53
        assert m.cluster.allowed(job, dst, port, proto) == dns, f"-> {dst.name}:{port}/{proto}"
        assert not m.cluster.allowed(dst, job, port, proto), f"{dst.name} -> it"
    for address in _outside(configs[stack]).values():
        for port in (80, 443):
            assert not m.cluster.allowed(job, address, port), f"-> {address.name}:{port}"


@pytest.mark.parametrize("stack", STACKS)
def test_only_the_abuse_scorer_reaches_the_feature_store(
    models: dict[str, Model], stack: str
) -> None:
    """The shared feature state's cluster is the scorer's alone: it reaches every node on the
    Redis port (never the bus), and no other workload reaches any; the redis_exporter scrapes
    it like the other clusters."""
    m = models[stack]
    nodes = m.where(DATA, **{NAME: "feature-store"})
    assert nodes, "the program declares the feature-store"
    ok = m.cluster.allowed
    scorer = m.workload(workloads.ABUSE_SCORER.name)
    exporter = m.one(DATA, **{NAME: exporters.REDIS_EXPORTER})
    for node in nodes:
        assert ok(scorer, node, redis.PORT), f"the scorer -> {node.name}"
        assert not ok(scorer, node, redis.BUS_PORT), "no client on the bus"
        assert ok(exporter, node, redis.PORT), "the exporter's scrapes"
        for w in workloads.ALL:
            if w is not workloads.ABUSE_SCORER:
                assert not ok(m.workload(w.name), node, redis.PORT), f"{w.name} -> {node.name}"


@pytest.mark.parametrize("stack", STACKS)
def test_the_platform_paths_still_work(
    models: dict[str, Model], configs: dict[str, config.StackConfig], stack: str
) -> None:
    m = models[stack]
    peers = [Address(str(p.vpc_cidr[1030]), f"a node of {p.region}") for p in configs[stack].peers]
    # a node of neither VPC: the peers' ports are for the peers
    stranger = Address("10.30.4.4", "another VPC")
    ok = m.cluster.allowed
    prometheus = m.one(OBS, **{NAME: "prometheus"})
    for w in workloads.ALL:
        if w.kind == "http":  # the API port (mTLS) is the gateway's alone
            assert not ok(prometheus, m.workload(w.name), w.port), f"{w.name}'s API from Prometheus"
    for role in ("count-cache", "idem-store", "feature-store"):
        a, b = m.where(DATA, **{NAME: role})[0], m.where(DATA, **{NAME: role})[-1]
        assert ok(a, b, 6379) and ok(a, b, 16379), f"{role} replication and bus"
        assert ok(m.one(DATA, **{NAME: f"{role}-create"}), b, 6379)
        assert not ok(m.workload("write"), b, 16379), "no client on the bus"
    etcd = m.one(DATA, **{NAME: "etcd"})
    assert ok(etcd, etcd, 2380) and ok(prometheus, etcd, 2381)
    assert ok(m.one(DATA, **{NAME: "etcd-auth"}), etcd, 2379)
    assert not ok(m.workload("write"), etcd, 2380), "no client on the peer port"
    brokers = m.where(DATA, **{"strimzi.io/broker-role": "true"})
    controller = m.one(DATA, **{"strimzi.io/controller-role": "true"})
    strimzi = m.one(OPS, **{"strimzi.io/kind": "cluster-operator"})
    eo = m.one(DATA, **{"strimzi.io/name": "likes-entity-operator"})
    registry = m.one(DATA, **{NAME: "schema-registry"})
    client_port = int(m.env["write"]["LIKES_KAFKA_BOOTSTRAP"].rsplit(":", 1)[1])
    for broker in brokers:
        assert ok(broker, controller, 9090) and ok(controller, broker, 9091), "KRaft"
        assert ok(strimzi, broker, 9091) and ok(strimzi, broker, 8443) and ok(eo, broker, 9091)
        assert ok(registry, broker, client_port), "the registry's _schemas"
        assert not ok(m.workload("write"), broker, 9091), "clients never on replication"
        assert not ok(m.workload("write"), broker, 9090)
        for peer in peers:
            assert ok(peer, broker, 9094) and not ok(peer, broker, client_port)
        assert not ok(stranger, broker, 9094)
        for mm2 in (p for p in m.pods if p.labels.get("strimzi.io/kind") == "KafkaMirrorMaker2"):
            assert ok(mm2, broker, client_port) and ok(strimzi, mm2, 8083)
            assert ok(prometheus, mm2, 9404) and not ok(m.workload("write"), mm2, 8083)
    assert ok(strimzi, controller, 9090)
    assert ok(m.one(DATA, **{NAME: "schema-registry-register"}), registry, 8081)
    scylla = m.one(DATA, **{NAME: "scylla"})
    assert ok(scylla, scylla, 7000) and ok(m.one(DATA, **{NAME: "schema-migration"}), scylla, 9042)
    assert ok(m.one(OPS, **{NAME: "scylla-operator"}), scylla, 10001) and ok(
        prometheus, scylla, 9180
    )
    # the operator's cleanup Job pods carry the cluster's label and call the member's agent
    job = {"scylla/cluster": "likes", "scylla-operator.scylladb.com/node-job-type": "Cleanup"}
    assert ok(Pod(DATA, job, "10.99.200.1", "cleanup job"), scylla, 10001)
    assert not ok(m.workload("read"), scylla, 10001)
    assert bool(peers) == bool(configs[stack].scylla.peer_datacenters)
    for peer in peers:
        assert ok(peer, scylla, 7000), "the peer data centre's nodes"
        assert not ok(peer, scylla, 9042) and not ok(peer, etcd, 2379)
    assert not ok(stranger, scylla, 7000)


def test_each_peer_cidr_is_the_peer_stacks_vpc(configs: dict[str, config.StackConfig]) -> None:
    # the policies admit a peer region by its VPC: the address range its own stack declares
    vpcs = {(c.environment, c.region): c.network.vpc_cidr for c in configs.values()}
    for c in configs.values():
        for p in c.peers:
            assert p.vpc_cidr == vpcs[(c.environment, p.region)], f"{c.region} -> {p.region}"


@pytest.mark.parametrize("stack", STACKS)
def test_the_cluster_enforces_network_policies(plans: dict[str, plan.Plan], stack: str) -> None:
    # the VPC CNI ignores every NetworkPolicy unless its network policy agent is enabled
    (cni,) = [
        r for r in plans[stack].of_type("aws:eks/addon:Addon") if r.inputs["addonName"] == "vpc-cni"
    ]
    assert json.loads(cni.inputs["configurationValues"])["enableNetworkPolicy"] == "true"


def test_strimzi_generates_no_policy_of_its_own(plans: dict[str, plan.Plan]) -> None:
    # Strimzi's generated policy would open every listener without networkPolicyPeers to all
    (release,) = [r for r in plans["prod-us"].resources if r.name == "op-strimzi"]
    assert release.inputs["values"]["generateNetworkPolicy"] is False


def test_the_evaluator_denies_by_default_and_unions_policies() -> None:
    a = Pod("a", {"app": "x"}, "10.0.0.1", "a")
    b = Pod("b", {"app": "y"}, "10.0.0.2", "b", frozenset({(80, TCP)}))
    deny: dict[str, Any] = {"metadata": {"namespace": "b"}, "spec": {"podSelector": {}}}
    allow: dict[str, Any] = {
        "metadata": {"namespace": "b"},
        "spec": {
            "podSelector": {"matchLabels": {"app": "y"}},
            "ingress": [
                {
                    "from": [
                        {
                            "namespaceSelector": {
                                "matchLabels": {"kubernetes.io/metadata.name": "a"}
                            },
                            "podSelector": {"matchLabels": {"app": "x"}},
                        }
                    ],
                    "ports": [{"port": 80}],
                }
            ],
        },
    }
    ns: dict[str, dict[str, str]] = {"a": {}, "b": {}}
    assert Cluster([], ns).allowed(a, b, 80)
    assert not Cluster([deny], ns).allowed(a, b, 80)
    assert Cluster([deny, allow], ns).allowed(a, b, 80)
    assert not Cluster([deny, allow], ns).allowed(a, b, 81)
    assert not Cluster([deny, allow], ns).allowed(a, b, 80, "UDP")
    other = Pod("b", {"app": "x"}, "10.0.0.3", "same labels, other namespace")
    assert not Cluster([deny, allow], ns).allowed(other, b, 80)
    egress: dict[str, Any] = {
        "metadata": {"namespace": "a"},
        "spec": {
            "podSelector": {},
            "policyTypes": ["Egress"],
            "egress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8", "except": ["10.0.0.2/32"]}}]}],
        },
    }
    assert not Cluster([egress], ns).allowed(a, b, 80), "excepted address"
    assert Cluster([egress], ns).allowed(a, other, 80)


# --- every namespace: denied unless declared, and everything the rendered configs imply -------

OURS = (APPS, EDGE, DATA, OBS, OPS)
UDP = "UDP"
# Alertmanager's documented defaults for an integration that names no URL
DEFAULT_URLS = {"pagerduty_configs": "https://events.pagerduty.com/v2/enqueue"}


@dataclass(frozen=True)
class Conn:
    src: Pod
    dst: Pod | Address
    port: int
    why: str
    protocol: str = TCP


def _host_port(address: str) -> tuple[str, int]:
    if "://" in address:
        scheme, rest = address.split("://", 1)
        host, _, port = rest.split("/", 1)[0].partition(":")
        return host, int(port) if port else (443 if scheme == "https" else 80)
    host, port = address.rsplit(":", 1)
    return host, int(port)


def _config_file(p: plan.Plan, namespace: str, config_map: str, key: str) -> str:
    return str(named(p, "ConfigMap", config_map, namespace).inputs["data"][key])


def _container(p: plan.Plan, kind: str, name: str, namespace: str) -> dict[str, Any]:
    (c,) = named(p, kind, name, namespace).inputs["spec"]["template"]["spec"]["containers"]
    return dict(c)


def implied(m: Model, p: plan.Plan) -> list[Conn]:
    """Every connection the program's own config implies, read from what it rendered: the
    workloads' env, Envoy's clusters, the limiter's Redis URL, Prometheus's discovery, targets
    and remote write, Alertmanager's receivers and peers, the collectors' exporters, Grafana's
    datasources, the API for every pod that carries a token, and DNS for every pod of ours."""
    out: list[Conn] = []

    def to(srcs: list[Pod], address: str, why: str, protocols: tuple[str, ...] = (TCP,)) -> None:
        host, port = _host_port(address)
        where = m.behind(host)
        for src in srcs:
            for dst in where if isinstance(where, list) else [where]:
                out.extend(Conn(src, dst, port, why, proto) for proto in protocols)

    dns = m.one("kube-system", **{"k8s-app": "kube-dns"})
    for pod in (q for q in m.pods if q.namespace in OURS):
        out += [Conn(pod, dns, 53, "DNS", UDP), Conn(pod, dns, 53, "DNS")]
        if pod in m.tokens:
            out.append(Conn(pod, KUBE_API, 443, "the API"))
    for w in workloads.ALL:
        src = m.workload(w.name)
        for where, port, use in configured(m, w):
            for dst in where if isinstance(where, list) else [where]:
                out.append(Conn(src, dst, port, use))
    # the gateway: Envoy's clusters, the limiter's counters
    envoy = m.where(EDGE, **{NAME: "envoy"})
    bootstrap = json.loads(
        _config_file(p, EDGE, gateway.ENVOY_CONFIG_MAP, gateway.ENVOY_CONFIG_FILE)
    )
    for cluster in bootstrap["staticResources"]["clusters"]:
        for locality in cluster["loadAssignment"]["endpoints"]:
            for lb in locality["lbEndpoints"]:
                sa = lb["endpoint"]["address"]["socketAddress"]
                if sa["address"] == "127.0.0.1":
                    continue  # the pod itself (the stats listener's admin): no policy applies
                to(envoy, f"{sa['address']}:{sa['portValue']}", f"cluster {cluster['name']}")
    limiter = _container(p, "Deployment", "ratelimit", EDGE)
    redis_url = next(e["value"] for e in limiter["env"] if e["name"] == "REDIS_URL")
    to(m.where(EDGE, **{NAME: "ratelimit"}), redis_url, "the limiter's counters")
    # Prometheus: the pods it discovers and keeps, its Alertmanagers, its remote write
    prometheus = m.where(OBS, **{NAME: "prometheus"})
    prom = yaml.safe_load(
        _config_file(
            p, OBS, observability.PROMETHEUS_CONFIG_MAP, observability.PROMETHEUS_CONFIG_FILE
        )
    )
    for job in prom["scrape_configs"]:
        # a job that keeps container ports by their name (the pod-sidecars job) scrapes those
        by_name = next(
            (
                r["regex"]
                for r in job.get("relabel_configs", [])
                if r.get("action") == "keep"
                and r.get("source_labels") == ["__meta_kubernetes_pod_container_port_name"]
            ),
            None,
        )
        for sd in job.get("kubernetes_sd_configs", []):
            assert sd["role"] == "pod", "this derivation reads pod discovery only"
            for pod in (q for q in m.pods if q.namespace in sd["namespaces"]["names"]):
                if by_name is not None:
                    out += [
                        Conn(src, pod, port, "scrape")
                        for name, port in m.port_names.get(pod, {}).items()
                        if re.fullmatch(by_name, name)
                        for src in prometheus
                    ]
                    continue
                ann = m.annotations.get(pod, {})
                if ann.get(observability.SCRAPE_ANNOTATION) == "true":
                    port = int(ann[observability.PORT_ANNOTATION])
                    out += [Conn(src, pod, port, "scrape") for src in prometheus]
    for am in prom["alerting"]["alertmanagers"]:
        for static in am["static_configs"]:
            for target in static["targets"]:
                to(prometheus, target, "alerts")
    for rw in prom.get("remote_write", []):
        to(prometheus, rw["url"], "remote write")
    # Alertmanager: its receivers' URLs and its peers (gossip over TCP and UDP)
    alertmanager = m.where(OBS, **{NAME: "alertmanager"})
    am_cfg = yaml.safe_load(
        _config_file(
            p, OBS, observability.ALERTMANAGER_CONFIG_MAP, observability.ALERTMANAGER_CONFIG_FILE
        )
    )
    for receiver in am_cfg["receivers"]:
        for kind, integrations in receiver.items():
            if kind.endswith("_configs"):
                for i in integrations:
                    to(alertmanager, i.get("url") or DEFAULT_URLS[kind], receiver["name"])
    for arg in _container(p, "StatefulSet", "alertmanager", OBS)["args"]:
        if arg.startswith("--cluster.peer="):
            to(alertmanager, arg.removeprefix("--cluster.peer="), "gossip", (TCP, UDP))
    # the collectors: where each exporter sends
    for app in ("otel-collector", "otel-sampler"):
        collectors = m.where(OBS, **{NAME: app})
        cfg = yaml.safe_load(
            _config_file(p, OBS, observability.config_map_name(app), "config.yaml")
        )
        for exporter in cfg["exporters"].values():
            if "endpoint" in exporter:
                to(collectors, exporter["endpoint"], "export")
            k8s_resolver = exporter.get("resolver", {}).get("k8s")
            if k8s_resolver:
                for port in k8s_resolver["ports"]:
                    to(collectors, f"{k8s_resolver['service']}.svc:{port}", "load balancing")
                out += [Conn(src, KUBE_API, 443, "the resolver") for src in collectors]
    # Grafana: every datasource its provisioning folder holds (the files as mounted)
    grafana = named(p, "Deployment", "grafana", OBS).inputs["spec"]["template"]["spec"]
    for volume in grafana["volumes"]:
        source = volume.get("configMap")
        for item in (source or {}).get("items", []):
            if item["path"].startswith("datasources/"):
                text = _config_file(p, OBS, source["name"], item["key"])
                for ds in yaml.safe_load(text)["datasources"]:
                    to(m.where(OBS, **{NAME: "grafana"}), ds["url"], "a datasource")
    return out


@pytest.fixture(scope="module")
def implications(models: dict[str, Model], plans: dict[str, plan.Plan]) -> dict[str, list[Conn]]:
    return {name: implied(models[name], plans[name]) for name in models}


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("namespace", OURS)
def test_each_namespace_allows_what_the_rendered_configs_imply(
    models: dict[str, Model], implications: dict[str, list[Conn]], stack: str, namespace: str
) -> None:
    m = models[stack]
    conns = [
        c
        for c in implications[stack]
        if namespace in (c.src.namespace, getattr(c.dst, "namespace", None))
    ]
    assert conns, f"nothing implied for {namespace}"
    for c in conns:
        assert m.cluster.allowed(c.src, c.dst, c.port, c.protocol), (
            f"{c.src.name} -> {c.dst.name}:{c.port}/{c.protocol} ({c.why})"
        )


def _outside(c: config.StackConfig) -> dict[str, Address]:
    private, public = network.subnet_plan(c.network.vpc_cidr, len(c.zones))
    out = {
        "public": PUBLIC,
        "api": KUBE_API,
        "cloudflare": Address(str(IPv4Network(gateway.CLOUDFLARE_IPV4[0])[7]), "Cloudflare"),
        "nlb": Address(str(public[0][9]), "the NLB's address in a public subnet"),
        "control-plane": Address(str(private[1][12]), "the API server's ENI"),
        "stranger": Address("10.30.4.4", "another VPC"),
    }
    for p in c.peers:
        out[p.region] = Address(str(p.vpc_cidr[1030]), f"a node of {p.region}")
    return out


def _probes(m: Model) -> list[tuple[Pod, int, str]]:
    """Every pod on every port it serves, on every port any policy names (an allow is only ever
    on a port a policy names), and on one that nothing names."""
    named_ports = {
        (q["port"], q.get("protocol", TCP))
        for policy in m.cluster.policies
        for rule in [*(policy["spec"].get("ingress") or []), *(policy["spec"].get("egress") or [])]
        for q in rule.get("ports") or []
    }
    return [
        (pod, port, proto)
        for pod in m.pods
        for port, proto in sorted(pod.ports | named_ports | {(1, TCP)})
    ]


def _stranger(namespace: str) -> Pod:
    return Pod(namespace, {NAME: "stranger"}, "10.99.250.250", f"a stranger in {namespace}")


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("namespace", OURS)
def test_each_namespace_denies_what_nobody_declared(
    models: dict[str, Model], configs: dict[str, config.StackConfig], stack: str, namespace: str
) -> None:
    m, c = models[stack], configs[stack]
    ok = m.cluster.allowed
    # out: a pod nobody selects reaches DNS and nothing else. In the operators' namespace every
    # pod is one of our releases' operators: the API (its addresses unknown at plan time, so
    # port 443 anywhere) and the Scylla members' agent are namespace-wide there.
    stranger = _stranger(namespace)
    for dst, port, proto in _probes(m):
        got = ok(stranger, dst, port, proto)
        want = dst.labels.get("k8s-app") == "kube-dns" and port == 53
        if namespace == OPS:
            want |= port == 443 and dst.namespace == "kube-system"
            want |= port == 10001 and dst.labels.get(NAME) == "scylla"
        assert got == want, f"{stranger.name} -> {dst.name}:{port}/{proto}"
    for address in _outside(c).values():
        for port in (80, 443, 9094):
            want = namespace == OPS and port == 443
            assert ok(stranger, address, port) == want, f"{stranger.name} -> {address.name}"
    # in: from a stranger in any namespace, nothing; from outside, only the declared entries
    mine = [(dst, port, proto) for dst, port, proto in _probes(m) if dst.namespace == namespace]
    assert mine, f"no pod modelled in {namespace}"
    for src_ns in (*OURS, "default"):
        src = _stranger(src_ns)
        for dst, port, proto in mine:
            want = src_ns == OPS and port == 10001 and dst.labels.get(NAME) == "scylla"
            assert ok(src, dst, port, proto) == want, f"{src.name} -> {dst.name}:{port}"
    outside = _outside(c)
    peers = {p.region for p in c.peers}
    webhooks = set(netpol.OPERATOR_WEBHOOKS)
    for label, address in outside.items():
        if label == "api":
            continue  # a destination (KUBE_API sits in prod-us's VPC, which prod-eu peers with)
        for dst, port, proto in [*mine, *((d, w, TCP) for d, _, _ in mine for w in webhooks)]:
            if label in ("cloudflare", "nlb"):
                want = dst.labels.get(NAME) == "envoy" and port == gateway.LISTENER_PORT
            elif label == "control-plane":
                want = dst.namespace == OPS and port in webhooks
            elif label in peers:
                want = (
                    dst.labels.get("strimzi.io/broker-role") == "true"
                    and port == netpol.KAFKA_PEERS_PORT
                ) or (
                    dst.labels.get(NAME) == "scylla"
                    and port in netpol.SCYLLA_INTERNODE
                    and bool(c.scylla.peer_datacenters)
                )
            else:
                want = False
            want &= proto == TCP
            assert ok(address, dst, port, proto) == want, f"{address.name} -> {dst.name}:{port}"


def _canonical(dst: Pod | Address) -> Pod | Address:
    """A host name outside the cluster may be any public address: all of them are PUBLIC."""
    if isinstance(dst, Address) and not any(
        ip_address(dst.ip) in IPv4Network(block) for block in netpol.PRIVATE
    ):
        return PUBLIC
    return dst


def _tolerated(m: Model, c: Conn) -> bool:
    """Allowed beyond the configs, on purpose: a pod with an API token reaches 443 anywhere
    outside our namespaces (the API's addresses are unknown at plan time), and Prometheus the
    datastores' exporters, which are opened ahead of a scrape config that discovers them."""
    dst_ns = getattr(c.dst, "namespace", None)
    if c.src in m.tokens and c.port == 443 and dst_ns not in OURS:
        return True
    return (
        c.src.labels.get(NAME) == "prometheus"
        and dst_ns == DATA
        and isinstance(c.dst, Pod)
        and c.port in m.metrics.get(c.dst, set())
    )


@pytest.mark.parametrize("stack", STACKS)
@pytest.mark.parametrize("namespace", (EDGE, OBS))
def test_the_configured_namespaces_allow_exactly_what_their_configs_imply(
    models: dict[str, Model],
    implications: dict[str, list[Conn]],
    configs: dict[str, config.StackConfig],
    stack: str,
    namespace: str,
) -> None:
    # the edge and observability pods connect only where their rendered configs say: each
    # allowed connection, in or out, is implied by a config (or tolerated, and says why)
    m = models[stack]
    want = {(c.src, c.dst, c.port, c.protocol) for c in implications[stack]}
    mine = [pod for pod in m.pods if pod.namespace == namespace]
    dests: list[tuple[Pod | Address, int, str]] = [
        *_probes(m),
        *((a, port, TCP) for a in _outside(configs[stack]).values() for port in (80, 443, 9094)),
        *((pod, port, UDP) for pod in mine for port, _ in pod.ports),
    ]
    for src in mine:
        for dst, port, proto in dests:
            got = m.cluster.allowed(src, dst, port, proto)
            c = Conn(src, dst, port, "probe", proto)
            expected = (src, _canonical(dst), port, proto) in want or _tolerated(m, c)
            assert got == expected, f"{src.name} -> {dst.name}:{port}/{proto}: {got}"
    for src in m.pods:
        for dst, port, proto in _probes(m):
            if dst.namespace == namespace:
                got = m.cluster.allowed(src, dst, port, proto)
                c = Conn(src, dst, port, "probe", proto)
                expected = (src, dst, port, proto) in want or _tolerated(m, c)
                assert got == expected, f"{src.name} -> {dst.name}:{port}/{proto}: {got}"
