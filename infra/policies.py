"""Policies over the declared resources' inputs; any violation fails the plan.

Pure functions of the inputs the program sent (camelCase Kubernetes manifests, custom resources)
and of the stack's raw config, so the plan and the tests run them the same way.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import yaml

from infra import alert_routing, alert_rules, config, observability

ZONE_KEY = "topology.kubernetes.io/zone"
TIER_LABEL = "likes.io/tier"
_SECRET_NAME = re.compile(r"(password|passwd|secret|token|api[_-]?key|private[_-]?key)", re.I)
_WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job", "CronJob", "Pod"}
# Workloads that run to completion: readiness/liveness probes mean nothing for them.
_RUN_TO_COMPLETION = {"Job", "CronJob"}
_PUBLIC_SCHEME = "service.beta.kubernetes.io/aws-load-balancer-scheme"


class Resource(Protocol):
    @property
    def type(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def inputs(self) -> dict[str, Any]: ...


@dataclass(frozen=True)
class Violation:
    policy: str
    resource: str
    message: str


def _get(obj: Any, *path: str) -> Any:
    for part in path:
        if not isinstance(obj, Mapping):
            return None
        obj = obj.get(part)
    return obj


def _kind(r: Resource) -> str | None:
    kind = r.inputs.get("kind")
    return kind if isinstance(kind, str) else None


def _ident(r: Resource) -> str:
    return f"{r.type}::{r.name}"


def pod_spec(r: Resource) -> Mapping[str, Any] | None:
    kind = _kind(r)
    if kind not in _WORKLOADS:
        return None
    if kind == "Pod":
        return _get(r.inputs, "spec")
    if kind == "CronJob":
        return _get(r.inputs, "spec", "jobTemplate", "spec", "template", "spec")
    return _get(r.inputs, "spec", "template", "spec")


def pod_labels(r: Resource) -> Mapping[str, str]:
    if _kind(r) == "Pod":
        return _get(r.inputs, "metadata", "labels") or {}
    if _kind(r) == "CronJob":
        return _get(r.inputs, "spec", "jobTemplate", "spec", "template", "metadata", "labels") or {}
    return _get(r.inputs, "spec", "template", "metadata", "labels") or {}


def containers_have_resources_and_probes(resources: Iterable[Resource]) -> list[Violation]:
    """Every container has CPU and memory requests and limits; long-running ones also have
    liveness and readiness probes (without them a wedged pod keeps its traffic)."""
    out: list[Violation] = []
    for r in resources:
        spec = pod_spec(r)
        if spec is None:
            continue
        kind = _kind(r)
        groups = [("container", c) for c in spec.get("containers") or []]
        groups += [("init container", c) for c in spec.get("initContainers") or []]
        for what, c in groups:
            cname = c.get("name", "?")
            res = c.get("resources") or {}
            for section in ("requests", "limits"):
                missing = [k for k in ("cpu", "memory") if k not in (res.get(section) or {})]
                if missing:
                    out.append(
                        Violation(
                            "container-resources",
                            _ident(r),
                            f"{what} {cname} has no {section} for {', '.join(missing)}",
                        )
                    )
            if what == "container" and kind not in _RUN_TO_COMPLETION:
                for probe in ("livenessProbe", "readinessProbe"):
                    if not c.get(probe):
                        out.append(
                            Violation(
                                "container-probes", _ident(r), f"container {cname} has no {probe}"
                            )
                        )
    return out


def _has_zone_spread(spec: Mapping[str, Any]) -> bool:
    for tsc in spec.get("topologySpreadConstraints") or []:
        if tsc.get("topologyKey") == ZONE_KEY and tsc.get("whenUnsatisfiable") == "DoNotSchedule":
            return True
    anti = _get(
        spec, "affinity", "podAntiAffinity", "requiredDuringSchedulingIgnoredDuringExecution"
    )
    return any(term.get("topologyKey") == ZONE_KEY for term in anti or [])


def _selects(selector: Mapping[str, Any] | None, lbls: Mapping[str, str]) -> bool:
    match = (selector or {}).get("matchLabels") or {}
    return bool(match) and all(lbls.get(k) == v for k, v in match.items())


def _zones_of_affinity(affinity: Any) -> set[str]:
    terms = _get(
        affinity,
        "nodeAffinity",
        "requiredDuringSchedulingIgnoredDuringExecution",
        "nodeSelectorTerms",
    )
    zones: set[str] = set()
    for term in terms or []:
        for expr in term.get("matchExpressions") or []:
            if expr.get("key") == ZONE_KEY and expr.get("operator") == "In":
                zones.update(expr.get("values") or [])
    return zones


def statefulsets_have_pdb_and_zone_spread(resources: Sequence[Resource]) -> list[Violation]:
    """A StatefulSet (or an operator-managed stateful set) without a PodDisruptionBudget can lose
    quorum to a node drain; without a hard zone spread, to a single zone outage."""
    out: list[Violation] = []
    pdbs = [r for r in resources if _kind(r) == "PodDisruptionBudget"]
    for r in resources:
        kind = _kind(r)
        if kind == "StatefulSet":
            spec = pod_spec(r) or {}
            if not _has_zone_spread(spec):
                out.append(
                    Violation("statefulset-zone-spread", _ident(r), "no hard spread over zones")
                )
            ns = _get(r.inputs, "metadata", "namespace")
            lbls = pod_labels(r)
            covered = any(
                _get(p.inputs, "metadata", "namespace") == ns
                and _selects(_get(p.inputs, "spec", "selector"), lbls)
                for p in pdbs
            )
            if not covered:
                out.append(
                    Violation(
                        "statefulset-pdb", _ident(r), "no PodDisruptionBudget selects its pods"
                    )
                )
        elif kind == "ScyllaCluster":
            racks = _get(r.inputs, "spec", "datacenter", "racks") or []
            zones = [frozenset(_zones_of_affinity(_get(rk, "placement"))) for rk in racks]
            if len(racks) < 3 or len(set(zones)) != len(racks) or not all(zones):
                out.append(
                    Violation(
                        "statefulset-zone-spread",
                        _ident(r),
                        "racks are not pinned to distinct zones",
                    )
                )
        elif kind == "KafkaNodePool":
            pod = _get(r.inputs, "spec", "template", "pod") or {}
            if not (_has_zone_spread(pod) or _zones_of_affinity(pod.get("affinity"))):
                out.append(
                    Violation(
                        "statefulset-zone-spread",
                        _ident(r),
                        "node pool not spread or pinned by zone",
                    )
                )
    return out


def no_plaintext_secrets(
    resources: Iterable[Resource], raw_config: Mapping[str, str], secret_keys: Iterable[str]
) -> list[Violation]:
    """Secrets come from Pulumi config secrets into Kubernetes Secrets, never as literal env
    values, ConfigMap entries or plain stack config."""
    out: list[Violation] = []
    secrets = set(secret_keys)
    for key in raw_config:
        leaf = key.split(":", 1)[-1]
        secretish = leaf in config.SECRET_FIELDS or _SECRET_NAME.search(leaf)
        if key.startswith(config.NAMESPACE + ":") and secretish and key not in secrets:
            out.append(
                Violation("secret-in-plain-config", key, "stack config value is not a secret")
            )
    for r in resources:
        if _kind(r) == "ConfigMap":
            for k in r.inputs.get("data") or {}:
                if _SECRET_NAME.search(k):
                    out.append(Violation("secret-in-plain-config", _ident(r), f"ConfigMap key {k}"))
        spec = pod_spec(r)
        if spec is None:
            continue
        for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]:
            for e in c.get("env") or []:
                if _SECRET_NAME.search(e.get("name", "")) and e.get("value"):
                    out.append(
                        Violation(
                            "secret-in-plain-config",
                            _ident(r),
                            f"container {c.get('name')} env {e['name']} is a literal value",
                        )
                    )
    return out


def _is_public_service(inputs: Mapping[str, Any]) -> bool:
    stype = _get(inputs, "spec", "type")
    scheme = (_get(inputs, "metadata", "annotations") or {}).get(_PUBLIC_SCHEME)
    if stype == "NodePort" or scheme == "internet-facing":
        return True
    return stype == "LoadBalancer" and scheme != "internal"


def no_public_datastore(resources: Sequence[Resource]) -> list[Violation]:
    """Datastores (Redis, Scylla, Kafka, etcd, Schema Registry) stay inside the VPC."""
    out: list[Violation] = []
    datastore_pods = [
        pod_labels(r) for r in resources if pod_labels(r).get(TIER_LABEL) == "datastore"
    ]
    for r in resources:
        kind = _kind(r)
        if kind == "Service":
            lbls = _get(r.inputs, "metadata", "labels") or {}
            sel = _get(r.inputs, "spec", "selector") or {}
            is_datastore = lbls.get(TIER_LABEL) == "datastore" or any(
                sel and all(p.get(k) == v for k, v in sel.items()) for p in datastore_pods
            )
            if is_datastore and _is_public_service(r.inputs):
                out.append(
                    Violation(
                        "public-datastore", _ident(r), "datastore Service is exposed publicly"
                    )
                )
        elif kind == "Kafka":
            svc_annotations = (
                _get(
                    r.inputs,
                    "spec",
                    "kafka",
                    "template",
                    "externalBootstrapService",
                    "metadata",
                    "annotations",
                )
                or {}
            )
            for listener in _get(r.inputs, "spec", "kafka", "listeners") or []:
                ltype = listener.get("type")
                internal = svc_annotations.get(_PUBLIC_SCHEME) == "internal"
                if ltype in {"nodeport", "route", "ingress"} or (
                    ltype == "loadbalancer" and not internal
                ):
                    out.append(
                        Violation(
                            "public-datastore",
                            _ident(r),
                            f"listener {listener.get('name')} is public",
                        )
                    )
        elif kind == "ScyllaCluster":
            node_type = _get(r.inputs, "spec", "exposeOptions", "nodeService", "type")
            annotations = (
                _get(r.inputs, "spec", "exposeOptions", "nodeService", "annotations") or {}
            )
            if node_type == "LoadBalancer" and annotations.get(_PUBLIC_SCHEME) != "internal":
                out.append(
                    Violation("public-datastore", _ident(r), "Scylla nodes exposed publicly")
                )
    return out


def _config_file(resources: Iterable[Resource], name: str, key: str) -> Any:
    for r in resources:
        if _kind(r) == "ConfigMap" and _get(r.inputs, "metadata", "name") == name:
            text = (r.inputs.get("data") or {}).get(key)
            return yaml.safe_load(text) if isinstance(text, str) else None
    return None


def alerts_reach_a_receiver(
    resources: Sequence[Resource], raw_config: Mapping[str, str]
) -> list[Violation]:
    """Every alert the rules can raise reaches a receiver that sends it somewhere, and the
    Watchdog reaches the heartbeat receiver, which in prod must post to the dead man's switch
    (review H3: the Watchdog and every ticket went to a `null` receiver)."""
    am_name = observability.ALERTMANAGER_CONFIG_MAP
    am = _config_file(resources, am_name, observability.ALERTMANAGER_CONFIG_FILE)
    rules = _config_file(resources, observability.RULES_CONFIG_MAP, alert_rules.RULES_FILENAME)
    if am is None or rules is None:
        return []  # no Alertmanager in this program: nothing to route
    ident = f"kubernetes:core/v1:ConfigMap::{am_name}"
    prod = raw_config.get(f"{config.NAMESPACE}:environment") == "prod"
    out: list[Violation] = []
    alerts = [r for g in rules.get("groups") or [] for r in g.get("rules") or [] if "alert" in r]
    for rule in alerts:
        labels = {**(rule.get("labels") or {}), "alertname": rule["alert"]}
        try:
            reached = alert_routing.receivers_for(am, labels)
        except alert_routing.MatcherError as e:
            return [Violation("alert-routing", ident, str(e))]
        what = f"{rule['alert']} (severity={labels.get('severity')})"
        if rule["alert"] == alert_rules.WATCHDOG:
            if reached != [observability.HEARTBEAT_RECEIVER]:
                out.append(Violation("alert-routing", ident, f"{what} reaches {reached}"))
            elif prod and "webhook" not in alert_routing.integrations(am, reached[0]):
                out.append(
                    Violation("alert-routing", ident, f"{what}: no dead man's switch in prod")
                )
            continue
        silent = [r for r in reached if not alert_routing.integrations(am, r)]
        if silent:
            out.append(Violation("alert-routing", ident, f"{what} reaches {silent}: sends nowhere"))
    return list(dict.fromkeys(out))  # one line per distinct problem


POLICIES: dict[str, str] = {
    "container-resources": "every container has CPU/memory requests and limits",
    "container-probes": "every long-running container has liveness and readiness probes",
    "statefulset-pdb": "every StatefulSet has a PodDisruptionBudget",
    "statefulset-zone-spread": "every StatefulSet is spread (or pinned) across zones",
    "secret-in-plain-config": "no secret in plain config, env literals or ConfigMaps",
    "public-datastore": "no datastore reachable from outside the VPC",
    "alert-routing": "every alert reaches a receiver that sends it; in prod the Watchdog reaches "
    "the dead man's switch",
}

_CHECKS: list[Callable[[Sequence[Resource]], list[Violation]]] = [
    containers_have_resources_and_probes,
    statefulsets_have_pdb_and_zone_spread,
    no_public_datastore,
]


def check(
    resources: Sequence[Resource], raw_config: Mapping[str, str], secret_keys: Iterable[str]
) -> list[Violation]:
    out: list[Violation] = []
    for fn in _CHECKS:
        out.extend(fn(resources))
    out.extend(no_plaintext_secrets(resources, raw_config, secret_keys))
    out.extend(alerts_reach_a_receiver(resources, raw_config))
    return out
