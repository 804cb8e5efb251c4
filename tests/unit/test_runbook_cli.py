"""The runbook files as `likes runbook` reads them: every one loads, its checks' constants
resolve, and a malformed one is refused naming the file and the field."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli import runbook
from cli.main import app
from infra import alert_rules
from services.contracts import metrics

runner = CliRunner()


def test_every_runbook_loads_and_answers_the_alerts_the_rules_name() -> None:
    books = runbook.all_runbooks()
    groups = alert_rules.rule_groups(alert_rules.default_slos())["groups"]
    alerts = {r["alert"] for g in groups for r in g["rules"] if "alert" in r}
    assert {a for rb in books for a in rb.alerts} == alerts
    for rb in books:
        for c in rb.checks:
            assert "${" not in c.promql + c.trouble + c.reading, (rb.slug, c.check)


def test_every_reading_is_written_with_the_labels_its_query_keeps() -> None:
    """A trouble reading names only `value` and the labels the query aggregates by (or, for a
    query that keeps its series' labels, instance): else on-call gets the raw sample."""
    for rb in runbook.all_runbooks():
        for c in rb.checks:
            kept = {"instance"}
            for group in re.findall(r"\bby \(([^)]*)\)", c.promql):
                kept |= {label.strip() for label in group.split(",")}
            labels = {k: "x" for k in kept}
            assert c.reading.format(value=1.0, **labels), (rb.slug, c.check)


def test_a_check_names_constants_so_a_renamed_metric_changes_the_runbook() -> None:
    rb = runbook.for_alert(alert_rules.AGGREGATOR_STALLED)
    loop = next(c for c in rb.checks if metrics.AGGREGATOR_LOOP_TIMESTAMP in c.promql)
    assert loop.trouble == f"> {alert_rules.LOOP_HUNG_AFTER_S}"
    assert loop.is_trouble(alert_rules.LOOP_HUNG_AFTER_S + 1)
    assert not loop.is_trouble(alert_rules.LOOP_HUNG_AFTER_S)


def _book(tmp_path: Path, front: str) -> Path:
    path = tmp_path / "x.md"
    path.write_text(f"---\n{front}---\n# X\n")
    return path


@pytest.mark.parametrize(
    ("front", "says"),
    [
        ("diagnose: []\n", "`alerts` must be a non-empty list"),
        ("alerts: [A]\ndiagnose:\n  - check: c\n    promql: up\n    reading: r\n",
         "missing ['trouble']"),
        ("alerts: [A]\ndiagnose:\n  - {check: c, promql: up, trouble: big, reading: r}\n",
         "is not like '> 60'"),
        ("alerts: [A]\ndiagnose:\n  - {check: c, promql: '${metrics.NOPE}', trouble: '> 1', "
         "reading: r}\n", "${metrics.NOPE} names no constant"),
        ("alerts: [A]\ndiagnose:\n  - {check: c, promql: up, trouble: '> 1', reading: r, "
         "when_empty: maybe}\n", "when_empty must be one of"),
    ],
)  # fmt: skip
def test_a_malformed_runbook_is_refused_naming_the_file_and_field(
    tmp_path: Path, front: str, says: str
) -> None:
    with pytest.raises(runbook.RunbookError) as e:
        runbook.load(_book(tmp_path, front))
    assert str(e.value).startswith("x.md") and says in str(e.value)


def test_list_json_and_show_and_an_unknown_alert() -> None:
    listed = json.loads(runner.invoke(app, ["runbook", "list", "--json"]).stdout)
    by_path = {r["runbook"]: r for r in listed}
    assert by_path["runbooks/aggregator-stalled.md"]["alerts"] == ["AggregatorStalled"]
    assert by_path["runbooks/aggregator-stalled.md"]["checks"] >= 2
    shown = runner.invoke(app, ["runbook", "show", "AggregatorStalled"])
    assert shown.exit_code == 0 and "User impact" in shown.stdout
    assert metrics.AGGREGATOR_LOOP_TIMESTAMP in shown.stdout
    unknown = runner.invoke(app, ["runbook", "diagnose", "NoSuchAlert"])
    assert unknown.exit_code == 2 and "no runbook answers the alert 'NoSuchAlert'" in unknown.output


def test_every_runbook_mitigates_escalates_and_links_to_what_exists() -> None:
    repo = runbook.REPO
    for rb in runbook.all_runbooks():
        assert rb.mitigations, f"{rb.slug}: no mitigation"
        assert rb.escalate, f"{rb.slug}: no escalation"
        assert rb.links, f"{rb.slug}: no links"
        for link in rb.links:
            assert link.startswith("https://") or (repo / link).exists(), (rb.slug, link)


def test_every_mitigation_is_a_likes_command_that_parses() -> None:
    """Each step's command resolves to a `likes` command, and its arguments parse (placeholders
    filled): a renamed command or option fails here, not at 3 a.m."""
    for rb in runbook.all_runbooks():
        for i, m in enumerate(rb.mitigations, 1):
            argv = m.argv({p: "some-post" for p in m.placeholders})
            command, rest = runbook.resolve(argv)
            assert command.callback is not None, (rb.slug, i, m.run)
            command.make_context("likes", list(rest))  # raises on an unknown option or argument
            if m.mutates:
                assert any(p.name == "yes" for p in command.params), (rb.slug, i, m.run)


def test_a_step_marked_read_only_that_mutates_is_refused(tmp_path: Path) -> None:
    front = (
        "alerts: [X]\nmitigate:\n- step: off\n  run: likes flags set panic on\n  mutates: false\n"
    )
    with pytest.raises(runbook.RunbookError, match="marked mutates: False"):
        runbook.load(_book(tmp_path, front))
    assert runbook.is_mutating("likes recount p1 --repair")
    assert not runbook.is_mutating("likes recount p1")
    assert not runbook.is_mutating("likes flags get")


def test_run_refuses_a_missing_step_or_value_and_a_declined_step_runs_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ran: list[list[str]] = []
    monkeypatch.setattr(runbook, "_invoke", lambda argv: ran.append(argv) or 0)
    out = runner.invoke(app, ["runbook", "run", "CanaryDrift", "--step", "99"])
    assert out.exit_code == 2 and "mitigation(s)" in out.output
    steps = runbook.for_alert("CanaryDrift").mitigations
    needs_post = next(i for i, m in enumerate(steps, 1) if m.placeholders)
    out = runner.invoke(app, ["runbook", "run", "CanaryDrift", "--step", str(needs_post)])
    assert out.exit_code == 2 and "--arg post_id=" in out.output
    args = ["runbook", "run", "CanaryDrift", "--step", str(needs_post), "--arg", "post_id=p1"]
    out = runner.invoke(app, args, input="n\n")
    assert out.exit_code == 1 and ran == []  # declined: nothing ran
    read_only = next(i for i, m in enumerate(steps, 1) if not m.mutates)
    out = runner.invoke(app, ["runbook", "run", "CanaryDrift", "--step", str(read_only)])
    assert out.exit_code == 0 and ran == [runbook.shlex.split(steps[read_only - 1].run)[1:]]
