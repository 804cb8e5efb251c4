"""`likes local ...`: bring the local stack up and down, and look at it."""

from __future__ import annotations

import json
import shutil
import sys
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.panel import Panel
from rich.progress import Progress, SpinnerColumn, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from local import components, ephemeral, layout, rendered, supervisor, transforms
from local.components.base import MissingBinary
from local.maven import MavenError

app = typer.Typer(help="The whole data plane on this machine, real servers on loopback.")
console = Console()
err = Console(stderr=True)


def _supervisor(
    kafka_brokers: int | None = None,
    stack: str | None = None,
    strict: bool = False,
    tls: bool | None = None,
    faults: bool | None = None,
) -> supervisor.Supervisor:
    lay = layout.from_env(kafka_brokers, stack, tls, faults)
    return supervisor.Supervisor(lay, components.build(lay, strict=strict))


def _status_table(status: dict[str, dict[str, object]]) -> Table:
    t = Table(title="local stack")
    for col in ("component", "address", "pid", "healthy"):
        t.add_column(col)
    for name, s in status.items():
        healthy = "[green]yes[/]" if s["healthy"] else "[red]no[/]"
        t.add_row(name, str(s["address"]), str(s["pid"] or "-"), healthy)
    return t


def _fail(e: BaseException) -> typer.Exit:
    if isinstance(e, supervisor.StartError):
        body = f"[bold]{e.reason}[/]"
        if e.log_tail:
            body += f"\n\n[dim]last lines of its log:[/]\n{e.log_tail}"
        body += f"\n\n[dim]full log: likes local logs {e.name}[/]"
        err.print(Panel(body, title=f"[red]{e.name} did not start", border_style="red"))
    else:
        err.print(f"[red]error:[/] {e}")
    return typer.Exit(1)


@app.command()
def up(
    kafka_brokers: Annotated[
        int | None,
        typer.Option(help="Kafka brokers: 3 (production settings: RF 3, min ISR 2) or 1 (quick)."),
    ] = None,
    only: Annotated[
        list[str] | None, typer.Option(help="Start only these components (and nothing else).")
    ] = None,
    stack: Annotated[
        str | None,
        typer.Option(
            help="The Pulumi stack whose rendered workloads run (default staging; another "
            "stack gets its own data folder, .stack-<name>)."
        ),
    ] = None,
    tls: Annotated[
        bool | None,
        typer.Option(
            "--tls/--no-tls",
            help="The TLS profile: etcd, Kafka, Cassandra and the schema registry serve TLS "
            "from a CA made at the first start (<stack home>/tls), as the program's servers "
            "do, and every client verifies them. Default: what the stack was last started "
            "with (plaintext for a new one).",
        ),
    ] = None,
    faults: Annotated[
        bool | None,
        typer.Option(
            "--faults/--no-faults",
            help="The game days' network profile: every Redis Cluster node, Kafka broker and "
            "the Cassandra node is reached through its own Toxiproxy proxy, which the servers "
            "announce, so `likes chaos` can add latency or cut a node off. Default: what the "
            "stack was last started with (off for a new one); benchmarks run without it.",
        ),
    ] = None,
    json_out: Annotated[
        bool, typer.Option("--json", help="Print the final status as JSON.")
    ] = False,
) -> None:
    """Render the stack's Pulumi program (under mocks, cached), start every server that is not
    running from what it renders, wait until each answers, print the status.

    The status printed (and the exit code) is one last probe of every server, the same one
    `likes local status` makes; a server that stopped answering after it was waited for is waited
    for again, up to its start timeout. Idempotent: a second `up` starts nothing."""
    lay = layout.from_env(stack=stack)
    recorded_stack = layout.recorded_stack(lay.home)
    if stack is not None and recorded_stack is not None and recorded_stack != stack:
        err.print(
            f"[red]error:[/] this stack ({lay.home}) runs the {recorded_stack} render; "
            "run `likes local down --wipe` first, or set LIKES_HOME to another folder"
        )
        raise typer.Exit(2)
    recorded = layout.recorded_brokers(lay.home)
    if kafka_brokers is not None and kafka_brokers not in (1, 3):
        err.print("[red]error:[/] --kafka-brokers must be 1 or 3")
        raise typer.Exit(2)
    if kafka_brokers is not None and recorded is not None and recorded != kafka_brokers:
        err.print(
            f"[red]error:[/] this stack ({lay.home}) was created with {recorded} Kafka broker(s); "
            "run `likes local down --wipe` before changing --kafka-brokers"
        )
        raise typer.Exit(2)
    recorded_tls = layout.recorded_tls(lay.home)
    changes_tls = tls is not None and recorded_tls is not None and tls != recorded_tls
    if changes_tls and _supervisor(stack=lay.stack).running():
        was, now = ("TLS", "plaintext") if recorded_tls else ("plaintext", "TLS")
        err.print(
            f"[red]error:[/] this stack ({lay.home}) is running {was}; "
            f"run `likes local down` before starting it {now}"
        )
        raise typer.Exit(2)
    recorded_faults = layout.recorded_faults(lay.home)
    if (
        faults is not None
        and faults != bool(recorded_faults)
        and _supervisor(stack=lay.stack).running()
    ):
        err.print(
            f"[red]error:[/] this stack ({lay.home}) is running "
            f"{'with' if recorded_faults else 'without'} the faults profile; "
            f"run `likes local down` before starting it {'with' if faults else 'without'} it"
        )
        raise typer.Exit(2)
    if not rendered.cache_path(lay.stack).exists():
        console.print(f"rendering the {lay.stack} stack of the Pulumi program (mocks)…")
    try:
        sup = _supervisor(kafka_brokers or recorded, lay.stack, strict=True, tls=tls, faults=faults)
    except transforms.Disagreement as e:
        err.print(
            f"[red]error:[/] the program and the code disagree: workload [bold]{e.workload}[/], "
            f"{e.field}: {e.problem}"
        )
        raise typer.Exit(1) from None
    except rendered.RenderError as e:
        err.print(f"[red]error:[/] {e}")
        raise typer.Exit(1) from None
    layout.record_profile(sup.layout)
    _, unreserved = ephemeral.reserve(sup.layout.ports.every())
    if unreserved:
        err.print(f"[yellow]warning:[/] {unreserved}")
    unknown = sorted(set(only or ()) - set(sup.components))
    if unknown:
        err.print(f"[red]error:[/] unknown component(s) {unknown}; known: {list(sup.components)}")
        raise typer.Exit(2)
    t0 = time.monotonic()
    scope = [n for n, (c, _s) in sup.all_servers().items() if not only or c.name in only]
    try:
        started, status = _run_with_progress(sup, only, scope)
    except (supervisor.StartError, MavenError, rendered.RenderError, MissingBinary) as e:
        raise _fail(e) from None
    if json_out:
        print(json.dumps(status))
    else:
        console.print(_status_table(status))
        took = time.monotonic() - t0
        if started:
            console.print(f"started {len(started)} server(s) in {took:.1f}s")
        else:
            console.print("everything was already running; nothing changed")
    if not all(status[n]["healthy"] for n in scope):
        raise typer.Exit(1)


