"""TLS in the program (issue 9 item 2): every internal server serves a certificate from the one
internal CA, under the names its clients dial, and every workload and setup Job finds that CA at
the path its settings name. Checked on each stack's plan (Pulumi mocks)."""

from __future__ import annotations

import posixpath
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from infra import etcd as etcd_infra
from infra import kafka as kafka_infra
from infra import plan, scylla
from infra import schema_registry as registry_infra
from infra import tls as tls_infra
from services.contracts import tls, workloads
from services.contracts.settings import Settings, parse_nodes
from tests.infra.conftest import STACKS, by_kind, named
from tests.infra.test_contracts import container_of, likes_env


def _certificates(p: plan.Plan) -> dict[tuple[str, str], dict[str, Any]]:
    """(namespace, Secret) -> the Certificate spec that fills it."""
    out = {}
    for r in by_kind(p, "Certificate"):
        ns, spec = r.inputs["metadata"].get("namespace"), r.inputs["spec"]
        # two Certificates filling one Secret overwrite each other at every renewal
        assert (ns, spec["secretName"]) not in out, (
            f"two Certificates write {ns}/{spec['secretName']}"
        )
        out[(ns, spec["secretName"])] = spec
    return out


def _covers(names: list[str], host: str) -> bool:
    """A certificate's dnsNames cover `host` (a wildcard covers exactly one leftmost label)."""
    for n in names:
        if n == host:
            return True
        if n.startswith("*.") and "." in host and host.split(".", 1)[1] == n[2:]:
            return True
    return False


def test_covers_matches_exact_names_and_one_wildcard_label_only() -> None:
    assert _covers(["a.b.svc"], "a.b.svc")
    assert _covers(["*.b.svc"], "a.b.svc")
    assert not _covers(["*.b.svc"], "x.a.b.svc")
    assert not _covers(["a.b.svc"], "a.b.svc.cluster.local")


def _secret_volumes(pod: dict[str, Any]) -> dict[str, str]:
    """volume name -> Secret name, for the pod's Secret volumes."""
    return {v["name"]: v["secret"]["secretName"] for v in pod.get("volumes", []) if "secret" in v}


def _mount_of(container: dict[str, Any], pod: dict[str, Any], path: str) -> str:
    """The Secret mounted at `path` in this container."""
    for m in container.get("volumeMounts", []):
        if m["mountPath"] == path:
            return _secret_volumes(pod)[m["name"]]
    raise AssertionError(f"{container['name']}: nothing mounted at {path}")


@pytest.fixture(scope="module", params=STACKS)
def stack_plan(request: pytest.FixtureRequest, plans: dict[str, plan.Plan]) -> plan.Plan:
    return plans[request.param]


def test_every_internal_certificate_comes_from_the_internal_ca(stack_plan: plan.Plan) -> None:
    issuer = named(stack_plan, "ClusterIssuer", tls.ISSUER).inputs["spec"]
    ca = _certificates(stack_plan)
    (ca_ns,) = [ns for ns, secret in ca if secret == tls.CA_SECRET]
    assert issuer == {"ca": {"secretName": tls.CA_SECRET}}
    assert ca[(ca_ns, tls.CA_SECRET)]["isCA"] is True
    internal = [s for (ns, secret), s in ca.items() if secret != tls.CA_SECRET]
    ours = [s for s in internal if s["issuerRef"]["name"] == tls.ISSUER]
    # the gateway's public certificate is the only one from another (the ACME) issuer
    assert len(internal) - len(ours) == 1
    for spec in ours:
        assert spec["issuerRef"]["kind"] == "ClusterIssuer"
        assert spec["privateKey"]["encoding"] == "PKCS8", spec["secretName"]
    for server in tls.SERVERS:
        assert any(s["secretName"] == server.secret for s in ours), server


def test_every_workload_mounts_its_certificate_where_its_settings_find_the_ca(
    stack_plan: plan.Plan,
) -> None:
    certs = _certificates(stack_plan)
    for w in workloads.ALL:
        dep = named(stack_plan, "Deployment", w.name).inputs
        pod = dep["spec"]["template"]["spec"]
        c = pod["containers"][0]  # the workload's own (a sidecar comes after)
        ns = dep["metadata"]["namespace"]
        env = likes_env(container_of(stack_plan, w))
        ca_file = env[Settings.env_name("tls_ca_file")]
        assert ca_file == tls.CA_FILE
        secret = _mount_of(c, pod, posixpath.dirname(ca_file))
        assert secret == tls.workload_secret(w.name)
        assert (ns, secret) in certs, f"{w.name}: no Certificate fills {secret}"


@pytest.mark.parametrize(
    ("job", "secret"),
    [("etcd-auth", tls.ETCD.secret), ("scylla-migrate", tls.SCYLLA.secret),
     ("schema-registry-register", tls.REGISTRY.secret)],
)  # fmt: skip
def test_every_setup_job_reaches_its_store_over_tls(
    stack_plan: plan.Plan, job: str, secret: str
) -> None:
    (j,) = [r.inputs for r in by_kind(stack_plan, "Job")
            if r.inputs["metadata"]["name"].startswith(job)]  # fmt: skip
    pod = j["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env[Settings.env_name("tls_ca_file")] == tls.CA_FILE
    assert _mount_of(c, pod, tls.MOUNT_DIR) == secret
    (vol,) = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == secret]
    # a Job that only verifies the server gets the CA, not the server's key
    assert [i["key"] for i in vol["secret"]["items"]] == [tls.CA_KEY]


