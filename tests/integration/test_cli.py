"""The `likes local` CLI's own promises, on a small separate stack (idem-store only)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import LIKES

OFFSET = 1500  # apart from the session's test stack


def run(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LIKES_HOME": str(home), "LIKES_PORT_OFFSET": str(OFFSET)}
    return subprocess.run([LIKES, *args], env=env, capture_output=True, text=True, timeout=120)


def test_a_server_that_cannot_start_gets_a_clear_message_with_its_log(tmp_path: Path) -> None:
    port = 6390 + OFFSET
    squatter = socket.socket()
    squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    squatter.bind(("127.0.0.1", port))
    squatter.listen()
    try:
        proc = run(tmp_path, "local", "up", "--only", "idem-store")
    finally:
        squatter.close()
        run(tmp_path, "local", "down")
    assert proc.returncode == 1
    assert "idem-store-1 did not start" in proc.stderr
    assert "Address already in use" in proc.stderr  # redis-server's own words, from its log
    assert "Traceback" not in proc.stderr + proc.stdout


def test_up_only_one_component_then_status_json_and_logs(tmp_path: Path) -> None:
    try:
        up = run(tmp_path, "local", "up", "--only", "idem-store", "--json")
        assert up.returncode == 0, up.stderr
        status = json.loads(run(tmp_path, "local", "status", "--json").stdout)
        assert all(status[f"idem-store-{i}"]["healthy"] for i in range(1, 7))
        assert status["idem-store-1"]["address"] == f"127.0.0.1:{6390 + OFFSET}"
        assert status["etcd"] == {"address": f"127.0.0.1:{2379 + OFFSET}", "pid": None,
                                  "healthy": False}  # fmt: skip
        logs = run(tmp_path, "local", "logs", "idem-store-1", "-n", "200")
        assert logs.returncode == 0 and "Ready to accept connections" in logs.stdout
    finally:
        down = run(tmp_path, "local", "down")
    assert down.returncode == 0 and "stopped 6 server(s)" in down.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["local", "logs", "nope"], "no server named 'nope'"),
        (["local", "up", "--only", "nope"], "unknown component(s) ['nope']"),
        (["local", "up", "--kafka-brokers", "2"], "--kafka-brokers must be 1 or 3"),
    ],
)
def test_bad_arguments_are_named(tmp_path: Path, args: list[str], message: str) -> None:
    proc = run(tmp_path, *args)
    assert proc.returncode == 2
    assert message in proc.stderr