def _run_with_progress(
    sup: supervisor.Supervisor, only: list[str] | None, scope: list[str]
) -> tuple[list[str], dict[str, dict[str, object]]]:
    """Start what is missing, then settle: the status to print is the last probe of all."""
    if not console.is_terminal:
        t0 = time.monotonic()

        def line(name: str, msg: str) -> None:
            console.print(f"[{time.monotonic() - t0:6.1f}s] {name}: {msg}", highlight=False)

        return sup.up(line, only), sup.settle(scope, line)
    with Progress(
        SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(), console=console
    ) as progress:
        tasks: dict[str, TaskID] = {}

        def report(name: str, msg: str) -> None:
            if name not in tasks:
                tasks[name] = progress.add_task(name, total=1)
            done = msg in ("ready", "failed")
            progress.update(tasks[name], description=f"{name}: {msg}", completed=1 if done else 0)

        return sup.up(report, only), sup.settle(scope, report)


@app.command()
def down(
    wipe: Annotated[
        bool, typer.Option(help="Also delete the stack's data, configs and logs.")
    ] = False,
) -> None:
    """Stop exactly the processes `up` started (by pid), dependents first."""
    sup = _supervisor()

    def report(name: str, msg: str) -> None:
        console.print(f"{name}: {msg}", highlight=False)

    stopped = sup.down(report)
    console.print(f"stopped {len(stopped)} server(s)")
    if wipe and sup.layout.home.exists():
        shutil.rmtree(sup.layout.home)
        console.print(f"removed {sup.layout.home}")


@app.command()
def status(
    json_out: Annotated[
        bool, typer.Option("--json", help="One JSON object: name -> state.")
    ] = False,
) -> None:
    """Each server's address, pid and whether it answers a real request now."""
    st = _supervisor().status()
    if json_out:
        print(json.dumps(st))
    else:
        console.print(_status_table(st))


@app.command()
def logs(
    name: Annotated[str, typer.Argument(help="Server name, as `likes local status` lists it.")],
    lines: Annotated[int, typer.Option("-n", "--lines", help="How many lines from the end.")] = 50,
    follow: Annotated[
        bool, typer.Option("-f", "--follow", help="Keep printing new lines.")
    ] = False,
) -> None:
    """Show a server's log."""
    sup = _supervisor()
    if name not in sup.all_servers():
        err.print(f"[red]error:[/] no server named {name!r}; known: {list(sup.all_servers())}")
        raise typer.Exit(2)
    path = sup.layout.log_file(name)
    if not path.exists():
        err.print(f"[yellow]{name} has no log yet ({path})[/]")
        raise typer.Exit(1)
    sys.stdout.write(supervisor.tail(path, lines) + "\n")
    if follow:
        with path.open("rb") as f:
            f.seek(0, 2)
            try:
                while True:
                    chunk = f.read()
                    if chunk:
                        sys.stdout.write(chunk.decode(errors="replace"))
                        sys.stdout.flush()
                    else:
                        time.sleep(0.3)
            except KeyboardInterrupt:
                pass


