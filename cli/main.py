"""Root of the `likes` CLI; each concern mounts its own Typer group here."""

from __future__ import annotations

import typer

from local import cli as local_cli

app = typer.Typer(
    help="Operate the like platform: local stack, infra, hot keys, runbooks.",
    no_args_is_help=True,
)
app.add_typer(local_cli.app, name="local")

if __name__ == "__main__":
    app()
