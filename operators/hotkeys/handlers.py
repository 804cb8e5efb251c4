"""The Kopf wiring: one timer per HotKeyPolicy runs a reconcile pass and writes its status.

    kopf run -A -m operators.hotkeys.handlers

Handlers decorate and delegate (the pass is reconciler.Reconciler); an invalid spec is a
PermanentError (no retry can fix it), an etcd outage a TemporaryError (retried after `delay`).
"""

from __future__ import annotations

from typing import Any

import kopf

from operators.hotkeys import crd
from operators.hotkeys.policy import InvalidPolicy, Policy
from operators.hotkeys.reconciler import EtcdUnavailable, Reconciler
from operators.hotkeys.settings import OperatorSettings
from services.common import observability
from services.contracts import workloads

GROUP, VERSION, PLURAL = crd.GROUP, crd.VERSION, crd.PLURAL  # what the program installs
INTERVAL_S = 1.0
RETRY_DELAY_S = 2.0


def build_reconciler() -> Reconciler:
    settings = OperatorSettings()
    # here, not at import: a test that brings its own reconciler installs no tracer provider
    observability.setup_tracing(workloads.HOTKEY_OPERATOR.name, settings.otlp_endpoint)
    return Reconciler.from_settings(settings)


@kopf.on.startup()
async def startup(memo: kopf.Memo, **_: Any) -> None:
    # a test (or an embedding program) may bring its own reconciler in the memo
    if getattr(memo, "reconciler", None) is None:
        memo.reconciler = build_reconciler()


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    reconciler = getattr(memo, "reconciler", None)
    if isinstance(reconciler, Reconciler):
        await reconciler.close()


@kopf.timer(GROUP, VERSION, PLURAL, interval=INTERVAL_S)
async def reconcile(
    spec: kopf.Spec, patch: kopf.Patch, memo: kopf.Memo, body: kopf.Body, **_: Any
) -> None:
    try:
        policy = Policy.from_spec(dict(spec))
    except InvalidPolicy as e:
        patch.status["errors"] = [str(e)]
        kopf.exception(body, reason="InvalidPolicy", message=str(e))
        raise kopf.PermanentError(str(e)) from e
    try:
        report = await memo.reconciler.tick(policy)
    except EtcdUnavailable as e:
        # the data plane keeps its last good config meanwhile; on-call sees why in the events
        # (Kopf posts only explicit events by default, not handler logs)
        kopf.warn(body, reason="EtcdUnavailable", message=f"{e}; retrying in {RETRY_DELAY_S}s")
        raise kopf.TemporaryError(f"etcd unavailable: {e}", delay=RETRY_DELAY_S) from e
    for name, value in report.status().items():
        patch.status[name] = value
