"""The pure parts of the store-login appliers (the rest runs against the real servers in
tests/integration/test_stack.py)."""

from __future__ import annotations

import base64
import ipaddress
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from cryptography import x509
from fastapi.testclient import TestClient

from local import layout
from local import tls as local_tls
from local.schema_registry import create_app
from services.contracts import etcd, events, keys, registry, tls, workloads
from services.contracts import kafka as kafka_contract
from services.schema import cql_roles, etcd_auth


def test_the_etcd_grant_covers_exactly_the_platforms_prefix() -> None:
    assert etcd.PREFIX == keys.ETCD_PREFIX
    end = etcd_auth.range_end(etcd.PREFIX.encode())
    assert end == b"/likes0"  # etcdctl --prefix: every key starting /likes/, nothing else
    inside = [b"/likes/", b"/likes/split/p1", b"/likes/\xff\xff"]
    outside = [b"/likes", b"/likes0", b"/likesx", b"/other/"]
    assert all(etcd.PREFIX.encode() <= k < end for k in inside)
    assert not any(etcd.PREFIX.encode() <= k < end for k in outside)
    assert etcd_auth.range_end(b"a\xff") == b"b"


def test_a_password_cannot_end_the_cql_string_it_is_quoted_in() -> None:
    assert cql_roles.quote("it's") == "'it''s'"
    assert cql_roles.quote("x' OR '1") == "'x'' OR ''1'"


def test_the_services_role_gets_data_permissions_only() -> None:
    assert set(cql_roles.SERVICE_PERMISSIONS) == {"SELECT", "MODIFY"}
    assert cql_roles.SERVICE_ROLE != cql_roles.ADMIN_ROLE != cql_roles.DEFAULT_SUPERUSER


def test_a_kafka_client_logs_in_with_scram_only_when_it_has_a_user() -> None:
    bare = kafka_contract.client_config("k:9092", None)
    assert bare == {"bootstrap.servers": "k:9092"}
    conf = kafka_contract.client_config("k:9092", kafka_contract.Credentials("likes", "pw"))
    assert conf["security.protocol"] == "SASL_PLAINTEXT"
    assert conf["sasl.mechanism"] == "SCRAM-SHA-512"
    assert (conf["sasl.username"], conf["sasl.password"]) == ("likes", "pw")
    assert "pw" not in repr(kafka_contract.Credentials("likes", "pw"))


def test_a_kafka_client_with_the_platforms_ca_speaks_tls_and_verifies_with_that_ca_only() -> None:
    creds = kafka_contract.Credentials("likes", "pw")
    conf = kafka_contract.client_config("k:9092", creds, "/etc/likes/tls/ca.crt")
    assert conf["security.protocol"] == "SASL_SSL" == kafka_contract.SECURITY_PROTOCOL
    assert conf["ssl.ca.location"] == "/etc/likes/tls/ca.crt"
    tls_only = kafka_contract.client_config("k:9092", None, "/ca.crt")
    assert tls_only["security.protocol"] == "SSL"


def test_the_registry_and_etcd_clients_take_the_ca(tmp_path: Path) -> None:
    conf = registry.client_config("https://r:8081", None, ca_file="/ca.crt")
    assert conf["ssl.ca.location"] == "/ca.crt"
    assert "ssl.ca.location" not in registry.client_config("http://r:8081", None)
    home = layout.Layout(home=tmp_path, ports=layout.Ports(0), tls=True)
    local_tls.ensure(home)
    ca = str(local_tls.ca_file(home))
    assert etcd.client("h", 1, None, 1.0, ca)._tls is not None
    assert etcd.client("h", 1, None, 1.0)._tls is None


def test_the_local_ca_is_made_once_and_each_certificate_verifies_under_it(tmp_path: Path) -> None:
    home = layout.Layout(home=tmp_path, ports=layout.Ports(0), tls=True)
    with ThreadPoolExecutor(4) as pool:  # components prepare at once: one CA, not four
        made = list(pool.map(lambda _: local_tls.ensure(home), range(4)))
    http_services = [w.name for w in workloads.SERVICES if w.kind == "http"]
    folders = [*(s.server for s in tls.SERVERS), *http_services, tls.GATEWAY]
    assert sorted(s for m in made for s in m) == sorted(folders)
    assert local_tls.ensure(home) == []
    ca = x509.load_pem_x509_certificate(local_tls.ca_file(home).read_bytes())
    for folder in folders:
        d = local_tls.root(home) / folder
        cert = x509.load_pem_x509_certificate((d / tls.CERT_KEY).read_bytes())
        cert.verify_directly_issued_by(ca)
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert ipaddress.ip_address(layout.HOST) in sans.get_values_for_type(x509.IPAddress)
        if folder in http_services:  # the names the gateway's render dials and checks
            names = sans.get_values_for_type(x509.DNSName)
            assert set(tls.service_names(folder, workloads.NAMESPACE)) <= set(names)


