"""`likes runbook list|show|diagnose`: the runbooks of runbooks/, and their read-only checks run.

A runbook is Markdown with YAML front matter: `alerts` (the alerts it answers, single-sourced with
infra/alert_rules.py by tests/infra/test_alert_rules.py) and `diagnose`, a list of checks, each

    check: what it asks                    (shown with the reading)
    promql: the query                      (`${metrics.NAME}`, `${rules.NAME}`, `${kafka.NAME}`
                                            name constants of services/contracts/metrics.py,
                                            infra/alert_rules.py, services/contracts/kafka.py:
                                            a renamed metric or a changed threshold changes the
                                            runbook too)
    trouble: "> 60"                        (a sample compared so is trouble; else ok)
    reading: "{instance}: {value:.0f} s"   (a trouble sample in words: its labels and value;
                                            an ok sample is shown raw)
    when_empty: ok | trouble | no data     (what no sample means; default "no data")

and `mitigate`, a list of steps, each

    step: what it does and when to take it
    run: likes flags set writes-readonly on  (a `likes` command; `{name}` placeholders are
                                              filled with `--arg name=value`)
    mutates: true | false                    (a mutating step asks first, and is audited)

then `escalate` (when, and to whom) and `links` (paths in this repository or URLs).

`diagnose` runs every check against Prometheus and prints each reading with its verdict: ok,
trouble, no data, or error (the query failed). Without ALERT it diagnoses what `likes alerts`
shows firing. `run ALERT --step N` runs mitigation N: a mutating one after a confirmation (--yes
skips it; the command then runs with --yes), with an audit record of the step and its exit
status (the command writes its own too). Addresses default to the local stack (LIKES_HOME /
LIKES_PORT_OFFSET), whose queries get its rules' time scale (local/observability_transforms.py,
transform 6).
"""

from __future__ import annotations

import json
import operator
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import httpx
import typer
import yaml
from rich.console import Console
from rich.markdown import Markdown
from rich.table import Table

REPO = Path(__file__).resolve().parent.parent
RUNBOOK_DIR = REPO / "runbooks"
VERDICTS = ("ok", "trouble", "no data", "error")
_EMPTY = ("ok", "trouble", "no data")
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
# commands that change the platform: a step running one must say `mutates: true` (and the reverse)
MUTATING = (
    ("flags", "set"), ("flags", "unset"), ("dlq", "replay"), ("hotkeys", "split"),
    ("hotkeys", "unsplit"), ("recount", "--repair"), ("local", "stop"), ("local", "up"),
    ("abuse", "unvoid"), ("abuse", "use"), ("abuse", "restore"),
)  # fmt: skip
_CONSTANT = re.compile(r"\$\{(metrics|rules|kafka)\.([A-Z][A-Z0-9_]*)\}")
_TROUBLE = re.compile(r"^\s*(>=|<=|==|!=|>|<)\s*(-?[0-9.eE+-]+)\s*$")
_OPS = {">": operator.gt, "<": operator.lt, ">=": operator.ge, "<=": operator.le,
        "==": operator.eq, "!=": operator.ne}  # fmt: skip

app = typer.Typer(
    help="The on-call runbooks: list them, read one, run its checks, carry out its mitigations."
)
console = Console()
err = Console(stderr=True)


class RunbookError(Exception):
    """A runbook file that does not say what a runbook must (names the file and the field)."""


@dataclass(frozen=True)
class Check:
    check: str
    promql: str
    trouble: str
    reading: str
    when_empty: str = "no data"

    def is_trouble(self, value: float) -> bool:
        m = _TROUBLE.match(self.trouble)
        assert m is not None  # checked when loaded
        return bool(_OPS[m.group(1)](value, float(m.group(2))))


@dataclass(frozen=True)
class Step:
    step: str
    run: str
    mutates: bool

    @property
    def placeholders(self) -> list[str]:
        return _PLACEHOLDER.findall(self.run)

    def argv(self, values: dict[str, str]) -> list[str]:
        """The command's arguments after `likes`, placeholders filled; KeyError names one
        without a value."""
        words = shlex.split(self.run)[1:]
        return [_PLACEHOLDER.sub(lambda m: values[m.group(1)], w) for w in words]


@dataclass(frozen=True)
class Runbook:
    slug: str
    path: Path
    alerts: tuple[str, ...]
    checks: tuple[Check, ...] = field(default=())
    body: str = ""
    mitigations: tuple[Step, ...] = field(default=())
    escalate: str = ""
    links: tuple[str, ...] = field(default=())


