"""What every `likes` command on etcd shares (`likes hotkeys`, `likes flags`): the connection from
the settings (the LIKES_* variables, else the local stack's), a clean exit 2 when etcd does not
answer, the confirmation and the audit record of a mutation."""

from __future__ import annotations

import asyncio
from typing import Any

import typer
from rich.console import Console

from cli import audit, stack_settings
from services.contracts import etcd

console = Console()
JsonOpt = typer.Option(False, "--json", help="machine-readable output")
YesOpt = typer.Option(False, "--yes", "-y", help="do not ask for confirmation")
CALL_TIMEOUT_S = 5.0  # each call, once logged in


class EtcdError(Exception):
    """etcd did not answer."""


async def _with_etcd(fn: Any) -> Any:
    try:  # the LIKES_* variables (a pod's), else the local stack's
        s = stack_settings.platform_settings()
    except (ValueError, stack_settings.NoSettings) as e:
        raise EtcdError(str(e)) from e
    client = etcd.from_settings(s, timeout=CALL_TIMEOUT_S)
    try:
        return await fn(await etcd.connected(client))
    except Exception as e:
        raise EtcdError(f"etcd {s.etcd_host}:{s.etcd_port}: {e!r}") from e
    finally:
        await client.close()


def run(fn: Any) -> Any:
    """`await fn(client)` on an etcd client; exit 2 with the reason when etcd does not answer."""
    try:
        return asyncio.run(_with_etcd(fn))
    except EtcdError as e:
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from e


def audited(command: str, args: dict[str, Any], fn: Any) -> Any:
    """run(fn), with an audit record of what came of it (cli/audit.py)."""
    try:
        done = run(fn)
    except typer.Exit:
        audit.record(command, args, "failed", "etcd did not answer")
        raise
    audit.record(command, args, "ok", done)
    return done


def confirm(what: str, yes: bool) -> None:
    if not yes and not typer.confirm(what):
        raise typer.Abort()
