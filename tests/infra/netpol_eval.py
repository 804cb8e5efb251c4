"""NetworkPolicy as Kubernetes evaluates it, over rendered specs (the plan's camelCase inputs).

A connection from pod (or address) A to pod B on a port is allowed when both ends allow it:
- B's side: no policy of type Ingress selects B, or some ingress rule of one that does matches A
  and the port;
- A's side: no policy of type Egress selects A, or some egress rule of one that does matches B
  and the port.
Policies are additive (a union); `from`/`to`/`ports` absent or empty means "all"; a peer with a
podSelector alone means the policy's own namespace; an ipBlock matches addresses, pods included
(on EKS a pod's address is a VPC address). Written from the Kubernetes API reference, independent
of the code that renders the policies.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

NS_LABEL = "kubernetes.io/metadata.name"


@dataclass(frozen=True)
class Pod:
    namespace: str
    labels: Mapping[str, str]
    ip: str
    name: str = ""
    ports: frozenset[tuple[int, str]] = field(default=frozenset())  # (port, protocol) it serves

    def __hash__(self) -> int:
        return hash((self.namespace, self.name, self.ip))


@dataclass(frozen=True)
class Address:
    """A host outside the cluster (or in a peered VPC)."""

    ip: str
    name: str = ""


End = Pod | Address


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """A LabelSelector; an empty one selects everything."""
    selector = selector or {}
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


class Cluster:
    def __init__(
        self, policies: Iterable[Mapping[str, Any]], namespaces: Mapping[str, Mapping[str, str]]
    ):
        self.policies = list(policies)
        # every namespace carries its name as a label
        self.namespaces = {n: {**labels, NS_LABEL: n} for n, labels in namespaces.items()}

    def _types(self, policy: Mapping[str, Any]) -> list[str]:
        spec = policy["spec"]
        if spec.get("policyTypes"):
            return list(spec["policyTypes"])
        return ["Ingress", *(["Egress"] if spec.get("egress") else [])]

    def _selecting(self, pod: Pod, kind: str) -> list[Mapping[str, Any]]:
        return [
            p
            for p in self.policies
            if p["metadata"]["namespace"] == pod.namespace
            and kind in self._types(p)
            and selects(p["spec"].get("podSelector"), pod.labels)
        ]

    def _peer_matches(self, peer: Mapping[str, Any], policy_ns: str, end: End) -> bool:
        if "ipBlock" in peer:
            block = peer["ipBlock"]
            ip = ipaddress.ip_address(end.ip)
            if ip not in ipaddress.ip_network(block["cidr"]):
                return False
            return not any(ip in ipaddress.ip_network(e) for e in block.get("except") or [])
        if not isinstance(end, Pod):
            return False  # selectors match pods only
        ns_sel = peer.get("namespaceSelector")
        if ns_sel is None:
            ns_ok = end.namespace == policy_ns
        else:
            ns_ok = selects(ns_sel, self.namespaces.get(end.namespace, {NS_LABEL: end.namespace}))
        pod_sel = peer.get("podSelector")
        return ns_ok and (pod_sel is None or selects(pod_sel, end.labels))

    @staticmethod
    def _port_matches(ports: list[Mapping[str, Any]] | None, port: int, protocol: str) -> bool:
        if not ports:
            return True
        for p in ports:
            if p.get("protocol", "TCP") != protocol:
                continue
            if "port" not in p:
                return True
            if not isinstance(p["port"], int):
                raise ValueError(f"named port {p['port']!r}: this evaluator knows numbers only")
            if p["port"] <= port <= p.get("endPort", p["port"]):
                return True
        return False

    def _side(self, pod: Pod, other: End, port: int, protocol: str, kind: str) -> bool:
        selecting = self._selecting(pod, kind)
        if not selecting:
            return True
        rules_key, peers_key = ("ingress", "from") if kind == "Ingress" else ("egress", "to")
        for policy in selecting:
            ns = policy["metadata"]["namespace"]
            for rule in policy["spec"].get(rules_key) or []:
                peers = rule.get(peers_key)
                if (not peers or any(self._peer_matches(p, ns, other) for p in peers)) and (
                    self._port_matches(rule.get("ports"), port, protocol)
                ):
                    return True
        return False

    def allowed(self, src: End, dst: End, port: int, protocol: str = "TCP") -> bool:
        egress = not isinstance(src, Pod) or self._side(src, dst, port, protocol, "Egress")
        ingress = not isinstance(dst, Pod) or self._side(dst, src, port, protocol, "Ingress")
        return egress and ingress
