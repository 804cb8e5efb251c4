"""Every Kubernetes manifest the program declares validates against the Kubernetes schema of the
stack's cluster version (kubernetes-validate, strict: unknown fields fail); our HotKeyPolicy
against its own CRD schema. Strimzi, Scylla and cert-manager publish no CRD schema as a package
here, so their resources are checked for the required fields REFERENCE.md lists instead."""

from __future__ import annotations

from typing import Any

import jsonschema
import kubernetes_validate
import pytest

from infra import config, operator, plan, services
from tests.infra.conftest import STACKS

# Custom resources without a schema we can load here: group -> fields each kind must carry.
_REQUIRED: dict[str, list[tuple[str, ...]]] = {
    "Kafka": [
        ("spec", "kafka", "listeners"), ("spec", "kafka", "config"), ("spec", "entityOperator"),
    ],
    "KafkaNodePool": [("spec", "replicas"), ("spec", "roles"), ("spec", "storage", "type")],
    "KafkaTopic": [
        ("metadata", "labels", "strimzi.io/cluster"), ("spec", "partitions"), ("spec", "replicas"),
    ],
    "KafkaMirrorMaker2": [
        ("spec", "replicas"), ("spec", "target", "alias"), ("spec", "target", "bootstrapServers"),
        ("spec", "target", "groupId"), ("spec", "target", "configStorageTopic"),
        ("spec", "target", "offsetStorageTopic"), ("spec", "target", "statusStorageTopic"),
        ("spec", "mirrors"),
    ],
    "KafkaUser": [("metadata", "labels", "strimzi.io/cluster"), ("spec", "authentication", "type")],
    "ScyllaCluster": [
        ("spec", "version"), ("spec", "datacenter", "name"), ("spec", "datacenter", "racks"),
    ],
    "Certificate": [("spec", "secretName"), ("spec", "issuerRef", "name")],
    "ClusterIssuer": [("spec",)],
}  # fmt: skip


def _manifests(p: plan.Plan) -> list[plan.Declared]:
    return [
        r
        for r in p.resources
        if r.type.startswith("kubernetes:") and "apiVersion" in r.inputs and "kind" in r.inputs
    ]


def _is_builtin(api_version: str) -> bool:
    group = api_version.rpartition("/")[0]
    return "." not in group or group.endswith(".k8s.io")


@pytest.mark.parametrize("stack", STACKS)
def test_builtin_manifests_validate_for_the_cluster_version(
    plans: dict[str, plan.Plan], configs: dict[str, config.StackConfig], stack: str
) -> None:
    version = f"{configs[stack].kubernetes_version}.0"
    checked: set[str] = set()
    failures: list[str] = []
    for r in _manifests(plans[stack]):
        if not _is_builtin(r.inputs["apiVersion"]):
            continue
        checked.add(f"{r.inputs['kind']}/{r.inputs['metadata']['name']}")
        try:
            kubernetes_validate.validate(r.inputs, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            failures.append(f"{r.type} {r.name}: {exc.message}")
    assert failures == []
    assert len(checked) > 100
    # the abuse model's publisher: a CronJob's job template and pod failure policy included
    assert f"CronJob/{services.MODELS_PUBLISHER}" in checked


def _strip_k8s_extensions(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {
            k: _strip_k8s_extensions(v)
            for k, v in schema.items()
            if not k.startswith("x-kubernetes")
        }
    if isinstance(schema, list):
        return [_strip_k8s_extensions(v) for v in schema]
    return schema


@pytest.mark.parametrize("stack", STACKS)
def test_hotkeypolicy_matches_its_crd_schema(
    plans: dict[str, plan.Plan], configs: dict[str, config.StackConfig], stack: str
) -> None:
    (crd,) = [r for r in _manifests(plans[stack]) if r.inputs["kind"] == "CustomResourceDefinition"]
    schema = _strip_k8s_extensions(crd.inputs["spec"]["versions"][0]["schema"]["openAPIV3Schema"])
    # a CRD schema is OpenAPI v3.0: boolean exclusiveMinimum, as in JSON Schema draft 4
    validator = jsonschema.Draft4Validator(schema)
    (policy,) = [r for r in _manifests(plans[stack]) if r.inputs["kind"] == operator.KIND]
    validator.validate(policy.inputs)
    pools = configs[stack].redis.hot_pools
    for field, value in (("replicationFactor", pools + 1), ("enterRate", 0), ("splitFactor", 0)):
        bad = {**policy.inputs, "spec": {**policy.inputs["spec"], field: value}}
        with pytest.raises(jsonschema.ValidationError):
            validator.validate(bad)


@pytest.mark.parametrize("stack", STACKS)
def test_operator_custom_resources_carry_required_fields(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    seen = set()
    for r in _manifests(plans[stack]):
        kind = r.inputs["kind"]
        if _is_builtin(r.inputs["apiVersion"]) or kind == operator.KIND:
            continue
        assert kind in _REQUIRED, f"no check for {kind}"
        seen.add(kind)
        for path in _REQUIRED[kind]:
            node: Any = r.inputs
            for part in path:
                assert isinstance(node, dict) and part in node, (
                    f"{kind} {r.name} lacks {'.'.join(path)}"
                )
                node = node[part]
    assert {"Kafka", "KafkaNodePool", "KafkaTopic", "ScyllaCluster"} <= seen