def test_a_jaas_login_line_cannot_be_broken_out_of() -> None:
    line = kafka_contract.jaas_config(kafka_contract.Credentials("u", 'p"; x="y'))
    assert line.endswith('password="p\\"; x=\\"y";')
    assert line.startswith("org.apache.kafka.common.security.scram.ScramLoginModule required ")


def test_the_services_kafka_acls_cover_every_platform_topic_and_grant_no_admin() -> None:
    acls = kafka_contract.service_acls(("us-east-1",))
    prefixes = [a.name for a in acls if a.type == "topic"]
    for topic in (*events.EVENT_TOPICS, events.DEAD_LETTER):
        assert any(topic.startswith(p) for p in prefixes), topic
        assert any(events.mirrored("us-east-1", topic).startswith(p) for p in prefixes)
    ops = {op for a in acls for op in a.operations}
    assert not ops & {"All", "Create", "Delete", "Alter", "AlterConfigs", "ClusterAction"}
    assert not [a for a in acls if a.type == "cluster"]
    # Strimzi's shape: a cluster resource carries no name
    assert kafka_contract.Acl("cluster", "", "literal", ("Describe",)).strimzi() == {
        "resource": {"type": "cluster"},
        "operations": ["Describe"],
    }


def test_the_registry_password_file_round_trips_and_refuses_what_it_cannot_hold() -> None:
    users = [registry.Credentials("likes", "s3cret-_x"), registry.Credentials("ops", "pw")]
    text = registry.password_file(users)
    assert text == "likes: s3cret-_x,user\nops: pw,user\n"
    assert registry.parse_password_file(text) == {"likes": "s3cret-_x", "ops": "pw"}
    # a user without the role is not admitted
    assert registry.parse_password_file("x: pw,admin\n") == {}
    for bad in (registry.Credentials("a:b", "pw"), registry.Credentials("a", "p,w")):
        with pytest.raises(ValueError):
            registry.password_file([bad])
    jaas = registry.jaas_file("/etc/auth/password.properties")
    assert jaas.startswith(f"{registry.REALM} {{")
    # Confluent 8 (Jetty 12): the module moved from org.eclipse.jetty.jaas.spi
    assert "  org.eclipse.jetty.security.jaas.spi.PropertyFileLoginModule required\n" in jaas
    assert 'file="/etc/auth/password.properties"' in jaas


class _EmptyStore:
    def read_all(self):  # type: ignore[no-untyped-def]
        return iter(())

    def append(self, key, value):  # type: ignore[no-untyped-def]
        raise AssertionError("nothing is written in this test")

    def close(self) -> None:
        pass


def _basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def test_the_local_registry_answers_only_logged_in_calls() -> None:
    app = create_app(_EmptyStore(), users={"likes": "pw"})  # type: ignore[arg-type]
    with TestClient(app) as c:
        refused = (
            {},
            _basic("likes", "wrong"),
            _basic("other", "pw"),
            {"Authorization": "Basic !!!"},
            {"Authorization": "Bearer pw"},
        )
        for headers in refused:
            r = c.get("/subjects", headers=headers)
            assert r.status_code == 401, headers
            assert r.json() == {"error_code": 401, "message": "Unauthorized"}
            assert r.headers["www-authenticate"] == f'Basic realm="{registry.REALM}"'
        assert c.get("/subjects", headers=_basic("likes", "pw")).json() == []


def test_the_local_etcd_bootstrap_retries_a_login_that_timed_out_never_a_refused_one() -> None:
    import grpc
    from grpc.aio import AioRpcError, Metadata

    from local.components import etcd as etcd_component

    def wrapped(code: grpc.StatusCode) -> Exception:
        try:
            raise etcd_auth.AuthSetupError("etcd login as root: ...") from AioRpcError(
                code, Metadata(), Metadata(), "..."
            )
        except etcd_auth.AuthSetupError as e:
            return e

    assert etcd_component._transient(wrapped(grpc.StatusCode.DEADLINE_EXCEEDED))
    assert etcd_component._transient(wrapped(grpc.StatusCode.UNAVAILABLE))
    assert not etcd_component._transient(wrapped(grpc.StatusCode.INVALID_ARGUMENT))  # bad password
    assert not etcd_component._transient(ValueError("not etcd's"))
