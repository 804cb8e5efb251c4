"""Apply the CQL files of services/schema/cql/ in name order, idempotently.

Shared by the local stack's bootstrap (replication {<dc>: 1}) and production's migration job
(RF 3 in every region's DC): the keyspace file carries a `{{replication}}` placeholder instead of a
hard-coded strategy. Every statement must be `IF NOT EXISTS`, so a rerun changes nothing. A column
added to an existing table is written `ALTER TABLE ks.t ADD IF NOT EXISTS col type` (Cassandra 4.1+
syntax) and run as a look-up in system_schema.columns then a plain `ADD`: the form every Cassandra
and Scylla accepts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

CQL_DIR = Path(__file__).resolve().parent / "cql"
PLACEHOLDER = "{{replication}}"
_UNFILLED = re.compile(r"\{\{\s*\w+\s*\}\}")
_DC_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")
_ADD_COLUMN = re.compile(
    r"^ALTER\s+TABLE\s+(\w+)\.(\w+)\s+ADD\s+IF\s+NOT\s+EXISTS\s+(\w+)\s+(.+)$",
    re.IGNORECASE | re.DOTALL,
)


class SchemaError(Exception):
    """A CQL file is not something this applier may run (not idempotent, unknown placeholder)."""


class _Session(Protocol):
    # The one cassandra.cluster.Session method used: keeps this module free of a driver import.
    def execute(self, query: str, *args: object, **kwargs: object) -> Any: ...


def replication_map(replication: Mapping[str, int]) -> str:
    """`{'dc': rf, ...}` as CQL: NetworkTopologyStrategy, the only strategy that keeps working
    when a second data centre (region) is added."""
    if not replication:
        raise ValueError("replication needs at least one data centre")
    parts = ["'class': 'NetworkTopologyStrategy'"]
    for dc, rf in sorted(replication.items()):
        if not _DC_NAME.match(dc) or not isinstance(rf, int) or rf < 1:
            raise ValueError(f"bad replication entry {dc!r}: {rf!r}")
        parts.append(f"'{dc}': {rf}")
    return "{" + ", ".join(parts) + "}"


def split_statements(text: str) -> list[str]:
    """Statements of a CQL file without comments (`--`, `//`, `/* */`), split on `;` outside
    quoted strings and identifiers."""
    out: list[str] = []
    buf: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        two = text[i : i + 2]
        if c in "'\"":  # copy a quoted string/identifier whole; '' and "" are escaped quotes
            j = i + 1
            while j < n and not (text[j] == c and text[j + 1 : j + 2] != c):
                j += 2 if text[j] == c else 1
            buf.append(text[i : j + 1])
            i = j + 1
        elif two in ("--", "//"):
            nl = text.find("\n", i)
            i = n if nl < 0 else nl
        elif two == "/*":
            end = text.find("*/", i + 2)
            i = n if end < 0 else end + 2
        elif c == ";":
            out.append("".join(buf))
            buf = []
            i += 1
        else:
            buf.append(c)
            i += 1
    out.append("".join(buf))
    return [s.strip() for s in out if s.strip()]


def statements(replication: Mapping[str, int], directory: Path = CQL_DIR) -> list[str]:
    """Every statement of directory/*.cql in file-name order, placeholder filled and checked."""
    repl = replication_map(replication)
    result: list[str] = []
    for path in sorted(directory.glob("*.cql")):
        for stmt in split_statements(path.read_text()):
            stmt = stmt.replace(PLACEHOLDER, repl)
            if m := _UNFILLED.search(stmt):
                raise SchemaError(f"{path.name}: unknown placeholder {m.group(0)}")
            upper = stmt.upper()
            if "IF NOT EXISTS" not in upper or (
                upper.startswith("ALTER") and not _ADD_COLUMN.match(stmt)
            ):
                raise SchemaError(f"{path.name}: not idempotent (no IF NOT EXISTS): {stmt[:80]}")
            result.append(stmt)
    return result


def apply(session: _Session, replication: dict[str, int], directory: Path = CQL_DIR) -> list[str]:
    """Run every statement (the driver waits for schema agreement after each DDL); return the
    ones sent, as sent (a column that exists already is not added again)."""
    sent: list[str] = []
    for stmt in statements(replication, directory):
        if m := _ADD_COLUMN.match(stmt):
            keyspace, table, column, type_ = m.groups()
            exists = session.execute(
                "SELECT column_name FROM system_schema.columns WHERE keyspace_name = %s "
                "AND table_name = %s AND column_name = %s",
                (keyspace.lower(), table.lower(), column.lower()),
            )
            if exists.one() is not None:
                continue
            stmt = f"ALTER TABLE {keyspace}.{table} ADD {column} {type_.strip()}"
        session.execute(stmt)
        sent.append(stmt)
    return sent
