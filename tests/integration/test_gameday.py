"""More of the game day in CI, on the second test stack (tests/conftest.py SECOND_STACK): its
worker has room once the alert tests are done, while the first stack's worker is still busy.
Each item is one experiment of chaos/experiments run by `likes chaos run`, judged as in
tests/integration/test_chaos.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import Stack
from tests.integration.test_chaos import experiment_passes

pytestmark = pytest.mark.stack

# the model server's outage (issue 13's failure mode) and a poison event (issue 14's list)
IN_CI_B = ("aggregator-poison-event", "abuse-model-down")


@pytest.mark.disruptive
@pytest.mark.parametrize("mode_id", IN_CI_B)
def test_the_experiment_passes_on_the_second_stack(
    stack: Stack, mode_id: str, tmp_path: Path
) -> None:
    experiment_passes(stack, mode_id, tmp_path)
