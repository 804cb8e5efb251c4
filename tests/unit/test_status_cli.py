"""`likes status` refuses what it cannot do with a message and exit 2, before reaching a store."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from cli.main import app

runner = CliRunner()


def test_an_unknown_view_is_refused_naming_the_views() -> None:
    got = runner.invoke(app, ["status", "nope"])
    assert got.exit_code == 2
    assert "no view 'nope': one of lag, cache, kafka, cassandra, etcd" in got.output


def test_without_settings_or_a_local_stack_it_says_what_to_set(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [k for k in os.environ if k.startswith("LIKES_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("LIKES_HOME", str(tmp_path / "no-stack"))
    got = runner.invoke(app, ["status", "kafka"])
    assert got.exit_code == 2
    assert "no LIKES_* settings and no local stack" in got.output
