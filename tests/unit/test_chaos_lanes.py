"""`likes chaos gameday --lanes N` (chaos/lanes.py): the plan that splits the experiments over
the lanes, the scratch stacks' ports, and the orchestration of the lanes' game days, which here
run as stand-in commands that write the journals a lane's game day would (no stack is started:
test_gameday runs the experiments themselves on the second test stack)."""

from __future__ import annotations

import fcntl
import json
import sys
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from chaos import catalog, lanes
from chaos.runner import Result, needs_faults
from cli.main import app
from local import layout
from services.contracts.convergence import HOLD_S

RUNNABLE = sorted(
    (m.id for m in catalog.modes() if m.enactable and m.has_experiment), key=needs_faults
)
FAULTS = {i for i in RUNNABLE if needs_faults(i)}
EST = {i: lanes.estimate_s(i) for i in RUNNABLE}
ALONE = catalog.alone()
runner = CliRunner()


def _with_buses(offset: int) -> set[int]:
    """Every port of a stack at `offset`, with its Redis clusters' bus ports (+10000)."""
    p = layout.Ports(offset)
    return p.every() | {q + 10000 for q in [*p.count_cache, *p.idem_store, *p.feature_store]}


def test_scratch_lanes_share_no_port_with_any_other_stack_of_the_machine() -> None:
    # the default stack, the two test stacks, test_gateway's edge, and the lanes themselves
    offsets = [0, 1000, 2000, 7000, *lanes.LANE_OFFSETS]
    for i, a in enumerate(offsets):
        for b in offsets[i + 1 :]:
            shared = _with_buses(a) & _with_buses(b)
            assert not shared, f"offsets {a} and {b} share ports {sorted(shared)[:5]}"


def test_every_experiment_runs_on_exactly_one_lane_and_the_faults_ones_on_the_last() -> None:
    home = Path("/stacks/prod-us")
    for n in range(1, lanes.MAX_LANES + 1):
        plan = lanes.plan(RUNNABLE, n, home, 0, EST)
        ran = [i for lane in plan for i in lane.ids]
        assert sorted(ran) == sorted(RUNNABLE) and len(ran) == len(set(ran))
        side, tail = plan[:n], plan[n:]
        assert [lane.number for lane in side] == list(range(1, n + 1))
        assert (plan[0].home, plan[0].offset, plan[0].scratch) == (home, 0, False)
        for lane in side[1:]:
            assert lane.scratch and lane.home.parent == home.parent and lane.home != home
            assert lane.offset == lanes.LANE_OFFSETS[lane.number - 2]
        # with lanes, the ones that run alone run last, on lane 1's stack, and only there
        assert ALONE - FAULTS, "the catalog has experiments that run alone: this test sees less"
        if n == 1:
            assert tail == [] and set(plan[0].ids) >= ALONE
        else:
            assert [(t.number, t.home, t.offset, t.tail) for t in tail] == [(1, home, 0, True)]
            assert set(tail[0].ids) == ALONE - FAULTS
            assert not any(set(lane.ids) & (ALONE - FAULTS) for lane in side)
            assert tail[0].folder(Path("o")) != side[0].folder(Path("o"))
        # a scratch lane leaves its stack's profile as it is (it is wiped next); lane 1 restores
        commands = [lanes.command(lane, Path("out")) for lane in plan]
        assert ["--no-restore-profile" in c for c in commands] == [lane.scratch for lane in plan]
        assert [lane.scratch for lane in plan] == [False] + [True] * (n - 1) + [False] * len(tail)
        assert FAULTS, "the catalog has network faults: this test would see nothing"
        assert set(side[-1].ids) >= FAULTS
        for lane in plan:  # within a lane, a game day's order: the faults profile's last,
            # after the ones that run alone
            flags = [(i in FAULTS, i in ALONE) for i in lane.ids]
            assert flags == sorted(flags)


