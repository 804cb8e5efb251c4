"""local/ephemeral.py: a stack's ports inside the kernel's ephemeral range are reserved, what the
list held is kept, and a host that refuses the write is named, not fatal."""

from __future__ import annotations

import os
from pathlib import Path

from chaos import lanes
from local import ephemeral, layout


def _proc(tmp_path: Path, reserved: str = "") -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "ip_local_port_range").write_text("32768\t60999\n")
    (proc / "ip_local_reserved_ports").write_text(reserved + "\n")
    return proc


def test_the_format_reads_and_writes_runs() -> None:
    assert ephemeral.parse("1000,2000-2002,\n") == {1000, 2000, 2001, 2002}
    assert ephemeral.parse("\n") == set()
    assert ephemeral.render([33094, 33092, 33093, 40000, 33192]) == "33092-33094,33192,40000"
    assert ephemeral.parse(ephemeral.render({5, 6, 7, 9})) == {5, 6, 7, 9}


def test_a_lanes_kafka_ports_are_reserved_and_what_was_there_is_kept(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "40000,50000-50002")
    ports = layout.Ports(lanes.LANE_OFFSETS[0]).every()
    added, problem = ephemeral.reserve(ports, proc)
    assert problem is None
    # the brokers, the controllers and the faults profile's proxies, nothing below the range
    p = layout.Ports(lanes.LANE_OFFSETS[0])
    kafka = {*p.kafka_brokers, *p.kafka_broker_proxies}
    assert kafka <= added and all(32768 <= x <= 60999 for x in added)
    held = ephemeral.parse((proc / "ip_local_reserved_ports").read_text())
    assert held == {40000, 50000, 50001, 50002} | added
    # again: nothing to add, nothing written
    (proc / "ip_local_reserved_ports").write_text("40000,50000-50002," + ephemeral.render(added))
    assert ephemeral.reserve(ports, proc) == (added, None)
    assert (proc / "ip_local_reserved_ports").read_text().startswith("40000,50000-50002,")


def test_a_stack_below_the_range_writes_nothing(tmp_path: Path) -> None:
    proc = _proc(tmp_path, "40000")
    assert ephemeral.reserve(layout.Ports(1000).every(), proc) == (set(), None)
    assert (proc / "ip_local_reserved_ports").read_text() == "40000\n"


def test_a_host_that_refuses_the_write_is_named_and_nothing_raises(tmp_path: Path) -> None:
    proc = _proc(tmp_path)
    (proc / "ip_local_reserved_ports").unlink()
    (proc / "ip_local_reserved_ports").mkdir()  # unwritable, even for root
    added, problem = ephemeral.reserve(layout.Ports(lanes.LANE_OFFSETS[0]).every(), proc)
    assert added and problem is not None
    assert "could not be reserved" in problem and "ip_local_reserved_ports" in problem


def test_the_kernel_takes_the_list_as_written() -> None:
    """On this host: as root the kernel then lists a lane's ports as reserved (what the game
    day does before its lanes start); without root the refusal is reported instead."""
    ports = layout.Ports(lanes.LANE_OFFSETS[0]).every()
    added, problem = ephemeral.reserve(ports)
    assert added  # a lane's Kafka ports are in the default range (32768-60999)
    if os.geteuid() == 0:
        assert problem is None
        assert added <= ephemeral.parse(
            Path("/proc/sys/net/ipv4/ip_local_reserved_ports").read_text()
        )
    else:
        assert problem is not None and "could not be reserved" in problem