def _constant(kind: str, name: str, where: str) -> str:
    from infra import alert_rules
    from services.contracts import kafka, metrics

    module = {"metrics": metrics, "rules": alert_rules, "kafka": kafka}[kind]
    value = getattr(module, name, None)
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise RunbookError(f"{where}: ${{{kind}.{name}}} names no constant of {module.__name__}")
    return str(value)


def _expand(text: str, where: str) -> str:
    return _CONSTANT.sub(lambda m: _constant(m.group(1), m.group(2), where), text)


def load(path: Path) -> Runbook:
    """One runbook file, its checks' constants filled in; RunbookError names what is wrong."""
    parts = path.read_text().split("---\n", 2)
    if len(parts) != 3 or parts[0].strip():
        raise RunbookError(f"{path.name}: no front matter between two '---' lines")
    front = yaml.safe_load(parts[1]) or {}
    alerts = front.get("alerts")
    if not isinstance(alerts, list) or not alerts or not all(isinstance(a, str) for a in alerts):
        raise RunbookError(f"{path.name}: `alerts` must be a non-empty list of alert names")
    checks = []
    for i, raw in enumerate(front.get("diagnose") or [], 1):
        where = f"{path.name}: diagnose step {i}"
        if not isinstance(raw, dict):
            raise RunbookError(f"{where}: not a mapping")
        missing = {"check", "promql", "trouble", "reading"} - set(raw)
        unknown = set(raw) - {"check", "promql", "trouble", "reading", "when_empty"}
        if missing or unknown:
            raise RunbookError(f"{where}: missing {sorted(missing)}, unknown {sorted(unknown)}")
        c = Check(
            check=str(raw["check"]),
            promql=_expand(str(raw["promql"]), where),
            trouble=_expand(str(raw["trouble"]), where),
            reading=_expand(str(raw["reading"]), where),
            when_empty=str(raw.get("when_empty", "no data")),
        )
        if not _TROUBLE.match(c.trouble):
            raise RunbookError(f"{where}: trouble {c.trouble!r} is not like '> 60'")
        if c.when_empty not in _EMPTY:
            raise RunbookError(f"{where}: when_empty must be one of {', '.join(_EMPTY)}")
        checks.append(c)
    steps = []
    for i, raw in enumerate(front.get("mitigate") or [], 1):
        where = f"{path.name}: mitigate step {i}"
        if not isinstance(raw, dict) or set(raw) != {"step", "run", "mutates"}:
            raise RunbookError(f"{where}: needs exactly step, run and mutates")
        step = Step(str(raw["step"]), str(raw["run"]), bool(raw["mutates"]))
        if not step.run.startswith("likes "):
            raise RunbookError(f"{where}: run {step.run!r} is not a `likes` command")
        if step.mutates != is_mutating(step.run):
            raise RunbookError(f"{where}: {step.run!r} is marked mutates: {step.mutates}")
        steps.append(step)
    links = front.get("links") or []
    if not isinstance(links, list) or not all(isinstance(link, str) for link in links):
        raise RunbookError(f"{path.name}: `links` must be a list of paths or URLs")
    return Runbook(path.stem, path, tuple(alerts), tuple(checks), parts[2], tuple(steps),
                   str(front.get("escalate") or "").strip(), tuple(links))  # fmt: skip


def is_mutating(run: str) -> bool:
    """Whether a `likes ...` command line changes the platform (MUTATING)."""
    words = shlex.split(run)[1:]
    for command, word in MUTATING:
        if words[:1] == [command] and (
            words[1:2] == [word] or (word.startswith("--") and word in words)
        ):
            return True
    return False


def all_runbooks(directory: Path = RUNBOOK_DIR) -> list[Runbook]:
    return [load(p) for p in sorted(directory.glob("*.md"))]


def for_alert(alert: str, directory: Path = RUNBOOK_DIR) -> Runbook:
    for rb in all_runbooks(directory):
        if alert in rb.alerts:
            return rb
    raise RunbookError(f"no runbook answers the alert {alert!r} (see `likes runbook list`)")


def _raw(labels: dict[str, str], value: float) -> str:
    shown = ", ".join(f"{k}={v}" for k, v in sorted(labels.items()) if k != "__name__")
    return f"{value:g} ({shown})" if shown else f"{value:g}"


def _reading(c: Check, labels: dict[str, str], value: float) -> str:
    """A trouble sample in the runbook's words; the raw sample if they name a missing label."""
    try:
        return c.reading.format(value=value, **labels)
    except (KeyError, IndexError, ValueError):
        return _raw(labels, value)


