"""What the Pulumi program renders for Prometheus and Alertmanager, read back from an offline plan
of one stack (`infra.plan`, under Pulumi's mocks). A plan takes ~10 s, so the result is cached
under .cache/rendered/, keyed on a hash of every file the render depends on."""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from infra import observability as obs
from infra import plan
from local.layout import REPO_ROOT

STACK = "staging"  # the stack the local stack plays
# everything a plan reads: the program, the stack files, the contracts it renders from
SOURCES = ("infra", "stacks", "services/contracts")
NAME_LABEL = "app.kubernetes.io/name"
_WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet"}


@dataclass(frozen=True)
class Pod:
    """A rendered workload's pod template, as Kubernetes service discovery would see its pods."""

    namespace: str
    labels: dict[str, str]
    annotations: dict[str, str]

    @property
    def name(self) -> str:
        return self.labels.get(NAME_LABEL, "")


@dataclass(frozen=True)
class Rendered:
    prometheus: dict[str, Any]  # prometheus.yml
    rules: dict[str, str]  # rules file name -> text (the rules ConfigMap)
    alertmanager: dict[str, Any]  # alertmanager.yml
    pods: list[Pod]

    def pod(self, name: str) -> Pod | None:
        return next((p for p in self.pods if p.name == name), None)


def sources_hash(root: Path = REPO_ROOT) -> str:
    digest = hashlib.sha256()
    for top in SOURCES:
        for path in sorted((root / top).rglob("*")):
            if path.is_file() and "__pycache__" not in path.parts:
                digest.update(str(path.relative_to(root)).encode() + b"\0")
                digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:32]


def from_plan(p: plan.Plan) -> Rendered:
    """The observability configs and the pod templates of one plan."""

    def data(config_map: str) -> dict[str, str]:
        return dict(p.find("kubernetes:core/v1:ConfigMap", config_map).inputs["data"])

    pods = []
    for r in p.resources:
        if r.inputs.get("kind") not in _WORKLOAD_KINDS:
            continue
        template = r.inputs.get("spec", {}).get("template", {}).get("metadata", {})
        ns = r.inputs.get("metadata", {}).get("namespace", "default")
        pods.append(Pod(ns, template.get("labels") or {}, template.get("annotations") or {}))
    return Rendered(
        prometheus=yaml.safe_load(data(obs.PROMETHEUS_CONFIG_MAP)[obs.PROMETHEUS_CONFIG_FILE]),
        rules=data(obs.RULES_CONFIG_MAP),
        alertmanager=yaml.safe_load(
            data(obs.ALERTMANAGER_CONFIG_MAP)[obs.ALERTMANAGER_CONFIG_FILE]
        ),
        pods=pods,
    )


_lock = threading.Lock()  # Prometheus and Alertmanager prepare in parallel threads


def load(cache_dir: Path, stack: str = STACK) -> Rendered:
    """The render of `stack`, from the cache when no source changed since it was made."""
    with _lock:
        key = f"{stack}-{sources_hash()}"
        path = cache_dir / "rendered" / f"{key}.json"
        try:
            raw = json.loads(path.read_text())
            return Rendered(**{**raw, "pods": [Pod(**p) for p in raw["pods"]]})
        except (FileNotFoundError, ValueError, TypeError, KeyError):
            pass
        rendered = from_plan(plan.run(stack))
        path.parent.mkdir(parents=True, exist_ok=True)
        for stale in path.parent.glob(f"{stack}-*.json"):
            stale.unlink(missing_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(rendered)))
        tmp.replace(path)  # another stack's `up` may read it at the same time
        return rendered
