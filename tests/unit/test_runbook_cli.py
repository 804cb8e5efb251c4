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
