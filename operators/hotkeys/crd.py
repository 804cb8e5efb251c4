"""The HotKeyPolicy custom resource, defined once: group, version, names and the OpenAPI schema
of its spec, derived from `Policy` (the operator's own reading of a spec). The program installs
this CRD and a default policy (infra/operator.py); the Kopf handlers watch this group/version."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from operators.hotkeys.policy import Policy
from services.contracts import keys

GROUP = "likes.io"
VERSION = "v1"
KIND = "HotKeyPolicy"
PLURAL = "hotkeypolicies"
SINGULAR = "hotkeypolicy"
SHORT_NAMES = ("hkp",)
NAME = f"{PLURAL}.{GROUP}"
API_VERSION = f"{GROUP}/{VERSION}"

_DESCRIPTIONS = {
    "enterRate": "estimated reads/s at which a post is promoted to hot",
    "exitRate": "a hot post stays hot while at or above this (hysteresis below enterRate)",
    "splitRate": "estimated reads/s at which a hot post's writes are also split over sub-keys",
    "maxHotKeys": "at most this many posts are held hot",
    "replicationFactor": "hot pools a hot post's count is copied into",
    "splitFactor": "sub-keys a split post's writes spread over",
    "cooldownSeconds": "seconds below exitRate before a hot post is demoted",
    "replicaTtlSeconds": "a hot-pool copy the operator stops refreshing expires after this",
}


def spec_schema(hot_pools: int) -> dict[str, Any]:
    """OpenAPI v3 schema of the spec: every field Policy reads, its type, bounds and default."""
    types = {f.name: f.type for f in fields(Policy)}
    defaults = Policy()
    props: dict[str, Any] = {}
    for name, attr in Policy.SPEC_NAMES.items():
        integer = types[attr] == "int"
        prop: dict[str, Any] = {
            "type": "integer" if integer else "number",
            "minimum": 0,
            "default": getattr(defaults, attr),
            "description": _DESCRIPTIONS[name],
        }
        props[name] = prop
    props["replicationFactor"].update(minimum=1, maximum=hot_pools)
    props["splitFactor"].update(minimum=1, maximum=keys.SPLIT_FACTOR)
    props["replicaTtlSeconds"]["minimum"] = 1
    props["enterRate"]["exclusiveMinimum"] = True
    return {
        "type": "object",
        "properties": {
            "spec": {"type": "object", "properties": props},
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
    }


def default_spec(hot_pools: int) -> dict[str, Any]:
    """The policy the program installs: Policy's defaults, replicated into every hot pool."""
    d = Policy(replication_factor=hot_pools)
    d.validate()
    return {name: getattr(d, attr) for name, attr in Policy.SPEC_NAMES.items()}
