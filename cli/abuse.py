"""`likes abuse train|evaluate|models|use|unvoid|restore`: the abuse scorer's model and its
cleanup.

- `train` generates labelled traffic (services/abuse/generator.py), fits the model, chooses its
  threshold on a validation split, grades it on held-out users and saves it as a new version,
  made current only when those grades meet the goals (`model.GOALS`; services/abuse/model.py
  says how and why). The program's `abuse-model-publish` CronJob runs it (infra/services.py).
- `evaluate` grades a saved version (the current one by default) again on the held-out users
  of its own training run, generated again from its parameters: precision, recall and ROC AUC
  at its threshold, and the calibration table.
- `models` lists the saved versions and which is current.
- `use` serves a saved version again (the rollback of a bad deploy).
- `unvoid` takes back a bad model's voids (cli/unvoid.py).
- `restore` lifts the degradation of accounts wrongly caught in a storm.

Models live in `abuse-models` under the local stack's home (LIKES_HOME, else the repo's .stack),
or `--model-dir`. Exit codes: 0 done; 1 refused (no threshold good enough: nothing saved; or a
version below the goals: saved, not made current); 2 nothing to work on (no model, an unusable
one, a bad option).
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from cli import audit, stack_settings, unvoid
from services.abuse import generator, model

app = typer.Typer(
    help="The abuse scorer: train and grade its model, list versions, undo a bad model's voids.",
    no_args_is_help=True,
)
app.command()(unvoid.unvoid)
console = Console()
err = Console(stderr=True)

EXIT_OK, EXIT_REFUSED, EXIT_ERROR = 0, 1, 2
JsonOpt = typer.Option(False, "--json", help="machine-readable output")
ModelDirOpt = typer.Option(
    None, "--model-dir", help="where the versions live (default: abuse-models in the stack's home)"
)


def _dir(model_dir: Path | None) -> Path:
    return model_dir if model_dir is not None else model.default_dir()


def _progress(quiet: bool) -> Progress:
    return Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                    console=err, transient=True, disable=quiet)  # fmt: skip


def _load(directory: Path, version: str | None) -> model.Model:
    try:
        return model.load(directory, version)
    except (model.NoModel, model.IncompatibleModel) as e:
        err.print(f"[red]{e}[/red]", soft_wrap=True)  # a path stays whole
        raise typer.Exit(EXIT_ERROR) from e


def _metrics_table(ev: dict[str, Any]) -> Table:
    t = Table("precision", "recall", "ROC AUC", "threshold", "likes", "bots", "FP", "FN",
              title="held-out users, at the model's threshold",
              caption="FP: humans' likes it voids; FN: bots' likes it leaves counted")  # fmt: skip
    t.add_row(f"{ev['precision']:.3f}", f"{ev['recall']:.3f}", f"{ev['roc_auc']:.3f}",
              f"{ev['threshold']:.3f}", str(ev["rows"]), str(ev["bots"]),
              *(str(ev.get(k, "-")) for k in ("false_positives", "false_negatives")))  # fmt: skip
    return t


def _calibration_table(ev: dict[str, Any]) -> Table:
    t = Table("predicted", "mean predicted", "observed bot share", "likes",
              title="calibration (a calibrated model's two middle columns agree)")  # fmt: skip
    for b in ev["calibration"]:
        t.add_row(f"{b['low']:.1f}-{b['high']:.1f}", f"{b['predicted']:.3f}",
                  f"{b['observed']:.3f}", str(b["count"]))  # fmt: skip
    return t


_GOALS = (
    f"ROC AUC >= {model.GOALS.roc_auc:g}, precision >= {model.GOALS.precision:g} at "
    f"recall >= {model.GOALS.recall:g}"
)


@app.command()
def train(
    users: Annotated[int, typer.Option(min=10, help="accounts in the generated traffic")] = (
        generator.Traffic.users
    ),
    seed: Annotated[int, typer.Option(help="the generator's seed (same seed, same traffic)")] = 0,
    gate: Annotated[
        bool,
        typer.Option(
            help=f"make the new version current only if its held-out grades meet the goals "
            f"({_GOALS}); else keep it saved, leave `current` as it was and exit 1. On by "
            "default: the model servers reload `current` on their own and the scorer voids likes "
            "with it, so publishing a worse model has to be asked for (--no-gate: an "
            "experiment; `abuse use V` serves a saved version deliberately)"
        ),
    ] = True,
    model_dir: Path | None = ModelDirOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Train a model on generated traffic, grade it on held-out users, save it as a new version
    and make it current if it meets the goals (see --gate)."""
    params = model.TrainParams(traffic=generator.Traffic(users=users, seed=seed))
    directory = _dir(model_dir)
    with _progress(as_json) as progress:
        task = progress.add_task("training", total=None)
        try:
            m = model.train(params, progress=lambda stage: progress.update(task, description=stage))
        except model.NoThreshold as e:
            if as_json:
                typer.echo(json.dumps({"version": None, "published": False, "error": str(e)}))
            err.print(f"[red]{e}[/red]; nothing saved", soft_wrap=True)
            raise typer.Exit(EXIT_REFUSED) from e
        held = m.meta["held_out"]
        misses = model.shortfalls(model.Evaluation.from_json(held))
        publish = not (gate and misses)
        progress.update(task, description="saving")
        before = model.current_version(directory)
        path = model.save(m, directory, make_current=publish)
    if as_json:
        typer.echo(json.dumps({"version": m.version, "path": str(path), "published": publish,
                               "current": m.version if publish else before,
                               "goals": dataclasses.asdict(model.GOALS),
                               "shortfalls": [dataclasses.asdict(x) for x in misses],
                               "training_s": m.meta["training_s"], "sizes": m.meta["sizes"],
                               **held}))  # fmt: skip
    else:
        what = "and made current" if publish else "but NOT made current"
        console.print(f"[bold]{m.version}[/bold] saved to {path} {what} "
                      f"(trained in {m.meta['training_s']:.1f} s)")  # fmt: skip
        sizes = m.meta["sizes"]
        console.print(", ".join(f"{k}: {v['users']} users, {v['rows']} likes ({v['bots']} bots')"
                                for k, v in sizes.items()))  # fmt: skip
        console.print(_metrics_table(held))
    if misses:
        below = "; ".join(str(x) for x in misses)
        if publish:  # --no-gate
            err.print(f"[yellow]published without the gate: held-out {below}[/yellow]")
        else:
            err.print(f"[red]{m.version} not published: held-out {below}[/red]; current stays "
                      f"{before or 'none'}", soft_wrap=True)  # fmt: skip
            raise typer.Exit(EXIT_REFUSED)


