"""What the Pulumi program renders for one stack, as the local stack reads it.

The program runs under Pulumi's mocks (infra.plan); every declared resource is kept with its
inputs. The render is cached on disk, keyed by the stack and a hash of every file the program
reads, so an unchanged program is not planned twice (a plan takes ~10 s on this machine).
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from local.layout import REPO_ROOT

# what the program is made of: a change to any of these files can change the render
SOURCES = ("infra", "stacks", "services", "operators", "Pulumi.yaml")
CACHE_DIR = REPO_ROOT / ".cache" / "rendered"
DEPLOYMENT = "kubernetes:apps/v1:Deployment"
CONFIG_MAP = "kubernetes:core/v1:ConfigMap"


class RenderError(Exception):
    """The program could not be rendered, or lacks what the local stack needs from it."""


def _fingerprint(stack: str, repo: Path = REPO_ROOT) -> str:
    h = hashlib.sha256(stack.encode())
    for top in SOURCES:
        root = repo / top
        files = [root] if root.is_file() else sorted(root.rglob("*"))
        for f in files:
            if f.is_file() and f.suffix in (".py", ".yaml", ".yml", ".json", ".cql", ".avsc"):
                h.update(str(f.relative_to(repo)).encode() + b"\0")
                h.update(f.read_bytes() + b"\0")
    return h.hexdigest()[:16]


@dataclass(frozen=True)
class Probe:
    path: str
    port: int


@dataclass(frozen=True)
class SecretRef:
    secret: str
    key: str


EnvValue = str | SecretRef


@dataclass(frozen=True)
class Container:
    """One container of a rendered Deployment: what a pod of it would run."""

    deployment: str
    name: str
    command: list[str]
    env: dict[str, EnvValue]
    ports: dict[str, int]
    liveness: Probe | None
    readiness: Probe | None
    replicas: int | None


def _probe(raw: dict[str, Any] | None) -> Probe | None:
    if not raw or "httpGet" not in raw:
        return None
    return Probe(raw["httpGet"]["path"], int(raw["httpGet"]["port"]))


@dataclass(frozen=True)
class Rendered:
    stack: str
    resources: list[dict[str, Any]]  # {"type", "name", "parent", "inputs"}

    def of_type(self, type_: str) -> list[dict[str, Any]]:
        return [r for r in self.resources if r["type"] == type_]

    def _by_meta_name(self, type_: str, name: str) -> dict[str, Any]:
        for r in self.of_type(type_):
            if r["inputs"].get("metadata", {}).get("name") == name:
                return r
        raise RenderError(f"stack {self.stack} renders no {type_.rsplit(':', 1)[-1]} {name!r}")

    def container(self, deployment: str, container: str | None = None) -> Container:
        """The (first, or named) container of a rendered Deployment."""
        dep = self._by_meta_name(DEPLOYMENT, deployment)["inputs"]
        spec = dep["spec"]["template"]["spec"]
        found = [c for c in spec["containers"] if container in (None, c["name"])]
        if not found:
            raise RenderError(f"Deployment {deployment} has no container {container!r}")
        c = found[0]
        env: dict[str, EnvValue] = {}
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            env[e["name"]] = SecretRef(ref["name"], ref["key"]) if ref else str(e.get("value", ""))
        return Container(
            deployment=deployment,
            name=c["name"],
            command=[*c.get("command", []), *c.get("args", [])],
            env=env,
            ports={
                p.get("name", str(p["containerPort"])): int(p["containerPort"])
                for p in c.get("ports", [])
            },
            liveness=_probe(c.get("livenessProbe")),
            readiness=_probe(c.get("readinessProbe")),
            replicas=dep["spec"].get("replicas"),
        )

    def config_map(self, name: str) -> dict[str, str]:
        """A rendered ConfigMap's data (file name -> contents)."""
        return dict(self._by_meta_name(CONFIG_MAP, name)["inputs"].get("data", {}))


@functools.lru_cache(maxsize=8)
def render(stack: str) -> Rendered:
    """The stack's render, from the cache when the program's sources did not change (and once
    per process: hashing the sources costs more than a token signature)."""
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    cached = CACHE_DIR / f"{stack}-{_fingerprint(stack)}.json"
    if cached.exists():
        return Rendered(stack, json.loads(cached.read_text()))
    from infra import config, plan, stackfile

    try:
        p = plan.run(stack)
    except (config.ConfigError, stackfile.StackFileError) as e:
        raise RenderError(f"stack {stack}: {e}") from e
    if not p.ok:
        raise RenderError(f"stack {stack} fails its policies: {p.violations}")
    resources = [r.as_json() for r in p.resources]
    for old in CACHE_DIR.glob(f"{stack}-*.json"):
        old.unlink(missing_ok=True)
    tmp = cached.with_suffix(".tmp")
    tmp.write_text(json.dumps(resources))
    tmp.replace(cached)
    return Rendered(stack, resources)


def cache_path(stack: str) -> Path:
    return CACHE_DIR / f"{stack}-{_fingerprint(stack)}.json"
