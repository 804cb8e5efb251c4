"""A rotated password reaches the server that checks it: Kubernetes Jobs are immutable and Pulumi
replaces one only when its template changes, so a setup step that applies a credential carries a
digest of it (infra/k8s.py credentials_digest), and so do the KafkaUsers (the User Operator sets
the SCRAM password) and the schema registry's pods (they read their logins at start).

One stack rendered under Pulumi's mocks with every secret set, then once more per secret with that
one changed: the resources that differ are exactly the ones that apply it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from infra import config, k8s, plan, redis
from tests.infra.conftest import by_kind

STACK = "prod-us"  # the Jobs are the same in every stack; this one also has peers' KafkaUsers
FIELDS = sorted(config.SECRET_FIELDS)

# What a rotation of each secret must change ("<kind>/<Pulumi name>"), and nothing else may.
AFFECTED: dict[str, set[str]] = {
    # etcd-auth sets the services' password (and fails loudly on a root password etcd lacks)
    "etcdRootPassword": {"Job/etcd-auth"},
    "etcdPassword": {"Job/etcd-auth"},
    # the migration Job ALTERs the services' role; the admin role is its own login
    "scyllaAdminPassword": {"Job/scylla-migrate"},
    "scyllaPassword": {"Job/scylla-migrate"},
    # the User Operator writes each KafkaUser's SCRAM password from its Secret
    "kafkaPassword": {"KafkaUser/kafka-user-likes"},
    "kafkaRegistryPassword": {"KafkaUser/kafka-user-schema-registry", "Deployment/schema-registry"},
    # the registry loads its password file at start; the registration Job proves the new login
    "schemaRegistryPassword": {"Job/schema-registry-register", "Deployment/schema-registry"},
    # no setup step applies these: Redis takes requirepass from its config file at start, the
    # PagerDuty key is read where it is used
    "redisPassword": set(),
    # the limiter and its Redis read it at start: both roll (the counters live a minute)
    "ratelimitRedisPassword": {"Deployment/ratelimit", "Deployment/ratelimit-redis"},
    # the aggregator and the canary read their tokens at start: their pods roll
    "cdnPurgeToken": {"Deployment/aggregator"},
    "canaryToken": {"Deployment/canary"},
    "pagerdutyRoutingKey": set(),
    "abusePagerdutyRoutingKey": set(),
}
# Setup Jobs that read a password but apply none: they only form the Redis Cluster, and a rerun
# against a Redis that still has the old requirepass would wait forever.
NOT_KEYED = {f"{role}-create" for role in redis.CLUSTERS}


def _key(field: str) -> str:
    return f"{config.NAMESPACE}:{field}"


def _secrets(rotated: str | None = None) -> dict[str, str]:
    return {_key(f): f"{f}-{'rotated' if f == rotated else 'first'}-Qx7hT2pLm9Rv" for f in FIELDS}


@pytest.fixture(scope="module")
def renders() -> dict[str | None, plan.Plan]:
    out: dict[str | None, plan.Plan] = {None: plan.run(STACK, secrets=_secrets())}
    for field in FIELDS:
        out[field] = plan.run(STACK, secrets=_secrets(field))
    return out


def _by_name(p: plan.Plan) -> dict[str, dict[str, Any]]:
    return {f"{r.inputs.get('kind', r.type)}/{r.name}": r.inputs for r in p.resources}


def test_the_table_names_every_secret() -> None:
    assert set(AFFECTED) == set(config.SECRET_FIELDS)


@pytest.mark.parametrize("field", FIELDS)
def test_a_rotation_changes_exactly_what_applies_the_secret(
    renders: dict[str | None, plan.Plan], field: str
) -> None:
    before, after = _by_name(renders[None]), _by_name(renders[field])
    assert before.keys() == after.keys()
    changed = {name for name in before if before[name] != after[name]}
    assert changed == AFFECTED[field]
    for name in changed:
        old, new = before[name], after[name]
        if name.startswith(("Job/", "Deployment/")):
            # pulumi-kubernetes replaces a Job (and rolls a Deployment) on a template change
            assert old["spec"]["template"] != new["spec"]["template"], name
            annotations = new["spec"]["template"]["metadata"]["annotations"]
        else:
            annotations = new["metadata"]["annotations"]
        assert k8s.CREDENTIALS_ANNOTATION in annotations, name


def test_no_secret_value_is_rendered(renders: dict[str | None, plan.Plan]) -> None:
    for field, p in renders.items():
        text = json.dumps([r.inputs for r in p.resources])
        for value in _secrets(field).values():
            assert value not in text, f"{value} in clear ({field} rotated)"


def _reads_a_secret(job: dict[str, Any]) -> bool:
    spec = job["spec"]["template"]["spec"]
    return any(
        "valueFrom" in e and "secretKeyRef" in e["valueFrom"]
        for c in spec["containers"]
        for e in c.get("env") or []
    )


def test_every_setup_job_that_reads_a_password_is_keyed_on_it(
    renders: dict[str | None, plan.Plan],
) -> None:
    # a new setup Job that applies a credential without the digest would never re-run
    jobs = [r for r in by_kind(renders[None], "Job") if _reads_a_secret(r.inputs)]
    assert {r.name for r in jobs} >= NOT_KEYED
    for r in jobs:
        annotations = r.inputs["spec"]["template"]["metadata"].get("annotations") or {}
        assert (k8s.CREDENTIALS_ANNOTATION in annotations) == (r.name not in NOT_KEYED), r.name
