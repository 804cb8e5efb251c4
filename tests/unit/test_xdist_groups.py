"""The test command (local/check.sh) runs `-n 2 --dist loadgroup` and relies on xdist keeping a
group on one worker: the stack's tests start one stack. pytest 9.2 broke that silently
(pytest-xdist#1386: every test ran wherever, and two workers each started a stack on the same
ports). This runs a small session the same way and fails if a group is split again."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import NO_STACK_NICENESS

TESTS = """
import os
import pytest

@pytest.mark.xdist_group("one")
@pytest.mark.parametrize("i", range(8))
def test_grouped(i):
    with open(os.path.join(os.environ["GROUP_OUT"], f"ran-{i}"), "w") as f:
        f.write(os.environ["PYTEST_XDIST_WORKER"])

@pytest.mark.parametrize("i", range(8))
def test_free(i):
    pass
"""


def test_a_group_runs_on_one_worker(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_groups.py").write_text(TESTS)
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "2", "--dist", "loadgroup",
         "-p", "no:cacheprovider", "test_groups.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
        env={**os.environ, "GROUP_OUT": str(tmp_path)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    workers = {(tmp_path / f"ran-{i}").read_text() for i in range(8)}
    assert len(workers) == 1, f"the group ran on {sorted(workers)}"


def test_a_test_without_the_stack_steps_back_on_the_cpu() -> None:
    """Under the test command's workers, a test that needs no stack runs niced (tests/conftest.py),
    so the stack's tests on the other worker, the run's critical path, keep their core."""
    mine = os.getpriority(os.PRIO_PROCESS, 0)
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        # one process (LIKES_TEST_WORKERS=0): nothing runs beside it, so nothing steps back;
        # it runs at the niceness it was started with, its parent's
        assert mine == os.getpriority(os.PRIO_PROCESS, os.getppid())
        return
    assert mine == NO_STACK_NICENESS
    child = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpriority(os.PRIO_PROCESS, 0))"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert int(child.stdout) == NO_STACK_NICENESS  # the servers a module starts inherit it
