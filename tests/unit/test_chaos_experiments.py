"""The experiments of chaos/experiments against Chaos Toolkit's own validation and the catalog
(one truth: a fault aims at the servers its mode names), and `likes chaos list|run` offline."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from chaoslib.experiment import ensure_experiment_is_valid
from typer.testing import CliRunner

from chaos import catalog
from cli.main import app

EXPERIMENTS = sorted(p.stem for p in catalog.EXPERIMENTS.glob("*.json"))
# to servers the catalog names
FAULTS = {"kill", "stop", "pause", "kill_shard", "add_toxic", "hang_loop"}
NETWORK_FAULTS = {"add_toxic"}  # through the --faults profile's proxies
# dealt to the data or the control plane, and what undoes each (in the method and the rollbacks)
DATA_FAULTS = {"produce_poison": None, "refuse_records": "accept_records", "set_flag": "unset_flag",
               "split_post": "unsplit_post", "register_incompatible_schema": None,
               "drop_answers": "keep_answers", "push_bad_config": "remove_bad_config",
               "push_stale_hot_flag": "remove_stale_hot_flag",
               "purge_api_outage": "end_purge_api_outage", "bot_storm": None,
               "deploy_bad_model": "rollback_model", "bad_sampling": "good_sampling",
               "cold_viral_post": None,
               "poison_schema_record": "restore_schema_record"}  # fmt: skip
# a mode's own checks, after invariants_hold
MODE_PROBES = {"post_cells_spread", "anonymous_max_age", "storm_voided", "none_voided",
               "spike_on_hot_pools", "sampling_moved"}  # fmt: skip
runner = CliRunner()


def funcs(activities: list[dict[str, Any]]) -> list[str]:
    return [a["provider"]["func"] for a in activities]


def test_there_are_experiments_and_each_is_an_enactable_mode() -> None:
    modes = {m.id: m for m in catalog.modes()}
    assert len(EXPERIMENTS) >= 6
    for mode_id in EXPERIMENTS:
        assert mode_id in modes, f"{mode_id}.json enacts no mode of catalog.yaml"
        assert modes[mode_id].enactable, f"{mode_id} is production-only in the catalog"


@pytest.mark.parametrize("mode_id", EXPERIMENTS)
def test_chaos_toolkit_accepts_the_experiment(mode_id: str) -> None:
    ensure_experiment_is_valid(catalog.experiment(mode_id))  # imports every Python provider too


@pytest.mark.parametrize("mode_id", EXPERIMENTS)
def test_traffic_fault_recovery_hypothesis_and_rollbacks(mode_id: str) -> None:
    exp, mode = catalog.experiment(mode_id), catalog.mode(mode_id)
    method = funcs(exp["method"])
    assert method[0] == "start_traffic"
    faults = [a for a in exp["method"] if a["provider"]["func"] in FAULTS]
    data_faults = [f for f in method if f in DATA_FAULTS]
    assert faults or data_faults, "no fault in the method"
    for a in faults:  # aimed where the catalog says
        args = a["provider"]["arguments"]
        servers = args["servers"] if "servers" in args else [args["component"]]
        assert set(servers) <= set(mode.targets), (servers, mode.targets)
    undo = list(dict.fromkeys(DATA_FAULTS[f] for f in data_faults if DATA_FAULTS[f]))
    if faults or undo:
        recover = ("restart", "restart_cold", "resume", "up", "remove_toxics",
                   "restart_hung", *undo)  # fmt: skip
        assert method[-1] in recover, "the method ends by recovering"
    # a network fault needs the proxies: the catalog says so, and `run` brings the profile up
    assert bool(set(method) & NETWORK_FAULTS) == (mode.profile == "faults"), mode.profile
    for u in undo:  # undone in the method, and again in the rollbacks (which always run)
        assert u in method and u in funcs(exp["rollbacks"]), u
    probes = exp["steady-state-hypothesis"]["probes"]
    # the invariants first (they stop the traffic); a mode's own checks after, on what it left
    assert [(p["provider"]["module"], p["provider"]["func"], p["tolerance"]) for p in probes] == [
        ("chaos.probes", "invariants_hold", True),
        *(("chaos.probes", f, True) for f in funcs(probes[1:]) if f in MODE_PROBES),
    ]
    assert funcs(exp["rollbacks"]) == [*undo, "stop_traffic", "up"]
    assert exp["configuration"] == {"mode": mode_id}  # the probe reads its alerts from the entry
    assert exp["description"].startswith(mode.seed)


def test_list_json_gives_every_mode() -> None:
    r = runner.invoke(app, ["chaos", "list", "--json"])
    assert r.exit_code == 0, r.output
    got = json.loads(r.stdout)
    assert [m["id"] for m in got] == [m.id for m in catalog.modes()]
    by_id = {m["id"]: m for m in got}
    for mode_id in EXPERIMENTS:
        assert by_id[mode_id]["experiment"] is True and by_id[mode_id]["enactable"] is True
    assert {"id", "component", "enactable"} <= set(got[0])


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["chaos", "run", "no-such-mode"], "no failure mode 'no-such-mode'"),
        (["chaos", "run", "cdn-pop-outage"], "production-only"),
        (["chaos", "run", "aggregator-crash", "--target", "prod-us"], "unknown --target"),
        (["chaos", "gameday", "--only", "aggregator-crash,no-such-mode"], "no-such-mode"),
        (["chaos", "run", "kafka-consumer-lag-spike", "--target", "k8s"], "pod-level counterpart"),
        # production pods are deleted only on a yes: CliRunner's stdin is no terminal to ask
        (["chaos", "run", "aggregator-crash", "--target", "k8s"], "without --yes"),
    ],
)
def test_run_refuses_what_it_cannot_run_naming_the_problem(args: list[str], says: str) -> None:
    r = runner.invoke(app, args)
    assert r.exit_code == 2, r.output
    assert says in r.output


def test_run_print_shows_the_production_variant_and_runs_nothing() -> None:
    r = runner.invoke(app, ["chaos", "run", "aggregator-crash", "--target", "k8s", "--print"])
    assert r.exit_code == 0, r.output
    e = json.loads(r.stdout)
    (fault,) = e["method"]
    assert fault["provider"]["func"] == "terminate_pods"
    assert fault["provider"]["arguments"]["label_selector"] == "app.kubernetes.io/name=aggregator"


def test_the_expected_alerts_are_the_catalogs_but_the_watchdog() -> None:
    from chaos import probes

    assert probes.expected_alerts("aggregator-crash") == [
        "AggregatorStalled", "ConsumerLagBudgetBurn"]  # fmt: skip
    assert probes.expected_alerts("kafka-broker-loss") == []  # "alert: none (gap)"
    assert probes.expected_alerts("prometheus-loss") == []  # the Watchdog only
    assert probes.expected_alerts(None) == probes.expected_alerts("no-such-mode") == []
    fired = {"AggregatorStalled": {"fired_s": 20.0, "resolved_s": 40.0},
             "ConsumerLagBudgetBurn": {"fired_s": 25.0, "resolved_s": None}}  # fmt: skip
    assert not probes._fired_and_resolved(fired, ["AggregatorStalled", "ConsumerLagBudgetBurn"])
    assert probes._fired_and_resolved(fired, ["AggregatorStalled"])
    # a fire-only alert (its window outlasts the run) must fire; it need not resolve
    assert probes.fire_only_alerts("dlq-unbounded-growth") == {"DeadLetterDailyGrowth"}
    assert probes.fire_only_alerts("aggregator-crash") == set()
    assert probes._fired_and_resolved(fired, ["ConsumerLagBudgetBurn"], {"ConsumerLagBudgetBurn"})
    never = {"DeadLetterDailyGrowth"}  # not in `fired` at all
    assert not probes._fired_and_resolved(fired, sorted(never), never)


def test_an_alert_firing_since_before_the_run_is_marked_carried_over(tmp_path: Path) -> None:
    """The sink's notifications since the run began: an alert whose every firing notification
    is of an episode begun before the run (its startsAt) is carried over, one that began in the
    run is not, even when an earlier episode of it (another instance's, say) is repeated
    before and after."""
    from chaos import probes, report
    from chaos.runner import Result

    since = 1_700_000_000.0  # 2023-11-14T22:13:20Z

    def note(at: float, *alerts: tuple[str, str, str]) -> dict[str, Any]:
        return {"receiver": "pager", "received_at": since + at, "payload": {"alerts": [
            {"labels": {"alertname": n}, "status": st, "startsAt": began}
            for n, st, began in alerts]}}  # fmt: skip

    before, during = "2023-11-14T22:12:00.123456789Z", "2023-11-14T22:13:30.5Z"
    entries = [
        note(-5, ("Old", "firing", before)),  # before the run: not read at all
        note(2, ("Old", "firing", before), ("Again", "firing", before)),
        note(12, ("Fresh", "firing", during), ("Again", "firing", during)),
        note(30, ("Again", "firing", before)),  # another instance's earlier episode, repeated
        note(40, ("Old", "resolved", before), ("Fresh", "resolved", during)),
    ]
    got = probes.alert_timings(entries, since)
    assert got["Old"] == {"receivers": ["pager"], "fired_s": 2.0, "resolved_s": 40.0,
                          "carried_over": True}  # fmt: skip
    assert got["Fresh"]["carried_over"] is False and got["Fresh"]["fired_s"] == 12.0
    assert got["Again"]["carried_over"] is False and got["Again"]["fired_s"] == 2.0
    assert probes._epoch(before) == since - 80 + 0.123456789
    assert probes._epoch("yesterday") is None
    run = Result("aggregator-crash", "completed", False, "passed", 70.0, [], {"alerts": got})
    rows = {r[0]: r for r in report._alerts(run)}
    assert rows["Old"][1] == "+2.0 s (carried over)" and rows["Fresh"][1] == "+12.0 s"


def test_the_report_has_a_table_a_section_and_a_plot_per_experiment(tmp_path: Path) -> None:
    from chaos import report
    from chaos.runner import Result

    timeline = [{"t": float(t), "write_ok": 0.0 if 5 <= t < 9 else 1.0, "write_p99_ms": 20.0,
                 "read_ok": 1.0, "read_p99_ms": 5.0} for t in range(15)]  # fmt: skip
    checks = {"checks": {"no_accepted_like_lost": True, "counts_converged": False},
              "timeline": timeline, "marks": [[5.0, "kill aggregator"], [9.0, "recovered"]],
              "drift": [[16.0, 12], [18.0, 0]], "traffic": {"likes_sent": 10, "likes_accepted": 9},
              "alerts": {"AggregatorStalled": {"fired_s": 7.0, "resolved_s": 30.0}}}  # fmt: skip
    ok = Result("aggregator-crash", "completed", False, "passed", 70.0, [], checks)
    bad = Result("kafka-broker-loss", "completed", True, "deviated", 80.0, [], {})
    md, page = report.write([ok, bad], tmp_path)
    text = md.read_text()
    assert "1 of 2 experiments passed." in text
    # writes failed for 4 s (t 5-8); no restart mark and no convergence data in this run
    assert "| [aggregator-crash](#aggregator-crash) | passed | 70.0 s | 4 s | - | - | - |" in text
    assert "| [kafka-broker-loss](#kafka-broker-loss) | deviated | 80.0 s | - | - | - | - |" in text
    assert report.timings(ok) == {"writes_degraded_s": 4.0, "reads_degraded_s": 0.0,
                                  "writes_back_after_s": None, "stale_for_s": None}  # fmt: skip
    late = Result("x", "completed", False, "passed", 1.0, [], {**checks, "marks": [
        [5.0, "kill aggregator"], [7.0, "restart aggregator"]],
        "convergence": {"first_match_s": 3.25}})  # fmt: skip
    assert report.timings(late)["writes_back_after_s"] == 2.0  # t 9, the first healthy second
    assert report.timings(late)["stale_for_s"] == 3.2
    assert "counts_converged | VIOLATED" in text and "at +5.0 s | kill aggregator" in text
    assert "| AggregatorStalled | +7.0 s | +30.0 s | [runbooks/aggregator-stalled.md]" in text
    svg = (tmp_path / "plots" / "aggregator-crash.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert not (tmp_path / "plots" / "kafka-broker-loss.svg").exists()  # no traffic, no plot
    assert page.read_text().count("<svg") == 1


def always(value: bool = True) -> bool:
    return value


def broken() -> None:
    raise RuntimeError("the fault could not be injected")


def _experiment(hypothesis: bool, action: str) -> dict[str, Any]:
    here = {"type": "python", "module": __name__}
    return {
        "title": "offline", "description": "the runner's verdicts",
        "steady-state-hypothesis": {"title": "h", "probes": [{
            "type": "probe", "name": "h", "tolerance": True,
            "provider": {**here, "func": "always", "arguments": {"value": hypothesis}}}]},
        "method": [{"type": "action", "name": action, "provider": {**here, "func": action}}],
    }  # fmt: skip


@pytest.mark.parametrize(
    ("hypothesis", "action", "verdict", "failed"),
    [
        (True, "always", "passed", []),
        # Chaos Toolkit says "completed" for both: the runner must not
        (True, "broken", "failed", ["broken"]),
        (False, "always", "failed", ["steady state before the method (the stack was not ready)"]),
    ],
)
def test_the_verdict_counts_failed_activities_and_an_unmet_hypothesis_before(
    hypothesis: bool, action: str, verdict: str, failed: list[str],
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
) -> None:  # fmt: skip
    from chaos import probes, runner

    monkeypatch.setattr(probes, "stack_ready", lambda: True)
    r = runner.run("offline", tmp_path, experiment=_experiment(hypothesis, action))
    assert (r.status, r.verdict, r.failed_activities) == ("completed", verdict, failed)
    assert json.loads((tmp_path / "offline.json").read_text())["likes"]["verdict"] == verdict


NETWORK_MODE = "write-edge-store-quorum-loss"  # profile: faults
PROCESS_MODE = "aggregator-crash"


@pytest.mark.parametrize(
    ("mode_id", "was_faults", "restore", "fails", "switches"),
    [
        (NETWORK_MODE, False, True, False, [True, False]),  # up in the profile, and back after
        (NETWORK_MODE, False, True, True, [True, False]),  # back even when the run raises
        (NETWORK_MODE, False, False, False, [True]),  # a game day restores at its own end
        (NETWORK_MODE, True, True, False, [True]),  # already in it: nothing to undo
        (PROCESS_MODE, False, True, False, []),  # needs no proxies: the stack stays as it is
    ],
)
def test_run_brings_the_faults_profile_up_for_a_network_fault_and_leaves_the_stack_as_found(
    mode_id: str, was_faults: bool, restore: bool, fails: bool, switches: list[bool],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    from chaos import actions, runner

    calls: list[bool] = []

    def use_profile(faults: bool) -> bool:
        calls.append(faults)
        return faults != was_faults

    def run(mode_id: str, journal_dir: Path | None, experiment: dict[str, Any]) -> runner.Result:
        if fails:
            raise KeyboardInterrupt
        return runner.Result(mode_id, "completed", False, "passed", 1.0)

    monkeypatch.setattr(actions, "use_profile", use_profile)
    monkeypatch.setattr(runner, "_run", run)
    if fails:
        with pytest.raises(KeyboardInterrupt):
            runner.run(mode_id, restore_profile=restore)
    else:
        assert runner.run(mode_id, restore_profile=restore).verdict == "passed"
    assert calls == switches


def test_a_game_day_runs_the_network_faults_last_and_switches_back_once(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from chaos import actions, report, runner
    from local import layout

    monkeypatch.setenv("LIKES_HOME", str(tmp_path / "stack"))
    profile = {"faults": False}
    ran: list[tuple[str, bool]] = []
    switched: list[bool] = []

    def use_profile(faults: bool) -> bool:
        switched.append(faults)
        changed = profile["faults"] != faults
        profile["faults"] = faults
        return changed

    def run(mode_id: str, journal_dir: Path, restore_profile: bool = True) -> runner.Result:
        assert restore_profile is False
        if runner.needs_faults(mode_id):
            use_profile(True)
        ran.append((mode_id, profile["faults"]))
        return runner.Result(mode_id, "completed", False, "passed", 1.0)

    monkeypatch.setattr(actions, "use_profile", use_profile)
    monkeypatch.setattr(runner, "run", run)
    monkeypatch.setattr(layout, "from_env", lambda: type("L", (), dict(profile))())
    monkeypatch.setattr(report, "write", lambda results, out: (out / "r.md", out / "r.html"))
    only = f"{NETWORK_MODE},{PROCESS_MODE},kafka-cross-az-partition"
    res = CliRunner().invoke(app, ["chaos", "gameday", "--only", only, "--out", str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert ran == [(PROCESS_MODE, False), (NETWORK_MODE, True), ("kafka-cross-az-partition", True)]
    assert switched == [True, True, False] and profile["faults"] is False
    # a scratch lane's game day (chaos/lanes.py) leaves its stack in the profile: wiped next
    switched.clear()
    res = CliRunner().invoke(app, ["chaos", "gameday", "--only", only, "--out", str(tmp_path),
                                   "--no-restore-profile"])  # fmt: skip
    assert res.exit_code == 0, res.output
    assert switched == [True, True] and profile["faults"] is True


SWITCH_FAILED = "ProbeFailed: count-cache node 10002: primary without a replica"


def _switch_back_fails(monkeypatch: pytest.MonkeyPatch, profile: dict[str, bool]) -> None:
    from chaos import actions
    from local import layout

    def use_profile(faults: bool) -> bool:
        if not faults:
            raise RuntimeError(SWITCH_FAILED)
        changed = profile["faults"] != faults
        profile["faults"] = faults
        return changed

    monkeypatch.setattr(actions, "use_profile", use_profile)
    monkeypatch.setattr(layout, "from_env", lambda: type("L", (), dict(profile))())


def test_a_run_whose_switch_back_fails_keeps_its_result_and_says_how_to_recover(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # after kafka-cross-az-partition the switch back raised inside `finally`: the verdict
    # and the journal's path were lost behind a traceback
    from chaos import runner

    _switch_back_fails(monkeypatch, {"faults": False})
    monkeypatch.setattr(runner, "_run", lambda m, j, e: runner.Result(m, "completed", False,
                                                                      "passed", 1.0))  # fmt: skip
    res = CliRunner().invoke(app, ["chaos", "run", NETWORK_MODE, "--json"])
    assert res.exit_code == 1, res.output
    out = json.loads(res.stdout.splitlines()[0])
    assert out["verdict"] == "passed" and SWITCH_FAILED in out["restore_error"]
    assert "likes local up --no-faults" in " ".join(res.output.split())  # Rich wraps lines


def test_a_game_day_whose_switch_back_fails_still_writes_its_report(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from chaos import report, runner

    monkeypatch.setenv("LIKES_HOME", str(tmp_path / "stack"))
    profile = {"faults": False}
    _switch_back_fails(monkeypatch, profile)

    def run(mode_id: str, journal_dir: Path, restore_profile: bool = True) -> runner.Result:
        if runner.needs_faults(mode_id):
            profile["faults"] = True
        return runner.Result(mode_id, "completed", False, "passed", 1.0)

    written: list[list[str]] = []

    def write(results: list[runner.Result], out: Path) -> tuple[Path, Path]:
        written.append([r.id for r in results])
        return out / "r.md", out / "r.html"

    monkeypatch.setattr(runner, "run", run)
    monkeypatch.setattr(report, "write", write)
    res = CliRunner().invoke(app, ["chaos", "gameday", "--only", f"{PROCESS_MODE},{NETWORK_MODE}",
                                   "--out", str(tmp_path)])  # fmt: skip
    assert res.exit_code == 1, res.output
    assert written == [[PROCESS_MODE, NETWORK_MODE]]
    said = " ".join(res.output.split())
    assert "likes local up --no-faults" in said and SWITCH_FAILED in said
