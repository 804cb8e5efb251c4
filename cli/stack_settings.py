"""Where the operator commands (`likes recount`, `likes status`) find the platform's stores.

The LIKES_* variables when any is set (a shell in a deployed environment, like `likes hotkeys`);
otherwise the local stack named by LIKES_HOME / LIKES_PORT_OFFSET (like `likes local ...`),
reached with the env the stack gives its aggregator (every store's address and login, and the
region its cells carry).
"""

from __future__ import annotations

import os

from services.contracts import settings


class NoSettings(Exception):
    """Neither LIKES_* variables nor a local stack: nothing says where the stores are."""


def platform_settings() -> settings.Settings:
    """ValueError: a bad or unknown LIKES_* variable; NoSettings: nothing to reach."""
    Settings, prefix = settings.Settings, settings.PREFIX
    if any(k.startswith(prefix) and k not in settings.TOOLING_VARS for k in os.environ):
        return Settings()
    from local import layout, transforms
    from services.contracts import workloads

    lay = layout.from_env()
    if not lay.home.exists():
        raise NoSettings(
            f"no LIKES_* settings and no local stack at {lay.home}: set the LIKES_* variables of "
            "the environment to check, or start the local stack (`likes local up`)"
        )
    env = transforms.workload_env(lay, workloads.AGGREGATOR.name)
    fields = Settings.model_fields
    values = {k.removeprefix(prefix).lower(): v for k, v in env.items()}
    return Settings.model_validate({k: v for k, v in values.items() if k in fields})
