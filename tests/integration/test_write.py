"""The write path against the real stack: accepted once, never lost, bad input refused.

The write app runs in-process (TestClient) with settings pointing at the test stack, so each test
can stop a server under it and watch what the service answers.
"""

from __future__ import annotations

import json
import threading
import time
import uuid

import pytest
from cassandra.cluster import Session
from confluent_kafka import Consumer, TopicPartition
from fastapi.testclient import TestClient

from services.contracts import clients, events, keys, signals
from services.schema import registry_schemas
from services.write.main import create_app
from tests.conftest import Stack

pytestmark = pytest.mark.stack


def token(stack: Stack, user: str) -> str:
    return stack.token(user)


def post_like(
    c: TestClient, stack: Stack, user: str, post: str, action: str = "like", key: str | None = None,
    reaction: str | None = None,
) -> tuple[int, dict[str, object], dict[str, str]]:  # fmt: skip
    body = {"post_id": post, "action": action}
    if reaction is not None:
        body["reaction"] = reaction
    r = c.post(
        "/v1/likes",
        json=body,
        headers={
            "Authorization": f"Bearer {token(stack, user)}",
            "Idempotency-Key": key or str(uuid.uuid4()),
        },
    )
    return r.status_code, r.json(), dict(r.headers)


def edge_state(cql: Session, user: str, post: str) -> str | None:
    row = cql.execute(
        "SELECT state FROM edges WHERE user_id = %s AND kind = 'edge' AND ref = %s", (user, post)
    ).one()
    return row.state if row else None


def outbox_rows(cql: Session, user: str) -> list[object]:
    return list(cql.execute("SELECT * FROM edges WHERE user_id = %s AND kind = 'outbox'", (user,)))


