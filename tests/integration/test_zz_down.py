"""`likes local down` stops exactly what `up` started and leaves no process behind."""

from __future__ import annotations

import subprocess

import pytest

from local.supervisor import Supervisor
from tests.conftest import Stack

pytestmark = [pytest.mark.stack, pytest.mark.last]


def test_down_leaves_no_process_of_the_stack_running(stack: Stack) -> None:
    recorded = Supervisor(stack.layout, []).running()
    assert recorded, "the stack should be running before down"
    stack.cli("local", "down")
    # same pid and kernel start time as recorded, and not a zombie
    alive = [e.name for e in recorded.values() if Supervisor.is_alive(e)]
    assert not alive, f"still running after down: {alive}"
    # nothing else that refers to the stack's home (children, forks) is left either
    leftover = subprocess.run(
        ["pgrep", "-af", str(stack.layout.home)], capture_output=True, text=True
    ).stdout.strip()
    assert leftover == "", leftover
    status = stack.status()
    assert all(s["pid"] is None and not s["healthy"] for s in status.values())
