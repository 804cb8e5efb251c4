"""`likes chaos`: the game days' failure modes and their experiments (chaos/)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from chaos.k8s import DEFAULT_STACK
from chaos.lanes import MAX_LANES

if TYPE_CHECKING:
    from chaos import lanes as lanes_mod
    from chaos import runner as runner_types

app = typer.Typer(
    help="Game days: the seed's failure modes (chaos/catalog.yaml) and their Chaos Toolkit "
    "experiments, run against the local stack (LIKES_HOME / LIKES_PORT_OFFSET) with real faults.",
    no_args_is_help=True,
)
console, err = Console(), Console(stderr=True)
TARGETS = ("local", "k8s")


@app.command("list")
def list_(
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Every failure mode: its component, whether the local stack can enact it, whether its
    experiment exists yet, and the stack profile it needs (`faults`: Toxiproxy's proxies)."""
    from chaos import catalog

    modes = catalog.modes()
    if json_out:
        print(json.dumps([m.as_dict() for m in modes]))
        return
    t = Table(title=f"failure modes ({sum(m.enactable for m in modes)} of {len(modes)} enactable)")
    for col in ("id", "component", "enactable", "experiment", "profile"):
        t.add_column(col)
    for m in modes:
        t.add_row(m.id, m.component, "yes" if m.enactable else "production-only",
                  "yes" if m.has_experiment else "-", m.profile or "-")  # fmt: skip
    console.print(t)


@app.command()
def run(
    mode_id: Annotated[str, typer.Argument(metavar="ID", help="A mode's id (`likes chaos list`).")],
    target: Annotated[
        str,
        typer.Option(
            help="Where the faults go: `local` (this machine's stack) or `k8s` (the cluster of "
            "the current kube context: the production variant, chaos/k8s.py)."
        ),
    ] = "local",
    stack: Annotated[
        str, typer.Option(help="With --target k8s: the Pulumi stack whose render names the pods.")
    ] = DEFAULT_STACK,
    print_only: Annotated[
        bool,
        typer.Option("--print", help="Print the experiment (Chaos Toolkit JSON) and run nothing."),
    ] = False,
    yes: Annotated[
        bool, typer.Option("--yes", help="With --target k8s: do not ask before deleting pods.")
    ] = False,
    journal_dir: Annotated[
        Path, typer.Option(help="Where the Chaos Toolkit journal is written (<ID>.json).")
    ] = Path("chaos-journals"),
    json_out: Annotated[bool, typer.Option("--json", help="Machine-readable output.")] = False,
) -> None:
    """Run one experiment: traffic through the gateway, the fault, the rollbacks (always), then
    the invariants checked against the stores. Exit 0 when it passed, 1 when it deviated or an
    activity failed, 2 when it cannot run, 130 on Ctrl-C (the traffic stops and the stack is
    rolled back first). Mutates the stack: run it on a stack you can break. A network fault's
    experiment needs the faults profile (Toxiproxy): a stack without it is brought up in it for
    the run and back after.

    With --target k8s it deletes the production pods the local fault stands for (asking first,
    unless --yes) and checks they run again; the users' traffic and the SLO alerts do the rest."""
    from chaos import catalog, runner
    from local import layout

    if target not in TARGETS:
        err.print(f"[red]error:[/] unknown --target {target!r}; supported: {', '.join(TARGETS)}")
        raise typer.Exit(2)
    try:
        experiment = catalog.experiment(mode_id)
        if target == "k8s":
            from chaos import k8s

            experiment = k8s.experiment(mode_id, stack)
    except KeyError as e:
        err.print(f"[red]error:[/] {e.args[0]}")
        raise typer.Exit(2) from None
    except Exception as e:  # k8s.NoVariant, or a stack the program cannot render
        err.print(f"[red]error:[/] no production variant: {e}")
        raise typer.Exit(2) from None
    if print_only:
        print(json.dumps(experiment, indent=2))
        return
    if target == "k8s":
        result = _run_k8s(mode_id, experiment, stack, yes, journal_dir, json_out)
    else:
        if not json_out:
            console.print(f"running {mode_id} against the local stack ... (Ctrl-C rolls back)")
            if runner.needs_faults(mode_id) and not layout.from_env().faults:
                console.print("it needs the faults profile: every server restarts in it now, "
                              "and once more after the run (as the stack was)")  # fmt: skip
        try:
            result = runner.run(mode_id, journal_dir)
        except KeyboardInterrupt:
            err.print(f"[yellow]interrupted:[/] {mode_id}: traffic stopped, stack rolled back")
            raise typer.Exit(130) from None
    if json_out:
        print(json.dumps(result.as_dict(), default=str))
    else:
        colour = {"passed": "green", "deviated": "yellow"}.get(result.verdict, "red")
        console.print(f"{mode_id}: [{colour}]{result.verdict}[/] in {result.duration_s} s "
                      f"(journal {result.journal})")  # fmt: skip
        for name, ok in (result.checks.get("checks") or {}).items():
            console.print(f"  {'ok ' if ok else 'BAD'} {name}")
        if result.failed_activities:
            console.print(f"  failed activities: {', '.join(result.failed_activities)}")
    if result.restore_error:
        _profile_not_restored(False, result.restore_error)
    if result.verdict != "passed" or result.restore_error:
        raise typer.Exit(1)


