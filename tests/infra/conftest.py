"""Plans of every stack, built once per session under Pulumi's mocks (each in its own context)."""

from __future__ import annotations

import shutil

import pytest

from infra import config, plan, stackfile

STACKS = stackfile.stack_names()


@pytest.fixture(scope="session")
def plans() -> dict[str, plan.Plan]:
    return {name: plan.run(name) for name in STACKS}


@pytest.fixture(scope="session")
def configs() -> dict[str, config.StackConfig]:
    out = {}
    for name in STACKS:
        sf = stackfile.load(name)
        out[name] = config.parse(sf.values, sf.secret_keys)
    return out


def by_kind(p: plan.Plan, kind: str) -> list[plan.Declared]:
    return [r for r in p.resources if r.inputs.get("kind") == kind]


def named(p: plan.Plan, kind: str, name: str, namespace: str | None = None) -> plan.Declared:
    for r in by_kind(p, kind):
        meta = r.inputs.get("metadata", {})
        if meta.get("name") == name and namespace in (None, meta.get("namespace")):
            return r
    raise AssertionError(f"no {kind} named {name}" + (f" in {namespace}" if namespace else ""))


def tool(name: str, package: str) -> str:
    """Path of a binary the tests run; a missing one fails the test (a skip would turn a machine
    without the binary into a green run that checked nothing)."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is not installed: `apt-get install {package}` (local/setup.sh does)")
    return path
