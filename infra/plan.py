"""Run the Pulumi program offline under Pulumi's mocks and record every declared resource.

`likes infra plan --stack prod-us [--json]` prints it (infra/cli.py). Each run happens
in an empty `contextvars.Context`, so several stacks can be planned in one process (the Pulumi
runtime keeps its settings, root stack and config in context variables).
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pulumi
import pulumi.runtime
from pulumi.runtime import mocks as pulumi_mocks
from pulumi.runtime.stack import run_pulumi_func
from pulumi.runtime.sync_await import _sync_await

from infra import config, policies, stackfile

PROJECT = "likes"


@dataclass(frozen=True)
class Declared:
    """One resource the program declared, with the inputs it passed (camelCase, as sent)."""

    type: str
    name: str
    urn: str
    parent_urn: str | None
    custom: bool
    inputs: dict[str, Any]

    @property
    def parent(self) -> str | None:
        return self.parent_urn.rsplit("::", 1)[-1] if self.parent_urn else None

    def as_json(self) -> dict[str, Any]:
        return {"type": self.type, "name": self.name, "parent": self.parent, "inputs": self.inputs}


@dataclass
class Plan:
    stack: str
    resources: list[Declared]
    violations: list[policies.Violation]
    placeholders: tuple[str, ...] = ()
    outputs: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.violations

    def of_type(self, type_: str) -> list[Declared]:
        return [r for r in self.resources if r.type == type_]

    def find(self, type_: str, name: str) -> Declared:
        for r in self.resources:
            if r.type == type_ and r.name == name:
                return r
        raise KeyError(f"{type_} {name} not declared")


_SECRET_SIG = "4dabf18193072939515e22adb298388d"  # pulumi's marker key for a secret value
SECRET_MARK = "[secret]"


def normalize(value: Any) -> Any:
    """Inputs as plain JSON: secrets masked, integral floats (protobuf numbers) back to ints."""
    if isinstance(value, dict):
        if _SECRET_SIG in value:
            # Keep a secret map's keys (a Secret's stringData stays a valid manifest).
            inner = value.get("value")
            return {k: SECRET_MARK for k in inner} if isinstance(inner, dict) else SECRET_MARK
        return {k: normalize(v) for k, v in value.items()}
    if isinstance(value, list):
        return [normalize(v) for v in value]
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


def _fake_outputs(typ: str, name: str, inputs: dict[str, Any]) -> dict[str, Any]:
    """Provider-computed outputs the program reads (ARNs, endpoints), made up but well-formed."""
    digest = hashlib.sha1(name.encode()).hexdigest()[:12]
    out: dict[str, Any] = {}
    if typ.startswith("aws:"):
        out["arn"] = f"arn:aws:{typ.split(':')[1].split('/')[0]}::123456789012:{name}"
    if typ == "aws:eks/cluster:Cluster":
        out["endpoint"] = f"https://{digest}.gr7.eks.amazonaws.com"
        out["certificateAuthority"] = {"data": "TU9DSy1DQQ=="}
        out["name"] = inputs.get("name", name)
        out["identities"] = [{"oidcs": [{"issuer": f"https://oidc.eks.amazonaws.com/id/{digest}"}]}]
    if typ == "aws:eks/nodeGroup:NodeGroup":
        out["nodeGroupName"] = name
    if typ == "kubernetes:core/v1:Service":
        host = f"{digest}.elb.amazonaws.com"
        out["status"] = {"loadBalancer": {"ingress": [{"hostname": host}]}}
    return out


class _Mocks(pulumi.runtime.Mocks):
    def __init__(self) -> None:
        # The monitor calls new_resource synchronously on its own (executor) thread: hand the
        # arguments back to it through a thread-local so concurrent registrations don't mix.
        self.local = threading.local()

    def new_resource(self, args: pulumi.runtime.MockResourceArgs) -> tuple[str | None, dict]:
        self.local.last = args
        state = {**args.inputs, **_fake_outputs(args.typ, args.name, args.inputs)}
        return f"{args.name}-id", state

    def call(self, args: pulumi.runtime.MockCallArgs) -> tuple[dict, list[tuple[str, str]] | None]:
        # The program makes no provider calls (no data sources): everything comes from config.
        raise NotImplementedError(f"unexpected provider call {args.token}")


class _Monitor(pulumi_mocks.MockMonitor):
    """The stock mock monitor, also remembering each resource's parent and URN."""

    def __init__(self, mocks: _Mocks) -> None:
        super().__init__(mocks)
        self.recorder = mocks
        self.declared: list[Declared] = []
        self.lock = threading.Lock()

    def RegisterResource(self, request: Any) -> Any:  # gRPC method name
        response = super().RegisterResource(request)
        if request.type != "pulumi:pulumi:Stack":
            args = self.recorder.local.last
            with self.lock:
                self.declared.append(
                    Declared(
                        args.typ,
                        args.name,
                        response.urn,
                        request.parent or None,
                        bool(args.custom),
                        normalize(args.inputs),
                    )
                )
        return response


def _execute(
    stack: str,
    values: dict[str, str],
    secret_keys: list[str],
    main: Callable[[], None] | None = None,
) -> list[Declared]:
    from infra import program

    # Pulumi's runtime builds futures on the thread's current loop; a caller (or an earlier
    # asyncio.run in the same process) may have left none
    asyncio.set_event_loop(asyncio.new_event_loop())
    monitor = _Monitor(_Mocks())
    pulumi.runtime.set_mocks(
        monitor.recorder, project=PROJECT, stack=stack, preview=False, monitor=monitor
    )
    pulumi.runtime.set_all_config(values, secret_keys)
    _sync_await(run_pulumi_func(main or program.main))
    return monitor.declared


def declare(main: Callable[[], None], stack: str = "components") -> list[Declared]:
    """What `main` declares under the same mocks, with no stack config: a component built on
    its own, with arguments no stack file has (the tests)."""
    return contextvars.Context().run(_execute, stack, {}, [], main)


def run(
    stack: str,
    directory: Path = stackfile.STACKS_DIR,
    secrets: Mapping[str, str] | None = None,
) -> Plan:
    """Plan one stack. Raises `config.ConfigError` / `stackfile.StackFileError` on bad config.
    `secrets`: values for secret keys (`likes:<field>` -> value) instead of the offline
    placeholder, e.g. to render a password rotation."""
    sf = stackfile.load(stack, directory)
    values = {**sf.values, **(secrets or {})}
    secret_keys = sf.secret_keys | set(secrets or {})
    # Validate first so a bad value never reaches the program (and the error names the key).
    config.parse(values, secret_keys)
    resources = contextvars.Context().run(_execute, stack, values, sorted(secret_keys))
    violations = policies.check(resources, values, secret_keys)
    return Plan(stack, resources, violations, sf.placeholders)
