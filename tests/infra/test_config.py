"""Bad stack config fails before any resource is declared, naming the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from infra import cli, config, policies, stackfile


def _raw(stack: str = "prod-us") -> tuple[dict[str, str], set[str]]:
    sf = stackfile.load(stack)
    return dict(sf.values), set(sf.secret_keys)


def _error(raw: dict[str, str], secrets: set[str]) -> config.ConfigError:
    with pytest.raises(config.ConfigError) as info:
        config.parse(raw, secrets)
    return info.value


def test_stack_files_parse() -> None:
    for name in stackfile.stack_names():
        raw, secrets = _raw(name)
        cfg = config.parse(raw, secrets)
        assert cfg.zones[0].startswith(cfg.region)


def test_zero_partitions_names_the_key() -> None:
    raw, secrets = _raw()
    kafka = json.loads(raw["likes:kafka"])
    kafka["partitions"] = 0
    raw["likes:kafka"] = json.dumps(kafka)
    err = _error(raw, secrets)
    assert [k for k, _ in err.problems] == ["likes:kafka.partitions"]
    assert "likes:kafka.partitions" in str(err)


def test_missing_region_names_the_key() -> None:
    raw, secrets = _raw()
    del raw["likes:region"]
    assert "likes:region" in [k for k, _ in _error(raw, secrets).problems]


def test_plaintext_password_names_the_key() -> None:
    raw, secrets = _raw()
    raw["likes:redisPassword"] = "hunter2"
    secrets.discard("likes:redisPassword")
    (key, message), *_ = _error(raw, secrets).problems
    assert key == "likes:redisPassword" and "secret" in message


def test_secretish_nested_key_in_plain_config_is_refused() -> None:
    raw, secrets = _raw()
    cdn = json.loads(raw["likes:cdn"])
    cdn["apiToken"] = "abc"
    raw["likes:cdn"] = json.dumps(cdn)
    assert "likes:cdn.apiToken" in [k for k, _ in _error(raw, secrets).problems]


@pytest.mark.parametrize(
    ("key", "patch", "expected"),
    [
        ("likes:kafka", {"minInsyncReplicas": 3}, "likes:kafka"),
        ("likes:etcd", {"members": 4}, "likes:etcd"),
        (
            "likes:nodeGroups",
            {"system": {"instanceTypes": [], "minSize": 1, "desiredSize": 1, "maxSize": 1}},
            "likes:nodeGroups.system.instanceTypes",
        ),
        # a CronJob schedule is five cron fields (or a macro); the time zone is the CronJob's
        (
            "likes:services",
            {"abuseModelPublishSchedule": "every monday"},
            "likes:services.abuseModelPublishSchedule",
        ),
        (
            "likes:services",
            {"abuseModelPublishSchedule": "TZ=Europe/Paris 0 3 * * 1"},
            "likes:services.abuseModelPublishSchedule",
        ),
        # monthly: the model would be stale (AbuseModelErrors) three weeks of four
        (
            "likes:services",
            {"abuseModelPublishSchedule": "0 3 1 * *"},
            "likes:services.abuseModelPublishSchedule",
        ),
    ],
)
def test_invalid_values_name_their_key(key: str, patch: dict[str, object], expected: str) -> None:
    raw, secrets = _raw()
    raw[key] = json.dumps({**json.loads(raw[key]), **patch})
    assert expected in [k for k, _ in _error(raw, secrets).problems]


@pytest.mark.parametrize(
    ("schedule", "weekly"),
    [
        ("0 3 * * 1", True),
        ("*/30 * * * *", True),
        ("0 3 1 * 1", True),  # the 1st, and every Monday
        ("@daily", True),
        ("@weekly", True),
        ("0 3 1 * *", False),
        ("0 3 * 6 1", False),  # June's Mondays only
        ("@monthly", False),
        ("@yearly", False),
    ],
)
def test_the_model_is_published_at_least_weekly(schedule: str, weekly: bool) -> None:
    assert config.runs_weekly(schedule) is weekly


def test_zones_must_belong_to_region() -> None:
    raw, secrets = _raw()
    raw["likes:zones"] = json.dumps(["eu-west-1a", "eu-west-1b", "eu-west-1c"])
    problems = _error(raw, secrets).problems
    assert any("zones" in m for _, m in problems) or "aws:region" in [k for k, _ in problems]


def _write_stack(tmp: Path, name: str, mutate: dict[str, object]) -> Path:
    doc = yaml.safe_load((stackfile.STACKS_DIR / "Pulumi.staging.yaml").read_text())
    doc["config"].update(mutate)
    (tmp / f"Pulumi.{name}.yaml").write_text(yaml.safe_dump(doc))
    return tmp


def test_secure_values_in_a_stack_file_count_as_secrets(tmp_path: Path) -> None:
    _write_stack(tmp_path, "s", {"likes:redisPassword": {"secure": "v1:AAAA"}})
    sf = stackfile.load("s", tmp_path)
    assert "likes:redisPassword" in sf.secret_keys
    assert "likes:redisPassword" not in sf.placeholders
    config.parse(sf.values, sf.secret_keys)


def test_cli_bad_config_exits_2_naming_the_key_without_traceback(tmp_path: Path) -> None:
    kafka = yaml.safe_load((stackfile.STACKS_DIR / "Pulumi.staging.yaml").read_text())["config"][
        "likes:kafka"
    ]
    _write_stack(
        tmp_path, "bad", {"likes:kafka": {**kafka, "partitions": 0}, "likes:redisPassword": "pw"}
    )
    result = CliRunner().invoke(cli.app, ["plan", "--stack", "bad", "--stacks-dir", str(tmp_path)])
    assert result.exit_code == 2
    assert "likes:kafka.partitions" in result.output
    assert "likes:redisPassword" in result.output
    assert "Traceback" not in result.output


def test_cli_unknown_stack_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(cli.app, ["plan", "--stack", "nope", "--stacks-dir", str(tmp_path)])
    assert result.exit_code == 2 and "Pulumi.nope.yaml" in result.output


def test_cli_json_lists_resources_with_parents() -> None:
    result = CliRunner().invoke(cli.app, ["plan", "--stack", "staging", "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.stdout)
    assert all(set(r) == {"type", "name", "parent", "inputs"} for r in rows)
    topics = [r for r in rows if r["type"] == "kubernetes:kafka.strimzi.io/v1:KafkaTopic"]
    assert {r["parent"] for r in topics} == {"kafka"}
    assert "hunter" not in result.stdout


def test_cli_tree_and_policy_failure_exit_1(monkeypatch: pytest.MonkeyPatch) -> None:
    ok = CliRunner().invoke(cli.app, ["plan", "--stack", "staging"])
    assert ok.exit_code == 0, ok.output
    assert "partitions=32" in ok.output and "pass" in ok.output

    def failing(resources: object) -> list[policies.Violation]:
        return [policies.Violation("container-probes", "x", "crafted")]

    monkeypatch.setattr(policies, "_CHECKS", [*policies._CHECKS, failing])
    bad = CliRunner().invoke(cli.app, ["plan", "--stack", "staging"])
    assert bad.exit_code == 1
    assert "crafted" in bad.output and "FAIL" in bad.output


def _observability(raw: dict[str, str], **patch: object) -> None:
    """Patch likes:observability; a None value removes the key."""
    obs = {**json.loads(raw["likes:observability"]), **patch}
    raw["likes:observability"] = json.dumps({k: v for k, v in obs.items() if v is not None})


def test_heartbeat_url_is_required_in_prod_naming_the_key() -> None:
    raw, secrets = _raw("prod-us")
    _observability(raw, heartbeatUrl=None)
    problems = _error(raw, secrets).problems
    assert [k for k, _ in problems] == ["likes:observability.heartbeatUrl"]
    assert "required in prod" in problems[0][1]


def test_heartbeat_url_is_optional_outside_prod() -> None:
    raw, secrets = _raw("staging")
    _observability(raw, heartbeatUrl=None)
    assert config.parse(raw, secrets).observability.heartbeat_url is None


@pytest.mark.parametrize(
    ("patch", "key"),
    [
        ({"ticketWebhookUrl": None}, "likes:observability.ticketWebhookUrl"),
        ({"ticketWebhookUrl": "oncall.example.com/hook"}, "likes:observability.ticketWebhookUrl"),
        ({"heartbeatUrl": "ftp://x"}, "likes:observability.heartbeatUrl"),
    ],
)
def test_alert_receiver_urls_are_validated(patch: dict[str, object], key: str) -> None:
    raw, secrets = _raw("staging")
    _observability(raw, **patch)
    assert [k for k, _ in _error(raw, secrets).problems] == [key]
