"""The production variants of the experiments (`likes chaos run ID --target k8s`): the same fault,
dealt to the pods the Pulumi program deploys, with chaostoolkit-kubernetes's actions.

Nothing here names a pod by hand. A local experiment's fault names local servers
(chaos/experiments/<id>.json: `kill` / `stop` of `aggregator`, `kafka-2`, `idem-store`, ...); each
is looked up in the stack's render (local/rendered.py, the program under Pulumi's mocks, the same
render the local stack runs), so the label selector is the one the program puts on the pods:

- our workloads and the stores the program runs as StatefulSets (Redis, etcd, the observability
  stack): `app.kubernetes.io/name=<name>`, the label infra/k8s.py's `selector()` matches on;
- Kafka: Strimzi's broker pods of the rendered `Kafka` (`strimzi.io/cluster`,
  `strimzi.io/broker-role`); the edge-store and counter-store: the Scylla Operator's member
  pods of the rendered `ScyllaCluster` (`scylla/cluster`);
- the abuse model: a sidecar of the abuse scorer's pods, so its pods (scorer and model both go).

One local node (`kafka-2`, `idem-store-3`) is one pod, chosen at random; a whole component
(`idem-store`) is every pod of it; a shard's primary (`kill_shard` without its replica) is one
pod of the component at random, primary or replica (which one is primary, only the running
cluster knows); a whole shard has no variant. `kill` is a deletion with no grace period
(SIGKILL), `stop` with the pod's own (SIGTERM). The local `restart` and `up` have no
counterpart: the pods' controllers recreate them at once, which is the production behaviour the
experiment observes.
A hang (`pause`, SIGSTOP) has no pod-level equivalent without an exec into the container, so
those modes have no production variant (NoVariant says why), nor do faults dealt to the data or
the control plane (poison records, a topic refusing writes, a flag): they need the cluster's own
Kafka and etcd clients, which this does not build.

The hypothesis is the pods': every targeted pod Running before the fault and again after the
fault's observation pause. Traffic is the users' own, and the invariants are watched by the
production SLO alerts, not by this probe.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from chaos import catalog

DEFAULT_STACK = "prod-us"
PROVIDER_MODULE_POD_ACTIONS = "chaosk8s.pod.actions"
PROVIDER_MODULE_POD_PROBES = "chaosk8s.pod.probes"
NAME_LABEL = "app.kubernetes.io/name"
STRIMZI_CLUSTER_LABEL = "strimzi.io/cluster"
STRIMZI_BROKER_LABEL = "strimzi.io/broker-role"
SCYLLA_CLUSTER_LABEL = "scylla/cluster"
# a local server that is not its own pod in production: the pod it lives in
SIDECAR_OF = {"abuse-model": "abuse-scorer"}
_NODE = re.compile(r"^(?P<component>[a-z][a-z0-9-]*?)-(?P<n>\d+)$")  # kafka-2, idem-store-3
_FAULTS = {"kill": 0, "stop": -1}  # grace period: none (SIGKILL), or the pod's own (SIGTERM)
# (a cluster that has been up a while has its preferred leaders: the brokers rebalance them)
_NO_COUNTERPART = {"start_traffic", "stop_traffic", "restart", "up", "prefer_leaders",
                   "expect_ring_unvoided"}  # fmt: skip
# faults dealt to the data or the control plane (chaos/actions.py), not to a pod
_DATA_FAULTS = {"produce_poison", "refuse_records", "accept_records", "set_flag", "unset_flag",
                "split_post", "unsplit_post", "push_bad_config", "remove_bad_config",
                "push_stale_hot_flag", "remove_stale_hot_flag",
                "register_incompatible_schema"}  # fmt: skip
# the other faults a pod deletion cannot stand for, and why
_OTHER_FAULTS = {
    "add_toxic": "a network fault on a node's Toxiproxy proxy: the cluster has no proxy in its "
    "data path (a network chaos tool's partition would be its counterpart; not built)",
    "drop_answers": "dealt by the game day's own clients, not to a pod: the local traffic "
    "aimed at the cluster's gateway would be its counterpart (not built)",
    "restart_cold": "a restart then FLUSHALL: emptying production's count-cache is not a fault "
    "to aim at a live cluster",
    "bot_storm": "dealt by the game day's own clients (a bot ring), not to a pod: the local "
    "traffic aimed at the cluster's gateway would be its counterpart (not built)",
    "deploy_bad_model": "a model version served from the models volume, not a pod: the "
    "cluster's `likes abuse use` against its volume would be its counterpart (not built)",
    "cold_viral_post": "a post's hot-pool copies deleted (as aged out): a data condition set "
    "up through the cluster's own Redis clients would be its counterpart (not built)",
    "bad_sampling": "a collector config pushed around the program: the cluster's sampler "
    "ConfigMap edited by hand and its pods rolled would be its counterpart (not built)",
    "poison_schema_record": "a rewrite of the registry's backing topic: production's registry "
    "serves only what it registered, and its _schemas is not a thing to corrupt on a live "
    "cluster",
    "purge_api_outage": "an outage of the CDN's purge API (Cloudflare's, no pod of ours): a "
    "fault proxy in front of the aggregators' egress would be its counterpart (not built)",
}
RECOVERY_WAIT_S = 60  # after the fault's own pause: for the controllers' new pods to run


class NoVariant(Exception):
    """The mode has no production variant (the reason is the message)."""


@dataclass(frozen=True)
class Target:
    """Pods of one kind in the program's namespace: `selector` and how many of them."""

    server: str  # the local name it stands for
    selector: str
    namespace: str
    everyone: bool  # every pod the selector matches, or one at random

    def args(self, grace_period: int) -> dict[str, Any]:
        out: dict[str, Any] = {"label_selector": self.selector, "ns": self.namespace}
        if self.everyone:
            out["all"] = True
        else:
            out.update(rand=True, qty=1)
        if grace_period >= 0:
            out["grace_period"] = grace_period
        return out


