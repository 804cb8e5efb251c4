"""Keep the kernel from lending a stack's ports to client sockets.

Linux picks a client socket's local port from `ip_local_port_range` (32768-60999 by default).
A stack at offset 4000 or more has its Kafka ports in that range (29092 + 4000 = 33092, the
controllers' 33192..., the faults profile's proxies 33292...), so a connection any process
opened earlier can already hold one: the broker's listener then fails to bind with "Address
already in use" although nothing listens there. It happened to a game day's second lane
(`likes chaos gameday --lanes 2`): kafka-3 could not bind 127.0.0.1:33194 while lane 1's
traffic ran, and the lane's 20 experiments were reported failed. A port in
`ip_local_reserved_ports` is never handed out that way (the kernel's own answer, the one
Kafka's and ZooKeeper's operators use), so `likes local up` and the game day's lanes reserve
theirs before starting anything. Only ports inside the ephemeral range are added; what the list
held is kept. Writing it needs root: without it `reserve` says so and the stack starts anyway.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

PROC = Path("/proc/sys/net/ipv4")


def parse(text: str) -> set[int]:
    """`ip_local_reserved_ports`' format ("1000,2000-2002") to the ports it names."""
    out: set[int] = set()
    for part in text.replace("\n", "").split(","):
        part = part.strip()
        if not part:
            continue
        low, _, high = part.partition("-")
        out.update(range(int(low), int(high or low) + 1))
    return out


def render(ports: Iterable[int]) -> str:
    """The ports as that file's format, runs of consecutive ports as ranges."""
    runs: list[list[int]] = []
    for p in sorted(set(ports)):
        if runs and p == runs[-1][1] + 1:
            runs[-1][1] = p
        else:
            runs.append([p, p])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def ephemeral_range(proc: Path = PROC) -> tuple[int, int]:
    low, high = (proc / "ip_local_port_range").read_text().split()
    return int(low), int(high)


def reserve(ports: Iterable[int], proc: Path = PROC) -> tuple[set[int], str | None]:
    """Add those of `ports` that the kernel could hand to a client socket to its reserved list.
    Returns the ports that needed it (none: nothing was written) and why they could not be
    reserved (None: they are)."""
    try:
        low, high = ephemeral_range(proc)
    except (OSError, ValueError):  # no such sysctl (not Linux): nothing to keep clear
        return set(), None
    at_risk = {p for p in ports if low <= p <= high}
    if not at_risk:
        return set(), None
    try:
        held = parse((proc / "ip_local_reserved_ports").read_text())
        if not at_risk <= held:
            (proc / "ip_local_reserved_ports").write_text(render(held | at_risk) + "\n")
    except OSError as e:  # not root
        return at_risk, (
            f"ports {render(at_risk)} are in the kernel's ephemeral range ({low}-{high}) and "
            f"could not be reserved ({e.strerror or e}): a client socket may hold one when its "
            f"server starts. As root: sysctl -w net.ipv4.ip_local_reserved_ports=<list>,"
            f"{render(at_risk)}"
        )
    return at_risk, None
