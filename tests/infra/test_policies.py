"""Each policy fails on a crafted bad resource and passes on the real program."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml

from infra import observability, plan, policies
from services.contracts import workloads
from tests.infra.conftest import STACKS, named

WRITE = workloads.WRITE.name


@dataclass(frozen=True)
class R:
    type: str
    name: str
    inputs: dict[str, Any] = field(default_factory=dict)


def _k8s(r: plan.Declared) -> R:
    return R(r.type, r.name, copy.deepcopy(r.inputs))


@pytest.mark.parametrize("stack", STACKS)
def test_every_policy_passes_on_the_real_program(plans: dict[str, plan.Plan], stack: str) -> None:
    p = plans[stack]
    sf_raw = {"likes:redisPassword": "x", "likes:cdnPurgeToken": "y"}
    assert policies.containers_have_resources_and_probes(p.resources) == []
    assert policies.statefulsets_have_pdb_and_zone_spread(p.resources) == []
    assert policies.no_public_datastore(p.resources) == []
    assert policies.no_plaintext_secrets(p.resources, sf_raw, list(sf_raw)) == []
    prod = {"likes:environment": "prod"}
    assert policies.alerts_reach_a_receiver(p.resources, prod) == []


def test_container_without_limits_or_probes_fails(plans: dict[str, plan.Plan]) -> None:
    bad = _k8s(named(plans["staging"], "Deployment", WRITE))
    container = bad.inputs["spec"]["template"]["spec"]["containers"][0]
    del container["resources"]["limits"]
    del container["readinessProbe"]
    found = {(v.policy, v.message) for v in policies.containers_have_resources_and_probes([bad])}
    assert ("container-resources", f"container {WRITE} has no limits for cpu, memory") in found
    assert ("container-probes", f"container {WRITE} has no readinessProbe") in found


def test_job_needs_resources_but_not_probes(plans: dict[str, plan.Plan]) -> None:
    job = next(r for r in plans["staging"].resources if r.name == "scylla-migrate")
    assert policies.containers_have_resources_and_probes([job]) == []
    bad = _k8s(job)
    del bad.inputs["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["memory"]
    (v,) = policies.containers_have_resources_and_probes([bad])
    assert v.policy == "container-resources" and "memory" in v.message


def test_statefulset_without_pdb_or_zone_spread_fails(plans: dict[str, plan.Plan]) -> None:
    sts = _k8s(named(plans["staging"], "StatefulSet", "etcd"))
    pdb = _k8s(named(plans["staging"], "PodDisruptionBudget", "etcd"))
    assert policies.statefulsets_have_pdb_and_zone_spread([sts, pdb]) == []
    found = {v.policy for v in policies.statefulsets_have_pdb_and_zone_spread([sts])}
    assert found == {"statefulset-pdb"}
    sts.inputs["spec"]["template"]["spec"]["topologySpreadConstraints"] = [
        c
        for c in sts.inputs["spec"]["template"]["spec"]["topologySpreadConstraints"]
        if c["topologyKey"] != "topology.kubernetes.io/zone"
    ]
    found = {v.policy for v in policies.statefulsets_have_pdb_and_zone_spread([sts, pdb])}
    assert found == {"statefulset-zone-spread"}


def test_scylla_racks_in_one_zone_fail(plans: dict[str, plan.Plan]) -> None:
    scylla = _k8s(
        next(r for r in plans["staging"].resources if r.inputs.get("kind") == "ScyllaCluster")
    )
    for rack in scylla.inputs["spec"]["datacenter"]["racks"]:
        terms = rack["placement"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        terms["nodeSelectorTerms"][0]["matchExpressions"][0]["values"] = ["us-west-2a"]
    (v,) = policies.statefulsets_have_pdb_and_zone_spread([scylla])
    assert v.policy == "statefulset-zone-spread"


def test_secret_in_plain_config_fails(plans: dict[str, plan.Plan]) -> None:
    raw = {"likes:redisPassword": "hunter2", "likes:region": "us-east-1"}
    (v,) = policies.no_plaintext_secrets([], raw, secret_keys=[])
    assert (v.policy, v.resource) == ("secret-in-plain-config", "likes:redisPassword")
    assert policies.no_plaintext_secrets([], raw, secret_keys=["likes:redisPassword"]) == []
    # the CDN purge token is a secret field too (the aggregator's Cloudflare purger)
    (v,) = policies.no_plaintext_secrets([], {"likes:cdnPurgeToken": "t"}, secret_keys=[])
    assert (v.policy, v.resource) == ("secret-in-plain-config", "likes:cdnPurgeToken")
    dep = _k8s(named(plans["staging"], "Deployment", WRITE))
    dep.inputs["spec"]["template"]["spec"]["containers"][0]["env"].append(
        {"name": "LIKES_REDIS_PASSWORD", "value": "hunter2"}
    )
    cm = R(
        "kubernetes:core/v1:ConfigMap", "leaky", {"kind": "ConfigMap", "data": {"api_token": "x"}}
    )
    found = policies.no_plaintext_secrets([dep, cm], {}, [])
    assert {v.resource for v in found} == {
        f"kubernetes:apps/v1:Deployment::{WRITE}",
        "kubernetes:core/v1:ConfigMap::leaky",
    }


def test_public_datastore_endpoint_fails(plans: dict[str, plan.Plan]) -> None:
    p = plans["prod-us"]
    sts = named(p, "StatefulSet", "idem-store")
    # A LoadBalancer Service that selects Redis pods without any datastore label of its own.
    lb = R(
        "kubernetes:core/v1:Service",
        "oops",
        {
            "kind": "Service",
            "metadata": {"labels": {}},
            "spec": {"type": "LoadBalancer", "selector": {"app.kubernetes.io/name": "idem-store"}},
        },
    )
    (v,) = policies.no_public_datastore([sts, lb])
    assert v.policy == "public-datastore"
    internal = copy.deepcopy(lb.inputs)
    internal["metadata"]["annotations"] = {
        "service.beta.kubernetes.io/aws-load-balancer-scheme": "internal"
    }
    assert policies.no_public_datastore([sts, R(lb.type, "ok", internal)]) == []
    kafka = _k8s(next(r for r in p.resources if r.inputs.get("kind") == "Kafka"))
    assert policies.no_public_datastore([kafka]) == []
    kafka.inputs["spec"]["kafka"]["template"] = {}
    (v,) = policies.no_public_datastore([kafka])
    assert "peers" in v.message
    # The gateway's public NLB is not a datastore.
    assert policies.no_public_datastore([named(p, "Service", "envoy")]) == []


def _alertmanager(p: plan.Plan) -> tuple[R, dict[str, Any]]:
    cm = _k8s(named(p, "ConfigMap", observability.ALERTMANAGER_CONFIG_MAP))
    return cm, yaml.safe_load(cm.inputs["data"][observability.ALERTMANAGER_CONFIG_FILE])


def _with(cm: R, am: dict[str, Any]) -> R:
    cm.inputs["data"][observability.ALERTMANAGER_CONFIG_FILE] = yaml.safe_dump(am)
    return cm


def _rules(p: plan.Plan) -> R:
    return _k8s(named(p, "ConfigMap", observability.RULES_CONFIG_MAP))


def test_alert_routed_to_a_silent_receiver_fails(plans: dict[str, plan.Plan]) -> None:
    """The H3 shape: tickets and the Watchdog sent to a receiver without integrations."""
    p = plans["prod-us"]
    cm, am = _alertmanager(p)
    am["receivers"].append({"name": "null"})
    for route in am["route"]["routes"]:
        if route["receiver"] in ("tickets", "heartbeat"):
            route["receiver"] = "null"
    found = policies.alerts_reach_a_receiver([_with(cm, am), _rules(p)], {})
    messages = {v.message for v in found}
    assert {v.policy for v in found} == {"alert-routing"}
    assert "Watchdog (severity=none) reaches ['null']" in messages
    assert "TraceExportFailing (severity=ticket) reaches ['null']: sends nowhere" in messages


def test_watchdog_without_a_dead_mans_switch_fails_in_prod_only(
    plans: dict[str, plan.Plan],
) -> None:
    p = plans["staging"]
    cm, am = _alertmanager(p)
    (heartbeat,) = [r for r in am["receivers"] if r["name"] == "heartbeat"]
    del heartbeat["webhook_configs"]  # what a stack without likes:observability.heartbeatUrl gets
    resources = [_with(cm, am), _rules(p)]
    assert policies.alerts_reach_a_receiver(resources, {"likes:environment": "staging"}) == []
    (v,) = policies.alerts_reach_a_receiver(resources, {"likes:environment": "prod"})
    assert v.message == "Watchdog (severity=none): no dead man's switch in prod"


def test_a_matcher_the_policy_cannot_read_fails_loudly(plans: dict[str, plan.Plan]) -> None:
    p = plans["staging"]
    cm, am = _alertmanager(p)
    am["route"]["routes"][0]["matchers"] = ["alertname=Watchdog"]  # unquoted: valid, not parsed
    (v,) = policies.alerts_reach_a_receiver([_with(cm, am), _rules(p)], {})
    assert "unsupported matcher" in v.message
