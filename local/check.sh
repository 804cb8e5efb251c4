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
# LIKES_TEST_WORKERS=0 runs everything in this one process
exec .venv/bin/pytest -q -rA --durations=80 -n "${LIKES_TEST_WORKERS:-2}" --dist loadgroup "$@"
