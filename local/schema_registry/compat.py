"""Pure schema decisions of the registry: parsing, schema identity and compatibility levels.

Compatibility is decided by Apache Avro's own reader/writer checker; this module only chooses
which (reader, writer) pairs a level asks for, the way Confluent's CompatibilityChecker does.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

import avro.errors
import avro.schema
import fastavro
from avro.compatibility import ReaderWriterCompatibilityChecker, SchemaCompatibilityType


class InvalidSchema(ValueError):
    """The text is not a valid Avro schema (Confluent error 42201)."""


class Level(StrEnum):
    NONE = "NONE"
    BACKWARD = "BACKWARD"
    BACKWARD_TRANSITIVE = "BACKWARD_TRANSITIVE"
    FORWARD = "FORWARD"
    FORWARD_TRANSITIVE = "FORWARD_TRANSITIVE"
    FULL = "FULL"
    FULL_TRANSITIVE = "FULL_TRANSITIVE"

    @classmethod
    def parse(cls, text: object) -> Level:
        """Case-insensitive, like Confluent; ValueError for anything else."""
        if not isinstance(text, str):
            raise ValueError(f"compatibility level must be a string, not {text!r}")
        try:
            return cls(text.strip().upper())
        except ValueError:
            raise ValueError(f"unknown compatibility level {text!r}") from None

    @property
    def transitive(self) -> bool:
        return self.name.endswith("_TRANSITIVE")

    @property
    def backward(self) -> bool:
        """The new schema must read data written with the old one(s)."""
        return self.value.startswith(("BACKWARD", "FULL"))

    @property
    def forward(self) -> bool:
        """The old schema(s) must read data written with the new one."""
        return self.value.startswith(("FORWARD", "FULL"))


DEFAULT_LEVEL = Level.BACKWARD


def parse_schema(text: str) -> avro.schema.Schema:
    """Parse an Avro schema; InvalidSchema with a readable reason otherwise.

    fastavro parses it too because it checks field defaults against their types (Apache Avro's
    Python parser does not) and because it is what the confluent-kafka serdes will use on it.
    """
    try:
        data = json.loads(text)
    except (TypeError, ValueError) as e:
        raise InvalidSchema(f"Invalid schema: not JSON: {e}") from None
    try:
        parsed = avro.schema.parse(text)
    except (avro.errors.AvroException, TypeError, ValueError, KeyError, AttributeError) as e:
        raise InvalidSchema(f"Invalid schema: {e}") from None
    try:
        fastavro.parse_schema(data, _write_hint=False)
    except Exception as e:  # fastavro raises a mix of its own and builtin exceptions
        raise InvalidSchema(f"Invalid schema: {e}") from None
    return parsed


def canonical_form(schema: avro.schema.Schema) -> str:
    """The identity of a schema for ids and re-registration: its parsed form as compact JSON with
    sorted keys, so whitespace, key order and `{"type": "string"}` vs `"string"` do not matter
    while names, defaults, docs and other properties still do."""
    return json.dumps(schema.to_json(), sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Verdict:
    """Outcome of a compatibility check; no messages means compatible."""

    messages: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.messages


def _pair(
    reader: avro.schema.Schema, writer: avro.schema.Schema, new_is_reader: bool, old_version: str
) -> list[str]:
    # A fresh checker per pair: it memoizes by object identity.
    result = ReaderWriterCompatibilityChecker().get_compatibility(reader=reader, writer=writer)
    if result.compatibility is SchemaCompatibilityType.compatible:
        return []
    kinds = ", ".join(sorted(i.name.upper() for i in result.incompatibilities))
    where = ", ".join(sorted(result.locations))
    details = "; ".join(sorted(result.messages))
    if new_is_reader:
        direction = f"the new schema cannot read data written with {old_version}"
    else:
        direction = f"{old_version} cannot read data written with the new schema"
    return [f"{kinds} at {where}: {details} ({direction})"]


def check(
    level: Level,
    new: avro.schema.Schema,
    existing: Sequence[avro.schema.Schema],
    labels: Sequence[str] | None = None,
) -> Verdict:
    """Decide whether `new` may follow `existing` (oldest first) under `level`.

    Plain levels compare with the latest schema only, `_TRANSITIVE` ones with every earlier one.
    `labels` names the existing schemas in messages (e.g. "version 3"); same length as existing.
    """
    if labels is not None and len(labels) != len(existing):
        raise ValueError("labels must name every existing schema")
    if level is Level.NONE or not existing:
        return Verdict()
    names = list(labels or [f"schema {i + 1}" for i in range(len(existing))])
    pairs = list(zip(existing, names, strict=True))
    if not level.transitive:
        pairs = pairs[-1:]
    messages: list[str] = []
    # newest first, so the first message is about the version a reader most likely meant
    for old, name in reversed(pairs):
        if level.backward:
            messages += _pair(reader=new, writer=old, new_is_reader=True, old_version=name)
        if level.forward:
            messages += _pair(reader=old, writer=new, new_is_reader=False, old_version=name)
    return Verdict(tuple(messages))