def _profile_not_restored(faults: bool, error: str) -> None:
    want = "--faults" if faults else "--no-faults"
    err.print(f"[red]error:[/] the stack could not be switched back to the profile it ran "
              f"({error}); `likes local up {want}` brings it back")  # fmt: skip


def _run_k8s(
    mode_id: str,
    experiment: dict[str, object],
    stack: str,
    yes: bool,
    journal_dir: Path,
    json_out: bool,
) -> runner_types.Result:
    from chaos import runner

    faults = [a["name"] for a in experiment["method"]]  # type: ignore[attr-defined]
    what = f"{mode_id} on the cluster of the current kube context ({', '.join(faults)})"
    if not yes:
        if not sys.stdin.isatty():
            err.print(f"[red]error:[/] refusing to run {what} without --yes (no terminal to ask)")
            raise typer.Exit(2)
        if not typer.confirm(f"This deletes production pods: {what}. Go on?", default=False):
            raise typer.Exit(2)
    if not json_out:
        console.print(f"running {what} ...")
    return runner.run_k8s(mode_id, journal_dir, stack)


@app.command()
def gameday(
    only: Annotated[
        list[str] | None,
        typer.Option(help="Run only these experiments (ids, repeated or comma-separated)."),
    ] = None,
    out: Annotated[
        Path, typer.Option(help="Where the journals and the report (Markdown, HTML) go.")
    ] = Path("gameday"),
    json_out: Annotated[bool, typer.Option("--json", help="Print the verdicts as JSON.")] = False,
    lanes: Annotated[
        int,
        typer.Option(
            min=1,
            max=MAX_LANES,
            help="Run the experiments on this many stacks at once. Lane 1 is this stack; each "
            "other lane is a scratch stack of its own (its home beside this one's, its ports "
            "shifted), brought up for the game day and wiped after it. No two experiments share "
            "a stack, so no fault compounds another's. The faults profile's experiments all run "
            "on the last lane; those that judge a rate run last, on this stack, once every "
            "scratch stack is down. On 2 cores, 2.",
        ),
    ] = 1,
    lane_locks: Annotated[
        Path | None,
        typer.Option(hidden=True, help="A lane's: the lanes' shared locks (chaos/lanes.turn)."),
    ] = None,
    restore_profile: Annotated[
        bool,
        typer.Option(hidden=True, help="--no-restore-profile: a scratch lane's, wiped after."),
    ] = True,
) -> None:
    """Run every experiment (or --only some) one after the other against the local stack (or
    on --lanes stacks at once), then write a journal per experiment and one report (report.md
    with plots/, report.html). Exit 0 when all passed, 1 when any deviated or failed, 2 when an
    id is unknown. Ctrl-C stops the traffic, rolls the stacks back and writes the report of
    what ran."""
    from chaos import catalog, report, runner
    from chaos import lanes as lanes_
    from local import layout

    runnable = [m.id for m in catalog.modes() if m.enactable and m.has_experiment]
    wanted = [i.strip() for o in only or [] for i in o.split(",") if i.strip()]
    unknown = sorted(set(wanted) - set(runnable))
    if unknown:
        err.print(f"[red]error:[/] no experiment for {', '.join(unknown)}; "
                  f"runnable: {', '.join(runnable)}")  # fmt: skip
        raise typer.Exit(2)
    # the faults profile's experiments last: the stack switches to it once (a restart of every
    # server) and back to what it was at the end
    ids = sorted((i for i in runnable if not wanted or i in wanted), key=runner.needs_faults)
    alone = catalog.alone()
    if lanes > 1:
        _gameday_in_lanes(ids, lanes, out, json_out)
        return
    found = layout.from_env().faults
    results: list[runner.Result] = []
    interrupted = False
    try:
        for n, mode_id in enumerate(ids, 1):
            if not json_out:
                if runner.needs_faults(mode_id) and not layout.from_env().faults:
                    console.print("switching to the faults profile (every server restarts)")
                console.print(f"[{n}/{len(ids)}] {mode_id} ...")
            try:
                with lanes_.turn(lane_locks, mode_id in alone):
                    r = runner.run(mode_id, out / "journals", restore_profile=False)
            except runner.Interrupted as stopped:
                results.append(stopped.result)  # the report shows it, verdict failed
                raise
            results.append(r)
            if not json_out:
                colour = {"passed": "green", "deviated": "yellow"}.get(r.verdict, "red")
                console.print(f"      [{colour}]{r.verdict}[/] in {r.duration_s} s")
    except KeyboardInterrupt:
        interrupted = True
        err.print("[yellow]interrupted:[/] traffic stopped, stack rolled back; reporting what ran")
    finally:
        restore_error = None
        if restore_profile and layout.from_env().faults != found:
            if not json_out:
                way = "back to" if found else "out of"
                console.print(f"switching the stack {way} the faults profile")
            restore_error = runner.switch_profile(found)
    md, page = report.write(results, out)
    if json_out:
        print(json.dumps({**report.summary(results), "report": str(md), "html": str(page)}))
    else:
        console.print(f"report: {md} and {page}")
    if restore_error:
        _profile_not_restored(found, restore_error)
    if interrupted:
        raise typer.Exit(130)
    if restore_error or any(r.verdict != "passed" for r in results):
        raise typer.Exit(1)


