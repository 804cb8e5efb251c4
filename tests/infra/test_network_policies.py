"""The rendered NetworkPolicies, evaluated as Kubernetes would (tests/infra/netpol_eval.py) over a
model of each stack's pods: the plan's own pod templates, plus the pods the operators create
(Strimzi's Kafka nodes, entity operator and MirrorMaker 2, Scylla's members) and the cluster's own
(CoreDNS, the operators), labelled as their documentation says.

- every workload reaches every server it is configured with, and nothing else in the datastores'
  namespace, on no other port;
- the edge namespace reaches no datastore;
- the platform's own paths (peers, setup Jobs, operators, MirrorMaker 2, Prometheus, DNS) work.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from infra import config, plan, platform
from services.contracts import workloads
from tests.infra.conftest import STACKS, by_kind
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
        """The pods a host name reaches (through its Service), or a public address."""
        parts = host.split(".")
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
    for r in p.resources:
        kind, md = r.inputs.get("kind"), r.inputs.get("metadata", {})
        if kind in ("Deployment", "StatefulSet", "Job"):
            t = r.inputs["spec"]["template"]
            ports = _tcp(
                *(q["containerPort"] for c in t["spec"]["containers"] for q in c.get("ports", []))
            )
            pod = Pod(md["namespace"], t["metadata"]["labels"], next(ips), md["name"], ports)
            pods.append(pod)
            if md["namespace"] == APPS and md["name"] in workloads.BY_NAME:
                (c,) = t["spec"]["containers"]
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
        pods.append(Pod(DATA, labels, next(ips), f"kafka {pool.inputs['metadata']['name']}", ports))
    services[(DATA, f"{cluster}-kafka-bootstrap")] = {**strimzi, "strimzi.io/broker-role": "true"}
    eo = {**strimzi, "strimzi.io/name": f"{cluster}-entity-operator"}
    pods.append(Pod(DATA, eo, next(ips), "entity operator"))
    for mm2 in by_kind(p, "KafkaMirrorMaker2"):
        name = mm2.inputs["metadata"]["name"]
        labels = {
            "strimzi.io/cluster": name,
            "strimzi.io/kind": "KafkaMirrorMaker2",
            "strimzi.io/name": f"{name}-mirrormaker2",
        }
        pods.append(Pod(DATA, labels, next(ips), f"mirror maker {name}", _tcp(8083, 9404)))
    for sc in by_kind(p, "ScyllaCluster"):
        name = sc.inputs["metadata"]["name"]
        labels = {
            "scylla/cluster": name,
            NAME: "scylla",
            "app.kubernetes.io/managed-by": "scylla-operator",
        }
        ports = _tcp(9042, 19042, 7000, 7001, 7199, 9180, 10001)
        pods.append(Pod(DATA, labels, next(ips), f"scylla {name}", ports))
        services[(DATA, f"{name}-client")] = {"scylla/cluster": name, NAME: "scylla"}
    co = {"name": "strimzi-cluster-operator", "strimzi.io/kind": "cluster-operator"}
    pods.append(Pod(OPS, co, next(ips), "strimzi cluster operator"))
    pods.append(Pod(OPS, {NAME: "scylla-operator"}, next(ips), "scylla operator"))
    dns = frozenset({(53, "UDP"), (53, TCP), (9153, TCP)})
    pods.append(Pod("kube-system", {"k8s-app": "kube-dns"}, next(ips), "coredns", dns))
    pods.append(Pod("kube-system", {"k8s-app": "metrics-server"}, next(ips), "metrics", _tcp(443)))
    namespaces = {
        r.inputs["metadata"]["name"]: r.inputs["metadata"].get("labels", {})
        for r in by_kind(p, "Namespace")
    }
    namespaces["kube-system"] = {}
    policies = [r.inputs for r in by_kind(p, "NetworkPolicy")]
    return Model(Cluster(policies, namespaces), pods, services, env)


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
def test_the_platform_paths_still_work(
    models: dict[str, Model], configs: dict[str, config.StackConfig], stack: str
) -> None:
    m = models[stack]
    peers = [Address(str(p.vpc_cidr[1030]), f"a node of {p.region}") for p in configs[stack].peers]
    # a node of neither VPC: the peers' ports are for the peers
    stranger = Address("10.30.4.4", "another VPC")
    ok = m.cluster.allowed
    prometheus = m.one(OBS, **{NAME: "prometheus"})
    envoy = m.one(EDGE, **{NAME: "envoy"})
    for w in workloads.ALL:
        assert ok(prometheus, m.workload(w.name), w.port), f"scrape {w.name}"
        assert ok(envoy, m.workload(w.name), w.port) == (w.kind == "http"), f"gateway {w.name}"
    for role in ("count-cache", "idem-store"):
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
