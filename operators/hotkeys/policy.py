"""The HotKeyPolicy spec as a typed, validated object (the CRD's `spec`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar

from services.contracts import keys


class InvalidPolicy(ValueError):
    """A spec that can never reconcile; names the bad fields."""


@dataclass(frozen=True)
class Policy:
    # estimated reads/s (the sampler's rate, already scaled up from the sample)
    enter_rate: float = 2000.0  # promote at or above this
    exit_rate: float = 1000.0  # stays hot while at or above this (hysteresis band below enter)
    split_rate: float = 4000.0  # also split the post's writes over sub-keys at or above this
    max_hot_keys: int = 100  # the cap: hot pools hold at most this many replicated posts
    replication_factor: int = 4  # hot pools a hot post is copied into
    split_factor: int = keys.SPLIT_FACTOR
    cooldown_s: float = 30.0  # below exit_rate this long before demotion
    replica_ttl_s: int = 15  # a replica the operator stops refreshing dies on its own

    # the CRD's camelCase names
    SPEC_NAMES: ClassVar[dict[str, str]] = {
        "enterRate": "enter_rate",
        "exitRate": "exit_rate",
        "splitRate": "split_rate",
        "maxHotKeys": "max_hot_keys",
        "replicationFactor": "replication_factor",
        "splitFactor": "split_factor",
        "cooldownSeconds": "cooldown_s",
        "replicaTtlSeconds": "replica_ttl_s",
    }

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Policy:
        types = {f.name: f.type for f in fields(cls)}
        values: dict[str, Any] = {}
        bad: list[str] = []
        for name, attr in cls.SPEC_NAMES.items():
            if name not in spec:
                continue
            try:
                conv = int if types[attr] == "int" else float
                values[attr] = conv(spec[name])
            except (TypeError, ValueError):
                bad.append(name)
        unknown = sorted(set(spec) - set(cls.SPEC_NAMES))
        if unknown:
            bad += unknown
        if bad:
            raise InvalidPolicy(f"invalid HotKeyPolicy spec field(s): {', '.join(sorted(bad))}")
        policy = cls(**values)
        policy.validate()
        return policy

    def validate(self) -> None:
        bad = []
        if self.enter_rate <= 0:
            bad.append("enterRate must be > 0")
        if not 0 <= self.exit_rate <= self.enter_rate:
            bad.append("exitRate must be within [0, enterRate] (the hysteresis band)")
        if self.split_rate < self.enter_rate:
            bad.append("splitRate must be >= enterRate (only hot posts are split)")
        if self.max_hot_keys < 0:
            bad.append("maxHotKeys must be >= 0")
        if self.replication_factor < 1:
            bad.append("replicationFactor must be >= 1")
        if not 1 <= self.split_factor <= keys.SPLIT_FACTOR:
            bad.append(f"splitFactor must be within [1, {keys.SPLIT_FACTOR}]")
        if self.cooldown_s < 0:
            bad.append("cooldownSeconds must be >= 0")
        if self.replica_ttl_s < 1:
            bad.append("replicaTtlSeconds must be >= 1")
        if bad:
            raise InvalidPolicy("; ".join(bad))