def _labels_of(res: dict[str, Any]) -> dict[str, str]:
    return dict((res["inputs"].get("metadata") or {}).get("labels") or {})


def _namespace_of(res: dict[str, Any]) -> str:
    return str((res["inputs"].get("metadata") or {}).get("namespace") or "default")


def _custom(rendered: Any, kind: str) -> dict[str, Any]:
    found = [
        r
        for r in rendered.resources
        if r["type"].startswith("kubernetes:") and r["type"].endswith(f":{kind}")
    ]
    if len(found) != 1:
        raise NoVariant(f"stack {rendered.stack} renders {len(found)} {kind} resources, not one")
    return found[0]


def target(server: str, stack: str = DEFAULT_STACK) -> Target:
    """The production pods of a local server or component, from the stack's render."""
    from local import rendered as rendering

    rendered = rendering.render(stack)
    name = SIDECAR_OF.get(server, server)
    node = _NODE.match(name)
    component = node.group("component") if node else name
    everyone = node is None
    if component == "kafka":
        kafka = _custom(rendered, "Kafka")
        cluster = kafka["inputs"]["metadata"]["name"]
        return Target(server, f"{STRIMZI_CLUSTER_LABEL}={cluster},{STRIMZI_BROKER_LABEL}=true",
                      _namespace_of(kafka), everyone)  # fmt: skip
    if component == "cassandra":
        scylla = _custom(rendered, "ScyllaCluster")
        cluster = scylla["inputs"]["metadata"]["name"]
        return Target(server, f"{SCYLLA_CLUSTER_LABEL}={cluster}", _namespace_of(scylla), everyone)
    for kind in ("apps/v1:Deployment", "apps/v1:StatefulSet"):
        for res in rendered.of_type(f"kubernetes:{kind}"):
            if _labels_of(res).get(NAME_LABEL) == component:
                return Target(server, f"{NAME_LABEL}={component}", _namespace_of(res), everyone)
    raise NoVariant(f"{server}: stack {stack} deploys no pods for it (a local-only server)")


def _terminate(name: str, t: Target, grace_period: int) -> dict[str, Any]:
    return {
        "type": "action",
        "name": name,
        "provider": {
            "type": "python",
            "module": PROVIDER_MODULE_POD_ACTIONS,
            "func": "terminate_pods",
            "arguments": t.args(grace_period),
        },
    }


def _kills(activity: dict[str, Any]) -> list[str]:
    """The servers a bot storm kills when the scorer first voids (chaos.actions.bot_storm)."""
    if activity["provider"]["func"] != "bot_storm":
        return []
    return list((activity["provider"].get("arguments") or {}).get("kill_on_first_void") or [])


