"""Compatibility decisions of the local schema registry (local.schema_registry.compat).

BACKWARD: the new schema, as reader, reads data written with the old one(s).
FORWARD: the old schema(s), as reader, read data written with the new one.
FULL: both. Plain levels compare with the latest version only, _TRANSITIVE with all of them.
"""

from __future__ import annotations

import json
from typing import Any

import avro.schema
import pytest

from local.schema_registry import compat
from local.schema_registry.compat import Level


def record(*fields: dict[str, Any], name: str = "Like") -> avro.schema.Schema:
    return compat.parse_schema(json.dumps({"type": "record", "name": name, "fields": list(fields)}))


A = {"name": "post_id", "type": "string"}
B_REQUIRED = {"name": "reaction", "type": "string"}
B_DEFAULT = {"name": "reaction", "type": "string", "default": "like"}


def ok(level: Level, new: avro.schema.Schema, *existing: avro.schema.Schema) -> bool:
    return compat.check(level, new, list(existing)).ok


# -- levels --------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["forward", "FORWARD", " Forward ", "forward_transitive"])
def test_level_parse_is_case_insensitive(text: str) -> None:
    assert Level.parse(text).value == text.strip().upper()


@pytest.mark.parametrize("text", ["", "sideways", "FORWARDS", None, 3])
def test_level_parse_rejects_unknown(text: object) -> None:
    with pytest.raises(ValueError):
        Level.parse(text)


def test_level_directions() -> None:
    assert {lv for lv in Level if lv.backward} == {
        Level.BACKWARD,
        Level.BACKWARD_TRANSITIVE,
        Level.FULL,
        Level.FULL_TRANSITIVE,
    }
    assert {lv for lv in Level if lv.forward} == {
        Level.FORWARD,
        Level.FORWARD_TRANSITIVE,
        Level.FULL,
        Level.FULL_TRANSITIVE,
    }
    assert {lv for lv in Level if lv.transitive} == {
        Level.BACKWARD_TRANSITIVE,
        Level.FORWARD_TRANSITIVE,
        Level.FULL_TRANSITIVE,
    }
    assert compat.DEFAULT_LEVEL is Level.BACKWARD


# -- one step ------------------------------------------------------------------------------


def test_forward_rejects_removing_a_field_the_old_reader_needs() -> None:
    old, new = record(A, B_REQUIRED), record(A)
    # the old reader meets data without `reaction` and has no default for it
    assert not ok(Level.FORWARD, new, old)
    assert not ok(Level.FULL, new, old)
    # the new reader simply ignores the old data's `reaction`
    assert ok(Level.BACKWARD, new, old)


def test_forward_accepts_removing_a_field_that_has_a_default() -> None:
    old, new = record(A, B_DEFAULT), record(A)
    assert ok(Level.FORWARD, new, old)
    assert ok(Level.FULL, new, old)


def test_adding_a_field_without_default_is_forward_but_not_backward() -> None:
    old, new = record(A), record(A, B_REQUIRED)
    assert ok(Level.FORWARD, new, old)  # the old reader ignores the new field
    assert not ok(Level.BACKWARD, new, old)  # the new reader finds no value and no default
    assert not ok(Level.FULL, new, old)


def test_adding_a_field_with_default_is_fully_compatible() -> None:
    old, new = record(A), record(A, B_DEFAULT)
    for level in Level:
        assert ok(level, new, old), level


def test_type_promotion_is_one_way() -> None:
    old = record({"name": "n", "type": "int"})
    new = record({"name": "n", "type": "long"})
    assert ok(Level.BACKWARD, new, old)  # a long reader reads an int
    assert not ok(Level.FORWARD, new, old)  # an int reader cannot read a long


def test_new_enum_symbol_breaks_old_readers() -> None:
    def reaction(*symbols: str) -> avro.schema.Schema:
        enum = {"type": "enum", "name": "Reaction", "symbols": list(symbols)}
        return record({"name": "reaction", "type": enum})

    old, new = reaction("like", "love"), reaction("like", "love", "wow")
    assert ok(Level.BACKWARD, new, old)
    verdict = compat.check(Level.FORWARD, new, [old])
    assert not verdict.ok
    assert "MISSING_ENUM_SYMBOLS" in verdict.messages[0]


