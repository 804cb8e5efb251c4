"""The local stack itself: every component up, idempotent, answering real client calls."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path

import aetcd.exceptions
import grpc
import httpx
import pytest
import redis
from aetcd import rpc
from cassandra import Unauthorized
from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import Cluster, NoHostAvailable
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.error import SchemaRegistryError
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.retry import Retry

from local import transforms
from local.components import cassandra
from local.components import kafka as kafka_component
from services.contracts import clients, etcd, events, keys, registry
from services.contracts import kafka as kafka_contract
from services.schema import cql_apply, cql_roles, etcd_auth
from tests.conftest import Stack

pytestmark = pytest.mark.stack


def test_up_from_nothing_brings_every_component_up_healthy(stack: Stack) -> None:
    status = json.loads(stack.first_up.stdout.splitlines()[-1])
    expected = {
        "etcd", "cassandra", "schema-registry", "prometheus", "alertmanager",
        "webhook-sink", "redis-exporter", "otel-collector", "tempo",
        "write", "read", "outbox-relay", "aggregator", "hotkey-sampler", "hotkey-operator",
        "consumer-lag", "canary", "abuse-scorer", "abuse-model",
        "identity-provider", "gateway", "ratelimit", "ratelimit-redis",
        *(f"hot-pool-{i}" for i in range(1, 5)),
        *(f"count-cache-{i}" for i in range(1, 7)),
        *(f"idem-store-{i}" for i in range(1, 7)),
        *(f"feature-store-{i}" for i in range(1, 7)),
        *(f"kafka-{i}" for i in range(1, stack.layout.kafka_brokers + 1)),
    }  # fmt: skip
    assert set(status) == expected
    unhealthy = {n: s for n, s in status.items() if not s["healthy"] or not s["pid"]}
    assert not unhealthy, unhealthy
    assert all(isinstance(s["address"], str) and s["address"] for s in status.values())


def test_second_up_changes_nothing(stack: Stack) -> None:
    before = stack.status()
    proc = stack.cli("local", "up")
    assert "nothing changed" in proc.stdout
    after = stack.status()
    assert {n: s["pid"] for n, s in after.items()} == {n: s["pid"] for n, s in before.items()}


def test_count_cache_is_a_cluster_serving_keys_in_different_slots(stack: Stack) -> None:
    rc = RedisCluster(
        startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in stack.count_cache_nodes],
        password=stack.redis_password,
        decode_responses=True,
    )
    try:
        keys = [f"count:{uuid.uuid4()}" for _ in range(50)]
        slots = {rc.keyslot(k) for k in keys}
        owners = {rc.get_node_from_key(k).name for k in keys}
        assert len(owners) == 3, "50 random keys should land on all three primaries"
        for i, k in enumerate(keys):
            rc.set(k, i)
        assert [int(rc.get(k)) for k in keys] == list(range(50))
        assert len(slots) > 40
        replicas = [n for n in rc.get_nodes() if n.server_type == "replica"]
        assert len(replicas) == 3
    finally:
        rc.close()


def test_idem_store_is_aof_and_keeps_keys_across_a_restart(stack: Stack) -> None:
    """Three shards with AOF, as the program declares: keys on every shard survive the whole
    cluster going down (`likes local stop idem-store` stops all six nodes) and coming back."""
    r = clients.idem_store(stack.settings(), timeout=2.0)
    primaries = [n for n in r.get_nodes() if n.server_type == "primary"]
    assert len(primaries) == 3
    for node in r.get_nodes():
        assert r.config_get("appendonly", target_nodes=node) == {"appendonly": "yes"}
    stored = {
        f"idem:u{i}:p1:{uuid.uuid4()}": json.dumps({"state": "liked", "i": i}) for i in range(60)
    }
    for key, value in stored.items():
        r.set(key, value, ex=86400)
    # the keys landed on every shard (a one-shard store would pass the rest of this test too)
    assert {r.get_node_from_key(k).name for k in stored} == {n.name for n in primaries}
    r.close()
    names = [f"idem-store-{i}" for i in range(1, 7)]
    before = stack.status()
    pids_before = {n: before[n]["pid"] for n in names}
    stack.cli("local", "stop", "idem-store")
    for host, port in stack.idem_nodes:
        with pytest.raises(redis.ConnectionError):
            redis.Redis(host=host, port=port, password=stack.redis_password).ping()
    status = stack.up()
    assert all(status[n]["pid"] not in (None, pids_before[n]) for n in names)
    r = clients.idem_store(stack.settings(), timeout=2.0)
    try:
        assert {k: r.get(k) for k in stored} == stored
        assert all(0 < r.ttl(k) <= 86400 for k in stored)
    finally:
        r.close()


def test_etcd_put_get_watch(stack: Stack) -> None:
    async def go() -> None:
        prefix = f"/likes/test/{uuid.uuid4()}/".encode()
        async with stack.etcd() as client:
            await client.put(prefix + b"a", b"1")
            got = await client.get(prefix + b"a")
            assert got is not None and got.value == b"1"
            watch = await client.watch_prefix(prefix)
            seen: list[bytes] = []

            async def consume() -> None:
                async for event in watch:
                    seen.append(event.kv.value)
                    if len(seen) == 2:
                        return

            task = asyncio.create_task(consume())
            await asyncio.sleep(0.2)
            await client.put(prefix + b"b", b"2")
            await client.put(prefix + b"c", b"3")
            await asyncio.wait_for(task, 10)
            await watch.cancel()
            assert seen == [b"2", b"3"]

    asyncio.run(go())


def test_kafka_acks_all_produce_and_committed_group_offset(stack: Stack) -> None:
    brokers = stack.layout.kafka_brokers
    topic = f"test.stack.{uuid.uuid4().hex[:8]}"
    admin = AdminClient(stack.kafka_config())
    fut = admin.create_topics(
        [NewTopic(topic, 3, brokers, config={"min.insync.replicas": str(min(2, brokers))})]
    )[topic]
    fut.result(30)
    md = admin.list_topics(topic, timeout=10).topics[topic]
    assert all(len(p.replicas) == brokers for p in md.partitions.values())

    prod = Producer({**stack.kafka_config(), "acks": "all",
                     "enable.idempotence": True})  # fmt: skip
    errors: list[KafkaError] = []
    for i in range(20):
        prod.produce(topic, key=str(i % 3), value=f"v{i}",
                     on_delivery=lambda err, _m: errors.append(err) if err else None)  # fmt: skip
    assert prod.flush(30) == 0 and not errors

    group = f"g-{uuid.uuid4().hex[:8]}"
    conf = {**stack.kafka_config(), "group.id": group,
            "auto.offset.reset": "earliest", "enable.auto.commit": False}  # fmt: skip
    c = Consumer(conf)
    c.subscribe([topic])
    got: list[str] = []
    deadline = time.monotonic() + 60
    while len(got) < 10 and time.monotonic() < deadline:
        m = c.poll(1.0)
        if m is not None and m.error() is None:
            got.append(m.value().decode())
            c.commit(message=m, asynchronous=False)
    committed = c.committed([TopicPartition(topic, p) for p in range(3)], timeout=10)
    c.close()
    assert len(got) >= 10
    assert sum(tp.offset for tp in committed if tp.offset >= 0) == len(got)

    # a new member of the same group resumes after the committed offsets: sees only the rest
    c2 = Consumer(conf)
    c2.subscribe([topic])
    rest: list[str] = []
    deadline = time.monotonic() + 60
    while len(got) + len(rest) < 20 and time.monotonic() < deadline:
        m = c2.poll(1.0)
        if m is not None and m.error() is None:
            rest.append(m.value().decode())
    c2.close()
    assert sorted(got + rest) == sorted(f"v{i}" for i in range(20))


def test_cassandra_create_insert_select_and_repository_schema(stack: Stack) -> None:
    # DDL outside the platform's keyspace: the admin role's (the services' role may not)
    admin = PlainTextAuthProvider(cql_roles.ADMIN_ROLE, cassandra.admin_password(stack.layout))
    cluster = Cluster(
        ["127.0.0.1"],
        port=stack.cassandra_port,
        auth_provider=admin,
        ssl_context=stack.cassandra_ssl,
    )
    session = cluster.connect()
    try:
        ks = f"t_{uuid.uuid4().hex[:8]}"
        session.execute(
            f"CREATE KEYSPACE {ks} WITH replication = {{'class': 'SimpleStrategy', "
            "'replication_factor': 1}"
        )
        session.execute(f"CREATE TABLE {ks}.kv (k text PRIMARY KEY, v int)")
        session.execute(f"INSERT INTO {ks}.kv (k, v) VALUES (%s, %s)", ("a", 41))
        row = session.execute(f"SELECT v FROM {ks}.kv WHERE k = %s", ("a",)).one()
        assert row.v == 41
        session.execute(f"DROP KEYSPACE {ks}")
        tables = {
            r.table_name
            for r in session.execute(
                "SELECT table_name FROM system_schema.tables WHERE keyspace_name = 'likes'"
            )
        }
        assert {"edges", "outbox_pending", "counter_cells"} <= tables, tables
    finally:
        cluster.shutdown()


def test_prometheus_alertmanager_and_webhook_sink_ready(stack: Stack) -> None:
    # what they run (rendered rules, relabeling, routes) is tested in test_observability.py
    assert httpx.get(f"{stack.prometheus_url}/-/ready", timeout=5).status_code == 200
    assert httpx.get(f"{stack.alertmanager_url}/-/ready", timeout=5).status_code == 200
    sink = f"http://{stack.host}:{stack.layout.ports.webhook_sink}"
    assert httpx.get(f"{sink}/-/ready", timeout=5).status_code == 200


def test_every_local_redis_requires_the_stacks_password(stack: Stack) -> None:
    """The program's Redis servers run with requirepass from the redis-auth secret; so do the
    local ones, so every client of ours runs its AUTH code in every test (no secret in argv)."""
    ports = [*stack.layout.ports.count_cache, *stack.layout.ports.idem_store]
    ports += stack.layout.ports.hot_pools
    secrets = transforms.stack_secrets(stack.layout)
    # the gateway's limiter Redis has its own Secret (ratelimit-redis-auth)
    passwords = {p: stack.redis_password for p in ports}
    passwords[stack.layout.ports.ratelimit_redis] = secrets[transforms.RATELIMIT_REDIS_AUTH]
    status = stack.status()
    # no retries: redis-py retries a refused login (an AuthenticationError is a ConnectionError)
    # with backoff, ~4 s a refusal, 2 minutes for this test
    once = {"socket_timeout": 2, "retry": Retry(NoBackoff(), 0)}
    for port, pw in passwords.items():
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host=stack.host, port=port, **once).ping()
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host=stack.host, port=port, password="guess", **once).ping()
        assert redis.Redis(host=stack.host, port=port, password=pw, **once).ping()
    for name, s in status.items():
        if name.startswith(("count-cache", "idem-store", "hot-pool", "ratelimit-redis")):
            cmdline = Path(f"/proc/{s['pid']}/cmdline").read_bytes().decode(errors="replace")
            assert all(pw not in cmdline for pw in passwords.values()), name


def test_etcd_requires_the_services_login_and_confines_it_to_the_platform_prefix(
    stack: Stack,
) -> None:
    """The program's etcd runs with auth (its etcd-auth Job); so does the local one, so every
    etcd client of ours logs in, in every test."""
    key = f"{etcd.PREFIX}test/{uuid.uuid4()}".encode()

    async def go() -> None:
        for creds in (None, etcd.Credentials(etcd.SERVICE_USER, "guess")):
            with pytest.raises(aetcd.exceptions.ClientError):
                async with etcd.client(stack.host, stack.etcd_port, creds, 2, stack.ca_file) as c:
                    await c.get(key)
        async with stack.etcd() as c:
            await c.put(key, b"1")
            with pytest.raises(aetcd.exceptions.ClientError, match="permission denied"):
                await c.put(b"/not-the-platforms/" + key, b"1")
            await c.delete(key)

    asyncio.run(go())
    # a rerun of the bootstrap changes nothing: any change to etcd's auth store would make every
    # running client's token stale
    root = transforms.stack_secrets(stack.layout)[transforms.ETCD_ROOT]
    rerun = etcd_auth.apply(
        stack.host, stack.etcd_port, root, stack.etcd_credentials, ca_file=stack.ca_file
    )
    assert asyncio.run(rerun) == []


def test_no_secret_of_the_stack_is_on_any_command_line(stack: Stack) -> None:
    """Passwords reach servers and workloads through files and env, never argv (/proc/*/cmdline
    is readable by every user of the machine, or pod)."""
    values = [v for v in transforms.stack_secrets(stack.layout).values() if len(v) >= 8]
    assert values
    status = stack.status()
    assert all(s["pid"] for s in status.values())
    for name, s in status.items():
        cmdline = Path(f"/proc/{s['pid']}/cmdline").read_bytes().decode(errors="replace")
        assert not [v for v in values if v in cmdline], name


def test_cassandra_requires_the_services_login_and_confines_it_to_the_platform_keyspace(
    stack: Stack,
) -> None:
    """The program's Scylla runs PasswordAuthenticator and CassandraAuthorizer (roles from its
    migration Job); so does the local Cassandra, so every session of ours logs in, in every test."""
    user = stack.cassandra_login[0]
    for refused in (None, (user, "guess"), (cql_roles.DEFAULT_SUPERUSER,) * 2):
        auth = PlainTextAuthProvider(*refused) if refused else None
        cluster = Cluster(
            [stack.host],
            port=stack.cassandra_port,
            auth_provider=auth,
            ssl_context=stack.cassandra_ssl,
        )
        with pytest.raises(NoHostAvailable, match=r"(?i)authenticat"):
            cluster.connect()
        cluster.shutdown()
    cluster = Cluster(
        [stack.host],
        port=stack.cassandra_port,
        auth_provider=stack.cassandra_auth,
        ssl_context=stack.cassandra_ssl,
    )
    session = cluster.connect(cql_roles.KEYSPACE)
    try:
        assert session.execute("SELECT count(*) FROM outbox_pending LIMIT 1").one() is not None
        with pytest.raises(Unauthorized):
            session.execute("CREATE TABLE IF NOT EXISTS likes.not_ours (k int PRIMARY KEY)")
        with pytest.raises(Unauthorized):
            session.execute("SELECT * FROM system_auth.roles")
    finally:
        cluster.shutdown()


def test_the_cql_applier_adds_a_column_once_to_a_table_that_exists(
    stack: Stack, tmp_path: Path
) -> None:
    """A column added to a live table (003_trace_context.cql) is written `ADD IF NOT EXISTS`,
    which Scylla may not parse: the applier looks the column up and sends a plain ADD, once."""
    layout = stack.layout
    admin = (cql_roles.ADMIN_ROLE, cassandra.admin_password(layout))
    cluster, session = cassandra.connect(
        stack.host, stack.cassandra_port, 30.0, admin, stack.cassandra_ssl
    )
    ks = f"applier_{uuid.uuid4().hex[:8]}"
    (tmp_path / "001.cql").write_text(
        f"CREATE KEYSPACE IF NOT EXISTS {ks} WITH replication = {cql_apply.PLACEHOLDER};\n"
        f"CREATE TABLE IF NOT EXISTS {ks}.t (k int PRIMARY KEY);\n"
    )
    (tmp_path / "002.cql").write_text(f"ALTER TABLE {ks}.t ADD IF NOT EXISTS c ascii;\n")
    dc = session.execute("SELECT data_center FROM system.local").one().data_center
    try:
        first = cql_apply.apply(session, {dc: 1}, tmp_path)
        second = cql_apply.apply(session, {dc: 1}, tmp_path)
        columns = session.execute(
            "SELECT column_name FROM system_schema.columns WHERE keyspace_name = %s "
            "AND table_name = 't'",
            (ks,),
        )
        assert sorted(r.column_name for r in columns) == ["c", "k"]
        edges = session.execute(
            "SELECT type FROM system_schema.columns WHERE keyspace_name = 'likes' "
            "AND table_name = 'edges' AND column_name = 'traceparent'"
        ).one()
    finally:
        session.execute(f"DROP KEYSPACE IF EXISTS {ks}")
        cluster.shutdown()
    assert first[-1] == f"ALTER TABLE {ks}.t ADD c ascii"
    assert len(first) == 3 and second == first[:2]  # the column exists: not added again
    assert edges is not None and edges.type == "ascii"  # the stack's own bootstrap added it


def _etcd_channel(stack: Stack) -> grpc.aio.Channel:
    """A raw gRPC channel to the stack's etcd (TLS in the --tls profile)."""
    target = f"{stack.host}:{stack.etcd_port}"
    if stack.ca_file is None:
        return grpc.aio.insecure_channel(target)
    ca = Path(stack.ca_file).read_bytes()
    return grpc.aio.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=ca))


def test_etcd_auth_repairs_drift_and_the_services_log_in_again_after_a_rotation(
    stack: Stack,
) -> None:
    """Rewriting a user's password (the auth Job rotating it) drops every token etcd issued to
    that user: the running read service must log in again (it drops its client on an error) and
    keep following the heat hints. A stray grant on the services' role is revoked by a rerun."""
    post = f"relogin-{uuid.uuid4().hex[:8]}"
    url = f"{stack.service_url('read')}/v1/posts/{post}/likes"
    root = transforms.stack_secrets(stack.layout)[transforms.ETCD_ROOT]
    creds = stack.etcd_credentials
    key = f"{keys.HEAT_PREFIX}{post}".encode()

    async def rotate_and_repair() -> list[str]:
        async with stack.etcd() as before:
            await before.get(key)  # logged in: holds a token
            async with _etcd_channel(stack) as ch:
                stub = rpc.AuthStub(ch)
                login = rpc.AuthenticateRequest(name=etcd.ROOT_USER, password=root)
                md = (("token", (await stub.Authenticate(login)).token),)
                stray = rpc.Permission(permType=rpc.Permission.READ, key=b"/stray/")
                grant = rpc.AuthRoleGrantPermissionRequest(name=etcd.SERVICE_ROLE, perm=stray)
                await stub.RoleGrantPermission(grant, metadata=md)
                same = rpc.AuthUserChangePasswordRequest(name=creds.user, password=creds.password)
                await stub.UserChangePassword(same, metadata=md)
            with pytest.raises(aetcd.exceptions.ClientError, match="invalid auth token"):
                await before.get(key)
        repaired = await etcd_auth.apply(
            stack.host, stack.etcd_port, root, creds, ca_file=stack.ca_file
        )
        async with stack.etcd() as c:
            await c.put(key, b"hot")
        return repaired

    try:
        assert asyncio.run(rotate_and_repair()) == [f"role revoke {etcd.SERVICE_ROLE} b'/stray/'"]
        deadline = time.monotonic() + 20
        got = ""
        while time.monotonic() < deadline and got != "public, max-age=5":
            got = httpx.get(url, timeout=5, verify=stack.service_verify).headers.get(
                "cache-control", ""
            )
            time.sleep(0.3)
        assert got == "public, max-age=5"  # the hint written after the rotation
    finally:

        async def clean() -> None:
            async with stack.etcd() as c:
                await c.delete(key)

        asyncio.run(clean())


def _login_errors(stack: Stack, conf: dict[str, object]) -> list[KafkaError]:
    """What a client with these settings meets: its metadata request fails; the errors its
    error callback saw say why."""
    seen: list[KafkaError] = []
    admin = AdminClient({**conf, "error_cb": seen.append, "log.connection.close": False})
    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    admin.poll(1.0)  # serves the error callback
    return seen


def test_kafka_refuses_a_client_without_a_login_or_with_a_wrong_password(stack: Stack) -> None:
    """The program's client listener requires SASL/SCRAM-SHA-512 (its KafkaUsers); so does every
    local broker, so every Kafka client of ours logs in, in every test."""
    bootstrap = stack.kafka_bootstrap
    # no SASL at all: the broker drops the connection before any request is served
    _login_errors(stack, {"bootstrap.servers": bootstrap})
    for creds in (
        kafka_contract.Credentials(kafka_contract.SERVICE_USER, "guess"),
        kafka_contract.Credentials("nobody", stack.kafka_login.password),
    ):
        conf = kafka_contract.client_config(bootstrap, creds, stack.ca_file)
        errors = _login_errors(stack, conf)
        assert any(e.code() == KafkaError._AUTHENTICATION for e in errors), errors
    # the services' login works, and so does the registry's (its own user)
    md = AdminClient(stack.kafka_config()).list_topics(timeout=10)
    assert kafka_contract.REGISTRY_TOPIC in md.topics
    registry_login = kafka_component.login(stack.layout, kafka_contract.REGISTRY_USER)
    conf = kafka_contract.client_config(bootstrap, registry_login, stack.ca_file)
    AdminClient(conf).list_topics(timeout=10)
    # a rerun of the users' bootstrap changes nothing (each password already logs in)
    assert kafka_component.ensure_users(stack.layout) == []


def test_the_brokers_admin_password_stays_in_0600_files(stack: Stack) -> None:
    """The brokers' own login sits in their properties (like a mounted Secret): readable by the
    stack's user only; the storage format's argument file is gone once the format ran."""
    conf = stack.layout.conf
    props = sorted(conf.glob("kafka-*.properties"))
    assert len(props) == stack.layout.kafka_brokers
    admin = kafka_component.login(stack.layout, kafka_contract.ADMIN_USER).password
    for f in props:
        assert f.stat().st_mode & 0o777 == 0o600, f
        assert admin in f.read_text()
    assert not list(conf.glob("kafka-format-*.args"))
    users = (stack.layout.home / "secrets" / "schema-registry.passwords").stat()
    assert users.st_mode & 0o777 == 0o600


def test_the_registry_refuses_anonymous_calls_and_wrong_logins(stack: Stack) -> None:
    """Production's registry runs with basic auth; so does the local one, and the deploy step
    (run by `likes local up`) has registered the event schema under every event topic."""
    url = f"{stack.registry_url}/subjects"
    good = stack.registry_login
    for auth in (None, (good.user, "guess"), ("nobody", good.password)):
        r = httpx.get(url, auth=auth, timeout=5, verify=stack.registry_verify)
        assert r.status_code == 401, auth
        assert r.json() == {"error_code": 401, "message": "Unauthorized"}
    r = httpx.get(url, auth=(good.user, good.password), timeout=5, verify=stack.registry_verify)
    assert r.status_code == 200
    assert {f"{t}-value" for t in events.EVENT_TOPICS} <= set(r.json())
    client = SchemaRegistryClient(
        registry.client_config(stack.registry_url, None, ca_file=stack.ca_file)
    )
    with pytest.raises(SchemaRegistryError) as refused:
        client.get_subjects()
    assert refused.value.http_status_code == 401