def experiment(mode_id: str, stack: str = DEFAULT_STACK) -> dict[str, Any]:
    """The production variant of the mode's local experiment (raises NoVariant)."""
    local = catalog.experiment(mode_id)
    method: list[dict[str, Any]] = []
    targets: dict[str, Target] = {}
    pod_faults = any(_kills(a) or a["provider"]["func"] in _FAULTS for a in local["method"])
    for activity in local["method"]:
        func = activity["provider"]["func"]
        if func in _NO_COUNTERPART:
            continue
        # a bot ring beside a pod fault (abuse-model-down) is traffic: in production the users'
        # own stands for it; killing the scorer mid-void (abuse-scorer-crash-mid-publish) is a
        # pod fault, dealt without the timing; a ring alone is the clients' own (_OTHER_FAULTS)
        if func == "bot_storm" and ((servers := _kills(activity)) or pod_faults):
            for server in servers:
                t = targets[server] = target(server, stack)
                method.append(_terminate(f"kill-{server}-pods", t, 0))
            if servers and "pauses" in activity:
                after = activity["pauses"].get("after", 0) + RECOVERY_WAIT_S
                method[-1]["pauses"] = {"after": after}
            continue
        if func in _DATA_FAULTS:
            raise NoVariant(
                f"{mode_id}: its fault `{func}` is dealt to Kafka's records or an etcd flag, not "
                "to a pod: it needs the cluster's own Kafka and etcd clients (not built)"
            )
        if func in _OTHER_FAULTS:
            raise NoVariant(f"{mode_id}: its fault `{func}` is {_OTHER_FAULTS[func]}")
        if func == "kill_shard":
            if activity["provider"]["arguments"].get("with_replica", True):
                raise NoVariant(
                    f"{mode_id}: which pods form one shard (a primary and its replica) only the "
                    "running cluster knows; a pod deletion cannot aim at both"
                )
            component = activity["provider"]["arguments"]["component"]
            t = targets[component] = replace(target(component, stack), everyone=False)
            method.append(_terminate(f"kill-one-{component}-pod", t, 0))
        elif func in _FAULTS:
            for server in activity["provider"]["arguments"]["servers"]:
                t = targets[server] = target(server, stack)
                name = f"{'kill' if _FAULTS[func] == 0 else 'stop'}-{server}-pods"
                method.append(_terminate(name, t, _FAULTS[func]))
        else:
            raise NoVariant(
                f"{mode_id}: its fault `{func}` has no pod-level counterpart (a SIGSTOP hang "
                "would need an exec into the container)"
            )
        if "pauses" in activity:
            method[-1]["pauses"] = {"after": activity["pauses"].get("after", 0) + RECOVERY_WAIT_S}
    if not method:
        raise NoVariant(f"{mode_id}: its experiment deals no fault")
    probes = [
        {
            "type": "probe",
            "name": f"{server}-pods-running",
            "tolerance": True,
            "provider": {
                "type": "python",
                "module": PROVIDER_MODULE_POD_PROBES,
                "func": "pods_in_phase",
                "arguments": {"label_selector": t.selector, "phase": "Running", "ns": t.namespace},
            },
        }
        for server, t in targets.items()
    ]
    return {
        "version": "1.0.0",
        "title": f"{mode_id} (production, stack {stack}): {local['title'].split(': ', 1)[-1]}",
        "description": local.get("description", ""),
        "tags": [*local.get("tags", []), "kubernetes"],
        "configuration": {"mode": mode_id, "target": "k8s", "stack": stack},
        "steady-state-hypothesis": {
            "title": "every targeted pod is Running (the SLO alerts watch the invariants)",
            "probes": probes,
        },
        "method": method,
        "rollbacks": [],
    }


def variants(stack: str = DEFAULT_STACK) -> dict[str, dict[str, Any] | str]:
    """Per runnable mode: its production experiment, or why it has none."""
    out: dict[str, dict[str, Any] | str] = {}
    for m in catalog.modes():
        if not (m.enactable and m.has_experiment):
            continue
        try:
            out[m.id] = experiment(m.id, stack)
        except NoVariant as e:
            out[m.id] = str(e)
    return out
