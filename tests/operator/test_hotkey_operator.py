"""The Kopf wiring against kmock (an emulated Kubernetes API): a HotKeyPolicy gets a status
patch; an etcd outage is retried as a temporary error and shows as an event. The reconcile pass
itself is tested against real etcd + Redis in tests/integration/test_hotkeys.py; here a scripted
stand-in answers for it, since only Kopf's side is under test."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import kmock
import kopf
import pytest

from operators.hotkeys import handlers
from operators.hotkeys.policy import Policy
from operators.hotkeys.reconciler import EtcdUnavailable, Report

RESOURCE = f"{handlers.GROUP}/{handlers.VERSION}/{handlers.PLURAL}"
API: dict[str, str] = {}  # the current test's kmock URL


# registered once (handlers live in the default registry for the whole session): point Kopf at
# whichever kmock the running test started
@kopf.on.login()
def login(**_: Any) -> kopf.ConnectionInfo:
    return kopf.ConnectionInfo(server=API["url"])


class ScriptedReconciler:
    """Fails the first `failures` passes as etcd would, then reports a hot set."""

    def __init__(self, failures: int = 0) -> None:
        self.failures = failures
        self.policies: list[Policy] = []

    async def tick(self, policy: Policy) -> Report:
        self.policies.append(policy)
        if len(self.policies) <= self.failures:
            raise EtcdUnavailable("etcd 127.0.0.1:1: connection refused")
        return Report(hot_keys=["viral"], split=["viral"], promoted=["viral"], at="now")


@pytest.fixture()
def cluster(kmock: kmock.KubernetesEmulator) -> kmock.KubernetesEmulator:
    kmock.resources.load_bundled()  # namespaces, CRDs, events: Kopf waits forever without
    kmock.resources[RESOURCE] = kmock.ResourceInfo(
        kind="HotKeyPolicy",
        namespaced=True,
        verbs={"list", "watch", "get", "patch"},
        subresources={"status"},
    )
    kmock.objects[RESOURCE, "likes", "default"] = {
        "apiVersion": f"{handlers.GROUP}/{handlers.VERSION}",
        "kind": "HotKeyPolicy",
        "metadata": {"name": "default", "namespace": "likes", "uid": "u1", "resourceVersion": "1"},
        "spec": {"enterRate": 100, "exitRate": 50, "splitRate": 400, "cooldownSeconds": 5},
    }
    return kmock


@contextlib.asynccontextmanager
async def operator(
    cluster: kmock.KubernetesEmulator, reconciler: ScriptedReconciler
) -> AsyncIterator[None]:
    registry = kopf.get_default_registry()  # handlers.py registered there on import
    API["url"] = str(cluster.url)
    settings = kopf.OperatorSettings()
    stop = asyncio.Event()
    task = asyncio.create_task(
        kopf.operator(
            registry=registry,
            settings=settings,
            clusterwide=True,
            stop_flag=stop,
            memo=kopf.Memo(reconciler=reconciler),
            standalone=True,
        )
    )
    try:
        yield
    finally:
        stop.set()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 10)


async def eventually(check: Any, timeout: float = 15.0) -> Any:
    async with asyncio.timeout(timeout):
        while True:
            result = check()
            if result:
                return result
            await asyncio.sleep(0.1)


def status(cluster: kmock.KubernetesEmulator) -> dict[str, Any]:
    return dict(cluster.objects[RESOURCE, "likes", "default"].get("status") or {})


def event_messages(cluster: kmock.KubernetesEmulator) -> list[str]:
    out = []
    for req in cluster:
        if req.method == "POST" and req.resource is not None and "events" in str(req.resource):
            body = req.data if isinstance(req.data, dict) else {}
            out.append(str(body.get("message", "")))
    return out


async def test_a_hotkeypolicy_gets_its_status_patched(cluster: kmock.KubernetesEmulator) -> None:
    reconciler = ScriptedReconciler()
    async with operator(cluster, reconciler):
        st = await eventually(lambda: status(cluster).get("hotKeys"))
    assert st == ["viral"]
    assert status(cluster)["splitKeys"] == ["viral"]
    assert reconciler.policies[0] == Policy(
        enter_rate=100, exit_rate=50, split_rate=400, cooldown_s=5
    )


async def test_an_etcd_outage_is_retried_as_a_temporary_error_with_an_event(
    cluster: kmock.KubernetesEmulator,
) -> None:
    reconciler = ScriptedReconciler(failures=1)
    async with operator(cluster, reconciler):
        await eventually(lambda: status(cluster).get("hotKeys"))
        messages = await eventually(
            lambda: [m for m in event_messages(cluster) if "connection refused" in m]
        )
    assert len(reconciler.policies) >= 2  # failed once, then retried and succeeded
    assert any("retrying" in m for m in messages), messages


def test_the_local_loop_survives_an_etcd_that_does_not_answer_its_policy_read() -> None:
    """At start the loop reads the policy before its first pass; an etcd that refuses or does
    not answer in time (a slow first login over TLS on a loaded machine) must be a retried
    EtcdUnavailable, not an exception that ends the process."""
    import socket

    from operators.hotkeys.local_loop import read_policy
    from operators.hotkeys.reconciler import Reconciler

    with socket.socket() as s:  # a loopback port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    reconciler = Reconciler("127.0.0.1", port, None, None, timeout_s=0.5)  # type: ignore[arg-type]

    async def go() -> None:
        try:
            await read_policy(reconciler, Policy())
        finally:
            await reconciler._drop_etcd()

    with pytest.raises(EtcdUnavailable, match="policy not read"):
        asyncio.run(go())
