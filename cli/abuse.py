"""`likes abuse`: the abuse scorer's tools."""

from __future__ import annotations

import typer

from cli import unvoid

app = typer.Typer(help="The abuse scorer: undo a bad model's voids.", no_args_is_help=True)
app.command()(unvoid.unvoid)
