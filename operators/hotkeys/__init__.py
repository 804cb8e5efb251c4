"""Hot-key replication: decisions (pure), the reconciler (etcd + Redis), the Kopf wiring
(`operators.hotkeys.handlers`, `kopf run -m operators.hotkeys.handlers`) and the on-call CLI."""

from operators.hotkeys.decisions import HotEntry, Plan, decide
from operators.hotkeys.policy import InvalidPolicy, Policy
from operators.hotkeys.reconciler import EtcdUnavailable, Reconciler, Report

__all__ = [
    "EtcdUnavailable",
    "HotEntry",
    "InvalidPolicy",
    "Plan",
    "Policy",
    "Reconciler",
    "Report",
    "decide",
]
