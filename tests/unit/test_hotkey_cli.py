"""`likes hotkeys` without a stack: a declined confirmation never reaches etcd, and an unreachable
etcd is a clean exit 2 with a message (no traceback). The etcd paths are in
tests/integration/test_hotkeys.py."""

from __future__ import annotations

import socket

import pytest
from typer.testing import CliRunner

from operators.hotkeys.cli import app


def dead_etcd() -> dict[str, str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return {"LIKES_ETCD_HOST": "127.0.0.1", "LIKES_ETCD_PORT": str(port)}


@pytest.mark.parametrize("command", [["split", "p1"], ["unsplit", "p1"]])
def test_a_declined_mutation_aborts_before_touching_etcd(command: list[str]) -> None:
    # etcd is unreachable: had the command tried it, it would exit 2 with an etcd error
    result = CliRunner().invoke(app, command, input="n\n", env=dead_etcd())
    assert result.exit_code == 1, result.output
    assert "?" in result.output and "Aborted" in result.output
    assert "etcd" not in result.output


def test_split_asks_with_the_post_and_factor() -> None:
    result = CliRunner().invoke(app, ["split", "p1", "--factor", "4"], input="n\n", env=dead_etcd())
    assert "split p1 over 4 sub-keys?" in result.output


def test_split_refuses_a_factor_the_aggregator_does_not_fold() -> None:
    result = CliRunner().invoke(app, ["split", "p1", "--factor", "9", "--yes"], env=dead_etcd())
    assert result.exit_code == 2
    assert "etcd" not in result.output


@pytest.mark.parametrize(
    "command", [["top"], ["top", "--json"], ["show", "p1"], ["split", "p1", "--yes"]]
)
def test_an_unreachable_etcd_is_exit_2_with_its_address(command: list[str]) -> None:
    env = dead_etcd()
    result = CliRunner().invoke(app, command, env=env)
    assert result.exit_code == 2, result.output
    assert f"etcd 127.0.0.1:{env['LIKES_ETCD_PORT']}" in result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