def test_renamed_record_is_incompatible() -> None:
    assert not ok(Level.BACKWARD, record(A, name="Other"), record(A))


def test_none_accepts_anything_and_nothing_to_compare_is_ok() -> None:
    assert ok(Level.NONE, record({"name": "x", "type": "int"}), record(A))
    for level in Level:
        assert ok(level, record(A))


# -- latest only vs transitive -------------------------------------------------------------


def test_forward_checks_latest_only_forward_transitive_checks_all() -> None:
    v1 = record(A, B_REQUIRED)  # readers of v1 need `reaction`
    v2 = record(A, B_DEFAULT)
    v3 = record(A)  # drops `reaction`: fine for v2 readers (default), not for v1 readers
    assert ok(Level.FORWARD, v3, v1, v2)
    verdict = compat.check(
        Level.FORWARD_TRANSITIVE, v3, [v1, v2], labels=["version 1", "version 2"]
    )
    assert not verdict.ok
    assert len(verdict.messages) == 1
    assert "version 1 cannot read data written with the new schema" in verdict.messages[0]
    assert "READER_FIELD_MISSING_DEFAULT_VALUE" in verdict.messages[0]


def test_backward_checks_latest_only_backward_transitive_checks_all() -> None:
    v1 = record(A)
    v2 = record(A, B_DEFAULT)
    v3 = record(A, B_REQUIRED)  # reads v2 data (which has `reaction`), not v1 data
    assert ok(Level.BACKWARD, v3, v1, v2)
    verdict = compat.check(Level.BACKWARD_TRANSITIVE, v3, [v1, v2], labels=["v1", "v2"])
    assert not verdict.ok
    assert "the new schema cannot read data written with v1" in verdict.messages[0]


def test_full_transitive_reports_both_directions_for_every_version() -> None:
    old1 = record({"name": "n", "type": "int"})
    old2 = record({"name": "n", "type": "int"}, B_DEFAULT)
    new = record({"name": "n", "type": "string"})
    verdict = compat.check(Level.FULL_TRANSITIVE, new, [old1, old2])
    assert len(verdict.messages) == 4
    # newest first: the version a reader most likely meant comes first
    assert "schema 2" in verdict.messages[0]


def test_labels_must_match_existing() -> None:
    with pytest.raises(ValueError):
        compat.check(Level.FULL, record(A), [record(A)], labels=[])


# -- identity and re-registration ----------------------------------------------------------


def test_identical_reregistration_is_compatible_at_every_level() -> None:
    v1 = record(A, B_REQUIRED)
    for level in Level:
        assert ok(level, record(A, B_REQUIRED), v1), level
        assert ok(level, record(A, B_REQUIRED), record(A, B_REQUIRED), v1), level


def test_identity_ignores_formatting_but_not_content() -> None:
    doc = {"type": "record", "name": "Like", "fields": [A, B_DEFAULT]}
    compact = compat.parse_schema(json.dumps(doc, separators=(",", ":")))
    spaced = compat.parse_schema(json.dumps(doc, indent=4))
    reordered = compat.parse_schema(json.dumps(dict(reversed(list(doc.items())))))
    form = compat.canonical_form(compact)
    assert compat.canonical_form(spaced) == form
    assert compat.canonical_form(reordered) == form
    primitive = compat.canonical_form(compat.parse_schema('"string"'))
    assert compat.canonical_form(compat.parse_schema('{"type": "string"}')) == primitive

    other_default = {**B_DEFAULT, "default": "love"}
    assert compat.canonical_form(record(A, other_default)) != form
    assert compat.canonical_form(record(B_DEFAULT, A)) != form  # field order is part of Avro


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        '{"type": "recrd", "name": "X"}',
        '{"type": "record", "name": "X"}',
        '{"type": "record", "name": "1X", "fields": []}',
        '{"type": "record", "name": "X", "fields": [{"name": "n", "type": "int", "default": "x"}]}',
        "123",
        "",
    ],
)
def test_invalid_schemas_are_rejected(text: str) -> None:
    with pytest.raises(compat.InvalidSchema):
        compat.parse_schema(text)
