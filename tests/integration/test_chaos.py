"""The game day on the test stack: experiments of chaos/experiments run by `likes chaos run`, with
real faults and traffic through the gateway, judged on the stores (chaos/probes.py); and one
experiment that breaks an invariant on purpose, which the hypothesis must catch."""

from __future__ import annotations

import copy
import json
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from chaos import catalog, runner, traffic
from services.contracts import clients
from tests.conftest import LIKES, Stack

pytestmark = pytest.mark.stack

# One test item per experiment run in CI: these on the first stack, IN_CI_B on the second
# (tests/integration/test_gameday.py). The rest of chaos/experiments runs by `likes chaos run`
# (each ~70-170 s: the suite's 45-minute budget holds a few; see the notes).
# edge-store-quorum-loss is not here yet: its invariants held in 3 runs of 3 (the count left
# short in 1 run of 5 was fixed in the aggregator), but ReadBreakerOpen fired in 2 of them only.
# The network experiments need the faults profile: a switch restarts every server twice (~3 min).
IN_CI = ("aggregator-crash", "write-idem-store-down")
# The alerts each experiment's catalog entry expects, written out here: an oracle of its own (the
# runner reads them from the catalog, and reports what it read).
EXPECTED_ALERTS = {
    "aggregator-crash": ["AggregatorStalled", "ConsumerLagBudgetBurn"],
    "write-idem-store-down": ["WriteAvailabilityBudgetBurn"],
    "aggregator-poison-event": [],
    "abuse-model-down": ["AbuseScoringStalled", "ConsumerLagBudgetBurn", "AbuseStorm"],
}
INVARIANTS = {"no_accepted_like_lost", "counts_converged", "reads_never_5xx", "writes_clean",
              "alerts_fired_and_resolved"}  # fmt: skip
EXTRA_CHECKS = {
    "aggregator-poison-event": {"poison_dead_lettered"},
    # the bot ring's: every like scored before the counts are judged, its likes voided after
    "abuse-model-down": {"ring_scored", "storm_voided"},
}


@pytest.mark.disruptive
@pytest.mark.parametrize("mode_id", IN_CI)
def test_the_experiment_passes_on_the_stack(stack: Stack, mode_id: str, tmp_path: Path) -> None:
    experiment_passes(stack, mode_id, tmp_path)


def experiment_passes(stack: Stack, mode_id: str, tmp_path: Path) -> None:
    """`likes chaos run MODE --json` on the stack: completed, not deviated, every invariant
    held, each expected alert delivered firing after the fault and resolved, every activity
    and rollback succeeded."""
    proc = stack.cli("chaos", "run", mode_id, "--json", "--journal-dir", str(tmp_path),
                     check=False, timeout=400)  # fmt: skip
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (out["id"], out["status"], out["deviated"]) == (mode_id, "completed", False), out
    assert out["verdict"] == "passed" and proc.returncode == 0, out
    checks = out["checks"]
    assert set(checks["checks"]) == INVARIANTS | EXTRA_CHECKS.get(mode_id, set())
    expected = EXPECTED_ALERTS[mode_id]
    assert checks["expected_alerts"] == expected
    for alert in expected:  # delivered firing after the fault, then resolved
        a = checks["alerts"][alert]
        assert 0 < a["fired_s"] < a["resolved_s"], (alert, a)
    sent = checks["traffic"]
    assert sent["likes_accepted"] >= 100, sent  # the traffic ran through the fault
    journal = json.loads(Path(out["journal"]).read_text())
    assert [a["status"] for a in journal["run"] + journal["rollbacks"]] == ["succeeded"] * (
        len(journal["run"]) + len(journal["rollbacks"])
    )
    if mode_id == "write-idem-store-down":
        # it failed closed, cleanly (503 + Retry-After, no hang), while the store was gone
        assert sent["writes"].get("503", 0) > 0 and sent["unclean_writes"] == 0, sent
    if mode_id == "aggregator-poison-event":  # every poison event dead-lettered, none counted
        poison = checks["poison"]
        assert poison["produced"] > 0 and poison["dead_lettered"] == poison["produced"], poison


