"""What the Pulumi program renders for Prometheus, Alertmanager and Grafana, taken from the stack's
render (local/rendered.py: the program under Pulumi's mocks, cached): the configs, the rules, the
dashboards, and the pod templates Kubernetes service discovery would see."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import yaml

from infra import dashboards, otel_config, plan
from infra import observability as obs
from local import rendered

NAME_LABEL = "app.kubernetes.io/name"
_WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet"}


@dataclass(frozen=True)
class Pod:
    """A rendered workload's pod template, as Kubernetes service discovery would see its pods."""

    namespace: str
    labels: dict[str, str]
    annotations: dict[str, str]
    # container name -> its named ports (name -> containerPort): Kubernetes SD makes a target of
    # each, with the container's and the port's names (the pod-sidecars job keeps some by name)
    containers: dict[str, dict[str, int]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.labels.get(NAME_LABEL, "")

    def container_with_port(self, port_name: str) -> str | None:
        """The container that declares the port named `port_name`."""
        return next((c for c, ports in self.containers.items() if port_name in ports), None)


@dataclass(frozen=True)
class Rendered:
    prometheus: dict[str, Any]  # prometheus.yml
    rules: dict[str, str]  # rules file name -> text (the rules ConfigMap)
    alertmanager: dict[str, Any]  # alertmanager.yml
    pods: list[Pod]
    # file name -> Grafana dashboard JSON model (the dashboards ConfigMap)
    dashboards: dict[str, dict[str, Any]] = field(default_factory=dict)
    collector: dict[str, Any] = field(default_factory=dict)  # the tail-sampling tier's config

    def pod(self, name: str) -> Pod | None:
        return next((p for p in self.pods if p.name == name), None)


def _containers(resource: dict[str, Any]) -> dict[str, dict[str, int]]:
    """A Deployment's (StatefulSet's, DaemonSet's) containers and their named ports."""
    pod_spec = ((resource["inputs"].get("spec") or {}).get("template") or {}).get("spec") or {}
    return {
        c["name"]: {p["name"]: int(p["containerPort"]) for p in c.get("ports") or [] if "name" in p}
        for c in pod_spec.get("containers") or []
    }


def _pod_metadata(resource: dict[str, Any]) -> dict[str, Any] | None:
    """The pod template's metadata of a workload (a Deployment, StatefulSet or DaemonSet, or an
    operator's resource whose pods take it: Strimzi's KafkaNodePool, the ScyllaCluster)."""
    inputs = resource["inputs"]
    spec = inputs.get("spec") or {}
    kind = inputs.get("kind") or resource["type"].rsplit(":", 1)[-1]
    if kind in _WORKLOAD_KINDS:
        return dict(spec.get("template", {}).get("metadata", {}))
    if kind == "KafkaNodePool":
        return dict(spec.get("template", {}).get("pod", {}).get("metadata", {}))
    if kind == "ScyllaCluster":
        return dict(spec.get("podMetadata", {}))
    return None


def from_plan(p: plan.Plan) -> Rendered:
    """The observability configs and pod templates of one plan (the infra tests' entry)."""
    return from_resources([r.as_json() | {"type": r.type} for r in p.resources])


def from_resources(resources: list[dict[str, Any]]) -> Rendered:
    """The observability configs and the pod templates of a render's resources."""

    def data(config_map: str) -> dict[str, str]:
        for r in resources:
            meta = r["inputs"].get("metadata", {})
            if r["type"] == "kubernetes:core/v1:ConfigMap" and meta.get("name") == config_map:
                return dict(r["inputs"]["data"])
        raise KeyError(f"the render has no ConfigMap {config_map}")

    pods = []
    for r in resources:
        template = _pod_metadata(r)
        if template is None:
            continue
        ns = r["inputs"].get("metadata", {}).get("namespace", "default")
        pods.append(
            Pod(
                ns,
                template.get("labels") or {},
                template.get("annotations") or {},
                _containers(r),
            )
        )
    return Rendered(
        prometheus=yaml.safe_load(data(obs.PROMETHEUS_CONFIG_MAP)[obs.PROMETHEUS_CONFIG_FILE]),
        rules=data(obs.RULES_CONFIG_MAP),
        alertmanager=yaml.safe_load(
            data(obs.ALERTMANAGER_CONFIG_MAP)[obs.ALERTMANAGER_CONFIG_FILE]
        ),
        pods=pods,
        dashboards={k: json.loads(v) for k, v in data(dashboards.CONFIG_MAP).items()},
        collector=yaml.safe_load(
            data(obs.config_map_name(otel_config.SAMPLER))[obs.COLLECTOR_CONFIG_FILE]
        ),
    )


def load(stack: str) -> Rendered:
    """The observability part of `stack`'s render (cached by local/rendered.py)."""
    return from_resources(rendered.render(stack).resources)
