"""Game-day lanes: the experiments split over several local stacks that run at once.

An experiment holds its stack for a minute or more, most of it waiting: the fault's 30 s, then
the convergence hold (services/contracts/convergence.HOLD_S, 28 s), which no experiment can
shorten without making its oracle one-sided. Forty of them one after the other take over an
hour; the game day's budget is 25 minutes (issue 14). So `likes chaos gameday --lanes N` runs
N lanes at once, each a `likes chaos gameday --only ...` process with its share:
- lane 1 is the stack the game day was started on;
- every other lane is a scratch stack of its own (a home beside lane 1's, its ports shifted by
  LANE_OFFSETS), brought up in lane 1's profile for the game day and wiped after it.

Lanes never share a stack, so no experiment's fault compounds another's, and each one's alerts,
ledger and convergence are its own: an experiment means on a lane what it means alone. What the
lanes share is the machine; on 2 cores, 2 lanes.

Some experiments judge a rate: a flash crowd must cross the hot-key sampler's detection floor,
which the load of a second stack on 2 cores kept it under (116 reads/s in a 2-lane game day). The
catalog marks those `alone` (with the reason). They run last, on lane 1's stack, once every
other lane has ended and its scratch stack is down: the tail lane. Holding the other lanes idle
around them was not enough: an idle second stack still kept the flash crowd under the floor
(218.8 reads/s, not flagged hot, in a 2-lane game day; 1,208 reads/s alone on the machine). An
experiment both alone and in the faults profile (none today) would wait on its lane for the
others' running experiments instead, and no lane starts another meanwhile (turn()).

The experiments that need the faults profile (Toxiproxy in front of every node) all go to the
last scratch lane: only that stack restarts into the profile, and the stack the game day was
started on never does.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from chaos import catalog
from services.contracts.convergence import HOLD_S

if TYPE_CHECKING:  # chaos.runner imports the faults' clients: `likes --help` need not
    from chaos.runner import Result

# the scratch lanes' port offsets: clear of the default stack (0), the test sessions' two
# (1000, 2000) and test_gateway's edge (7000), bus ports included (tests/unit/test_chaos_lanes)
LANE_OFFSETS = (4000, 5000, 6000)
MAX_LANES = 1 + len(LANE_OFFSETS)
# what an experiment costs beyond its pauses: the hypothesis before, the readiness wait, the
# rollbacks, the report's reads (measured: write-idem-store-down spent ~4 s outside them)
OVERHEAD_S = 10.0
# bringing a scratch lane's stack up: 48 servers, ~60 s on an idle machine, ~4.5 min beside
# lane 1's experiments (a 2-lane run of 4 experiments here)
LANE_START_S = 240.0
PROFILE_SWITCH_S = 60.0  # a lane's stack restarting into the faults profile


@dataclass(frozen=True)
class Lane:
    number: int  # 1: the game day's own stack
    home: Path
    offset: int
    ids: tuple[str, ...]
    tail: bool = False  # lane 1's stack again, after every other lane: the experiments alone

    @property
    def scratch(self) -> bool:
        return self.number > 1

    @property
    def label(self) -> str:
        return f"{self.number} (alone)" if self.tail else str(self.number)

    def folder(self, out: Path) -> Path:
        """Where the lane's game day writes its journals and report, in the game day's `out`."""
        return out / (f"lane-{self.number}-alone" if self.tail else f"lane-{self.number}")

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """The environment of this lane's `likes` commands: its stack's home and ports."""
        return {**base, "LIKES_HOME": str(self.home), "LIKES_PORT_OFFSET": str(self.offset)}


def estimate_s(mode_id: str, experiment: Mapping[str, Any] | None = None) -> float:
    """What a run of the mode's experiment takes: its pauses, the convergence hold the
    hypothesis waits out after the method, and OVERHEAD_S."""
    exp = experiment if experiment is not None else catalog.experiment(mode_id)
    activities = [*exp.get("method", ()), *exp.get("rollbacks", ())]
    pauses = sum(
        float(v) for a in activities for v in (a.get("pauses") or {}).values() if v is not None
    )
    return pauses + HOLD_S + OVERHEAD_S


def plan(
    ids: Sequence[str],
    lanes: int,
    home: Path,
    offset: int,
    estimates: Mapping[str, float] | None = None,
) -> list[Lane]:
    """Every id on exactly one lane, the lanes' expected ends as even as the estimates allow
    (longest first, each to the lane that ends soonest: LPT). A scratch lane starts LANE_START_S
    late; the faults profile's experiments all go to the last lane (one profile switch, on a
    scratch stack), after its others, as a game day orders them. With more than one lane, the
    experiments that run alone go to the tail lane, last in the list: lane 1's stack once the
    others have ended (an alone one in the faults profile stays on its lane and lengthens every
    lane by its estimate). A scratch lane that would get nothing is left out (its number stays
    unused: the numbers name the ports)."""
    if not 1 <= lanes <= MAX_LANES:
        raise ValueError(f"lanes must be 1 to {MAX_LANES}, not {lanes}")
    est = {i: (estimates or {}).get(i) or estimate_s(i) for i in ids}
    lanes = min(lanes, max(len(ids), 1))
    ends = [0.0] + [LANE_START_S] * (lanes - 1)
    share: list[list[str]] = [[] for _ in range(lanes)]
    profile = catalog.faults_profile()
    faults = [i for i in ids if i in profile]
    if faults:
        last = lanes - 1
        share[last] += faults
        ends[last] += sum(est[i] for i in faults) + (PROFILE_SWITCH_S if last else 0)
    alone = catalog.alone()
    tail = [i for i in ids if i in alone and i not in profile] if lanes > 1 else []
    for i in sorted((i for i in ids if i not in faults and i not in tail), key=lambda i: -est[i]):
        k = min(range(lanes), key=lambda k: ends[k])
        share[k].append(i)
        if i in alone:  # every lane waits it out
            ends = [e + est[i] for e in ends]
        else:
            ends[k] += est[i]
    order = {i: n for n, i in enumerate(ids)}
    out = []
    for k, chosen in enumerate(share):
        if k and not chosen:
            continue  # a scratch lane with no work is not worth its stack
        # alone ones after the others: lane 1's would otherwise idle through a scratch lane's
        # start (a load the stage is held for, as for an experiment)
        chosen.sort(key=lambda i: (i in faults, i in alone, order[i]))
        if k == 0:
            out.append(Lane(1, home, offset, tuple(chosen)))
        else:
            lane_home = home.with_name(f"{home.name}-lane{k + 1}")
            out.append(Lane(k + 1, lane_home, LANE_OFFSETS[k - 1], tuple(chosen)))
    if tail:
        out.append(Lane(1, home, offset, tuple(tail), tail=True))
    return out


def expected_end_s(lanes: Sequence[Lane], estimates: Mapping[str, float]) -> float:
    """When the last lane is expected to end, by the estimates plan() balanced them with: the
    lanes side by side, then the tail lane."""
    profile, alone = catalog.faults_profile(), catalog.alone()
    side = [lane for lane in lanes if not lane.tail]
    waits = sum(estimates[i] for lane in side for i in lane.ids if i in alone)
    return max(
        (LANE_START_S if lane.scratch else 0.0)
        + sum(estimates[i] for i in lane.ids if i not in alone)
        + waits
        + (PROFILE_SWITCH_S if lane.scratch and profile.intersection(lane.ids) else 0)
        for lane in side
    ) + sum(estimates[i] for lane in lanes if lane.tail for i in lane.ids)


def results(lane: Lane, journals: Path, failure: str | None = None) -> list[Result]:
    """The lane's results from the journals its game day wrote (runner._save: the verdict is
    under "likes"); an experiment with no journal failed (`failure` says why, or it never
    ran: its lane stopped first)."""
    from chaos.runner import Result

    out = []
    for mode_id in lane.ids:
        path = journals / f"{mode_id}.json"
        try:
            r = Result(**json.loads(path.read_text())["likes"])
        except (OSError, ValueError, KeyError, TypeError):
            why = failure or f"no journal: lane {lane.number} stopped before it ran"
            r = Result(mode_id, "failed", False, "failed", 0.0, [why])
        out.append(r)
    return out


def locks(out: Path) -> Path:
    """The lanes' shared lock files (turn()), in the game day's `out`."""
    return out / ".lanes"


def command(lane: Lane, out: Path) -> list[str]:
    """The lane's game day: its share, its own folder of the game day's `out`, the lanes'
    shared locks; a scratch lane leaves its stack in the faults profile (it is wiped next)."""
    return [sys.executable, "-m", "cli.main", "chaos", "gameday", "--only", ",".join(lane.ids),
            "--out", str(lane.folder(out)), "--lane-locks", str(locks(out)),
            *(["--no-restore-profile"] if lane.scratch else [])]  # fmt: skip


@contextlib.contextmanager
def turn(locks: Path | None, alone: bool) -> Iterator[None]:
    """Hold the lanes' stage for one experiment: shared by any number of lanes, or for this
    lane `alone`. Two flock(2) files in `locks` (None: no lanes, nothing to hold): `stage`,
    held shared by each running experiment and exclusively by one that runs alone, and `gate`,
    which a lane passes before taking the stage, and which one waiting to run alone holds
    meanwhile: the lanes that end their experiment cannot start another and keep the stage
    from ever coming free. The kernel drops a dead lane's locks."""
    if locks is None:
        yield
        return
    locks.mkdir(parents=True, exist_ok=True)
    with open(locks / "gate", "a+") as gate, open(locks / "stage", "a+") as stage:
        fcntl.flock(gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(stage, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(stage, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(gate, fcntl.LOCK_UN)


def reserve_ports(lane: Lane) -> str | None:
    """Keep the kernel from lending the lane's ports to client sockets (local/ephemeral.py):
    a scratch lane's Kafka ports are in the ephemeral range. Why they could not be, or None."""
    from local import ephemeral, layout

    return ephemeral.reserve(layout.Ports(lane.offset).every())[1]


def up_command(tls: bool) -> list[str]:
    """A scratch lane's stack, in lane 1's TLS profile (the faults profile is the lane's own
    game day's to switch to)."""
    return [sys.executable, "-m", "cli.main", "local", "up", "--tls" if tls else "--no-tls",
            "--no-faults", "--json"]  # fmt: skip


def down_command() -> list[str]:
    return [sys.executable, "-m", "cli.main", "local", "down", "--wipe"]