def _answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@pytest.mark.disruptive
def test_ctrl_c_stops_the_run_and_leaves_the_stack_whole(stack: Stack, tmp_path: Path) -> None:
    """Ctrl-C while an experiment's fault holds (the idem-store killed, 30 s to go): the run
    stops at once with 130 and says so, its rollbacks ran (the journal is `interrupted` and
    lists them), and the stack is whole again when it exits: every killed server answers."""
    mode_id = "write-idem-store-down"
    ports = stack.layout.ports.idem_store
    proc = subprocess.Popen([LIKES, "chaos", "run", mode_id, "--journal-dir", str(tmp_path)],
                            env=stack.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)  # fmt: skip
    try:
        deadline = time.monotonic() + 180
        while all(_answers(p) for p in ports):  # the fault: the method killed them
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        out, errs = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            stack.up()
    assert proc.returncode == 130, (out, errs)
    assert "interrupted" in errs, errs
    assert all(_answers(p) for p in ports), "a killed idem-store node is still down"
    journal = json.loads((tmp_path / f"{mode_id}.json").read_text())
    assert journal["status"] == "interrupted", journal["status"]
    # the method stopped where the Ctrl-C came: the fault's 30 s were not waited out, its own
    # restart step never ran (the rollbacks restarted the store)
    ran = [r["activity"]["name"] for r in journal["run"]]
    assert ran[-1] == "kill-idem-store" and "restart-idem-store" not in ran, ran
    rolled = {r["activity"]["name"]: r["status"] for r in journal["rollbacks"]}
    assert rolled and set(rolled.values()) == {"succeeded"}, rolled
    assert "stop-traffic" in rolled, rolled
    assert journal["likes"]["verdict"] == "failed", journal["likes"]


def lose_an_accepted_like() -> list[str]:
    """Sabotage, reachable only from this test: delete the edge of one like the platform
    accepted (a 202), as a store that dropped an acknowledged write would."""
    from cli import stack_settings

    t = traffic.current()
    assert t is not None and t.ledger, "no accepted like to lose"
    user, post = sorted(t.ledger)[0]
    cluster, session = clients.cassandra(stack_settings.platform_settings())
    try:
        session.execute(
            "DELETE FROM edges WHERE user_id = %s AND kind = 'edge' AND ref = %s", (user, post)
        )
    finally:
        cluster.shutdown()
    return [user, post]


def test_an_experiment_that_loses_a_like_deviates(
    stack: Stack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for k, v in stack.env.items():
        if k.startswith("LIKES_"):
            monkeypatch.setenv(k, v)
    exp = copy.deepcopy(catalog.experiment("aggregator-crash"))
    exp["title"] = "sabotage: one accepted like's edge deleted"
    exp["configuration"] = {"mode": "sabotage"}  # no catalog entry: no alert to wait for
    start = exp["method"][0]
    start["pauses"] = {"after": 3}
    exp["method"] = [start, {
        "type": "action", "name": "lose-an-accepted-like",
        "provider": {"type": "python", "module": __name__, "func": "lose_an_accepted_like"},
    }]  # fmt: skip
    probe = exp["steady-state-hypothesis"]["probes"][0]
    probe["provider"]["arguments"] = {"timeout_s": 5}  # it cannot converge: do not wait long
    result = runner.run("sabotage", tmp_path, experiment=exp)
    assert (result.status, result.deviated, result.verdict) == ("completed", True, "deviated")
    checks = result.checks["checks"]
    assert checks["no_accepted_like_lost"] is False, result.checks
    assert len(result.checks["lost"]) == 1, result.checks
    assert checks["reads_never_5xx"] and checks["writes_clean"], result.checks
