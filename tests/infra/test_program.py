"""The program under mocks, per stack: the numbers that matter for durability and limits."""

from __future__ import annotations

import hashlib
import json
import math

import pytest
import yaml

from infra import config, kafka, plan, redis, services
from services.contracts import events, workloads
from services.schema import cql_apply, registry_schemas
from tests.infra.conftest import STACKS, by_kind, named

COMPONENTS = {
    "Network", "Cluster", "Platform", "Redis", "Kafka", "Scylla", "Etcd", "SchemaRegistry",
    "Observability", "Services", "Operator", "Gateway", "Cdn", "NetworkPolicies", "InternalCa",
}  # fmt: skip


def test_three_stacks_exist() -> None:
    assert set(STACKS) >= {"prod-us", "prod-eu", "staging"}


@pytest.mark.parametrize("stack", STACKS)
def test_stack_builds_every_component_and_passes_policies(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    p = plans[stack]
    types = {
        r.type.removeprefix("likes:infra:") for r in p.resources if r.type.startswith("likes:")
    }
    assert types == COMPONENTS
    assert p.violations == []
    # Every child of a component is parented (nothing leaks to the stack root but components).
    roots = [r for r in p.resources if r.parent and r.parent.startswith("likes-")]
    assert {r.type for r in roots} <= {f"likes:infra:{c}" for c in COMPONENTS}


@pytest.mark.parametrize("stack", STACKS)
def test_topics_partitions_replication_and_min_isr(
    plans: dict[str, plan.Plan], configs: dict[str, config.StackConfig], stack: str
) -> None:
    topics = {
        t.inputs["metadata"]["name"]: t.inputs["spec"] for t in by_kind(plans[stack], "KafkaTopic")
    }
    assert set(topics) == {"likes.committed", "likes.voided", "likes.unvoided", "likes.dead-letter"}
    expected = configs[stack].kafka.partitions
    for name in ("likes.committed", "likes.voided", "likes.unvoided"):
        assert topics[name]["partitions"] == expected
    for spec in topics.values():
        assert spec["replicas"] == 3
        assert spec["config"]["min.insync.replicas"] == 2
        assert spec["config"]["unclean.leader.election.enable"] is False
    dead = topics["likes.dead-letter"]
    assert dead["partitions"] == 32
    assert dead["config"]["retention.ms"] == 30 * 24 * 3600 * 1000


@pytest.mark.parametrize("stack", ["prod-us", "prod-eu"])
def test_prod_event_topics_have_256_partitions(plans: dict[str, plan.Plan], stack: str) -> None:
    for name in ("likes.committed", "likes.voided"):
        assert named(plans[stack], "KafkaTopic", name).inputs["spec"]["partitions"] == 256


def test_topic_specs_follow_args() -> None:
    args = kafka.KafkaArgs(
        namespace="n", region="r", zones=("a", "b", "c"), version="4.1.1", controllers=3,
        brokers_per_zone=1, broker_storage_gi=1, broker_cpu="1", broker_memory_gi=1,
        partitions=7, dead_letter_partitions=5, dead_letter_retention_days=2, retention_hours=1,
        replication_factor=3, min_insync_replicas=2, mirror_maker_replicas=1,
        service_password="pw", registry_password="pw",
    )  # fmt: skip
    specs = {t.name: t for t in kafka.topic_specs(args)}
    assert specs["likes.committed"].partitions == 7
    assert specs["likes.dead-letter"].partitions == 5
    assert specs["likes.dead-letter"].config["retention.ms"] == 2 * 86_400_000


@pytest.mark.parametrize("stack", STACKS)
def test_kafka_cluster_is_durable_and_zone_aware(
    plans: dict[str, plan.Plan], configs: dict[str, config.StackConfig], stack: str
) -> None:
    cluster = by_kind(plans[stack], "Kafka")[0].inputs
    assert cluster["apiVersion"] == "kafka.strimzi.io/v1"
    cfg = cluster["spec"]["kafka"]["config"]
    assert cfg["default.replication.factor"] == 3
    assert cfg["min.insync.replicas"] == 2
    assert cfg["transaction.state.log.min.isr"] == 2
    assert cluster["spec"]["kafka"]["rack"]["topologyKey"] == "topology.kubernetes.io/zone"
    pools = [r.inputs for r in by_kind(plans[stack], "KafkaNodePool")]
    broker_zones = set()
    for pool in pools:
        assert pool["metadata"]["labels"]["strimzi.io/cluster"] == "likes"
        if pool["spec"]["roles"] == ["broker"]:
            terms = pool["spec"]["template"]["pod"]["affinity"]["nodeAffinity"][
                "requiredDuringSchedulingIgnoredDuringExecution"
            ]["nodeSelectorTerms"]
            broker_zones.update(terms[0]["matchExpressions"][0]["values"])
    assert broker_zones == set(configs[stack].zones)


def test_mirror_maker_pulls_peer_regions_without_loops(plans: dict[str, plan.Plan]) -> None:
    for stack, own, peer in (
        ("prod-us", "us-east-1", "eu-west-1"),
        ("prod-eu", "eu-west-1", "us-east-1"),
    ):
        (mm2,) = by_kind(plans[stack], "KafkaMirrorMaker2")
        spec = mm2.inputs["spec"]
        assert spec["target"]["alias"] == own
        (mirror,) = spec["mirrors"]
        assert mirror["source"]["alias"] == peer
        # Identity names + two-way mirroring would loop; the default policy prefixes remote topics.
        assert "replication.policy.class" not in mirror["sourceConnector"]["config"]
    assert by_kind(plans["staging"], "KafkaMirrorMaker2") == []


@pytest.mark.parametrize("stack", STACKS)
def test_scylla_three_racks_in_three_zones_and_rf3(
    plans: dict[str, plan.Plan], configs: dict[str, config.StackConfig], stack: str
) -> None:
    cfg = configs[stack]
    (cluster,) = by_kind(plans[stack], "ScyllaCluster")
    dc = cluster.inputs["spec"]["datacenter"]
    assert dc["name"] == cfg.region
    zones = [
        rack["placement"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
            "nodeSelectorTerms"
        ][0]["matchExpressions"][0]["values"]
        for rack in dc["racks"]
    ]
    assert sorted(z for zs in zones for z in zs) == sorted(cfg.zones)
    (job,) = [j for j in by_kind(plans[stack], "Job") if j.name == "scylla-migrate"]
    env = {
        e["name"]: e.get("value")
        for e in job.inputs["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    replication = json.loads(env["CQL_REPLICATION"])
    assert replication[cfg.region] == 3
    assert set(replication.values()) == {3}
    # The statements the Job will run, rendered by the repository's own applier.
    cql = named(plans[stack], "ConfigMap", "scylla-cql").inputs["data"]
    assert set(cql) == {p.name for p in cql_apply.CQL_DIR.glob("*.cql")}
    keyspace = cql_apply.statements(replication)[0]
    assert "'class': 'NetworkTopologyStrategy'" in keyspace
    assert f"'{cfg.region}': 3" in keyspace


@pytest.mark.parametrize("stack", STACKS)
def test_etcd_five_members_quorum_pdb_and_zone_spread(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    sts = named(plans[stack], "StatefulSet", "etcd").inputs
    assert sts["spec"]["replicas"] == 5
    assert (
        "--initial-cluster="
        + ",".join(
            f"etcd-{i}=https://etcd-{i}.etcd-peer.likes-data.svc.cluster.local:2380"
            for i in range(5)
        )
        in sts["spec"]["template"]["spec"]["containers"][0]["command"]
    )
    pdb = named(plans[stack], "PodDisruptionBudget", "etcd").inputs["spec"]
    assert pdb["minAvailable"] == 3  # quorum of five: at most two down
    assert (
        pdb["selector"]["matchLabels"].items()
        <= sts["spec"]["template"]["metadata"]["labels"].items()
    )
    spread = sts["spec"]["template"]["spec"]["topologySpreadConstraints"]
    assert {"topology.kubernetes.io/zone", "DoNotSchedule", 1} <= {
        v for c in spread for v in (c["topologyKey"], c["whenUnsatisfiable"], c["maxSkew"])
    }


@pytest.mark.parametrize("stack", STACKS)
def test_redis_idem_store_aof_and_hot_pools(
    plans: dict[str, plan.Plan], configs: dict[str, config.StackConfig], stack: str
) -> None:
    idem = (
        named(plans[stack], "ConfigMap", "idem-store-conf")
        .inputs["data"]["redis.conf"]
        .splitlines()
    )
    assert {"appendonly yes", "appendfsync everysec", "maxmemory-policy noeviction"} <= set(idem)
    cache = (
        named(plans[stack], "ConfigMap", "count-cache-conf")
        .inputs["data"]["redis.conf"]
        .splitlines()
    )
    assert "appendonly no" in cache and "cluster-enabled yes" in cache
    idem_sts = named(plans[stack], "StatefulSet", "idem-store").inputs["spec"]
    assert idem_sts["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"] == (
        f"{configs[stack].redis.idem_store_storage_gi}Gi"
    )
    pools = [s for s in by_kind(plans[stack], "StatefulSet") if s.name.startswith("hot-pool-")]
    assert len(pools) == 4
    # each hot pool is one addressable server (independent pods behind one name missed: C10)
    assert {p.inputs["spec"]["replicas"] for p in pools} == {1}
    # The password reaches Redis as a file from the Secret: not a literal, not argv, not env.
    data_ns = named(plans[stack], "StatefulSet", "idem-store").inputs["metadata"]["namespace"]
    assert named(plans[stack], "Secret", "redis-auth", data_ns).inputs["stringData"] == {
        "password": plan.SECRET_MARK,
        redis.AUTH_CONF_KEY: plan.SECRET_MARK,
    }
    for sts in by_kind(plans[stack], "StatefulSet"):
        if not sts.name.startswith(("count-cache", "idem-store", "feature-store", "hot-pool-")):
            continue
        spec = sts.inputs["spec"]["template"]["spec"]
        (c,) = spec["containers"]
        assert "PASSWORD" not in json.dumps(c["command"]).upper(), sts.name
        assert "REDIS_PASSWORD" not in {e["name"] for e in c["env"]}, sts.name
        conf_name = "hot-pool" if sts.name.startswith("hot-pool") else sts.name
        conf = next(
            r for r in by_kind(plans[stack], "ConfigMap") if r.name.startswith(conf_name)
        ).inputs["data"]["redis.conf"]
        assert f"include {redis.AUTH_CONF_DIR}/{redis.AUTH_CONF_KEY}" in conf.splitlines()
        auth = next(v for v in spec["volumes"] if v["name"] == "auth")
        assert auth["secret"]["secretName"] == redis.AUTH_SECRET
        mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
        assert mounts["auth"] == redis.AUTH_CONF_DIR


@pytest.mark.parametrize("stack", ["prod-us", "staging"])  # the zones' owners (test_cdn.py)
def test_cdn_caches_anonymous_counts_and_bypasses_authorization(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    (rules,) = [r for r in plans[stack].resources if r.name == "cdn-cache-rules"]
    assert rules.inputs["phase"] == "http_request_cache_settings"
    cache, bypass = rules.inputs["rules"]
    auth = 'any(lower(http.request.headers.names[*])[*] eq "authorization")'
    assert cache["actionParameters"]["cache"] is True
    assert cache["actionParameters"]["edgeTtl"]["mode"] == "respect_origin"
    assert f"not {auth}" in cache["expression"]
    assert 'http.request.method eq "GET"' in cache["expression"]
    assert '"/v1/posts/"' in cache["expression"] and '"/likes"' in cache["expression"]
    # The bypass comes last, so it overrides: any Authorization header or any non-GET.
    assert bypass["actionParameters"]["cache"] is False
    assert bypass["expression"].endswith(f'({auth} or http.request.method ne "GET")')
    (waf,) = [r for r in plans[stack].resources if r.name == "cdn-waf"]
    assert all(rule["action"] == "execute" for rule in waf.inputs["rules"])
    (dns,) = [r for r in plans[stack].resources if r.name == "cdn-api"]
    assert dns.inputs["proxied"] is True
    assert dns.inputs["content"].endswith(".elb.amazonaws.com")  # the gateway NLB's hostname


def _find(obj: object, key: str) -> list[object]:
    found: list[object] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == key:
                found.append(v)
            found.extend(_find(v, key))
    elif isinstance(obj, list):
        for v in obj:
            found.extend(_find(v, key))
    return found


@pytest.mark.parametrize("stack", STACKS)
def test_gateway_rate_limits_and_mirror_fraction(plans: dict[str, plan.Plan], stack: str) -> None:
    rl = yaml.safe_load(
        named(plans[stack], "ConfigMap", "ratelimit-config").inputs["data"]["config.yaml"]
    )
    limits = {
        (top["value"], d["key"]): (d["rate_limit"]["requests_per_unit"], d["rate_limit"]["unit"])
        for top in rl["descriptors"]
        for d in top["descriptors"]
    }
    assert limits == {
        ("likes_write", "user_id"): (100, "minute"),
        ("likes_write", "remote_address"): (1000, "minute"),
        ("likes_batch_read", "remote_address"): (600, "minute"),
    }
    bootstrap = json.loads(named(plans[stack], "ConfigMap", "envoy").inputs["data"]["envoy.json"])
    mirrors = [m for found in _find(bootstrap, "requestMirrorPolicies") for m in found]  # type: ignore[attr-defined]
    assert mirrors, "reads are not mirrored to the hot-key sampler"
    for mirror in mirrors:
        assert mirror["cluster"] == "hotkey_sampler"
        fraction = mirror["runtimeFraction"]["defaultValue"]
        # 1/100: proto3 JSON leaves out the default enum value (HUNDRED).
        assert fraction["numerator"] == 1
        assert fraction.get("denominator", "HUNDRED") == "HUNDRED"
    domains = {d for d in _find(bootstrap, "domain") if isinstance(d, str)}
    assert rl["domain"] in domains  # Envoy asks the ratelimit service in the domain it serves
    hpa = named(plans[stack], "HorizontalPodAutoscaler", "envoy").inputs["spec"]
    assert hpa["minReplicas"] >= 2
    assert (
        named(plans[stack], "PodDisruptionBudget", "envoy").inputs["spec"]["maxUnavailable"]
        == "10%"
    )


@pytest.mark.parametrize("stack", STACKS)
def test_schema_registry_forward_and_registers_repository_schemas(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    dep = named(plans[stack], "Deployment", "schema-registry").inputs
    env = {
        e["name"]: e.get("value") for e in dep["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    assert env["SCHEMA_REGISTRY_SCHEMA_COMPATIBILITY_LEVEL"] == "forward"
    assert registry_schemas.COMPATIBILITY == "FORWARD"
    # the Job registers what the applier reads from the repository: every event topic's value
    subjects = registry_schemas.subjects()
    assert {f"{t}-value" for t in events.EVENT_TOPICS} <= set(subjects)
    (job,) = [j for j in by_kind(plans[stack], "Job") if j.name == "schema-registry-register"]
    # a changed schema is a new Job (Jobs are immutable): the name carries the schemas' digest
    digest = hashlib.sha256(json.dumps(subjects, sort_keys=True).encode()).hexdigest()[:10]
    assert job.inputs["metadata"]["name"] == f"schema-registry-register-{digest}"


def test_operator_runs_the_kopf_wiring_module(plans: dict[str, plan.Plan]) -> None:
    """The Deployment must import the module that registers the handlers, or Kopf runs idle.
    (That those handlers watch the installed CRD: test_contracts.py.)"""
    import importlib

    import kopf

    commands = [
        c["command"]
        for r in plans["staging"].resources
        if r.type == "kubernetes:apps/v1:Deployment" and "operator" in r.name
        for c in r.inputs["spec"]["template"]["spec"]["containers"]
        if c.get("command", [None])[0] == "kopf"
    ]
    assert commands, "no kopf container in the operator Deployment"
    module = commands[0][commands[0].index("-m") + 1]
    importlib.import_module(module)
    registry = kopf.get_default_registry()
    handlers = [
        *registry._spawning.get_all_handlers(),  # timers and daemons
        *registry._changing.get_all_handlers(),
    ]
    assert any(h.fn.__module__ == module for h in handlers), f"{module} registers no handler"


def test_each_peer_reaches_the_other_regions_peer_listener(
    plans: dict[str, plan.Plan], configs: dict[str, config.StackConfig]
) -> None:
    """A stack's `likes:peers[].kafkaBootstrap` names the peer region's Kafka: its port must be
    the listener the peer stack opens for MirrorMaker 2 (TLS, SCRAM), not an in-cluster one (the
    stacks named 9093, the in-cluster mTLS listener)."""
    by_region = {cfg.region: name for name, cfg in configs.items()}
    checked = 0
    for name, cfg in configs.items():
        for peer in cfg.peers:
            other = plans[by_region[peer.region]]
            k = named(other, "Kafka", kafka.KafkaArgs.cluster_name).inputs
            port = int(peer.kafka_bootstrap.rsplit(":", 1)[1])
            listeners = {x["port"]: x for x in k["spec"]["kafka"]["listeners"]}
            assert port in listeners, f"{name}: peer {peer.region} opens no listener on {port}"
            assert listeners[port]["name"] == kafka.PEER_LISTENER, name
            assert listeners[port]["tls"] is True
            checked += 1
    assert checked >= 2  # prod-us and prod-eu peer each other


@pytest.mark.parametrize("stack", STACKS)
def test_the_models_publisher_runs_on_its_schedule_alone_bounded_and_unprivileged(
    plans: dict[str, plan.Plan], configs: dict[str, config.StackConfig], stack: str
) -> None:
    """The abuse model's publishing CronJob (what it runs and where it writes:
    test_contracts.py): the stack's schedule in UTC, one run at a time, a bounded run and
    history, a refusal failing at once and other failures retried, and a pod like the others:
    non-root, read-only root, no API token."""
    job = named(plans[stack], "CronJob", services.MODELS_PUBLISHER).inputs
    cfg = configs[stack].services
    spec = job["spec"]
    assert job["apiVersion"] == "batch/v1"
    assert spec["schedule"] == cfg.abuse_model_publish_schedule
    assert spec["timeZone"] == "Etc/UTC"
    assert spec["concurrencyPolicy"] == "Forbid"  # two runs would train the same model twice
    assert spec["successfulJobsHistoryLimit"] >= 1 and spec["failedJobsHistoryLimit"] >= 1
    run = spec["jobTemplate"]["spec"]
    assert run["backoffLimit"] == services.PUBLISH_RETRIES
    assert run["activeDeadlineSeconds"] == services.PUBLISH_DEADLINE_S
    rules = {r["action"]: r for r in run["podFailurePolicy"]["rules"]}
    assert rules["FailJob"]["onExitCodes"]["operator"] == "In"
    assert rules["Ignore"]["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]
    pod = run["template"]["spec"]
    assert pod["restartPolicy"] == "Never"  # a pod failure policy requires it
    assert pod["automountServiceAccountToken"] is False
    assert pod["securityContext"]["runAsNonRoot"] is True
    (c,) = pod["containers"]
    sec = c["securityContext"]
    assert sec["runAsNonRoot"] is True and sec["readOnlyRootFilesystem"] is True
    assert sec["allowPrivilegeEscalation"] is False and sec["capabilities"]["drop"] == ["ALL"]
    # scikit-learn and joblib write their temporaries under /tmp: a volume of its own
    (tmp,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
    assert "emptyDir" in next(v for v in pod["volumes"] if v["name"] == tmp["name"])
    size = cfg.abuse_model_publish
    memory = f"{size.memory_mi}Mi"
    assert c["resources"]["requests"] == {"cpu": size.cpu, "memory": memory}
    assert c["resources"]["limits"]["memory"] == memory
    env = {e["name"]: e["value"] for e in c["env"]}
    limit = c["resources"]["limits"]["cpu"]
    cores = int(limit[:-1]) / 1000 if limit.endswith("m") else float(limit)
    assert env["OMP_NUM_THREADS"] == str(max(1, math.ceil(cores)))  # the limit, not the node


@pytest.mark.parametrize("stack", STACKS)
def test_the_models_publisher_also_runs_once_per_image_at_deploy(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    """A fresh stack has no model until the schedule's first run, and a new image may need a
    new one: a Job runs the CronJob's very run (the same spec, so every check of the CronJob's
    holds for it) at deploy. Its pod template carries the image, so a new image is a new Job;
    `pulumi up` does not wait minutes of training for it."""
    p = plans[stack]
    cron = named(p, "CronJob", services.MODELS_PUBLISHER).inputs
    job = named(p, "Job", services.MODELS_PUBLISHER_AT_DEPLOY).inputs
    assert job["spec"] == cron["spec"]["jobTemplate"]["spec"]
    assert job["metadata"]["annotations"] == {"pulumi.com/skipAwait": "true"}
    assert job["metadata"]["labels"] == cron["spec"]["jobTemplate"]["metadata"]["labels"]
    deployment = named(p, "Deployment", workloads.ABUSE_SCORER.name).inputs
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["image"] == deployment["spec"]["template"]["spec"]["containers"][0]["image"]


def _services(*deployed: workloads.Workload) -> list[plan.Declared]:
    """What infra/services.py declares for these workloads alone (no stack deploys fewer)."""
    scale = config.ServiceScale(min_replicas=1, max_replicas=1)

    def build() -> None:
        specs = [services.ServiceSpec(w, scale, {}, config.ContainerSize() if w.sidecar else None)
                 for w in deployed]  # fmt: skip
        services.Services(
            "services",
            services.ServicesArgs(
                namespace=workloads.NAMESPACE, image="likes:test", services=specs,
                redis_password="r", cdn_purge_token="c", canary_token="t", etcd_password="e",
                cassandra_password="s", kafka_password="k", registry_password="g",
                models_publish_schedule="@weekly", models_publisher=config.ContainerSize(),
            ),
        )  # fmt: skip

    return plan.declare(build)


def test_the_models_claim_and_its_publisher_come_with_the_abuse_scorer_only() -> None:
    def kinds(declared: list[plan.Declared]) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for r in declared:
            if "kind" in r.inputs:  # a Kubernetes object, not the component
                out.setdefault(r.inputs["kind"], set()).add(r.inputs["metadata"]["name"])
        return out

    without = kinds(_services(workloads.WRITE, workloads.AGGREGATOR))
    assert "Deployment" in without  # the build did declare the services
    assert "PersistentVolumeClaim" not in without and "CronJob" not in without
    assert "Job" not in without
    with_scorer = kinds(_services(workloads.WRITE, workloads.ABUSE_SCORER))
    assert with_scorer["PersistentVolumeClaim"] == {services.MODELS_CLAIM}
    assert with_scorer["CronJob"] == {services.MODELS_PUBLISHER}
    assert with_scorer["Job"] == {services.MODELS_PUBLISHER_AT_DEPLOY}


@pytest.mark.parametrize("stack", STACKS)
def test_every_workload_scales_between_its_configured_bounds_and_keeps_most_pods_in_a_drain(
    plans: dict[str, plan.Plan], configs: dict[str, config.StackConfig], stack: str
) -> None:
    """Each service's HPA aims at its own Deployment with the stack's bounds (the abuse
    scorer's 2..64 among them), and its PDB selects exactly that Deployment's pods."""
    for w in workloads.SERVICES:  # (the operator is deployed apart, not as a service)
        scale = getattr(configs[stack].services, w.name.replace("-", "_"))
        hpa = named(plans[stack], "HorizontalPodAutoscaler", w.name).inputs["spec"]
        assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment",
                                         "name": w.name}, w.name  # fmt: skip
        assert (hpa["minReplicas"], hpa["maxReplicas"]) == (
            scale.min_replicas,
            scale.max_replicas,
        ), w.name
        dep = named(plans[stack], "Deployment", w.name).inputs["spec"]
        pods = dep["template"]["metadata"]["labels"]
        pdb = named(plans[stack], "PodDisruptionBudget", w.name).inputs["spec"]
        selector = pdb["selector"]["matchLabels"]
        assert selector == dep["selector"]["matchLabels"] and selector.items() <= pods.items()
        assert pdb["maxUnavailable"] == "10%", w.name