def test_two_lanes_balance_the_expected_durations() -> None:
    est = EST
    alone = sum(est.values())
    plan = lanes.plan(RUNNABLE, 2, Path("/h"), 0, est)
    assert ALONE, "the catalog has experiments that run alone: this test would see less"
    waits = sum(est[i] for i in ALONE)  # the tail lane runs those after the others
    side = [lane for lane in plan if not lane.tail]
    ends = [sum(est[i] for i in lane.ids) + (lanes.LANE_START_S if lane.scratch else 0)
            for lane in side]  # fmt: skip
    # LPT: no lane ends later than half the shared work plus the scratch lane's start and the
    # longest experiment, plus the one profile switch; then the experiments run alone
    bound = (alone - waits + lanes.LANE_START_S) / 2 + max(est.values())
    assert max(ends) <= bound + lanes.PROFILE_SWITCH_S, (ends, bound)
    assert lanes.expected_end_s(plan, est) == waits + max(
        e + (lanes.PROFILE_SWITCH_S if lane.scratch and FAULTS & set(lane.ids) else 0)
        for e, lane in zip(ends, side, strict=True)
    )
    assert lanes.expected_end_s(plan, est) < 0.65 * alone


def test_an_estimate_is_the_pauses_the_hold_and_the_overhead() -> None:
    exp = {
        "method": [{"pauses": {"after": 5}}, {"pauses": {"before": 2, "after": 30}}, {}],
        "rollbacks": [{"pauses": {"after": 1}}],
    }
    assert lanes.estimate_s("x", exp) == 38 + HOLD_S + lanes.OVERHEAD_S


def test_a_lane_count_out_of_range_is_refused() -> None:
    for n in (0, lanes.MAX_LANES + 1):
        with pytest.raises(ValueError, match="lanes must be"):
            lanes.plan(RUNNABLE, n, Path("/h"), 0)
    # no scratch lane without work: one experiment, or too little to outlast a lane's start
    assert len(lanes.plan(RUNNABLE[:1], 3, Path("/h"), 0, EST)) == 1
    assert [lane.number for lane in lanes.plan(RUNNABLE[:2], 2, Path("/h"), 0, EST)] == [1]
    r = runner.invoke(app, ["chaos", "gameday", "--lanes", str(lanes.MAX_LANES + 1)])
    assert r.exit_code == 2 and "--lanes" in r.output
    r = runner.invoke(app, ["chaos", "gameday", "--lanes", "2", "--only", "no-such-mode"])
    assert r.exit_code == 2 and "no-such-mode" in r.output


def test_a_missing_journal_is_a_failed_experiment_with_the_reason(tmp_path: Path) -> None:
    lane = lanes.Lane(2, Path("/h-lane2"), 4000, ("a", "b"))
    found = Result("a", "completed", False, "passed", 61.5, [], {"checks": {"x": True}})
    (tmp_path / "a.json").write_text(json.dumps({"status": "completed", "likes": found.as_dict()}))
    (tmp_path / "c.json").write_text("{not json")
    got = lanes.results(lane, tmp_path)
    assert got[0] == found
    assert (got[1].id, got[1].verdict) == ("b", "failed")
    assert "lane 2 stopped" in got[1].failed_activities[0]
    why = lanes.results(lane, tmp_path, "lane 2's stack did not start: refused")
    assert why[1].failed_activities == ["lane 2's stack did not start: refused"]


# a lane's game day, played: journals for its ids under <out>/journals, each verdict from
# VERDICTS (passed by default); the ids and the lane's home go to a record file
FAKE_GAMEDAY = """
import json, os, sys
from pathlib import Path
ids, out = sys.argv[1].split(","), Path(sys.argv[2])
verdicts = json.loads(os.environ.get("VERDICTS", "{}"))
(out / "journals").mkdir(parents=True, exist_ok=True)
for i in ids:
    v = verdicts.get(i, "passed")
    r = {"id": i, "status": "completed", "deviated": v == "deviated", "verdict": v,
         "duration_s": 1.0, "failed_activities": [], "checks": {}, "journal": None}
    (out / "journals" / f"{i}.json").write_text(json.dumps({"likes": r}))
    print(f"{i} {v}", flush=True)
with open(os.environ["RECORD"], "a") as f:
    f.write(json.dumps({"home": os.environ["LIKES_HOME"], "ids": ids}) + "\\n")
"""