@app.command()
def evaluate(
    version: Annotated[str | None, typer.Option(help="a saved version (default: current)")] = None,
    model_dir: Path | None = ModelDirOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Grade a saved model again on the held-out users of its own training run: precision,
    recall and ROC AUC at its threshold, its false positives and negatives (likes), and its
    calibration."""
    m = _load(_dir(model_dir), version)
    with _progress(as_json) as progress:
        progress.add_task("generating the held-out users' likes again", total=None)
        started = time.monotonic()
        ds = model.held_out(m)
        ev = model.evaluate(m, ds).to_json()
    out = {"version": m.version, **ev, "held_out_users": len(set(ds.users.tolist())),
           "training_s": m.meta.get("training_s"),
           "evaluation_s": round(time.monotonic() - started, 2)}  # fmt: skip
    if as_json:
        typer.echo(json.dumps(out))
        return
    console.print(f"[bold]{m.version}[/bold]: {out['held_out_users']} held-out users")
    console.print(_metrics_table(out))
    console.print(_calibration_table(out))


@app.command()
def models(model_dir: Path | None = ModelDirOpt, as_json: bool = JsonOpt) -> None:
    """The saved versions, oldest first, and which one is current (the one the server loads)."""
    directory = _dir(model_dir)
    current = model.current_version(directory)
    rows = []
    for meta in model.versions(directory):
        held = meta.get("held_out", {})
        rows.append({"version": meta.get("version"), "current": meta.get("version") == current,
                     "trained_at": meta.get("trained_at"), "threshold": meta.get("threshold"),
                     **{k: held.get(k) for k in ("precision", "recall", "roc_auc")},
                     "users": meta.get("params", {}).get("traffic", {}).get("users"),
                     "seed": meta.get("params", {}).get("traffic", {}).get("seed")})  # fmt: skip
    if as_json:
        typer.echo(json.dumps({"model_dir": str(directory), "current": current, "versions": rows}))
        return
    if not rows:
        console.print(f"no abuse models in {directory}: `likes abuse train` makes one")
        return
    t = Table(title=str(directory), caption="P, R, AUC: on its held-out users; * current")
    t.add_column("", no_wrap=True)
    t.add_column("version", no_wrap=True)
    for name in ("threshold", "P", "R", "AUC", "users"):
        t.add_column(name, no_wrap=True)
    for r in rows:
        t.add_row("*" if r["current"] else "", r["version"],
                  *(f"{r[k]:.3f}" if isinstance(r[k], int | float) else "-"
                    for k in ("threshold", "precision", "recall", "roc_auc")),
                  str(r["users"]))  # fmt: skip
    console.print(t)
    if current is None:
        console.print("[yellow]no version is current: the model server serves none[/yellow]")


@app.command()
def use(
    version: str = typer.Argument(
        ..., help="the saved version to serve (see `likes abuse models`)"
    ),
    model_dir: Path | None = ModelDirOpt,
    yes: bool = typer.Option(False, "--yes", "-y", help="do not ask for confirmation"),
    as_json: bool = JsonOpt,
) -> None:
    """Make VERSION the current model: the model servers load it within their reload interval.

    The rollback of a bad model deploy: `use` the previous version first, then `unvoid` the bad
    one's voids (the scorer would otherwise void the same likes again on a replay)."""
    directory = _dir(model_dir)
    before = model.current_version(directory)
    if not (directory / version).is_dir():
        known = ", ".join(str(v.get("version")) for v in model.versions(directory)) or "none"
        err.print(f"[red]no abuse model {version} in {directory}[/red] (saved: {known})")
        raise typer.Exit(EXIT_ERROR)
    if not yes and not typer.confirm(f"Serve abuse model {version} (now {before})?"):
        raise typer.Abort()
    try:
        model.set_current(directory, version)
    except model.NoModel as e:
        err.print(f"[red]{e}[/red]")
        raise typer.Exit(EXIT_ERROR) from e
    audit.record("abuse use", {"version": version, "model_dir": str(directory)}, "ok",
                 {"before": before})  # fmt: skip
    if as_json:
        typer.echo(json.dumps({"current": version, "before": before}))
    else:
        console.print(f"current abuse model: {version} (was {before})")


@app.command()
def restore(
    users: Annotated[list[str], typer.Argument(help="the user ids to restore")],
    yes: bool = typer.Option(False, "--yes", "-y", help="do not ask for confirmation"),
    as_json: bool = JsonOpt,
) -> None:
    """Lift the degradation of USERS (services/contracts/degrade.py): their likes are admitted at
    once again. For humans a storm caught (a bad model, a shared network); the scorer degrades
    an account again if its likes keep being voided."""
    from redis.exceptions import RedisError

    from services.contracts import clients, degrade

    try:
        settings = stack_settings.platform_settings()
    except (ValueError, stack_settings.NoSettings) as e:
        err.print(f"[red]{e}[/red]")
        raise typer.Exit(EXIT_ERROR) from e
    if not yes and not typer.confirm(f"Lift the degradation of {len(users)} account(s)?"):
        raise typer.Abort()
    rc = clients.idem_store(settings, timeout=2.0)
    try:
        lifted = {user: degrade.restore(rc, user) for user in users}
    except RedisError as e:
        err.print(f"[red]the idem-store did not answer: {e}[/red]")
        raise typer.Exit(EXIT_ERROR) from e
    finally:
        rc.close()
    restored = [u for u, was in lifted.items() if was]
    audit.record("abuse restore", {"users": users}, "ok", {"restored": restored})
    if as_json:
        typer.echo(
            json.dumps(
                {"restored": restored, "not_degraded": [u for u in users if u not in restored]}
            )
        )
        return
    for user, was in lifted.items():
        console.print(f"{user}: {'restored' if was else 'was not degraded'}")
