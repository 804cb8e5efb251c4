"""Kill switches (services/contracts/flags.py): values, what panic implies, and how each workload
honors them without etcd in the loop (the stack test sets them through etcd)."""

from __future__ import annotations

import asyncio

import pytest
from typer.testing import CliRunner

from cli import flags as flags_cli
from cli.main import app
from services.contracts import flags
from services.read.heat import COLD_TTL_S, HOT_TTL_S, StaticHeat, SwitchedHeat
from services.write.splits import SplitRouter

ON, OFF = flags.State(True, "ann", 1), flags.State(False, "bob", 2)


def switches(**states: flags.State) -> flags.Switches:
    kill = flags.Switches("127.0.0.1", 1)  # never started: `apply` plays a poll
    kill.apply({k.replace("_", "-"): v for k, v in states.items()})
    return kill


def test_a_state_round_trips_and_garbage_is_no_value() -> None:
    state = flags.State(True, "ann", 1234, "bad push")
    assert flags.decode(state.encode()) == state
    assert flags.decode(b"on") == flags.State(True, "etcdctl")
    assert flags.decode(b" OFF\n") == flags.State(False, "etcdctl")
    for garbage in (b"maybe", b"{}", b'{"on": "yes"}', b"[1]", b"\xff"):
        assert flags.decode(garbage) is None, garbage


def test_panic_engages_the_control_plane_freezes_but_not_writes_readonly() -> None:
    kill = switches(panic=ON)
    engaged = {s for s in flags.Switch if kill.engaged(s)}
    assert engaged == {flags.Switch.PANIC, flags.Switch.SAMPLER_OFF, flags.Switch.HOTKEYS_FREEZE}
    assert not switches(panic=OFF).engaged(flags.Switch.SAMPLER_OFF)
    assert switches(writes_readonly=ON).engaged(flags.Switch.WRITES_READONLY)
    assert not switches(writes_readonly=ON).engaged(flags.Switch.PANIC)


def test_a_switch_change_runs_the_callbacks_once_and_exports_every_switch() -> None:
    exported: dict[str, float] = {}
    kill = flags.Switches("127.0.0.1", 1, gauge=exported.__setitem__)
    seen: list[tuple[flags.Switch, flags.State | None]] = []
    kill.on_change(lambda s, st: seen.append((s, st)))
    flush = {"schema-cache-flush": ON}
    kill.apply(flush)
    kill.apply(flush)  # the same value again: no callback
    kill.apply({})
    assert seen == [(flags.Switch.SCHEMA_CACHE_FLUSH, ON), (flags.Switch.SCHEMA_CACHE_FLUSH, None)]
    assert set(exported) == {s.value for s in flags.Switch}
    kill.apply({"panic": ON, "not-a-switch": ON})
    assert exported["panic"] == exported["hotkeys-freeze"] == 1.0
    assert exported["writes-readonly"] == 0.0


def test_panic_makes_the_read_path_ignore_heat_and_the_write_path_ignore_splits() -> None:
    heat = StaticHeat({"viral": "hot"})
    assert SwitchedHeat(heat, switches()).ttl("viral") == HOT_TTL_S
    assert SwitchedHeat(heat, switches(panic=ON)).ttl("viral") == COLD_TTL_S

    class Split:
        def current(self) -> dict[str, object]:
            return {"viral": type("Flag", (), {"factor": 8})()}

    calm = SplitRouter(Split(), switches())  # type: ignore[arg-type]
    assert {calm.shard_for("viral") for _ in range(200)} != {0}
    panicked = SplitRouter(Split(), switches(panic=ON))  # type: ignore[arg-type]
    assert {panicked.shard_for("viral") for _ in range(200)} == {0}


def test_an_unknown_switch_or_value_is_named_and_nothing_is_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_etcd(fn: object) -> object:
        raise AssertionError("etcd reached with bad input")

    monkeypatch.setattr(flags_cli.etcd_commands, "run", no_etcd)
    bad = CliRunner().invoke(app, ["flags", "set", "panik", "on", "--yes"])
    assert bad.exit_code == 2 and "no kill switch 'panik'" in bad.output
    assert "writes-readonly" in bad.output  # the known ones are listed
    bad = CliRunner().invoke(app, ["flags", "set", "panic", "maybe", "--yes"])
    assert bad.exit_code == 2 and "neither on nor off" in bad.output


def test_a_switch_holds_through_an_etcd_outage() -> None:
    """The poll against a port nothing listens on fails; the switches read before stay."""
    kill = flags.Switches("127.0.0.1", 1, interval_s=0.01)
    kill.last_good.ok({"writes-readonly": ON})
    kill.apply(kill.current())

    async def outage() -> None:
        await kill.start()
        await asyncio.sleep(0.3)  # many failed polls
        await kill.close()

    asyncio.run(outage())
    assert kill.engaged(flags.Switch.WRITES_READONLY)
    assert kill.last_good.grace_s == float("inf")
