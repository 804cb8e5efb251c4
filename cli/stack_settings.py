"""Where the operator commands (`likes recount`, `likes status`) find the platform's stores.

The LIKES_* variables when any is set (a shell in a deployed environment, like `likes hotkeys`);
otherwise the local stack named by LIKES_HOME / LIKES_PORT_OFFSET (like `likes local ...`),
reached with the env the stack gives its aggregator (every store's address and login, and the
region its cells carry).
"""

from __future__ import annotations

import os
from typing import TypeVar

from services.contracts import settings, workloads

S = TypeVar("S", bound=settings.Settings)


class NoSettings(Exception):
    """Neither LIKES_* variables nor a local stack: nothing says where the stores are."""


def platform_settings() -> settings.Settings:
    """ValueError: a bad or unknown LIKES_* variable; NoSettings: nothing to reach."""
    return workload_settings(settings.Settings, workloads.AGGREGATOR)


def in_environment() -> bool:
    """The LIKES_* variables name the stores (a shell in a deployed environment)."""
    prefix = settings.PREFIX
    return any(k.startswith(prefix) and k not in settings.TOOLING_VARS for k in os.environ)


def workload_settings(kind: type[S], workload: workloads.Workload) -> S:
    """`kind` read from the LIKES_* variables, or else from the env the local stack gives
    `workload` (a store only some workloads reach, such as the abuse scorer's feature-store)."""
    Settings, prefix = kind, settings.PREFIX
    if in_environment():
        return Settings()
    from local import layout, transforms

    lay = layout.from_env()
    if not lay.home.exists():
        raise NoSettings(
            f"no LIKES_* settings and no local stack at {lay.home}: set the LIKES_* variables of "
            "the environment to check, or start the local stack (`likes local up`)"
        )
    env = transforms.workload_env(lay, workload.name)
    fields = Settings.model_fields
    values = {k.removeprefix(prefix).lower(): v for k, v in env.items()}
    return Settings.model_validate({k: v for k, v in values.items() if k in fields})