def run_check(
    c: Check, prometheus: str, localize: Callable[[str], str] = lambda q: q
) -> dict[str, Any]:
    """One check against Prometheus: its verdict and readings (the trouble ones, or all).
    `localize`: the query as the local stack runs it (its ranges time-scaled)."""
    query = localize(c.promql)
    out: dict[str, Any] = {"check": c.check, "promql": query, "trouble": c.trouble}
    try:
        resp = httpx.get(f"{prometheus}/api/v1/query", params={"query": query}, timeout=15)
        body = resp.json()
        if resp.status_code != 200 or body.get("status") != "success":
            raise ValueError(body.get("error") or f"HTTP {resp.status_code}")
    except (httpx.HTTPError, ValueError) as e:
        return {**out, "verdict": "error", "readings": [f"query failed: {e}"]}
    samples = [
        (s.get("metric", {}), float(s["value"][1]))
        for s in body["data"]["result"]
        if body["data"]["resultType"] == "vector"
    ]
    if not samples:
        return {**out, "verdict": c.when_empty, "readings": ["no series"]}
    bad = [(labels, v) for labels, v in samples if c.is_trouble(v)]
    if bad:
        return {**out, "verdict": "trouble", "readings": [_reading(c, *b) for b in bad]}
    return {**out, "verdict": "ok", "readings": [_raw(*sample) for sample in samples]}


def diagnose_alert(
    alert: str, prometheus: str, localize: Callable[[str], str] = lambda q: q
) -> dict[str, Any]:
    rb = for_alert(alert)
    return {
        "alert": alert,
        "runbook": str(rb.path.relative_to(REPO)),
        "checks": [run_check(c, prometheus, localize) for c in rb.checks],
    }


def _local_prometheus() -> tuple[str, Callable[[str], str]]:
    """The local stack's Prometheus, and its time scale: a check reads the window the local
    alert did (a 15m range there is what 15m is in production)."""
    from local import layout, observability_render
    from local import observability_transforms as transforms

    lay = layout.from_env()
    rendered = observability_render.load(lay.stack).prometheus
    url = f"http://{layout.HOST}:{lay.ports.prometheus}"
    return url, lambda q: transforms.query(q, rendered)


@app.command("list")
def list_(
    as_json: Annotated[bool, typer.Option("--json", help="A JSON list of runbooks.")] = False,
) -> None:
    """Every runbook, the alerts it answers and how many read-only checks it runs.

    --json prints a list of objects with runbook (its path), alerts and checks (a count)."""
    rows: list[dict[str, Any]] = [
        {"runbook": str(rb.path.relative_to(REPO)), "alerts": list(rb.alerts),
         "checks": len(rb.checks)}
        for rb in _loaded()
    ]  # fmt: skip
    if as_json:
        print(json.dumps(rows))
        return
    table = Table("runbook", "alerts", "checks")
    for r in rows:
        table.add_row(r["runbook"], ", ".join(r["alerts"]), str(r["checks"]))
    console.print(table)


@app.command()
def show(
    alert: Annotated[str, typer.Argument(help="An alert name, e.g. AggregatorStalled.")],
) -> None:
    """The runbook of ALERT: what fired, user impact, and the checks `diagnose` runs."""
    rb = _for(alert)
    console.print(Markdown(rb.body))
    if rb.checks:
        console.print("\n[bold]Checks[/bold] (likes runbook diagnose " + alert + ")")
        for i, c in enumerate(rb.checks, 1):
            console.print(f"{i}. {c.check}\n   [dim]{c.promql}[/dim]  trouble when {c.trouble}")
    if rb.mitigations:
        console.print(f"\n[bold]Mitigations[/bold] (likes runbook run {alert} --step N)")
        for i, m in enumerate(rb.mitigations, 1):
            kind = "[red]mutating[/red]" if m.mutates else "read-only"
            console.print(f"{i}. {m.step} ({kind})\n   [dim]{m.run}[/dim]")
    if rb.escalate:
        console.print(f"\n[bold]Escalate[/bold]\n{rb.escalate}")
    if rb.links:
        console.print("\n[bold]Links[/bold]\n" + "\n".join(f"- {link}" for link in rb.links))


def resolve(argv: list[str]) -> tuple[Any, list[str]]:
    """The (click) command a `likes` argument list runs, and the words after its name; KeyError
    names a word that is no command."""
    import typer.main

    from cli.main import app as root

    cmd: Any = typer.main.get_command(root)
    rest = list(argv)
    while hasattr(cmd, "get_command") and rest and not rest[0].startswith("-"):
        sub = cmd.get_command(cmd.context_class(cmd), rest[0])
        if sub is None:
            raise KeyError(rest[0])
        cmd, rest = sub, rest[1:]
    return cmd, rest


