"""Read `stacks/Pulumi.<stack>.yaml` into the flat config map Pulumi hands a program.

Used by the offline plan only (`pulumi up` reads the file itself). Structured values become JSON
strings, as Pulumi passes them; `secure:` values cannot be decrypted offline, so they become a
placeholder and their key is recorded as secret.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from infra import config

REPO_ROOT = Path(__file__).resolve().parent.parent
STACKS_DIR = REPO_ROOT / "stacks"
PLACEHOLDER = "offline-plan-placeholder"


class StackFileError(Exception):
    """The stack file is missing or not a Pulumi stack config."""


@dataclass(frozen=True)
class StackFile:
    name: str
    values: dict[str, str]
    secret_keys: frozenset[str]
    # Secret keys absent from the file that the plan filled with a placeholder.
    placeholders: tuple[str, ...]


def _has_secure(value: Any) -> bool:
    if isinstance(value, dict):
        return set(value) == {"secure"} or any(_has_secure(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_secure(v) for v in value)
    return False


def _strip_secure(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"secure"}:
            return PLACEHOLDER
        return {k: _strip_secure(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_strip_secure(v) for v in value]
    return value


def _as_config_string(value: Any) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def stack_names(directory: Path = STACKS_DIR) -> list[str]:
    return sorted(p.name[len("Pulumi.") : -len(".yaml")] for p in directory.glob("Pulumi.*.yaml"))


def load(stack: str, directory: Path = STACKS_DIR, fill_secrets: bool = True) -> StackFile:
    path = directory / f"Pulumi.{stack}.yaml"
    if not path.is_file():
        known = ", ".join(stack_names(directory)) or "none"
        raise StackFileError(f"no stack file {path.name} in {directory} (stacks: {known})")
    doc = yaml.safe_load(path.read_text()) or {}
    raw = doc.get("config") if isinstance(doc, dict) else None
    if not isinstance(raw, dict):
        raise StackFileError(f"{path.name} has no `config:` mapping")
    values: dict[str, str] = {}
    secrets: set[str] = set()
    for key, value in raw.items():
        if _has_secure(value):
            secrets.add(key)
        values[str(key)] = _as_config_string(_strip_secure(value))
    placeholders: list[str] = []
    if fill_secrets:
        # Secrets are never committed; offline, stand in for the ones a real run must have.
        for field in sorted(config.SECRET_FIELDS):
            key = f"{config.NAMESPACE}:{field}"
            if key not in values:
                values[key] = PLACEHOLDER
                secrets.add(key)
                placeholders.append(key)
    return StackFile(stack, values, frozenset(secrets), tuple(placeholders))