def _gameday_in_lanes(ids: list[str], n: int, out: Path, json_out: bool) -> None:
    """`gameday --lanes N` (chaos/lanes.py): each lane's game day is a `likes chaos gameday
    --only` process on its own stack, its output prefixed with its lane; the report merges
    their journals. The lanes run in sessions of their own, so a Ctrl-C here reaches each
    exactly once (forwarded): a second one landing in a lane's rollback would cut it short."""
    import os
    import signal
    import subprocess
    import threading
    import time

    from chaos import lanes as lanes_
    from chaos import report
    from local import layout

    base = layout.from_env()
    est = {i: lanes_.estimate_s(i) for i in ids}
    plan = lanes_.plan(ids, n, base.home, base.ports.offset, est)
    # before lane 1's traffic opens its connections: one of them could take a scratch lane's
    # Kafka port (local/ephemeral.py); each lane's `up` reserves its own again
    for lane in plan:
        if lane.scratch:
            unreserved = lanes_.reserve_ports(lane)
            if unreserved and not json_out:
                err.print(f"[yellow]warning:[/] lane {lane.label}: {unreserved}")
    if not json_out:
        t = Table(title=f"{len(ids)} experiments on {len(plan)} lanes, expected "
                        f"~{lanes_.expected_end_s(plan, est) / 60:.0f} min")  # fmt: skip
        for col in ("lane", "stack", "ports +", "experiments", "expected"):
            t.add_column(col)
        for lane in plan:
            t.add_row(lane.label, str(lane.home) + (" (scratch)" if lane.scratch else ""),
                      str(lane.offset), str(len(lane.ids)),
                      f"{sum(est[i] for i in lane.ids) / 60:.1f} min")  # fmt: skip
        console.print(t)
    started = time.monotonic()
    failures: dict[int, str] = {}
    running: dict[str, subprocess.Popen[str]] = {}
    exits: dict[str, int | None] = {}
    stopping = threading.Event()

    def say(lane: lanes_.Lane, line: str) -> None:
        if not json_out:
            console.print(f"lane {lane.label} | {line}", markup=False, highlight=False)

    def spawn(lane: lanes_.Lane, argv: list[str]) -> subprocess.Popen[str]:
        proc = subprocess.Popen(
            argv, env=lane.env(os.environ), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True, start_new_session=True,
        )  # fmt: skip
        running[lane.label] = proc
        return proc

    def run_lane(lane: lanes_.Lane) -> None:
        try:
            if lane.scratch:
                say(lane, f"bringing its stack up ({lane.home}, ports +{lane.offset})")
                with lanes_.turn(lanes_.locks(out), alone=False):  # a load as an experiment is
                    up = spawn(lane, lanes_.up_command(base.tls))
                    output, _ = up.communicate()
                if up.returncode != 0:
                    kept = _keep_start_logs(lane, out, output)  # the stack is wiped below
                    tail = " / ".join(output.strip().splitlines()[-3:])
                    failures[lane.number] = (
                        f"lane {lane.number}'s stack did not start (its output and server logs "
                        f"are in {kept}): {tail}"
                    )
                    say(lane, failures[lane.number])
                    return
            if stopping.is_set():
                return
            proc = spawn(lane, lanes_.command(lane, out))
            assert proc.stdout is not None
            for line in proc.stdout:
                say(lane, line.rstrip())
            exits[lane.label] = proc.wait()
        finally:
            if lane.scratch:
                say(lane, "taking its stack down (wiped)")
                subprocess.run(lanes_.down_command(), env=lane.env(os.environ),
                               capture_output=True, timeout=300)  # fmt: skip

    def run_side_by_side(chosen: list[lanes_.Lane]) -> None:
        threads = [threading.Thread(target=run_lane, args=(lane,), daemon=True) for lane in chosen]
        for th in threads:
            th.start()
        while any(th.is_alive() for th in threads):
            try:
                for th in threads:
                    th.join(0.5)
            except KeyboardInterrupt:
                if not stopping.is_set():
                    stopping.set()
                    err.print("[yellow]interrupted:[/] every lane stops its traffic and rolls "
                              "back; scratch stacks are taken down")  # fmt: skip
                    for proc in list(running.values()):
                        if proc.poll() is None:
                            proc.send_signal(signal.SIGINT)

    # the lanes side by side; then, with every scratch stack down, the experiments run alone
    run_side_by_side([lane for lane in plan if not lane.tail])
    for lane in plan:
        if lane.tail and not stopping.is_set():
            run_side_by_side([lane])
    interrupted = stopping.is_set()
    results = [r for lane in plan
               for r in lanes_.results(lane, lane.folder(out) / "journals",
                                       failures.get(lane.number))]  # fmt: skip
    order = {i: k for k, i in enumerate(ids)}
    results.sort(key=lambda r: order[r.id])
    md, page = report.write(results, out)
    took = round(time.monotonic() - started, 1)
    if json_out:
        lanes_out = [{"lane": lane.number, "alone": lane.tail, "home": str(lane.home),
                      "offset": lane.offset, "ids": list(lane.ids), "exit": exits.get(lane.label),
                      "failure": failures.get(lane.number)} for lane in plan]  # fmt: skip
        print(json.dumps({**report.summary(results), "duration_s": took, "lanes": lanes_out,
                          "report": str(md), "html": str(page)}))  # fmt: skip
    else:
        passed = sum(r.verdict == "passed" for r in results)
        console.print(f"{passed} of {len(results)} passed in {took / 60:.1f} min; "
                      f"report: {md} and {page}")  # fmt: skip
    if interrupted:
        raise typer.Exit(130)
    if any(r.verdict != "passed" for r in results):
        raise typer.Exit(1)


def _keep_start_logs(lane: lanes_mod.Lane, out: Path, output: str) -> Path:
    """A scratch lane whose stack did not start: `up`'s output and the stack's server logs,
    copied into the lane's folder of the game day before the stack is wiped."""
    import shutil

    from local import layout

    kept = lane.folder(out) / "stack-start"
    kept.mkdir(parents=True, exist_ok=True)
    (kept / "up.log").write_text(output)
    logs = layout.Layout(home=lane.home, ports=layout.Ports(lane.offset)).logs
    if logs.is_dir():
        shutil.copytree(logs, kept / "logs", dirs_exist_ok=True)
    return kept
