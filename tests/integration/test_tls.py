"""The --tls profile on the real stack (issue 9 item 2): etcd, Kafka, Cassandra and the schema
registry serve TLS from the stack's CA, as the program's servers do; a client that does not speak
TLS, or that trusts another CA, is refused by each; the services run with the CA their rendered
env names. (Every other test of the session talks to these stores over TLS too: the test stack
runs this profile.)"""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

import aetcd
import httpx
import pytest
from cassandra.cluster import Cluster, NoHostAvailable
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from local import layout
from local import tls as local_tls
from services.contracts import etcd, kafka, tls, workloads
from services.contracts.settings import Settings
from tests.conftest import Stack

pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
def ca(stack: Stack) -> str:
    if not stack.layout.tls or stack.ca_file is None:
        pytest.fail("the test stack must run the --tls profile (tests/conftest.py starts it so)")
    return stack.ca_file


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A CA of another stack: certificates the stack's servers hold must not verify under it."""
    home = tmp_path_factory.mktemp("other-stack")
    other = layout.Layout(home=home, ports=layout.Ports(0), tls=True)
    local_tls.ensure(other)
    return str(local_tls.ca_file(other))


def test_the_stack_ca_signed_every_server_certificate_and_only_they_name_loopback(
    stack: Stack, ca: str
) -> None:
    root = local_tls.root(stack.layout)
    assert (root / "ca" / tls.KEY_KEY).stat().st_mode & 0o777 == 0o600
    ctx = ssl.create_default_context(cafile=ca)
    for server in tls.SERVERS:
        d = local_tls.server_dir(stack.layout, server)
        assert (d / tls.KEY_KEY).stat().st_mode & 0o777 == 0o600
        assert (d / local_tls.KEYSTORE).stat().st_mode & 0o777 == 0o600
        assert Path(d / tls.CA_KEY).read_bytes() == Path(ca).read_bytes()
    # the CA a client loads is one certificate, not a bundle with the system's roots
    assert len(ctx.get_ca_certs()) == 1


def test_etcd_refuses_plaintext_and_a_foreign_ca(stack: Stack, ca: str, other_ca: str) -> None:
    creds = stack.etcd_credentials

    async def get(ca_file: str | None) -> None:
        async with etcd.client(stack.host, stack.etcd_port, creds, 3, ca_file) as c:
            await c.get(b"/likes/tls-probe")

    for refused in (None, other_ca):
        with pytest.raises((aetcd.exceptions.ClientError, asyncio.TimeoutError)):
            asyncio.run(get(refused))
    asyncio.run(get(ca))  # the stack's CA: verified and logged in


def _metadata_errors(conf: dict[str, object]) -> list[KafkaError]:
    seen: list[KafkaError] = []
    admin = AdminClient({**conf, "error_cb": seen.append, "log.connection.close": False})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    admin.poll(1.0)
    return seen


def test_kafka_refuses_plaintext_and_a_foreign_ca(stack: Stack, ca: str, other_ca: str) -> None:
    login = stack.kafka_login
    plaintext = kafka.client_config(stack.kafka_bootstrap, login)
    assert plaintext["security.protocol"] == kafka.PLAINTEXT_PROTOCOL
    _metadata_errors(plaintext)  # SASL without TLS: the TLS listener cannot parse it
    foreign = kafka.client_config(stack.kafka_bootstrap, login, other_ca)
    errors = _metadata_errors(foreign)
    assert any(e.code() == KafkaError._SSL for e in errors), errors
    md = AdminClient(kafka.client_config(stack.kafka_bootstrap, login, ca)).list_topics(timeout=10)
    assert md.brokers


def test_cassandra_refuses_plaintext_and_a_foreign_ca(stack: Stack, ca: str, other_ca: str) -> None:
    for context in (None, tls.cassandra_context(other_ca)):
        cluster = Cluster(
            [stack.host],
            port=stack.cassandra_port,
            auth_provider=stack.cassandra_auth,
            ssl_context=context,
            connect_timeout=5,
        )
        with pytest.raises(NoHostAvailable):
            cluster.connect()
        cluster.shutdown()
    cluster = Cluster(
        [stack.host],
        port=stack.cassandra_port,
        auth_provider=stack.cassandra_auth,
        ssl_context=tls.cassandra_context(ca),
    )
    try:
        row = cluster.connect().execute("SELECT release_version FROM system.local").one()
        assert row is not None
    finally:
        cluster.shutdown()


def test_the_registry_serves_only_https_verified_by_the_stack_ca(
    stack: Stack, ca: str, other_ca: str
) -> None:
    url = stack.registry_url
    assert url.startswith("https://")
    login = stack.registry_login
    auth = (login.user, login.password)
    with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port
        httpx.get(url.replace("https://", "http://") + "/subjects", auth=auth, timeout=5)
    with pytest.raises(httpx.ConnectError, match=r"(?i)certificate verify failed"):
        httpx.get(f"{url}/subjects", auth=auth, timeout=5, verify=tls.client_context(other_ca))
    r = httpx.get(f"{url}/subjects", auth=auth, timeout=5, verify=tls.client_context(ca))
    assert r.status_code == 200


def test_the_workloads_run_with_the_ca_their_rendered_env_names(stack: Stack, ca: str) -> None:
    """The `tls` transform points the program's mounted CA (tls.CA_FILE) at the stack's CA, and
    every workload's settings build from it: the services that are up (the session's other tests
    drive likes through them) reach every store over TLS."""
    name = Settings.env_name("tls_ca_file")
    for w in ("write", "read", "outbox-relay", "aggregator", "hotkey-sampler", "hotkey-operator"):
        env = stack.workload_env(w)
        assert env[name] == ca, w
        assert env[Settings.env_name("schema_registry_url")].startswith("https://"), w
    status = stack.status()
    assert all(status[w]["healthy"] for w in ("write", "read", "outbox-relay", "aggregator"))


@pytest.mark.parametrize("service", [w.name for w in workloads.SERVICES if w.kind == "http"])
def test_each_services_api_requires_the_gateways_certificate_and_its_ops_port_none(
    stack: Stack, ca: str, other_ca: str, service: str
) -> None:
    """Gateway -> service mTLS on the running stack: the API answers a client holding the
    gateway's certificate, and refuses one without a certificate, one with another stack's, and
    plain HTTP; the probes and metrics answer in plain HTTP on the ops port."""
    api, ops = stack.service_url(service), stack.ops_url(service)
    assert api.startswith("https://") and ops.startswith("http://")
    with httpx.Client(verify=stack.service_verify, timeout=5) as c:
        # a route no service serves: 404 from the service itself, once the handshake passed
        assert c.get(f"{api}/v1/no-such-route").status_code == 404
    with pytest.raises(httpx.TransportError):  # no client certificate
        httpx.get(f"{api}/v1/no-such-route", verify=tls.client_context(ca), timeout=5)
    other_home = Path(other_ca).parent.parent  # the other stack's certificates
    foreign = tls.client_context(ca)
    gw = other_home / tls.GATEWAY
    foreign.load_cert_chain(gw / tls.CERT_KEY, gw / tls.KEY_KEY)
    with pytest.raises(httpx.TransportError):
        httpx.get(f"{api}/v1/no-such-route", verify=foreign, timeout=5)
    with pytest.raises(httpx.TransportError):
        httpx.get(api.replace("https://", "http://") + "/healthz", timeout=5)
    assert httpx.get(f"{ops}{workloads.READY_PATH}", timeout=5).status_code == 200
    assert httpx.get(f"{ops}/v1/no-such-route", timeout=5).status_code == 404  # ops paths only