def events_for(
    stack: Stack, intent_uuids: set[str], want: int, timeout: float = 30, lookback_s: float = 600
) -> list[events.LikeEvent]:
    """Consume likes.committed from `lookback_s` ago (by message time, so a topic a long test run
    has filled is not read from its beginning: on a loaded machine that alone outlasted a 60 s
    wait); the events of these intents."""
    deser = clients.like_deserializer(clients.schema_registry(stack.settings()))
    c = Consumer({**stack.kafka_config(), "group.id": f"t-{uuid.uuid4()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    md = c.list_topics(events.COMMITTED, timeout=10).topics[events.COMMITTED]
    since_ms = int((time.time() - lookback_s) * 1000)
    wanted = [TopicPartition(events.COMMITTED, p, since_ms) for p in md.partitions]
    ends = {p: c.get_watermark_offsets(TopicPartition(events.COMMITTED, p), timeout=10)[1]
            for p in md.partitions}  # fmt: skip
    # offsets_for_times answers -1 for a partition with nothing that recent: start at its end
    parts = [TopicPartition(events.COMMITTED, tp.partition,
                            tp.offset if tp.offset >= 0 else ends[tp.partition])
             for tp in c.offsets_for_times(wanted, timeout=10)]  # fmt: skip
    c.assign(parts)
    found: list[events.LikeEvent] = []
    deadline = time.monotonic() + timeout
    from confluent_kafka.serialization import MessageField, SerializationContext

    while time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            try:
                ev = deser(m.value(), SerializationContext(m.topic(), MessageField.VALUE))
            except Exception:
                continue  # another test's deliberately broken (poison) message
            if ev.intent_uuid in intent_uuids:
                found.append(ev)
        if len(found) >= want:
            # read on to the end of what was there, to see duplicates too
            pos = {tp.partition: tp.offset for tp in c.position(parts)}
            if all(pos[p] >= ends[p] for p in ends):
                break
        elif m is None:
            ends = {p.partition: c.get_watermark_offsets(p, timeout=10)[1] for p in parts}
    c.close()
    return found


def once(evs: list[events.LikeEvent]) -> list[events.LikeEvent]:
    """The events as a consumer counts them: publication is at-least-once (the writer and the
    relay may both publish one outbox row), so dedup on intent_uuid. A duplicate must be the very
    same publication (same event_id), never a second intent."""
    by_intent: dict[str, events.LikeEvent] = {}
    for e in evs:
        first = by_intent.setdefault(e.intent_uuid, e)
        assert first.event_id == e.event_id, (first, e)
    return list(by_intent.values())


def test_like_is_written_published_and_remembered(
    stack: Stack, app_client: TestClient, cql: Session
) -> None:
    user, post, key = f"u-{uuid.uuid4()}", f"p-{uuid.uuid4()}", str(uuid.uuid4())
    status, body, _ = post_like(app_client, stack, user, post, key=key)
    assert status == 202, body
    assert body == {"intent_uuid": key, "state": "liked", "changed": True}
    assert edge_state(cql, user, post) == "liked"
    evs = once(events_for(stack, {key}, want=1))
    assert [(e.user_id, e.post_id, e.action, e.delta) for e in evs] == [(user, post, "like", 1)]
    idem = clients.idem_store(stack.settings(), timeout=2.0)
    stored = json.loads(idem.get(keys.idem_key(user, post, key)) or "{}")
    assert stored["state"] == "liked" and 0 < idem.ttl(keys.idem_key(user, post, key)) <= 86400
    # the published event's outbox row is cleaned up once Kafka acked it
    deadline = time.monotonic() + 10
    while outbox_rows(cql, user) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert outbox_rows(cql, user) == []


def test_the_abuse_signals_travel_on_the_event_and_a_malformed_one_is_refused(
    stack: Stack, app_client: TestClient, cql: Session
) -> None:
    # issue 13: the scorer reads the client's IP (the CDN's header), the device fingerprint and
    # the account's age (a token claim) off the like event: only the write path sees them
    user, post = f"u-{uuid.uuid4()}", f"p-{uuid.uuid4()}"
    created = int(time.time()) - 3600  # a fresh account
    with_signals, bare, bad = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    auth = {"Authorization": f"Bearer {stack.token(user, account_created=created)}"}
    r = app_client.post(
        "/v1/likes", json={"post_id": post, "action": "like"},
        headers={**auth, "Idempotency-Key": with_signals, signals.CLIENT_IP_HEADER: "203.0.113.7",
                 signals.DEVICE_HEADER: "dev-4f2a"},
    )  # fmt: skip
    assert r.status_code == 202, r.text
    r = app_client.post(
        "/v1/likes",
        json={"post_id": post, "action": "unlike"},
        headers={"Authorization": f"Bearer {stack.token(user)}", "Idempotency-Key": bare},
    )
    assert r.status_code == 202, r.text
    for header, value, status, code in (
        (signals.CLIENT_IP_HEADER, "203.0.113.999", 400, "invalid_signal"),
        (signals.DEVICE_HEADER, "two words", 422, "invalid_request"),  # the declared pattern
    ):
        r = app_client.post(
            "/v1/likes", json={"post_id": post, "action": "like"},
            headers={**auth, "Idempotency-Key": bad, header: value},
        )  # fmt: skip
        assert (r.status_code, r.json()["error"]["code"]) == (status, code), r.text
    assert edge_state(cql, user, post) == "unliked"  # the refused likes wrote nothing
    evs = {e.intent_uuid: e for e in once(events_for(stack, {with_signals, bare}, want=2))}
    liked = evs[with_signals]
    assert (liked.client_ip, liked.device, liked.account_created) == (
        "203.0.113.7",
        "dev-4f2a",
        created * 1000,
    )
    # an old client sends no header: no signal, never a refusal (the default token's account is
    # an old one)
    assert evs[bare].client_ip is None and evs[bare].device is None
    assert evs[bare].account_created is not None and evs[bare].account_created < created * 1000
    assert bad not in evs


def test_retry_storm_with_one_key_is_applied_once(
    stack: Stack, app_client: TestClient, cql: Session
) -> None:
    user, post, key = f"u-{uuid.uuid4()}", f"p-{uuid.uuid4()}", str(uuid.uuid4())
    results: list[tuple[int, dict[str, object]]] = []

    def hit() -> None:
        s, b, _ = post_like(app_client, stack, user, post, key=key)
        results.append((s, b))

    threads = [threading.Thread(target=hit) for _ in range(12)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(s == 202 for s, _ in results), results
    # every twin gets the first answer, "changed": from the idem key once it is set, or from
    # the key's intent row before that (review D8: the intent row answered "not changed"); the
    # like was applied once all the same: one edge transition, one publication (below)
    assert [b for _, b in results] == [{"intent_uuid": key, "state": "liked", "changed": True}] * 12
    assert edge_state(cql, user, post) == "liked"
    evs = once(events_for(stack, {key}, want=1, timeout=15))
    assert len(evs) == 1


def test_like_on_a_liked_edge_changes_nothing(
    stack: Stack, app_client: TestClient, cql: Session
) -> None:
    user, post = f"u-{uuid.uuid4()}", f"p-{uuid.uuid4()}"
    k1, k2, k3 = (str(uuid.uuid4()) for _ in range(3))
    assert post_like(app_client, stack, user, post, key=k1)[1]["changed"] is True
    s, body, _ = post_like(app_client, stack, user, post, key=k2)
    assert s == 202 and body == {"intent_uuid": k2, "state": "liked", "changed": False}
    # an unlike of something never liked is a no-op too, never a -1
    s, body, _ = post_like(app_client, stack, user, f"p-{uuid.uuid4()}", "unlike", key=k3)
    assert s == 202 and body["changed"] is False and body["state"] == "unliked"
    assert len(once(events_for(stack, {k1, k2, k3}, want=1, timeout=10))) == 1


def test_interleaved_like_unlike_retries_final_state_wins(
    stack: Stack, app_client: TestClient, cql: Session
) -> None:
    user, post = f"u-{uuid.uuid4()}", f"p-{uuid.uuid4()}"
    a, b, c = (str(uuid.uuid4()) for _ in range(3))
    assert post_like(app_client, stack, user, post, "like", a)[0] == 202
    assert post_like(app_client, stack, user, post, "unlike", b)[0] == 202
    idem = clients.idem_store(stack.settings())  # the services' own (cluster) client
    # the worst case: the idem keys were lost (e.g. a crash before the SET); late retries of the
    # first like and the unlike arrive, in the wrong order, after the final like
    assert post_like(app_client, stack, user, post, "like", c)[0] == 202
    for k in (a, b):  # one key per call: they live in different slots
        idem.delete(keys.idem_key(user, post, k))
    for action, key in [("unlike", b), ("like", a), ("unlike", b), ("like", a)]:
        s, body, _ = post_like(app_client, stack, user, post, action, key)
        # the first answer (each one changed the edge), and nothing changes now (below)
        want = {"intent_uuid": key, "state": "unliked" if action == "unlike" else "liked",
                "changed": True}  # fmt: skip
        assert s == 202 and body == want, body
    assert edge_state(cql, user, post) == "liked"
    evs = once(events_for(stack, {a, b, c}, want=3))
    assert sorted((e.intent_uuid, e.delta) for e in evs) == sorted([(a, 1), (b, -1), (c, 1)])
    assert sum(e.delta for e in evs) == 1


def test_an_unlike_takes_back_the_stored_reaction_even_when_read_stale(
    stack: Stack, app_client: TestClient, cql: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    # review D5: like "love" then a plain unlike folded as love +1, like -1: a count of 0 with
    # "love: 1" in top_reactions, forever
    user, post, post2 = f"u-{uuid.uuid4()}", f"p-{uuid.uuid4()}", f"p-{uuid.uuid4()}"
    a, b, c, d = (str(uuid.uuid4()) for _ in range(4))
    assert post_like(app_client, stack, user, post, "like", a, reaction="love")[0] == 202
    s, body, _ = post_like(app_client, stack, user, post, "unlike", b)  # the default "like"
    assert s == 202 and body["changed"] is True

    # the stored reaction read stale (another request changed it between the read and the
    # batch): the conditional batch refuses it and the retry takes back what is stored
    writer = app_client.app.state.writer  # type: ignore[attr-defined]
    monkeypatch.setattr(writer, "_stored", lambda _it: ("like", False))
    assert post_like(app_client, stack, user, post2, "like", c, reaction="wow")[0] == 202
    s, body, _ = post_like(app_client, stack, user, post2, "unlike", d)
    assert s == 202 and body["changed"] is True
    assert edge_state(cql, user, post2) == "unliked"

    evs = once(events_for(stack, {a, b, c, d}, want=4))
    got = sorted((e.post_id, e.delta, e.reaction) for e in evs)
    assert got == sorted([(post, 1, "love"), (post, -1, "love"), (post2, 1, "wow"),
                          (post2, -1, "wow")])  # fmt: skip


@pytest.mark.parametrize(
    ("case", "status", "code"),
    [
        ("no_key", 400, "missing_idempotency_key"),
        ("bad_key", 400, "malformed_idempotency_key"),
        ("bad_action", 422, "invalid_request"),
        ("bad_post_id", 422, "invalid_request"),
        ("oversized", 413, "body_too_large"),
        ("not_json", 422, "invalid_request"),
        ("no_token", 401, "missing_token"),
        ("forged_token", 401, "invalid_token"),
        ("other_user", 403, "forbidden_user"),
    ],
)
def test_bad_input_gets_a_clear_4xx_and_writes_nothing(
    stack: Stack, app_client: TestClient, cql: Session, case: str, status: int, code: str
) -> None:
    user, post = f"u-{uuid.uuid4()}", f"p-{uuid.uuid4()}"
    body: object = {"post_id": post, "action": "like"}
    headers = {
        "Authorization": f"Bearer {token(stack, user)}",
        "Idempotency-Key": str(uuid.uuid4()),
    }
    content: bytes | None = None
    if case == "no_key":
        del headers["Idempotency-Key"]
    elif case == "bad_key":
        headers["Idempotency-Key"] = "not-a-uuid"
    elif case == "bad_action":
        body = {"post_id": post, "action": "love"}
    elif case == "bad_post_id":
        body = {"post_id": post + ":3", "action": "like"}
    elif case == "oversized":
        body = {"post_id": post, "action": "like", "pad": "x" * 10_000}
    elif case == "not_json":
        content = b"{not json"
        headers["Content-Type"] = "application/json"
    elif case == "no_token":
        del headers["Authorization"]
    elif case == "forged_token":
        headers["Authorization"] = "Bearer " + token(stack, user)[:-4] + "AAAA"
    elif case == "other_user":
        body = {"post_id": post, "action": "like", "user_id": "someone-else"}
    if content is not None:
        r = app_client.post("/v1/likes", content=content, headers=headers)
    else:
        r = app_client.post("/v1/likes", json=body, headers=headers)
    assert r.status_code == status, r.text
    assert r.json()["error"]["code"] == code
    assert edge_state(cql, user, post) is None
    assert outbox_rows(cql, user) == []


def test_a_key_reused_for_another_post_is_refused_never_a_202_that_writes_nothing(
    app_client: TestClient, stack: Stack, cql: Session
) -> None:
    """Issue: the same Idempotency-Key for post A then post B answered 202 twice; B was never
    liked (invariant 1: a 202 means the like exists). Now the reuse is a 409 — also once the
    idem key is gone (expired, or its SET failed), through the key's intent row."""
    user, a, b, key = (
        f"u-{uuid.uuid4()}",
        f"p-{uuid.uuid4()}",
        f"p-{uuid.uuid4()}",
        str(uuid.uuid4()),
    )
    assert post_like(app_client, stack, user, a, key=key)[0] == 202
    s, body, _ = post_like(app_client, stack, user, b, key=key)
    assert s == 409 and body["error"]["code"] == "idempotency_key_reused", body
    assert edge_state(cql, user, b) is None
    # the idem-store forgot the key: the intent row still knows it was A's
    clients.idem_store(stack.settings()).delete(keys.idem_key(user, a, key))
    s, body, _ = post_like(app_client, stack, user, b, key=key)
    assert s == 409 and body["error"]["code"] == "idempotency_key_reused", body
    # the same key for the other action on A is another request too
    s, body, _ = post_like(app_client, stack, user, a, "unlike", key=key)
    assert s == 409, body
    # and the true replay of A still answers A's first answer, changing nothing
    s, body, _ = post_like(app_client, stack, user, a, key=key)
    assert s == 202 and body["state"] == "liked" and body["changed"] is True, body
    assert edge_state(cql, user, a) == "liked" and edge_state(cql, user, b) is None


def test_an_unreadable_idem_value_is_not_a_500(
    app_client: TestClient, stack: Stack, cql: Session
) -> None:
    """A corrupt (or older-format) idem value answered 500 (review D12); now the key's intent
    row decides: a first request is applied, its replay changes nothing."""
    user, post, key = f"u-{uuid.uuid4()}", f"p-{uuid.uuid4()}", str(uuid.uuid4())
    idem = clients.idem_store(stack.settings())
    idem.set(keys.idem_key(user, post, key), "{not json", ex=60)
    s, body, _ = post_like(app_client, stack, user, post, key=key)
    assert s == 202 and body["state"] == "liked", body
    idem.set(keys.idem_key(user, post, key), '{"fp": "x"}', ex=60)  # no state: an old format
    s, body, _ = post_like(app_client, stack, user, post, key=key)
    assert s == 202 and body == {"intent_uuid": key, "state": "liked", "changed": True}, body
    assert edge_state(cql, user, post) == "liked"
    assert len(once(events_for(stack, {key}, want=1, timeout=10))) == 1


def test_a_replay_from_the_intent_row_returns_the_first_answer(
    app_client: TestClient, stack: Stack, cql: Session
) -> None:
    """Review D8: with the idem key gone (expired, or its SET failed after the commit), a replay
    is answered from the key's intent row; it said `changed: false` where the first answer said
    `changed: true`. DESIGN: a replay of the same key returns the first answer."""
    user, post, noop_post = f"u-{uuid.uuid4()}", f"p-{uuid.uuid4()}", f"p-{uuid.uuid4()}"
    k1, k2, k3 = (str(uuid.uuid4()) for _ in range(3))
    idem = clients.idem_store(stack.settings())
    first = post_like(app_client, stack, user, post, key=k1)[1]
    assert first == {"intent_uuid": k1, "state": "liked", "changed": True}
    noop = post_like(app_client, stack, user, post, key=k2)[1]  # already liked: a no-op
    assert noop == {"intent_uuid": k2, "state": "liked", "changed": False}
    unlike_noop = post_like(app_client, stack, user, noop_post, "unlike", key=k3)[1]
    assert unlike_noop == {"intent_uuid": k3, "state": "unliked", "changed": False}
    for p, k in ((post, k1), (post, k2), (noop_post, k3)):
        idem.delete(keys.idem_key(user, p, k))
    # the intent rows answer now, each with its own first answer
    assert post_like(app_client, stack, user, post, key=k1)[1] == first
    assert post_like(app_client, stack, user, post, key=k2)[1] == noop
    assert post_like(app_client, stack, user, noop_post, "unlike", key=k3)[1] == unlike_noop
    assert len(once(events_for(stack, {k1, k2, k3}, want=1, timeout=10))) == 1


def test_a_registry_without_the_event_schema_gives_a_clean_503_then_writes_once_registered(
    stack: Stack, cql: Session
) -> None:
    """Producers never register schemas (the deploy step does). The registry answers but does
    not hold the event schema: the write is refused with 503 + Retry-After and nothing is
    written or registered; once the registration step ran again the same app writes and
    publishes with the registered schema."""
    registry = stack.registry_client()
    subject = f"{events.COMMITTED}-value"
    # soft delete: the schema's id stays readable, so consumers of earlier events are unharmed
    registry.delete_subject(subject)
    try:
        with TestClient(create_app(stack.settings())) as c:  # a serializer with nothing cached
            user, post = f"u-{uuid.uuid4()}", f"p-{uuid.uuid4()}"
            status, body, headers = post_like(c, stack, user, post)
            assert status == 503, body
            assert "retry-after" in {h.lower() for h in headers}
            assert edge_state(cql, user, post) is None
            assert outbox_rows(cql, user) == []
            assert subject not in registry.get_subjects()  # the writer registered nothing
            assert registry_schemas.apply(registry, registry_schemas.subjects())
            status, body, _ = post_like(c, stack, user, post)
            assert status == 202, body
            (ev,) = once(events_for(stack, {str(body["intent_uuid"])}, 1))
            assert (ev.user_id, ev.post_id, ev.action) == (user, post, "like")
    finally:
        registry_schemas.apply(registry, registry_schemas.subjects())
        registry.close()


def test_a_request_the_edge_store_refuses_is_a_client_error_and_leaves_no_marker(
    stack: Stack, app_client: TestClient, cql: Session
) -> None:
    # Review D12: CASSANDRA_ERRORS held InvalidRequest, so a request the edge-store refuses for
    # what it is (here a user id of 64 KiB: Cassandra keys a partition with at most 65535 bytes)
    # was answered "503, retry with the same key", and refused again at every retry; its outbox
    # marker, written before the batch, named a row no relay could even look up. The API
    # refuses such a subject at auth (keys.USER_ID_PATTERN): this is the layer behind it, for
    # whatever else the store may refuse; the wrapper hands the real writer the refused id.
    from dataclasses import replace

    from services.write import core
    from services.write.core import outbox_shard

    huge, post = "u" * 65536, f"p-{uuid.uuid4()}"
    writer: core.LikeWriter = app_client.app.state.writer  # type: ignore[attr-defined]

    class RefusedUser:
        def write(self, it: core.Intent) -> core.Outcome:
            return writer.write(replace(it, user_id=huge))

    t0 = time.time()
    app_client.app.state.writer = RefusedUser()  # type: ignore[attr-defined]
    try:
        s, body, headers = post_like(app_client, stack, f"u-{uuid.uuid4()}", post)
        s_unlike, body_unlike, _ = post_like(app_client, stack, f"u-{uuid.uuid4()}", post,
                                             action="unlike")  # fmt: skip
    finally:
        app_client.app.state.writer = writer  # type: ignore[attr-defined]
    assert s == 422, body
    assert body["error"]["code"] == "refused_by_edge_store"  # type: ignore[index]
    assert "retry-after" not in headers
    # an unlike reads the stored reaction first: refused the same way, not a 503
    assert s_unlike == 422, body_unlike
    buckets = {int(t // 60) for t in (t0, time.time())}
    left = [
        r
        for b in buckets
        for r in cql.execute(
            "SELECT user_id FROM outbox_pending WHERE bucket = %s AND shard = %s",
            (b, outbox_shard(huge)),
        )
        if r.user_id == huge
    ]
    assert left == [], "the refused write left its marker for the relay"
    with pytest.raises(core.Refused):  # the writer's own contract, for callers other than the API
        writer.write(core.Intent(huge, post, "like", "like", str(uuid.uuid4())))
