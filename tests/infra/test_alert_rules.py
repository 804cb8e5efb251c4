"""Alert rules: the committed file is what the code generates, promtool accepts every rule, and the
hand-written promtool unit tests (infra/rules/likes.rules.test.yml) pass, and fail when they
should."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra import alert_rules
from infra.alert_rules import (
    RULES_FILENAME,
    BurnRateAlert,
    Slo,
    default_slos,
    render,
    rule_groups,
    write_rules,
)
from tests.infra.conftest import tool

REPO = Path(__file__).resolve().parents[2]
RULES_DIR = REPO / "infra" / "rules"
UNIT_TESTS = RULES_DIR / "likes.rules.test.yml"
UNIT_TEST_FILES = (
    UNIT_TESTS,
    RULES_DIR / "likes.plain.test.yml",
    RULES_DIR / "likes.slis.test.yml",
    RULES_DIR / "likes.abuse.test.yml",
    RULES_DIR / "likes.workers.test.yml",
)


def _promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    # a missing promtool fails the test: a skip would pass a run that checked no rule
    promtool = tool("promtool", "prometheus")
    return subprocess.run([promtool, *args], capture_output=True, text=True, timeout=300, cwd=cwd)


def _rules(groups: dict[str, Any]) -> list[dict[str, Any]]:
    return [rule for group in groups["groups"] for rule in group["rules"]]


def _alerts(groups: dict[str, Any], name: str) -> list[dict[str, Any]]:
    return [r for r in _rules(groups) if r.get("alert") == name]


# --- the committed file ------------------------------------------------------------------------


def test_committed_rules_equal_a_fresh_generation() -> None:
    committed = (RULES_DIR / RULES_FILENAME).read_text()
    assert committed == render(rule_groups(default_slos())), (
        "infra/rules is stale: run `python -m infra.alert_rules infra/rules`"
    )


def test_module_entry_point_writes_the_rules_file(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "infra.alert_rules", str(tmp_path / "out")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    written = tmp_path / "out" / RULES_FILENAME
    assert written.read_text() == (RULES_DIR / RULES_FILENAME).read_text()


def test_write_rules_accepts_a_file_path(tmp_path: Path) -> None:
    target = write_rules(tmp_path / "custom.yml")
    assert target == tmp_path / "custom.yml"
    assert yaml.safe_load(target.read_text()) == rule_groups(default_slos())


# --- promtool ----------------------------------------------------------------------------------


def test_promtool_accepts_every_generated_rule(tmp_path: Path) -> None:
    fresh = write_rules(tmp_path)
    for path in (fresh, RULES_DIR / RULES_FILENAME):
        proc = _promtool("check", "rules", str(path))
        assert proc.returncode == 0, proc.stdout + proc.stderr
        count = len(_rules(rule_groups(default_slos())))
        assert f"SUCCESS: {count} rules found" in proc.stdout


def test_promtool_unit_tests_pass() -> None:
    proc = _promtool("test", "rules", *(f.name for f in UNIT_TEST_FILES), cwd=RULES_DIR)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == len(UNIT_TEST_FILES)


def _write_availability_cases() -> dict[str, Any]:
    """The hand-written cases that test write-availability alone: a cheap subset (the full file
    takes ~25 s of CPU) for the runs below that must fail."""
    tests = yaml.safe_load(UNIT_TESTS.read_text())
    tests["tests"] = [
        case
        for case in tests["tests"]
        if {c["alertname"] for c in case.get("alert_rule_test", [])}
        == {"WriteAvailabilityBudgetBurn"}
    ]
    assert len(tests["tests"]) >= 5
    return tests


def _run_unit_tests_against(tmp_path: Path, slos: list[Slo], tests: dict[str, Any]) -> int:
    (tmp_path / RULES_FILENAME).write_text(render(rule_groups(slos)))
    (tmp_path / "cases.test.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    proc = _promtool("test", "rules", "cases.test.yml", cwd=tmp_path)
    return proc.returncode


def _some_case_fails(tmp_path: Path, slos: list[Slo], tests: dict[str, Any]) -> bool:
    """Whether the cases catch these rules: each case alone, up to the first that fails. The
    same verdict as one run of them all (a run fails iff a case does), but a catch costs the
    cases up to it (~3 s of promtool CPU each) instead of all of them (~25 s, 60 s under CI's
    load, per broken generator)."""
    return any(
        _run_unit_tests_against(tmp_path, slos, {**tests, "tests": [case]}) != 0
        for case in tests["tests"]
    )


def _write_availability() -> list[Slo]:
    return [slo for slo in default_slos() if slo.name == "write-availability"]


def test_a_wrong_expectation_makes_promtool_fail(tmp_path: Path) -> None:
    """The blip case expects silence; claiming the fast page fires there must fail. The case
    alone (test_promtool_unit_tests_pass runs all of them): it passes, then with the wrong
    expectation it fails."""
    tests = _write_availability_cases()
    (case,) = [
        case
        for case in tests["tests"]
        if any(check["eval_time"] == "423m" for check in case["alert_rule_test"])
    ]
    tests["tests"] = [case]
    assert _run_unit_tests_against(tmp_path, _write_availability(), tests) == 0
    (blip,) = case["alert_rule_test"]
    assert blip["exp_alerts"] == []
    blip["exp_alerts"] = [
        {
            "exp_labels": {
                "severity": "page",
                "slo": "write-availability",
                "service": "write",
                "long_window": "1h",
                "short_window": "5m",
            }
        }
    ]
    assert _run_unit_tests_against(tmp_path, _write_availability(), tests) != 0


@pytest.mark.parametrize(
    "broken",
    [
        # a fast page at 30x instead of 14.4x would stay silent where it must page
        (
            BurnRateAlert("page", 30.0, "1h", "5m"),
            BurnRateAlert("page", 6.0, "6h", "30m"),
            BurnRateAlert("ticket", 1.0, "3d", "6h"),
        ),
        # no short window (long AND long): the fast page would not resolve after recovery
        (
            BurnRateAlert("page", 14.4, "1h", "1h"),
            BurnRateAlert("page", 6.0, "6h", "6h"),
            BurnRateAlert("ticket", 1.0, "3d", "3d"),
        ),
        # paging on the short window alone: the blip would page
        (
            BurnRateAlert("page", 14.4, "5m", "5m"),
            BurnRateAlert("page", 6.0, "30m", "30m"),
            BurnRateAlert("ticket", 1.0, "6h", "6h"),
        ),
    ],
)
def test_unit_tests_catch_a_broken_generator(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: tuple[BurnRateAlert, ...]
) -> None:
    monkeypatch.setattr(alert_rules, "BURN_RATE_ALERTS", broken)
    assert _some_case_fails(tmp_path, _write_availability(), _write_availability_cases())


def test_unit_tests_cover_every_alert() -> None:
    tested = {
        case["alertname"]
        for path in UNIT_TEST_FILES
        for test in yaml.safe_load(path.read_text())["tests"]
        for case in test.get("alert_rule_test", [])
    }
    generated = {r["alert"] for r in _rules(rule_groups(default_slos())) if "alert" in r}
    assert generated <= tested, f"alerts without a promtool unit test: {generated - tested}"


# --- structure ---------------------------------------------------------------------------------


def test_default_slos_cover_the_seed_slis() -> None:
    slos = {slo.name: slo for slo in default_slos()}
    assert {"read-availability", "write-availability", "write-latency", "consumer-lag"} <= set(slos)
    # time-based: the bit "lag above 10 s" is recorded, and the ratio averages that bit
    (bad_bit,) = slos["consumer-lag"].inputs
    assert bad_bit == (
        "slo:sli_bad:bool",
        'max(likes_consumer_lag_seconds{topic="likes.committed"}) > bool 10',
    )
    assert "slo:sli_bad:bool" in slos["consumer-lag"].error_ratio
    # reads: degraded answers and the gateway's 5xx, not the service's own status (never 5xx)
    read = slos["read-availability"].error_ratio
    assert 'likes_read_tier_total{tier=~"last_good|none"}' in read
    assert 'envoy_cluster_name="read_svc",envoy_response_code_class="5"' in read
    assert "likes_http_requests_total" not in read
    assert slos["read-availability"].objective > slos["write-availability"].objective


def test_each_slo_has_the_workbook_burn_rate_alerts() -> None:
    groups = rule_groups(default_slos())
    write = _alerts(groups, "WriteAvailabilityBudgetBurn")
    # SRE Workbook table 5-8, written out here rather than read back from the module
    expected = {
        ("1h", "5m"): ("page", "(14.4 * 0.001)"),
        ("6h", "30m"): ("page", "(6 * 0.001)"),
        ("3d", "6h"): ("ticket", "(1 * 0.001)"),
    }
    got = {}
    for alert in write:
        labels = alert["labels"]
        long_w, short_w = labels["long_window"], labels["short_window"]
        assert f'slo:sli_error:ratio_rate{long_w}{{slo="write-availability"}}' in alert["expr"]
        assert f'slo:sli_error:ratio_rate{short_w}{{slo="write-availability"}}' in alert["expr"]
        assert "\nand\n" in alert["expr"]
        threshold = alert["expr"].split(" > ")[1].split("\n")[0]
        got[(long_w, short_w)] = (labels["severity"], threshold)
    assert got == expected
    for slo in default_slos():
        assert len(_alerts(groups, alert_rules.alert_name(slo))) == 3


def test_every_alert_names_a_runbook_and_severity() -> None:
    for rule in _rules(rule_groups(default_slos())):
        if "alert" not in rule:
            continue
        assert rule["labels"]["severity"] in {"page", "ticket", "none"}
        slug = rule["annotations"]["runbook"]
        assert rule["annotations"]["runbook_url"] == f"runbooks/{slug}.md"
        assert rule["annotations"]["summary"]


def test_recording_rules_exist_for_every_window_an_alert_reads() -> None:
    groups = rule_groups(default_slos())
    recorded = {(r["record"], r["labels"].get("slo")) for r in _rules(groups) if "record" in r}
    for slo in default_slos():
        for window in ("5m", "30m", "1h", "6h", "3d"):
            assert (f"slo:sli_error:ratio_rate{window}", slo.name) in recorded


def test_each_slo_group_records_before_it_alerts() -> None:
    # alerts read this cycle's ratios only if their recording rules come first in the group
    for group in rule_groups(default_slos())["groups"]:
        kinds = ["record" if "record" in r else "alert" for r in group["rules"]]
        assert kinds == sorted(kinds, key=lambda k: k == "alert")


def test_dead_letter_and_watchdog_alerts() -> None:
    groups = rule_groups(default_slos())
    (dlq,) = _alerts(groups, "DeadLetterDailyGrowth")
    assert "_dead_letter_total" in dlq["expr"] and "[1d]" in dlq["expr"]
    assert dlq["expr"].endswith("> 1000")
    (watchdog,) = _alerts(groups, "Watchdog")
    assert watchdog["expr"] == "vector(1)"


def test_slo_validation() -> None:
    good = default_slos()[0]
    with pytest.raises(ValueError, match="objective"):
        replace(good, objective=1.0)
    with pytest.raises(ValueError, match="window"):
        replace(good, error_ratio="sum(rate(x[5m]))")
    with pytest.raises(ValueError, match="name"):
        replace(good, name="Read Availability")
    with pytest.raises(ValueError, match="duplicate"):
        rule_groups([good, good])


def test_custom_slo_is_rendered_with_its_own_objective() -> None:
    slo = Slo(
        name="sampler-availability",
        service="sampler",
        objective=0.99,
        error_ratio=(
            'sum(rate(errors_total[{window}])) / sum(rate(requests_total{{a="b"}}[{window}]))'
        ),
        description="the sampler answers",
        runbook="sampler",
    )
    (group, _slis, _plain, _workers, _abuse) = rule_groups([slo])["groups"]
    fast = group["rules"][5]
    assert fast["alert"] == "SamplerAvailabilityBudgetBurn"
    assert "> (14.4 * 0.01)" in fast["expr"]
    # the placeholder is replaced literally; PromQL braces are left alone
    assert group["rules"][0]["expr"] == (
        'sum(rate(errors_total[5m])) / sum(rate(requests_total{{a="b"}}[5m]))'
    )


RUNBOOKS = REPO / "runbooks"


def test_every_alert_has_a_runbook_and_every_runbook_an_alert() -> None:
    by_slug: dict[str, set[str]] = {}
    for rule in _rules(rule_groups(default_slos())):
        if "alert" in rule:
            by_slug.setdefault(rule["annotations"]["runbook"], set()).add(rule["alert"])
            # runbook_url resolves to the file, from the repository's root
            assert (REPO / rule["annotations"]["runbook_url"]).is_file(), rule["alert"]
    files = {p.stem: p for p in RUNBOOKS.glob("*.md")}
    assert set(files) == set(by_slug), "a runbook without an alert, or an alert without one"
    for slug, path in files.items():
        _, front, body = path.read_text().split("---\n", 2)
        assert set(yaml.safe_load(front)["alerts"]) == by_slug[slug], slug
        assert "## What fired" in body and "## User impact" in body, slug
