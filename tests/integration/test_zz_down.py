"""`likes local down` stops exactly what `up` started and leaves no process behind."""

from __future__ import annotations

import re
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
    # nothing else that refers to the stack's home (children, forks) is left either; the home
    # whole, not as a prefix: the second test stack's home (.stack-test-b) begins with this one's,
    # and its servers still ran when this test did (CI, 2026-12-06)
    home = re.compile(re.escape(str(stack.layout.home)) + r"(?=/|\s|$)")
    processes = subprocess.run(["ps", "-eo", "pid=,args="], capture_output=True, text=True)
    leftover = [line.strip() for line in processes.stdout.splitlines() if home.search(line)]
    assert leftover == [], leftover
    status = stack.status()
    assert all(s["pid"] is None and not s["healthy"] for s in status.values())
