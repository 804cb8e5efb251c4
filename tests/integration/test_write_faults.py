"""The write path under faults: idem-store down fails closed, Cassandra down fails fast, Kafka
down still accepts (the outbox relay publishes once it is back)."""

from __future__ import annotations

import os
import signal
import threading
import time
import uuid

import httpx
import pytest
from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent_with_args
from fastapi.testclient import TestClient

from services.contracts import clients, convergence, workloads
from services.relay.core import OutboxRelay
from services.write.core import Publisher
from tests.conftest import Stack
from tests.integration.test_write import edge_state, events_for, outbox_rows, post_like

pytestmark = [pytest.mark.stack, pytest.mark.disruptive]


def wait_for_cql(cql: Session, timeout: float = 60) -> None:
    """The test's own driver session notices a restarted node on its own schedule."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            cql.execute("SELECT release_version FROM system.local")
            return
        except clients.CASSANDRA_ERRORS:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def wait_for_writes(app_client: TestClient, stack: Stack, timeout: float = 60) -> None:
    """Until the in-process write service accepts a like again: its driver session notices a
    restarted Cassandra on its own schedule, and a test that restarts a store leaves the next
    one a write path that works (the CI run that found it: the next test's first like got
    edge_store_unavailable)."""
    deadline = time.monotonic() + timeout
    while True:
        s, body, _ = post_like(app_client, stack, f"u-{uuid.uuid4()}", f"p-{uuid.uuid4()}")
        if s == 202:
            return
        assert time.monotonic() < deadline, body
        time.sleep(0.5)


def test_idem_store_down_fails_closed_and_writes_nothing(
    stack: Stack, app_client: TestClient, cql: Session
) -> None:
    user, post = f"u-{uuid.uuid4()}", f"p-{uuid.uuid4()}"
    stack.cli("local", "stop", "idem-store")
    try:
        s, body, headers = post_like(app_client, stack, user, post)
        assert s == 503, body
        assert body["error"]["code"] == "idem_store_unavailable"
        assert headers.get("retry-after") == "1"
        assert edge_state(cql, user, post) is None and outbox_rows(cql, user) == []
    finally:
        stack.up()
    assert post_like(app_client, stack, user, post)[0] == 202


def test_cassandra_down_fails_fast_with_503(
    stack: Stack, app_client: TestClient, cql: Session
) -> None:
    user, post, key = f"u-{uuid.uuid4()}", f"p-{uuid.uuid4()}", str(uuid.uuid4())
    stack.cli("local", "stop", "cassandra")
    try:
        t0 = time.monotonic()
        s, body, headers = post_like(app_client, stack, user, post, key=key)
        took = time.monotonic() - t0
        assert s == 503, body
        assert body["error"]["code"] == "edge_store_unavailable"
        assert headers.get("retry-after") == "1"
        print(f"write answered 503 {took:.2f}s after Cassandra went away")
        # the stack's write service (the rendered probe path) stops being ready: with every
        # edge-store host down a probe must not trust the pod (review H14)
        ready = f"{stack.ops_url(workloads.WRITE.name)}{workloads.READY_PATH}"
        deadline = time.monotonic() + 30
        while httpx.get(ready, timeout=5).status_code != 503:
            assert time.monotonic() < deadline, "write stayed ready with Cassandra down"
            time.sleep(0.5)
        assert httpx.get(ready, timeout=5).json()["checks"]["edge-store"] is False
    finally:
        stack.up()
    # the client retries with the same key once it is back: accepted exactly once
    deadline = time.monotonic() + 60
    while True:
        s, body, _ = post_like(app_client, stack, user, post, key=key)
        if s == 202 or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert s == 202 and body["changed"] is True
    wait_for_cql(cql)
    assert edge_state(cql, user, post) == "liked"


def test_a_killed_cassandra_keeps_every_write_it_acknowledged(
    stack: Stack, cql: Session, app_client: TestClient
) -> None:
    """A 202 is a promise the edge exists (invariant 1), and production keeps it with a quorum of
    replicas; the local stack has one node, so its commitlog must sync before it acknowledges
    (local/cassandra/cassandra.yaml). With the periodic sync it had, replay stopped at the last
    sync marker and a SIGKILL lost the writes acknowledged since (a game day found three likes
    gone that way): this writes a burst, kills the node the moment the last one is
    acknowledged, and finds every row after the restart."""
    user = f"u-durable-{uuid.uuid4()}"
    insert = cql.prepare(
        "INSERT INTO edges (user_id, kind, ref, state, void) VALUES (?, 'edge', ?, 'liked', false)"
    )
    refs = [f"p-{i}" for i in range(2000)]
    pid = stack.pid("cassandra")
    results = execute_concurrent_with_args(cql, insert, [(user, r) for r in refs], concurrency=64)
    assert all(ok for ok, _ in results)  # every one acknowledged
    os.kill(pid, signal.SIGKILL)  # at once: a CLI would give a periodic sync a second to run
    stack.up()
    wait_for_cql(cql)
    rows = cql.execute("SELECT ref FROM edges WHERE user_id = %s AND kind = 'edge'", (user,))
    kept = {r.ref for r in rows}
    assert len(kept) == len(refs), f"{len(refs) - len(kept)} acknowledged writes lost"
    wait_for_writes(app_client, stack)


def test_kafka_down_still_202_and_relay_drains_after_restart(
    stack: Stack, app_client: TestClient, cql: Session
) -> None:
    users = [f"u-{uuid.uuid4()}" for _ in range(5)]
    post = f"p-{uuid.uuid4()}"
    keys_: list[str] = []
    brokers = [f"kafka-{i}" for i in range(1, stack.layout.kafka_brokers + 1)]
    for b in brokers:
        stack.cli("local", "stop", "--kill", b)
    try:
        for u in users:
            k = str(uuid.uuid4())
            keys_.append(k)
            s, body, _ = post_like(app_client, stack, u, post, key=k)
            assert s == 202 and body["changed"] is True, body
        # accepted and durable: every edge and its outbox row is in the edge-store
        wait_for_cql(cql)
        assert all(edge_state(cql, u, post) == "liked" for u in users)
        assert all(len(outbox_rows(cql, u)) == 1 for u in users)
    finally:
        stack.up()

    settings = stack.settings()
    cluster, session = clients.cassandra(settings)
    publisher = Publisher(clients.producer(settings))
    relay = OutboxRelay(session, publisher)
    stop = threading.Event()

    def loop() -> None:
        while not stop.is_set():
            relay.run_once()
            stop.wait(0.5)

    t = threading.Thread(target=loop)
    t.start()
    try:
        evs = events_for(stack, set(keys_), want=len(keys_), timeout=60)
    finally:
        stop.set()
        t.join()
        publisher.close()
        cluster.shutdown()
    # each like published (at least once; consumers dedup on intent_uuid), none lost
    assert {e.intent_uuid for e in evs} == set(keys_)
    assert all(outbox_rows(cql, u) == [] for u in users)
    # and counted exactly once, by the stack's own aggregator, as the read service answers
    read = stack.gateway_url  # as clients read
    deadline = time.monotonic() + 60
    while True:
        count = httpx.get(f"{read}/v1/posts/{post}/likes", timeout=5).json()["count"]
        if count == len(users) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert count == len(users)


def test_a_publish_the_producer_refuses_after_the_commit_is_still_a_202(
    stack: Stack, app_client: TestClient, cql: Session
) -> None:
    """librdkafka refuses a message synchronously (BufferError: its queue is full; a
    KafkaException for one it cannot send) after the edge-store commit: the like is durable,
    so the answer is 202, never a 500 (review D12), and the relay publishes it."""
    writer = app_client.app.state.writer  # type: ignore[attr-defined]
    # a real producer whose local queue holds one message that waits a minute to be sent:
    # the second produce() raises BufferError
    full = Publisher(
        clients.producer(
            stack.settings(), **{"queue.buffering.max.messages": 1, "linger.ms": 60000}
        )
    )
    users = [f"u-{uuid.uuid4()}" for _ in range(3)]
    post = f"p-{uuid.uuid4()}"
    original, writer.publisher = writer.publisher, full
    try:
        answers = [post_like(app_client, stack, u, post) for u in users]
    finally:
        writer.publisher = original
        full.close(timeout=0)
    assert [(s, body["changed"]) for s, body, _ in answers] == [(202, True)] * len(users)
    assert all(edge_state(cql, u, post) == "liked" for u in users)
    # the stack's relay publishes what the producer refused: counted once each, and it stays
    # so (the queued copy may still go out when the producer closes; consumers dedup it)
    read = f"{stack.gateway_url}/v1/posts/{post}/likes"
    result = convergence.wait_converged(
        lambda: {post: httpx.get(read, timeout=5).json()["count"]}, {post: len(users)}
    )
    assert result.converged, str(result)
