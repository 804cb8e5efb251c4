#!/usr/bin/env bash
# The test command: the lint gate, then every test against a real local stack that the test
# session starts (and stops) itself. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
./local/setup.sh
echo "==> lint: ruff check, ruff format --check, mypy"
.venv/bin/ruff check .
.venv/bin/ruff format --check .
.venv/bin/mypy
echo "==> tests"
# two workers: one starts the stack and runs its tests in order (they mostly wait on servers),
# the other runs the tests that need no stack meanwhile (tests/conftest.py groups them);
# LIKES_TEST_WORKERS=0 runs everything in this one process. With two workers the other one, its
# own tests done, runs the alert tests and some game days on a second stack (tests/conftest.py
# SECOND_STACK) while the first stack's worker is still busy; LIKES_TEST_STACKS=1 keeps every
# test on one stack
if [ "${LIKES_TEST_WORKERS:-2}" != 0 ]; then export LIKES_TEST_STACKS="${LIKES_TEST_STACKS:-2}"; fi
exec .venv/bin/pytest -q -rA --durations=80 -n "${LIKES_TEST_WORKERS:-2}" --dist loadgroup "$@"
