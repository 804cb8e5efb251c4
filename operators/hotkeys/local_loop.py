"""The reconcile loop without Kubernetes (the local stack): the policy is read from etcd
(`/likes/flags/hotkey-policy`, the CRD's spec as JSON; defaults when absent), and /readyz and
/metrics are served for the supervisor.

    python -m operators.hotkeys --port 8600 --interval 0.25
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging

from prometheus_client import Counter, Gauge

from operators.hotkeys.policy import InvalidPolicy, Policy
from operators.hotkeys.reconciler import EtcdUnavailable, Reconciler
from operators.hotkeys.settings import OperatorSettings
from services.common import observability, switches, worker_http
from services.contracts import flags, keys
from services.contracts import metrics as metric_names
from services.contracts.workloads import HOTKEY_OPERATOR as WORKLOAD

log = logging.getLogger("hotkeys.operator")

POLICY_KEY = keys.FLAGS_PREFIX + "hotkey-policy"
HOT_KEYS = Gauge(metric_names.HOTKEYS_HOT, "Posts the operator holds hot")
SPLIT_KEYS = Gauge(metric_names.HOTKEYS_SPLIT, "Posts split by the operator")
ERRORS = Counter(metric_names.HOTKEYS_RECONCILE_ERRORS, "Failed reconcile passes", ["kind"])


async def read_policy(reconciler: Reconciler, current: Policy) -> Policy:
    """The policy in etcd, or `current` when absent or invalid (logged, never fatal). etcd not
    answering (a slow first login over TLS on a loaded machine timed the operator out at start):
    EtcdUnavailable, which the loop retries, as it does a pass."""
    try:
        raw = await reconciler._prefix(POLICY_KEY)
    except Exception as e:
        await reconciler._drop_etcd()
        raise EtcdUnavailable(f"etcd: policy not read: {e!r}") from e
    value = raw.get("")
    if value is None:
        return Policy()
    try:
        return Policy.from_spec(json.loads(value))
    except (InvalidPolicy, ValueError) as e:
        log.warning("invalid hotkey policy in etcd; keeping the previous one",
                    extra={"fields": {"error": str(e)}})  # fmt: skip
        return current


async def run(interval_s: float, host: str, port: int) -> None:
    settings = OperatorSettings()
    observability.setup_logging(WORKLOAD.name, settings.log_level)
    observability.setup_tracing(WORKLOAD.name, settings.otlp_endpoint)
    reconciler = Reconciler.from_settings(settings)
    state = {"passes": 0}
    worker_http.serve(host, port, lambda: {"reconciled": state["passes"] > 0})
    policy = Policy()
    try:
        while True:
            try:
                policy = await read_policy(reconciler, policy)
                report = await reconciler.tick(policy)
                state["passes"] += 1
                HOT_KEYS.set(len(report.hot_keys))
                SPLIT_KEYS.set(len(report.split))
                engaged = flags.engaged_by(reconciler.switches)
                for s in flags.Switch:
                    switches.export(s.value, 1.0 if s in engaged else 0.0)
                if report.promoted or report.demoted:
                    log.info("hot set changed", extra={"fields": report.status()})
                if report.errors:
                    ERRORS.labels("data-plane").inc()
            except EtcdUnavailable as e:
                ERRORS.labels("etcd").inc()
                log.warning("etcd unavailable", extra={"fields": {"error": str(e)}})
            await asyncio.sleep(interval_s)
    finally:
        await reconciler.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8600)
    parser.add_argument("--interval", type=float, default=0.25)
    args = parser.parse_args()
    asyncio.run(run(args.interval, args.host, args.port))