@app.command()
def run(
    alert: Annotated[str, typer.Argument(help="An alert name, e.g. DeadLetterDailyGrowth.")],
    step: Annotated[int, typer.Option("--step", help="The mitigation's number (see show).")],
    arg: Annotated[
        list[str] | None,
        typer.Option("--arg", help="NAME=VALUE for a {NAME} placeholder of the step's command"),
    ] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
) -> None:
    """Run mitigation N of ALERT's runbook. A mutating step asks first (--yes skips that and
    passes --yes on), and leaves an audit record of the step and its exit status. Exits with
    the command's status."""
    from cli import audit

    rb = _for(alert)
    if not 1 <= step <= len(rb.mitigations):
        raise typer.BadParameter(
            f"{alert}'s runbook has {len(rb.mitigations)} mitigation(s)", param_hint="--step"
        )
    m = rb.mitigations[step - 1]
    values = {}
    for a in arg or []:
        name, sep, value = a.partition("=")
        if not sep:
            raise typer.BadParameter(f"{a!r} is not NAME=VALUE", param_hint="--arg")
        values[name] = value
    missing = [p for p in m.placeholders if p not in values]
    if missing:
        raise typer.BadParameter(
            f"the step runs `{m.run}`: give " + ", ".join(f"--arg {p}=..." for p in missing),
            param_hint="--arg",
        )
    argv = m.argv(values)
    command, _ = resolve(argv)
    console.print(f"step {step}: {m.step}\n  likes {shlex.join(argv)}")
    if m.mutates:
        if not yes and not typer.confirm("This changes the platform. Run it?"):
            raise typer.Abort()
        if any(p.name == "yes" for p in command.params) and "--yes" not in argv:
            argv.append("--yes")
    code = _invoke(argv)
    if m.mutates:
        record = {"alert": alert, "step": step, "command": "likes " + shlex.join(argv)}
        audit.record("runbook run", record, "ok" if code == 0 else "failed", {"exit": code})
    raise typer.Exit(code)


def _invoke(argv: list[str]) -> int:
    """Run `likes ARGV` (its own process: its output, prompts and exit status are its own)."""
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "cli.main", *argv], cwd=REPO).returncode


@app.command()
def diagnose(
    alert: Annotated[
        str | None, typer.Argument(help="An alert name (default: every alert firing now).")
    ] = None,
    as_json: Annotated[
        bool, typer.Option("--json", help="A JSON list, one object per alert.")
    ] = False,
    prometheus: Annotated[
        str | None,
        typer.Option(help="Prometheus's URL (default: the local stack's, time-scaled)."),
    ] = None,
    alertmanager: Annotated[
        str | None, typer.Option(help="Alertmanager's URL, for the firing alerts.")
    ] = None,
) -> None:
    """Run the read-only checks of ALERT's runbook (or of every firing alert's) and print each
    reading with its verdict: ok, trouble, no data or error.

    --json prints a list of objects with alert, runbook and checks; each check has check,
    promql, trouble, verdict and readings (strings). Exits 1 when a check found trouble."""
    from cli import alerts as alerts_cli

    prom, localize = (prometheus, lambda q: q) if prometheus else _local_prometheus()
    if alert is not None:
        names = [alert]
        _for(alert)  # an unknown alert is a usage error before any query
    else:
        am = alertmanager or alerts_cli._local_urls()[0]
        try:
            firing = alerts_cli.firing(am)
        except httpx.HTTPError as e:
            err.print(f"[red]cannot read firing alerts:[/red] {e} (Alertmanager {am})")
            raise typer.Exit(2) from None
        names = sorted({a["name"] for a in firing if a["state"] == "firing"} - {"Watchdog"})
    results = [diagnose_alert(n, prom, localize) for n in names]
    if as_json:
        print(json.dumps(results))
    elif not results:
        console.print("no alert firing: nothing to diagnose")
    for r in results if not as_json else []:
        console.print(f"[bold]{r['alert']}[/bold]  ({r['runbook']})")
        if not r["checks"]:
            console.print("  this runbook has no checks yet: read it with `likes runbook show`")
        for c in r["checks"]:
            style = {"ok": "green", "trouble": "bold red", "error": "red"}.get(
                c["verdict"], "yellow"
            )
            console.print(f"  [{style}]{c['verdict']:>8}[/]  {c['check']}")
            for line in c["readings"]:
                console.print(f"            {line}")
    if any(c["verdict"] == "trouble" for r in results for c in r["checks"]):
        raise typer.Exit(1)


def _loaded() -> list[Runbook]:
    try:
        return all_runbooks()
    except RunbookError as e:
        err.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from None


def _for(alert: str) -> Runbook:
    try:
        return for_alert(alert)
    except RunbookError as e:
        err.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from None
