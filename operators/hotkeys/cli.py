"""`likes hotkeys top|show|split|unsplit`: on-call's view of the hot-key set, reading and writing
the same etcd keys as the sampler and the operator. Mutations confirm unless --yes, and leave an
audit record (`likes audit`). Settings: the LIKES_* variables, else the local stack's."""

from __future__ import annotations

import json
from typing import Any

import aetcd
import typer
from rich.console import Console
from rich.table import Table

from cli import etcd_commands
from services.contracts import hotkeys, keys

app = typer.Typer(help="Hot keys: what the sampler flagged, what the operator replicated/split.")
console = Console()

JsonOpt, YesOpt = etcd_commands.JsonOpt, etcd_commands.YesOpt


async def _prefix(client: aetcd.Client, prefix: str) -> dict[str, bytes]:
    return {
        hotkeys.post_of(kv.key, prefix): kv.value for kv in await client.get_prefix(prefix.encode())
    }


async def _snapshot(client: aetcd.Client) -> dict[str, dict[str, Any]]:
    hot = await _prefix(client, keys.HOTKEYS_PREFIX)
    heat = await _prefix(client, keys.HEAT_PREFIX)
    split = await _prefix(client, keys.SPLIT_PREFIX)
    pools = await _prefix(client, hotkeys.HOTPOOL_PREFIX)
    out: dict[str, dict[str, Any]] = {}
    for post in sorted({*hot, *heat, *split, *pools}):
        flag = hotkeys.decode_split(split[post]) if post in split else None
        out[post] = {
            "post_id": post,
            "rate": hotkeys.decode_hot(hot[post]) if post in hot else None,
            "heat": heat[post].decode(errors="replace") if post in heat else None,
            "split": None if flag is None else {"factor": flag.factor, "by": flag.by},
            "hot_pools": hotkeys.decode_pools(pools[post]) if post in pools else [],
        }
    return out


def _table(rows: list[dict[str, Any]]) -> Table:
    t = Table("post", "rate/s", "heat", "split", "hot pools")
    for r in rows:
        split = f"{r['split']['factor']} ({r['split']['by']})" if r["split"] else "-"
        rate = "-" if r["rate"] is None else f"{r['rate']:.0f}"
        t.add_row(r["post_id"], rate, r["heat"] or "-", split, str(len(r["hot_pools"])))
    return t


@app.command()
def top(limit: int = typer.Option(20, "--limit", "-n"), as_json: bool = JsonOpt) -> None:
    """The hottest posts (sampler's estimate), with what the operator did about them."""
    rows = sorted(
        etcd_commands.run(_snapshot).values(), key=lambda r: (-(r["rate"] or 0.0), r["post_id"])
    )[:limit]
    if as_json:
        typer.echo(json.dumps(rows))
    else:
        console.print(_table(rows))


@app.command()
def show(post_id: str, as_json: bool = JsonOpt) -> None:
    """One post's hot-key state (not hot: every field empty)."""
    row = etcd_commands.run(_snapshot).get(post_id) or {
        "post_id": post_id, "rate": None, "heat": None, "split": None, "hot_pools": [],
    }  # fmt: skip
    if as_json:
        typer.echo(json.dumps(row))
    else:
        console.print(_table([row]))


@app.command()
def split(
    post_id: str,
    factor: int = typer.Option(keys.SPLIT_FACTOR, min=2, max=keys.SPLIT_FACTOR),
    yes: bool = YesOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Spread a post's writes over `factor` sub-keys (manual: the operator will not undo it)."""
    etcd_commands.confirm(f"split {post_id} over {factor} sub-keys?", yes)
    flag = hotkeys.SplitFlag(factor, "manual", hotkeys.now_ms())

    async def put(client: aetcd.Client) -> None:
        await client.put((keys.SPLIT_PREFIX + post_id).encode(), flag.encode())

    etcd_commands.audited("hotkeys split", {"post_id": post_id, "factor": factor}, put)
    result = {"post_id": post_id, "split": {"factor": factor, "by": "manual"}}
    typer.echo(json.dumps(result) if as_json else f"split {post_id} (factor {factor})")


@app.command()
def unsplit(post_id: str, yes: bool = YesOpt, as_json: bool = JsonOpt) -> None:
    """Remove a post's split flag (counts stay exact: the aggregator sums every shard)."""
    etcd_commands.confirm(f"unsplit {post_id}?", yes)

    async def delete(client: aetcd.Client) -> bool:
        return bool(await client.delete((keys.SPLIT_PREFIX + post_id).encode()))

    existed = etcd_commands.audited("hotkeys unsplit", {"post_id": post_id}, delete)
    result = {"post_id": post_id, "removed": existed}
    typer.echo(json.dumps(result) if as_json else f"unsplit {post_id}: removed={existed}")