def test_etcd_serves_tls_under_the_name_the_workloads_dial(stack_plan: plan.Plan) -> None:
    sts = named(stack_plan, "StatefulSet", "etcd").inputs
    ns = sts["metadata"]["namespace"]
    pod = sts["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    cmd = c["command"]
    assert f"--listen-client-urls=https://0.0.0.0:{etcd_infra.CLIENT_PORT}" in cmd
    assert f"--listen-peer-urls=https://0.0.0.0:{etcd_infra.PEER_PORT}" in cmd
    assert all(f in cmd for f in etcd_infra.server_tls_flags(etcd_infra.TLS_DIR))
    assert not [f for f in cmd if f.startswith("--trusted-ca-file")]  # clients log in instead
    assert _mount_of(c, pod, etcd_infra.TLS_DIR) == tls.ETCD.secret
    names = _certificates(stack_plan)[(ns, tls.ETCD.secret)]["dnsNames"]
    host = likes_env(container_of(stack_plan, workloads.WRITE))[Settings.env_name("etcd_host")]
    assert _covers(names, host)
    assert _covers(names, f"etcd-0.etcd-peer.{ns}.svc.cluster.local")  # the peers' names


def test_kafkas_client_listener_serves_the_internal_certificate_under_the_dialled_names(
    stack_plan: plan.Plan,
) -> None:
    k = named(stack_plan, "Kafka", kafka_infra.KafkaArgs.cluster_name).inputs
    ns = k["metadata"]["namespace"]
    env = likes_env(container_of(stack_plan, workloads.AGGREGATOR))
    ((host, port),) = parse_nodes(env[Settings.env_name("kafka_bootstrap")])
    (listener,) = [x for x in k["spec"]["kafka"]["listeners"] if x["port"] == port]
    assert listener["tls"] is True
    chain = listener["configuration"]["brokerCertChainAndKey"]
    assert chain == {
        "secretName": tls.KAFKA.secret,
        "certificate": tls.CERT_KEY,
        "key": tls.KEY_KEY,
    }
    names = _certificates(stack_plan)[(ns, tls.KAFKA.secret)]["dnsNames"]
    assert _covers(names, host)
    cluster = kafka_infra.KafkaArgs.cluster_name
    # after bootstrap a client dials each broker by its per-broker name
    assert _covers(names, f"{cluster}-pool-a-0.{cluster}-kafka-brokers.{ns}.svc")


def test_scyllas_client_port_serves_only_tls_from_the_mounted_certificate(
    stack_plan: plan.Plan,
) -> None:
    cfg = named(stack_plan, "ConfigMap", scylla.CONFIG_MAP).inputs
    enc = yaml.safe_load(cfg["data"]["scylla.yaml"])["client_encryption_options"]
    assert enc["enabled"] is True and enc["require_client_auth"] is False
    cluster = named(stack_plan, "ScyllaCluster", scylla.ScyllaArgs.cluster_name).inputs
    for rack in cluster["spec"]["datacenter"]["racks"]:
        (mount,) = [m for m in rack["volumeMounts"] if m["mountPath"] == scylla.TLS_DIR]
        (vol,) = [v for v in rack["volumes"] if v["name"] == mount["name"]]
        assert vol["secret"]["secretName"] == tls.SCYLLA.secret
        assert rack["scyllaConfig"] == scylla.CONFIG_MAP
    assert posixpath.dirname(enc["certificate"]) == scylla.TLS_DIR
    assert posixpath.dirname(enc["keyfile"]) == scylla.TLS_DIR


def test_the_registry_serves_https_under_the_name_the_workloads_dial(
    stack_plan: plan.Plan,
) -> None:
    dep = named(stack_plan, "Deployment", "schema-registry").inputs
    ns = dep["metadata"]["namespace"]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["SCHEMA_REGISTRY_LISTENERS"] == f"https://0.0.0.0:{registry_infra.PORT}"
    keystore = env["SCHEMA_REGISTRY_SSL_KEYSTORE_LOCATION"]
    assert _mount_of(c, pod, posixpath.dirname(keystore)) == tls.REGISTRY.secret
    assert env["SCHEMA_REGISTRY_KAFKASTORE_SECURITY_PROTOCOL"] == "SASL_SSL"
    spec = _certificates(stack_plan)[(ns, tls.REGISTRY.secret)]
    assert spec["keystores"]["pkcs12"]["create"] is True
    url = likes_env(container_of(stack_plan, workloads.WRITE))[
        Settings.env_name("schema_registry_url")
    ]
    assert urlsplit(url).scheme == "https"
    assert _covers(spec["dnsNames"], urlsplit(url).hostname or "")


def test_the_internal_ca_component_is_declared_once(stack_plan: plan.Plan) -> None:
    cas = [r for r in stack_plan.resources if r.type == "likes:infra:InternalCa"]
    assert len(cas) == 1
    assert tls_infra.SELF_SIGNED in {
        r.inputs["metadata"]["name"] for r in by_kind(stack_plan, "ClusterIssuer")
    }
