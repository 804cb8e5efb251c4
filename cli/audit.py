"""The operators' audit trail: who ran which mutating `likes` command, when, and what came of it.

One store with a written schema: the `likes.audit` table of the edge-store
(services/schema/cql/004_audit.cql), written as the services' role after the command acted.
`who` is LIKES_OPERATOR, else the login name. A record that cannot be written does not undo
what the command did: the command says so on stderr, and its own exit status stands.

`likes audit [--since 1d] [--json]` lists the records, newest first.
"""

from __future__ import annotations

import getpass
import json
import os
import uuid
from datetime import UTC, date, datetime, timedelta
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from cli import alerts, stack_settings

OPERATOR_ENV = "LIKES_OPERATOR"
RESULTS = ("ok", "failed")

console = Console()
err = Console(stderr=True)


def operator() -> str:
    return os.environ.get(OPERATOR_ENV) or getpass.getuser()


def record(command: str, args: dict[str, Any], result: str, detail: Any = None) -> bool:
    """Write one record; False (and a warning on stderr) when the store did not take it."""
    from services.contracts import clients

    if result not in RESULTS:
        raise ValueError(f"result {result!r} is not one of {RESULTS}")
    try:
        s = stack_settings.platform_settings()
        cluster, session = clients.cassandra(s, request_timeout=10.0)
    except Exception as e:
        err.print(f"[yellow]audit record not written[/yellow] ({command}): {e}")
        return False
    try:
        at = uuid.uuid1()
        session.execute(
            "INSERT INTO audit (day, at, who, command, args, result, detail) "
            "VALUES (%s, %s, %s, %s, %s, %s, %s)",
            (datetime.now(UTC).date(), at, operator(), command, json.dumps(args, sort_keys=True),
             result, json.dumps(detail, sort_keys=True, default=str)),
        )  # fmt: skip
        return True
    except Exception as e:
        err.print(f"[yellow]audit record not written[/yellow] ({command}): {e}")
        return False
    finally:
        cluster.shutdown()


def read(since: timedelta, now: datetime | None = None) -> list[dict[str, Any]]:
    """Records of the last `since`, newest first (one query per UTC day)."""
    from cassandra.util import datetime_from_uuid1

    from services.contracts import clients

    now = now or datetime.now(UTC)
    start = now - since
    cluster, session = clients.cassandra(stack_settings.platform_settings(), request_timeout=10.0)
    try:
        out: list[dict[str, Any]] = []
        day: date = now.date()
        while day >= start.date():
            rows = session.execute(
                "SELECT at, who, command, args, result, detail FROM audit WHERE day = %s", (day,)
            )
            for r in rows:
                when = datetime_from_uuid1(r.at).replace(tzinfo=UTC)
                if when < start:
                    break  # newest first within the day
                out.append({"at": when.isoformat(), "who": r.who, "command": r.command,
                            "args": json.loads(r.args or "{}"), "result": r.result,
                            "detail": json.loads(r.detail or "null")})  # fmt: skip
            day -= timedelta(days=1)
        return out
    finally:
        cluster.shutdown()


def audit(
    since: Annotated[str, typer.Option(help="How far back (30m, 1h, 2d).")] = "1d",
    as_json: Annotated[bool, typer.Option("--json", help="A JSON list of records.")] = False,
) -> None:
    """What operators did to the platform with the mutating `likes` commands, newest first.

    --json prints a list of objects with at (ISO 8601, UTC), who, command, args, result (ok |
    failed) and detail."""
    window = timedelta(seconds=alerts._parse_since(since))
    try:
        rows = read(window)
    except (ValueError, stack_settings.NoSettings) as e:
        err.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from None
    except Exception as e:  # the edge-store did not answer
        err.print(f"[red]cannot read the audit trail:[/red] {type(e).__name__}: {e}")
        raise typer.Exit(2) from None
    if as_json:
        print(json.dumps(rows))
        return
    if not rows:
        console.print(f"no operator action in the last {since}")
        return
    table = Table("at", "who", "command", "args", "result")
    for r in rows:
        style = "green" if r["result"] == "ok" else "red"
        table.add_row(r["at"], r["who"], r["command"], json.dumps(r["args"]),
                      f"[{style}]{r['result']}[/]")  # fmt: skip
    console.print(table)
