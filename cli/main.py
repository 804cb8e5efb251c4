"""Root of the `likes` CLI; each concern mounts its own Typer group here."""

from __future__ import annotations

import typer

from cli import abuse, alerts, audit, chaos, dlq, flags, recount, runbook, slo, status
from infra import cli as infra_cli
from local import cli as local_cli
from operators.hotkeys import cli as hotkeys_cli

app = typer.Typer(
    help=(
        "Operate the like platform: the local stack, the infra program, hot keys, kill switches, "
        "dead letters, recounts, alerts and their runbooks, game days."
    ),
    no_args_is_help=True,
)
app.add_typer(local_cli.app, name="local")
app.add_typer(infra_cli.app, name="infra")
app.add_typer(hotkeys_cli.app, name="hotkeys")
app.add_typer(runbook.app, name="runbook")
app.add_typer(flags.app, name="flags")
app.add_typer(dlq.app, name="dlq")
app.add_typer(abuse.app, name="abuse")
app.add_typer(chaos.app, name="chaos")
app.command()(recount.recount)
app.command()(alerts.alerts)
app.command()(slo.slo)
app.command()(status.status)
app.command()(audit.audit)

if __name__ == "__main__":
    app()
