"""`likes infra …`: plan a stack offline (Pulumi mocks), show the resource tree and the policies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console
from rich.table import Table
from rich.tree import Tree

from infra.stackfile import STACKS_DIR

if TYPE_CHECKING:
    from infra import plan

# the program (Pulumi, Envoy's typed config) is imported by the command that runs it, not by
# every `likes` call: on-call's `likes local status` should not pay a second for it

app = typer.Typer(
    help="The Pulumi program: plan stacks offline under Pulumi's mocks.", no_args_is_help=True
)


@app.callback()
def _group() -> None:
    """Plan the Pulumi program's stacks offline."""


def _summary(r: plan.Declared) -> str:
    """The few properties an operator looks at first, per resource kind."""
    i = r.inputs
    spec: dict[str, Any] = i["spec"] if isinstance(i.get("spec"), dict) else {}
    kind = i.get("kind")
    meta: dict[str, Any] = i["metadata"] if isinstance(i.get("metadata"), dict) else {}
    where = f"{meta.get('namespace')}/" if meta.get("namespace") else ""
    bits: list[str] = []
    if kind == "KafkaTopic":
        cfg = spec.get("config", {})
        bits = [
            f"partitions={spec.get('partitions')}",
            f"replicas={spec.get('replicas')}",
            f"min.isr={cfg.get('min.insync.replicas')}",
            f"retention.ms={cfg.get('retention.ms')}",
        ]
    elif kind == "ScyllaCluster":
        dc = spec.get("datacenter", {})
        bits = [f"dc={dc.get('name')}"] + [
            f"rack {x['name']}x{x['members']}" for x in dc.get("racks", [])
        ]
    elif kind == "KafkaNodePool":
        bits = [f"replicas={spec.get('replicas')}", f"roles={','.join(spec.get('roles', []))}"]
    elif kind in {"StatefulSet", "Deployment"}:
        containers = spec.get("template", {}).get("spec", {}).get("containers", [])
        bits = [f"replicas={spec.get('replicas', 'hpa')}"] + [
            c.get("image", "") for c in containers
        ]
    elif kind == "PodDisruptionBudget":
        bits = [
            f"minAvailable={spec.get('minAvailable')}"
            if "minAvailable" in spec
            else f"maxUnavailable={spec.get('maxUnavailable')}"
        ]
    elif kind == "HorizontalPodAutoscaler":
        bits = [f"{spec.get('minReplicas')}..{spec.get('maxReplicas')}"]
    elif kind == "Service":
        bits = [str(spec.get("type", "ClusterIP"))]
    elif r.type == "aws:eks/nodeGroup:NodeGroup":
        sc = i.get("scalingConfig", {})
        bits = [",".join(i.get("instanceTypes", [])), f"{sc.get('minSize')}..{sc.get('maxSize')}"]
    elif r.type == "aws:eks/cluster:Cluster":
        bits = [f"k8s {i.get('version')}"]
    elif r.type == "cloudflare:index/ruleset:Ruleset":
        bits = [str(i.get("phase")), f"{len(i.get('rules', []))} rules"]
    elif r.type == "aws:ec2/subnet:Subnet":
        bits = [str(i.get("cidrBlock")), str(i.get("availabilityZone"))]
    label = f"[bold]{r.name}[/] [dim]{r.type}[/]"
    if kind and r.type.startswith("kubernetes:"):
        label += f" [cyan]{where}{meta.get('name', '')}[/]"
    return label + (f" — {' '.join(bits)}" if bits else "")


def render_tree(result: plan.Plan) -> Tree:
    root = Tree(f"[bold]stack {result.stack}[/] — {len(result.resources)} resources")
    nodes: dict[str, Tree] = {}
    by_parent: dict[str | None, list[plan.Declared]] = {}
    urns = {r.urn for r in result.resources}
    for r in result.resources:
        parent = r.parent_urn if r.parent_urn in urns else None
        by_parent.setdefault(parent, []).append(r)

    def add(branch: Tree, parent: str | None) -> None:
        for r in sorted(by_parent.get(parent, []), key=lambda x: (x.custom, x.type, x.name)):
            nodes[r.urn] = branch.add(_summary(r))
            add(nodes[r.urn], r.urn)

    add(root, None)
    return root


def render_policies(result: plan.Plan) -> Table:
    from infra import policies

    table = Table(title="policies")
    table.add_column("policy")
    table.add_column("result")
    table.add_column("violations")
    for key, description in policies.POLICIES.items():
        found = [v for v in result.violations if v.policy == key]
        status = "[red]FAIL[/]" if found else "[green]pass[/]"
        table.add_row(
            f"{key}\n[dim]{description}[/]",
            status,
            "\n".join(f"{v.resource}: {v.message}" for v in found),
        )
    return table


@app.command("plan")
def plan_command(
    stack: str = typer.Option(..., "--stack", "-s", help="stack name: stacks/Pulumi.<stack>.yaml"),
    as_json: bool = typer.Option(False, "--json", help="print [{type, name, parent, inputs}]"),
    stacks_dir: Path = typer.Option(STACKS_DIR, "--stacks-dir", help="where the stack files are"),
) -> None:
    """Run the program offline under Pulumi's mocks; exit 1 when a policy fails, 2 on bad config."""
    from infra import config, plan, stackfile

    err = Console(stderr=True)
    try:
        result = plan.run(stack, stacks_dir)
    except (config.ConfigError, stackfile.StackFileError) as exc:
        problems = exc.problems if isinstance(exc, config.ConfigError) else [("stack", str(exc))]
        for key, message in problems:
            err.print(f"[red]config error[/] {key}: {message}", highlight=False)
        raise typer.Exit(2) from None
    if as_json:
        payload: list[dict[str, Any]] = [r.as_json() for r in result.resources]
        typer.echo(json.dumps(payload, indent=1, sort_keys=True))
    else:
        out = Console()
        out.print(render_tree(result))
        out.print(render_policies(result))
        for key in result.placeholders:
            out.print(
                f"[yellow]note[/] {key} is not in the stack file; a placeholder stood in offline"
            )
    for v in result.violations:
        err.print(f"[red]policy {v.policy}[/] {v.resource}: {v.message}", highlight=False)
    if result.violations:
        raise typer.Exit(1)
