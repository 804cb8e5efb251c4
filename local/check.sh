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
exec .venv/bin/pytest -q -rA --durations=15 "$@"
