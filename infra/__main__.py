"""Entry point `pulumi up` runs (Pulumi.yaml `main: infra/`): build the program, nothing else."""

import sys
from pathlib import Path

# Pulumi runs this directory as a script; make the repository importable as `infra.*` even when
# the package is not installed into the virtualenv.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pulumi

from infra import config, program

try:
    program.main()
except config.ConfigError as exc:
    # A RunError is reported without a traceback: the message names the bad keys.
    raise pulumi.RunError(f"invalid stack config: {exc}") from None
