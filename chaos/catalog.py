"""The failure-mode catalog (catalog.yaml) and the experiments that enact its modes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).parent
CATALOG = HERE / "catalog.yaml"
EXPERIMENTS = HERE / "experiments"


@dataclass(frozen=True)
class Mode:
    id: str
    component: str
    seed: str
    holds: tuple[str, ...]
    enactable: bool
    targets: tuple[str, ...]
    profile: str | None
    fidelity: str | None
    production_only: str | None
    alone: str | None = None  # why a game day's other lanes must be idle while it runs

    @property
    def experiment(self) -> Path:
        return EXPERIMENTS / f"{self.id}.json"

    @property
    def has_experiment(self) -> bool:
        return self.experiment.exists()

    def as_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "component": self.component, "enactable": self.enactable,
            "experiment": self.has_experiment, "profile": self.profile,
            "targets": list(self.targets), "fidelity": self.fidelity,
            "production_only": self.production_only, "alone": self.alone, "seed": self.seed,
        }  # fmt: skip


def _mode(m: dict[str, Any]) -> Mode:
    return Mode(
        id=m["id"], component=m["component"], seed=m["seed"], holds=tuple(m.get("holds", ())),
        enactable=bool(m["enactable"]), targets=tuple(m.get("targets") or ()),
        profile=m.get("profile"), fidelity=m.get("fidelity"),
        production_only=m.get("production_only"), alone=m.get("alone"),
    )  # fmt: skip


def modes() -> list[Mode]:
    return [_mode(m) for m in yaml.safe_load(CATALOG.read_text())["modes"]]


def mode(mode_id: str) -> Mode:
    by_id = {m.id: m for m in modes()}
    if mode_id not in by_id:
        raise KeyError(f"no failure mode {mode_id!r} in {CATALOG.name} (`likes chaos list`)")
    return by_id[mode_id]


def faults_profile() -> set[str]:
    """The modes whose experiments need the faults profile (Toxiproxy in front of the nodes)."""
    return {m.id for m in modes() if m.profile == "faults"}


def alone() -> set[str]:
    """The modes whose experiments a game day runs while its other lanes idle (chaos/lanes.py)."""
    return {m.id for m in modes() if m.alone}


def experiment(mode_id: str) -> dict[str, Any]:
    m = mode(mode_id)
    if not m.enactable:
        raise KeyError(f"{mode_id} is production-only: {m.production_only}")
    if not m.has_experiment:
        raise KeyError(f"{mode_id} has no experiment yet ({m.experiment.relative_to(HERE.parent)})")
    data: dict[str, Any] = json.loads(m.experiment.read_text())
    return data