@pytest.fixture
def played(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The lanes' commands replaced by stand-ins; returns the record file."""
    record = tmp_path / "record.jsonl"
    monkeypatch.setenv("RECORD", str(record))
    monkeypatch.setenv("LIKES_HOME", str(tmp_path / "stack"))
    monkeypatch.setattr(
        lanes,
        "command",
        lambda lane, out: [
            sys.executable,
            "-c",
            FAKE_GAMEDAY,
            ",".join(lane.ids),
            str(lane.folder(out)),
        ],
    )
    monkeypatch.setattr(lanes, "up_command", lambda tls: [sys.executable, "-c", "pass"])
    down = (
        "import os; open(os.environ['RECORD'], 'a')"
        ".write('down ' + os.environ['LIKES_HOME'] + '\\n')"
    )
    monkeypatch.setattr(lanes, "down_command", lambda: [sys.executable, "-c", down])
    # the host's sysctl is left alone here (tests/unit/test_ephemeral_ports.py writes a copy)
    monkeypatch.setattr(
        lanes, "reserve_ports", lambda lane: record.open("a").write(f"reserve {lane.offset}\n")
    )
    return record


def test_two_lanes_run_their_shares_on_their_own_stacks_and_one_report_holds_all(
    played: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = RUNNABLE[:6]
    monkeypatch.setenv("VERDICTS", json.dumps({ids[3]: "deviated"}))
    out = tmp_path / "gd"
    r = runner.invoke(app, ["chaos", "gameday", "--lanes", "2", "--only", ",".join(ids),
                            "--out", str(out), "--json"])  # fmt: skip
    assert r.exit_code == 1, r.output  # one deviated
    summary = json.loads(r.output.strip().splitlines()[-1])
    assert [e["id"] for e in summary["experiments"]] == ids  # the game day's order
    assert summary["passed"] == 5
    assert {e["id"]: e["verdict"] for e in summary["experiments"]}[ids[3]] == "deviated"
    lines = played.read_text().splitlines()
    runs = [json.loads(x) for x in lines if x.startswith("{")]
    homes: dict[str, list[str]] = {}
    for x in runs:  # lane 1's stack twice: its share, then the ones run alone
        homes.setdefault(Path(x["home"]).name, []).extend(x["ids"])
    assert set(homes) == {"stack", "stack-lane2"}
    assert sorted(homes["stack"] + homes["stack-lane2"]) == sorted(ids)
    assert [x for x in lines if x.startswith("down")] == [f"down {tmp_path / 'stack-lane2'}"]
    # the scratch lane's ports were kept from client sockets before any lane ran
    assert lines[0] == f"reserve {lanes.LANE_OFFSETS[0]}" and lines.count(lines[0]) == 1
    report = (out / "report.md").read_text()
    assert all(f"[{i}]" in report for i in ids) and "5 of 6 experiments passed" in report


def test_the_experiments_run_alone_come_last_on_lane_1_once_the_scratch_stack_is_down(
    played: Path, tmp_path: Path
) -> None:
    alone = sorted(ALONE - FAULTS)
    ids = [*alone, *[i for i in RUNNABLE if i not in ALONE][:4]]
    out = tmp_path / "gd"
    r = runner.invoke(app, ["chaos", "gameday", "--lanes", "2", "--only", ",".join(ids),
                            "--out", str(out), "--json"])  # fmt: skip
    assert r.exit_code == 0, r.output
    summary = json.loads(r.output.strip().splitlines()[-1])
    assert sorted(e["id"] for e in summary["experiments"]) == sorted(ids)
    tail = [x for x in summary["lanes"] if x["alone"]]
    assert [(x["lane"], sorted(x["ids"]), x["exit"]) for x in tail] == [(1, alone, 0)]
    lines = played.read_text().splitlines()
    down = lines.index(f"down {tmp_path / 'stack-lane2'}")
    runs = [(n, json.loads(x)) for n, x in enumerate(lines) if x.startswith("{")]
    last = [n for n, x in runs if sorted(x["ids"]) == alone]
    assert len(last) == 1 and last[0] > down, lines  # after the scratch stack went down
    assert runs[-1][1]["home"] == str(tmp_path / "stack")  # on lane 1's stack
    assert all(n < down for n, x in runs if sorted(x["ids"]) != alone)


def test_a_lane_whose_stack_does_not_start_fails_its_experiments_and_is_still_taken_down(
    played: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(
        lanes, "up_command", lambda tls: [sys.executable, "-c", "print('port taken'); exit(1)"]
    )
    ids = RUNNABLE[:8]
    r = runner.invoke(app, ["chaos", "gameday", "--lanes", "2", "--only", ",".join(ids),
                            "--out", str(tmp_path / "gd"), "--json"])  # fmt: skip
    assert r.exit_code == 1, r.output
    summary = json.loads(r.output.strip().splitlines()[-1])
    lane2 = next(x for x in summary["lanes"] if x["lane"] == 2)
    assert "did not start" in lane2["failure"] and "port taken" in lane2["failure"]
    assert lane2["ids"]
    # what `up` said is kept in the lane's folder: the stack and its logs are wiped
    assert (tmp_path / "gd" / "lane-2" / "stack-start" / "up.log").read_text() == "port taken\n"
    assert str(tmp_path / "gd" / "lane-2" / "stack-start") in lane2["failure"]
    verdicts = {e["id"]: e["verdict"] for e in summary["experiments"]}
    assert {verdicts[i] for i in lane2["ids"]} == {"failed"}
    assert {verdicts[i] for i in ids if i not in lane2["ids"]} == {"passed"}
    assert f"down {tmp_path / 'stack-lane2'}" in played.read_text()


def test_an_experiment_alone_waits_for_the_running_ones_and_no_lane_starts_one_meanwhile(
    tmp_path: Path,
) -> None:
    locks = tmp_path / "locks"
    log: list[str] = []
    entered = {k: threading.Event() for k in "abc"}
    release = {k: threading.Event() for k in "abc"}

    def lane(name: str, alone: bool) -> None:
        with lanes.turn(locks, alone):
            log.append(f"{name} in")
            entered[name].set()
            release[name].wait(30)
            log.append(f"{name} out")

    def gate_held() -> bool:
        with open(locks / "gate", "a+") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f, fcntl.LOCK_UN)
            return False

    a = threading.Thread(target=lane, args=("a", False))
    a.start()
    assert entered["a"].wait(10)
    b = threading.Thread(target=lane, args=("b", True))  # alone: waits for a
    b.start()
    for _ in range(400):  # b holds the gate while it waits for the stage
        if gate_held():
            break
        threading.Event().wait(0.05)
    assert gate_held() and not entered["b"].is_set()
    c = threading.Thread(target=lane, args=("c", False))  # shared, but behind b
    c.start()
    assert not entered["c"].wait(1.0), "a lane started an experiment while one waited alone"
    release["a"].set()
    assert entered["b"].wait(10)
    assert not entered["c"].wait(0.5), "a lane started an experiment beside one alone"
    release["b"].set()
    assert entered["c"].wait(10)
    release["c"].set()
    for t in (a, b, c):
        t.join(10)
    assert log == ["a in", "a out", "b in", "b out", "c in", "c out"]
    with lanes.turn(None, True):  # no lanes: nothing to hold
        log.append("alone, no lanes")
    assert log[-1] == "alone, no lanes"


def test_shared_turns_run_side_by_side(tmp_path: Path) -> None:
    second = threading.Event()

    def other_lane() -> None:
        with lanes.turn(tmp_path, False):
            second.set()

    with lanes.turn(tmp_path, False):
        t = threading.Thread(target=other_lane, daemon=True)
        t.start()
        assert second.wait(10), "a lane's experiment waited for another that does not run alone"
    t.join(10)
