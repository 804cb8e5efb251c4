"""Run one experiment with Chaos Toolkit (chaoslib) and judge it.

Chaos Toolkit reports `completed` even when an action failed (an activity's failure is in its
own `status`), and when the hypothesis failed BEFORE the method (then nothing ran): the verdict
here is `passed` only when the hypothesis held before and after the method (not `deviated`) and
every activity and rollback succeeded. Rollbacks run
always (the `always` strategy: the stack is left as it was found, whatever happened), and the
traffic is stopped and `likes local up` run once more if the run is interrupted (Ctrl-C).
Chaos Toolkit catches a Ctrl-C that lands in the method itself, runs the rollbacks and returns
an `interrupted` journal: the run then saves that journal and raises KeyboardInterrupt, so a
game day stops instead of going on to the next experiment.
"""

from __future__ import annotations

import json
import logging
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chaos import actions, catalog, probes, traffic
from chaos.k8s import DEFAULT_STACK

SETTINGS = {"runtime": {"rollbacks": {"strategy": "always"}}}
READY_WAIT_S = 120.0  # for every server to answer before an experiment starts
log = logging.getLogger("chaos.runner")


@dataclass
class Result:
    id: str
    status: str  # Chaos Toolkit's: completed, failed, aborted, interrupted
    deviated: bool
    verdict: str  # passed, deviated or failed
    duration_s: float
    failed_activities: list[str] = field(default_factory=list)
    checks: dict[str, Any] = field(default_factory=dict)
    journal: str | None = None
    # why the stack could not be switched back out of the faults profile after the run
    restore_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def run(
    mode_id: str,
    journal_dir: Path | None = None,
    experiment: dict[str, Any] | None = None,
    restore_profile: bool = True,
) -> Result:
    """Run the mode's experiment (chaos/experiments/<id>.json), or `experiment` under its id.
    A mode of the faults profile (its catalog entry's `profile: faults`) first brings the stack
    up in it when it runs without, and with `restore_profile` brings it back after: the stack
    is left as it was found (a game day switches once and restores at its end)."""
    if experiment is None:
        experiment = catalog.experiment(mode_id)
    switched = needs_faults(mode_id) and actions.use_profile(True)
    try:
        result = _run(mode_id, journal_dir, experiment)
    except BaseException:
        if switched and restore_profile:
            switch_profile(False)
        raise
    if switched and restore_profile:
        result.restore_error = switch_profile(False)
    return result


def switch_profile(faults: bool) -> str | None:
    """Bring the stack into (or out of) the faults profile; None when it came up, else why
    not. A failed switch must not lose the results of what ran before it (a game day's report
    was never written when the switch back raised): the callers report it beside them."""
    try:
        actions.use_profile(faults)
    except Exception as e:
        log.warning("switching the stack's profile failed: %s", e)
        return f"{type(e).__name__}: {e}"
    return None


def needs_faults(mode_id: str) -> bool:
    """The mode's experiment needs the --faults profile (Toxiproxy in front of the nodes); a
    test's own experiment under an id of its own does not."""
    return mode_id in catalog.faults_profile()


def _run(mode_id: str, journal_dir: Path | None, experiment: dict[str, Any]) -> Result:
    from chaoslib.experiment import run_experiment

    traffic.end()
    traffic._current = None  # each run measures its own traffic
    probes.last.clear()
    logging.getLogger("chaostoolkit").setLevel(logging.WARNING)
    started = time.monotonic()
    # a precondition, not the hypothesis: an earlier experiment's recovery may still be settling
    # (a service's readiness follows its stores by a few seconds)
    deadline = started + READY_WAIT_S
    while not probes.stack_ready() and time.monotonic() < deadline:
        time.sleep(2)
    with _sigint_seen() as ctrl_c:
        try:
            journal: dict[str, Any] = dict(run_experiment(experiment, settings=SETTINGS))
        except KeyboardInterrupt:
            traffic.end()
            actions.up()
            raise
        finally:
            traffic.end()
    duration = round(time.monotonic() - started, 1)
    result = _save(judge(mode_id, journal, duration, dict(probes.last)), journal, journal_dir)
    if ctrl_c.is_set():  # Chaos Toolkit caught it in the method and ran the rollbacks
        actions.up()
        raise Interrupted(result)
    return result


class Interrupted(KeyboardInterrupt):
    """A Ctrl-C during a run, after its rollbacks: `result` is the interrupted run's."""

    def __init__(self, result: Result) -> None:
        super().__init__(result.id)
        self.result = result


@contextmanager
def _sigint_seen() -> Iterator[threading.Event]:
    """Set when SIGINT arrives meanwhile (it still raises KeyboardInterrupt where it lands)."""
    seen = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield seen  # signals reach the main thread only
        return

    def on_sigint(signum: int, frame: Any) -> None:
        seen.set()
        signal.default_int_handler(signum, frame)

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)


def judge(mode_id: str, journal: dict[str, Any], duration: float, checks: dict[str, Any]) -> Result:
    """The verdict on a Chaos Toolkit journal (this module's docstring)."""
    activities = list(journal.get("run") or []) + list(journal.get("rollbacks") or [])
    failed = [
        a.get("activity", {}).get("name", "?") for a in activities if a.get("status") != "succeeded"
    ]
    status, deviated = str(journal.get("status")), bool(journal.get("deviated"))
    before = (journal.get("steady_states") or {}).get("before") or {}
    if before.get("steady_state_met") is False:  # Chaos Toolkit: "completed", nothing ran
        failed.insert(0, "steady state before the method (the stack was not ready)")
    if deviated:
        verdict = "deviated"
    elif status == "completed" and not failed:
        verdict = "passed"
    else:
        verdict = "failed"
    return Result(mode_id, status, deviated, verdict, duration, failed, checks)


def run_k8s(
    mode_id: str,
    journal_dir: Path | None = None,
    stack: str = DEFAULT_STACK,
    secrets: dict[str, str] | None = None,
    experiment: dict[str, Any] | None = None,
) -> Result:
    """The mode's production variant (chaos/k8s.py), or `experiment`, against the cluster of the
    current kube context (or `secrets`: chaostoolkit-kubernetes's KUBERNETES_HOST and friends)."""
    from chaoslib.experiment import run_experiment

    from chaos import k8s

    if experiment is None:
        experiment = k8s.experiment(mode_id, stack)
    if secrets:
        experiment["secrets"] = {"k8s": dict(secrets)}
        for activity in [*experiment["method"], *experiment["steady-state-hypothesis"]["probes"]]:
            activity["provider"]["secrets"] = ["k8s"]
    logging.getLogger("chaostoolkit").setLevel(logging.WARNING)
    started = time.monotonic()
    journal: dict[str, Any] = dict(run_experiment(experiment, settings=SETTINGS))
    duration = round(time.monotonic() - started, 1)
    deleted = [
        name
        for a in journal.get("run") or []
        if a.get("activity", {}).get("provider", {}).get("func") == "terminate_pods"
        for name in a.get("output") or []
    ]
    return _save(judge(mode_id, journal, duration, {"pods_deleted": deleted}), journal, journal_dir)


def _save(result: Result, journal: dict[str, Any], journal_dir: Path | None) -> Result:
    mode_id = result.id
    if journal_dir is not None:
        journal_dir.mkdir(parents=True, exist_ok=True)
        path = journal_dir / f"{mode_id}.json"
        path.write_text(json.dumps({**journal, "likes": result.as_dict()}, indent=2, default=str))
        result.journal = str(path)
    return result