@app.command()
def stop(
    name: Annotated[
        str,
        typer.Argument(
            help="Server name, as `likes local status` lists it, or a component "
            "(e.g. idem-store: all its nodes)."
        ),
    ],
    kill: Annotated[
        bool, typer.Option("--kill", help="SIGKILL, no clean shutdown (drills).")
    ] = False,
) -> None:
    """Stop one server, or every server of a component (`likes local up` starts them again)."""
    sup = _supervisor()
    servers = sup.all_servers()
    if name in servers:
        names = [name]
    elif name in sup.components:
        names = [s.name for s in sup.components[name].servers()]
    else:
        err.print(
            f"[red]error:[/] no server or component named {name!r}; "
            f"servers: {list(servers)}; components: {list(sup.components)}"
        )
        raise typer.Exit(2)
    for n in names:
        was = sup.kill(n) if kill else sup.stop(n)
        console.print(f"{n}: {'stopped' if was else 'was not running'}")


@app.command()
def token(
    user_id: Annotated[str, typer.Argument(help="The user the token speaks for (its `sub`).")],
    ttl: Annotated[int, typer.Option(help="Validity in seconds.")] = 3600,
) -> None:
    """Print a bearer token (RS256) signed by the stack's local identity provider, with the
    issuer and audience the stack's render requires, e.g. for curl:

    curl -H "Authorization: Bearer $(likes local token alice)" ...
    """
    print(transforms.sign_token(layout.from_env(), user_id, ttl_s=ttl))


@app.command()
def demo(
    users: Annotated[int, typer.Option(help="Distinct users liking.")] = 40,
    posts: Annotated[
        int, typer.Option(help="Posts they like (Zipf-ish: early posts get more).")
    ] = 5,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for counts to converge.")] = 60,
    json_out: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Drive a short burst of real likes through the gateway (each retried with the same
    Idempotency-Key, some replayed on purpose) and print the counts the read path converges to.
    """
    import concurrent.futures as cf
    import uuid

    from services.client import LikesClient

    lay = layout.from_env()
    api = f"http://{layout.HOST}:{lay.ports.gateway}"
    client = LikesClient(api, api, vary_client_ip=True)  # each user its own address (the CDN's)
    run = uuid.uuid4().hex[:6]
    post_ids = [f"demo-{run}-{i}" for i in range(posts)]
    plan = [
        (f"user-{run}-{u}", post_ids[p])
        for u in range(users)
        for p in range(posts)
        if u % (p + 1) == 0  # post i is liked by every (i+1)-th user
    ]
    expected = {p: sum(1 for _, q in plan if q == p) for p in post_ids}

    def like(pair: tuple[str, str]) -> int:
        user, post = pair
        tok = transforms.sign_token(lay, user)
        key = str(uuid.uuid4())
        first = client.like(post, idempotency_key=key, token=tok).status_code
        # a client retry of the same intent: must not count again
        replay = client.like(post, idempotency_key=key, token=tok).status_code
        return first if first != 202 else replay

    t0 = time.monotonic()
    with cf.ThreadPoolExecutor(16) as pool:
        codes = list(pool.map(like, plan))
    wrote = time.monotonic() - t0
    if any(c != 202 for c in codes):
        err.print(f"[red]error:[/] some writes were not accepted: {sorted(set(codes))}")
        raise typer.Exit(1)
    counts: dict[str, dict[str, object]] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        counts = {p: client.count(p) for p in post_ids}
        if all(counts[p]["count"] == expected[p] for p in post_ids):
            break
        time.sleep(0.5)
    converged = all(counts[p]["count"] == expected[p] for p in post_ids)
    took = time.monotonic() - t0
    if json_out:
        print(json.dumps({"expected": expected, "counts": counts, "converged": converged}))
    else:
        t = Table(title=f"{len(plan)} likes (+{len(plan)} replays) in {wrote:.1f}s")
        for col in ("post", "likes sent", "count read", "stale"):
            t.add_column(col)
        for p in post_ids:
            ok = counts[p]["count"] == expected[p]
            shown = f"[green]{counts[p]['count']}[/]" if ok else f"[red]{counts[p]['count']}[/]"
            t.add_row(p, str(expected[p]), shown, str(counts[p].get("stale")))
        console.print(t)
        state = "[green]converged[/]" if converged else "[red]did not converge[/]"
        console.print(f"{state} after {took:.1f}s")
    if not converged:
        raise typer.Exit(1)
