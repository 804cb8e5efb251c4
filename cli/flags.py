"""`likes flags get|set|unset`: the kill switches in etcd (services/contracts/flags.py says what
each does in each workload). The workloads see a change within about a second, and keep the last
value they read while etcd is unreachable. `set` and `unset` confirm unless --yes and leave an
audit record (`likes audit`)."""

from __future__ import annotations

import json
from typing import Annotated, Any

import aetcd
import typer
from rich.table import Table

from cli import audit, etcd_commands
from services.contracts import flags, hotkeys

app = typer.Typer(
    help="Kill switches: " + ", ".join(s.value for s in flags.Switch) + ". "
    "`likes flags get` says what each does.",
    no_args_is_help=True,
)
console = etcd_commands.console
JsonOpt, YesOpt = etcd_commands.JsonOpt, etcd_commands.YesOpt
ReasonOpt = typer.Option("", "--reason", "-r", help="why (kept in the switch and the audit)")


def _switch(name: str) -> flags.Switch:
    try:
        return flags.parse(name)
    except flags.UnknownSwitch as e:
        raise typer.BadParameter(str(e), param_hint="NAME") from e


async def _read(client: aetcd.Client) -> dict[str, flags.State | None]:
    got = {
        hotkeys.post_of(kv.key, flags.PREFIX): flags.decode(kv.value)
        for kv in await client.get_prefix(flags.PREFIX.encode())
    }
    return {s.value: got.get(s.value) for s in flags.Switch}


def _rows(states: dict[str, flags.State | None]) -> list[dict[str, Any]]:
    engaged = flags.engaged_by({k: v for k, v in states.items() if v is not None})
    rows = []
    for s in flags.Switch:
        state = states.get(s.value)
        rows.append({
            "switch": s.value,
            "set": None if state is None else state.to_json(),
            "engaged": s in engaged,  # on, or implied by panic
            "effect": flags.EFFECTS[s],
        })  # fmt: skip
    return rows


@app.command()
def get(
    name: Annotated[str | None, typer.Argument(help="one switch; all when left out")] = None,
    as_json: bool = JsonOpt,
) -> None:
    """Each switch: set on or off (by whom, since when, why), engaged (on, or implied by panic),
    and what it does."""
    rows = _rows(etcd_commands.run(_read))
    if name is not None:
        rows = [r for r in rows if r["switch"] == _switch(name).value]
    if as_json:
        typer.echo(json.dumps(rows if name is None else rows[0]))
        return
    t = Table("switch", "engaged", "set", "by", "reason", "effect")
    for r in rows:
        st = r["set"]
        t.add_row(
            r["switch"],
            "[red]yes[/red]" if r["engaged"] else "no",
            "-" if st is None else ("on" if st["on"] else "off"),
            "-" if st is None else st["by"],
            "-" if st is None else (st["reason"] or "-"),
            r["effect"],
        )
    console.print(t)


def put(switch: flags.Switch, on: bool, reason: str) -> flags.State:
    """Turn `switch` on or off in etcd, audited (the game days' set_flag too)."""
    state = flags.State(on, audit.operator(), hotkeys.now_ms(), reason)

    async def put(client: aetcd.Client) -> dict[str, Any]:
        await client.put(flags.key(switch).encode(), state.encode())
        return state.to_json()

    etcd_commands.audited("flags set", {"switch": switch.value, "on": on, "reason": reason}, put)
    return state


@app.command("set")
def set_(
    name: Annotated[str, typer.Argument(help="the switch")],
    value: Annotated[str, typer.Argument(help="on or off")],
    reason: str = ReasonOpt,
    yes: bool = YesOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Turn a switch on or off (`off` keeps a record of who turned it off; `unset` removes it)."""
    switch = _switch(name)
    if value.lower() not in ("on", "off"):
        raise typer.BadParameter(f"{value!r} is neither on nor off", param_hint="VALUE")
    on = value.lower() == "on"
    etcd_commands.confirm(
        f"turn {switch.value} {'ON' if on else 'off'}? ({flags.EFFECTS[switch]})", yes
    )
    state = put(switch, on, reason)
    if as_json:
        typer.echo(json.dumps({"switch": switch.value, **state.to_json()}))
    else:
        shown = "ON" if on else "off"
        console.print(f"{switch.value} is {shown} (the workloads see it within seconds)")


def remove(switch: flags.Switch) -> bool:
    """Remove `switch` from etcd, audited; whether it was there."""

    async def delete(client: aetcd.Client) -> bool:
        return bool(await client.delete(flags.key(switch).encode()))

    return bool(etcd_commands.audited("flags unset", {"switch": switch.value}, delete))


@app.command()
def unset(
    name: Annotated[str, typer.Argument(help="the switch")],
    yes: bool = YesOpt,
    as_json: bool = JsonOpt,
) -> None:
    """Remove a switch (the workloads treat it as off)."""
    switch = _switch(name)
    etcd_commands.confirm(f"remove {switch.value}?", yes)
    existed = remove(switch)
    if as_json:
        typer.echo(json.dumps({"switch": switch.value, "removed": existed}))
    else:
        console.print(f"{switch.value}: {'removed' if existed else 'was not set'}")
