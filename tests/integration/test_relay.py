"""The outbox relay on the real edge-store and Kafka: a stale marker without its outbox row is
dropped, one whose row exists (a batch that applied after its client gave up) is published, the
drop going through a SERIAL read of the user's partition (review D1); a marker a lagging writer
puts into a bucket already passed is still found, an unpublishable row is dead-lettered instead
of pinning the low-water mark (D11); replicas share the shards through leases and take over a
dead replica's."""

from __future__ import annotations

import itertools
import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from cassandra.cluster import Session
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.serialization import MessageField, SerializationContext

from infra import alert_rules
from services.contracts import clients, convergence, events, keys
from services.contracts import metrics as metric_names
from services.relay import core as relay_core
from services.relay.core import OutboxRelay
from services.write import core as write_core
from services.write.core import OUTBOX_SHARDS, Publisher, outbox_shard
from tests import loopback
from tests.conftest import Stack
from tests.integration.test_aggregator import wait_for
from tests.integration.test_write import events_for, outbox_rows

pytestmark = pytest.mark.stack


def marker(cql: Session, user: str, event_id: uuid.UUID, created: datetime) -> tuple[int, int]:
    bucket, shard = int(created.timestamp() // 60), outbox_shard(user)
    cql.execute(
        "INSERT INTO outbox_pending (bucket, shard, created_at, event_id, user_id) "
        "VALUES (%s, %s, %s, %s, %s)",
        (bucket, shard, created, event_id, user),
    )
    return bucket, shard


def markers_of(cql: Session, bucket: int, shard: int, event_id: uuid.UUID) -> int:
    rows = cql.execute(
        "SELECT event_id FROM outbox_pending WHERE bucket = %s AND shard = %s", (bucket, shard)
    )
    return sum(1 for r in rows if r.event_id == event_id)


def test_a_stale_marker_is_dropped_without_a_row_and_published_with_one(
    stack: Stack, cql: Session
) -> None:
    stack.cli("local", "stop", "outbox-relay")  # the stack's relay would race ours for them
    try:
        _drop_and_publish(stack, cql)
    finally:
        stack.up()


def _drop_and_publish(stack: Stack, cql: Session) -> None:
    settings = stack.settings()
    # older than the write timeout, even as seen from a writer whose clock lags the most
    created = datetime.now(UTC) - timedelta(seconds=45 + convergence.MAX_CLOCK_SKEW_S)
    # 1. a batch that never applied: no outbox row
    lost_user, lost_event = f"u-{uuid.uuid4()}", uuid.uuid4()
    lost_at = marker(cql, lost_user, lost_event, created)
    # 2. a batch that applied after its client saw a timeout: the row is there, unpublished
    user, post, intent = f"u-{uuid.uuid4()}", f"p-{uuid.uuid4()}", str(uuid.uuid4())
    ev = events.LikeEvent.new(
        intent_uuid=intent, user_id=user, post_id=post, action="like", reaction="like",
        delta=1, region=settings.region, shard=0,
    )  # fmt: skip
    ser = clients.like_serializer(clients.schema_registry(settings))
    payload = ser(ev, SerializationContext(events.COMMITTED, MessageField.VALUE))
    cql.execute(
        "INSERT INTO edges (user_id, kind, ref, post_id, topic, kafka_key, payload, created_at, "
        "published, intent_uuid) VALUES (%s, 'outbox', %s, %s, %s, %s, %s, %s, false, %s)",
        (user, ev.event_id, post, events.COMMITTED, keys.kafka_key(post, 0), payload, created,
         uuid.UUID(intent)),
    )  # fmt: skip
    late_at = marker(cql, user, uuid.UUID(ev.event_id), created)

    cluster, session = clients.cassandra(settings)
    publisher = Publisher(clients.producer(settings))
    try:
        relay = OutboxRelay(session, publisher)
        res = relay.run_once()
    finally:
        publisher.close()
        cluster.shutdown()
    assert res.dropped_markers >= 1 and res.published >= 1
    assert markers_of(cql, *lost_at, lost_event) == 0
    assert markers_of(cql, *late_at, uuid.UUID(ev.event_id)) == 0
    assert outbox_rows(cql, user) == []
    assert [e.event_id for e in events_for(stack, {intent}, want=1)] == [ev.event_id]


def test_an_acked_event_whose_row_the_edge_store_fails_to_delete_is_noted(stack: Stack) -> None:
    """Kafka acked the event, then the edge-store failed the row's delete (hung here: the
    delete times out). The writer notes the event in the idem-store, which the relay reads
    before it republishes (the next test). Without the note, the row waited for the store and
    was republished minutes later, past the aggregator's dedup horizon: a double count."""
    settings = stack.settings()
    cluster, session = clients.cassandra(settings)  # a 2 s request timeout, as the writer's
    idem = clients.idem_store(settings)
    q = write_core.Statements(session)  # prepared while the store answers
    acked: Future[None] = Future()
    acked.set_result(None)
    created = datetime.now(UTC)
    bucket = int(created.timestamp() // 60)

    def cleanup(event_id: str) -> None:
        user = f"u-{uuid.uuid4()}"
        write_core.after_publish(
            session, q, acked, user, event_id, bucket, outbox_shard(user), created, idem
        )

    try:
        deleted = str(uuid.uuid4())
        cleanup(deleted)  # the store answers: the deletes succeed, nothing is noted
        # ... once they are answered: the deletes are asynchronous, and a store paused while
        # they were in flight failed them (CI, a slow machine: the event was noted)
        wait_for(
            lambda: all(sum(st["in_flights"]) == 0 for st in session.get_pool_state().values()),
            10,
            "the first deletes answered",
        )
        left = str(uuid.uuid4())
        pid = stack.pid("cassandra")
        os.kill(pid, signal.SIGSTOP)
        try:
            cleanup(left)
            wait_for(lambda: idem.exists(keys.published_key(left)), 20, "the note")
        finally:
            os.kill(pid, signal.SIGCONT)
        assert idem.ttl(keys.published_key(left)) > 3600  # outlives a store's outage
        assert not idem.exists(keys.published_key(deleted))
    finally:
        cluster.shutdown()


def test_a_row_noted_as_published_is_cleaned_up_not_published_again(
    stack: Stack, cql: Session
) -> None:
    """The relay reads the notes before it publishes: a noted row is deleted unpublished (its
    writer's copy is in Kafka), a row without one is published, each event once in the log.
    Both rows are older than the aggregator's dedup horizon, as after the edge-store's outage."""
    created = datetime.now(UTC) - timedelta(seconds=2 * convergence.HOLD_S + 60)
    idem = clients.idem_store(stack.settings())
    noted_user, plain_user = f"u-{uuid.uuid4()}", f"u-{uuid.uuid4()}"
    with own_relays(stack) as (session, publisher):
        noted, noted_event, noted_at = unpublished_row(stack, cql, created, user=noted_user)
        plain, plain_event, plain_at = unpublished_row(stack, cql, created, user=plain_user)
        row = cql.execute(
            "SELECT topic, kafka_key, payload FROM edges WHERE user_id = %s AND kind = 'outbox' "
            "AND ref = %s",
            (noted_user, noted_event),
        ).one()
        # the writer's copy, acked; its row's delete failed, so it noted the event
        publisher.publish(row.topic, row.kafka_key, row.payload).result(timeout=30)
        write_core.note_published(idem, noted_event)
        res = OutboxRelay(session, publisher, idem=lambda: idem).run_once()
    assert res.already_published == 1 and res.published >= 1
    assert outbox_rows(cql, noted_user) == [] and outbox_rows(cql, plain_user) == []
    assert markers_of(cql, *noted_at, uuid.UUID(noted_event)) == 0
    assert markers_of(cql, *plain_at, uuid.UUID(plain_event)) == 0
    copies = Counter(e.intent_uuid for e in events_for(stack, {noted, plain}, want=2))
    assert copies == {noted: 1, plain: 1}


def test_with_the_idem_store_down_rows_are_published_and_it_is_not_asked_every_bucket(
    stack: Stack, cql: Session
) -> None:
    """No note can be read: the row is published all the same (a like never published is
    lost). The idem-store is then left alone for IDEM_RETRY_S, so a pass over many buckets does
    not wait out a connect timeout once per bucket."""
    created = datetime.now(UTC) - timedelta(seconds=2 * convergence.HOLD_S + 60)
    settings = stack.settings().model_copy(update={"idem_store_nodes": "127.0.0.1:1"})
    asked = []

    def unreachable() -> Any:
        asked.append(time.monotonic())
        return clients.idem_store(settings)  # connection refused: raises

    user = f"u-{uuid.uuid4()}"
    with own_relays(stack) as (session, publisher):
        first, _, _ = unpublished_row(stack, cql, created, user=user)
        relay = OutboxRelay(session, publisher, idem=unreachable)
        res = relay.run_once()
        second, _, _ = unpublished_row(stack, cql, created, user=user)
        again = relay.run_once()
    # asked at least once (its rows were checked), never twice within IDEM_RETRY_S
    assert asked and all(b - a >= relay_core.IDEM_RETRY_S for a, b in itertools.pairwise(asked))
    assert res.published >= 1 and again.published >= 1 and outbox_rows(cql, user) == []
    copies = Counter(e.intent_uuid for e in events_for(stack, {first, second}, want=2))
    assert copies == {first: 1, second: 1}


# -- outbox rows as a writer leaves them ------------------------------------------------------


def unpublished_row(
    stack: Stack, cql: Session, created: datetime, *, user: str | None = None,
    payload: bytes | None = None,
) -> tuple[str, str, tuple[int, int]]:  # fmt: skip
    """An outbox row and its marker, unpublished (its writer never got the ack): (intent,
    event_id, (bucket, shard) of the marker)."""
    settings = stack.settings()
    user, post, intent = user or f"u-{uuid.uuid4()}", f"p-{uuid.uuid4()}", str(uuid.uuid4())
    ev = events.LikeEvent.new(
        intent_uuid=intent, user_id=user, post_id=post, action="like", reaction="like",
        delta=1, region=settings.region, shard=0,
    )  # fmt: skip
    if payload is None:
        payload = _serializer(stack)(ev, SerializationContext(events.COMMITTED, MessageField.VALUE))
    cql.execute(
        "INSERT INTO edges (user_id, kind, ref, post_id, topic, kafka_key, payload, created_at, "
        "published, intent_uuid) VALUES (%s, 'outbox', %s, %s, %s, %s, %s, %s, false, %s)",
        (user, ev.event_id, post, events.COMMITTED, keys.kafka_key(post, 0), payload, created,
         uuid.UUID(intent)),
    )  # fmt: skip
    return intent, ev.event_id, marker(cql, user, uuid.UUID(ev.event_id), created)


_SERIALIZERS: dict[str, Any] = {}


def _serializer(stack: Stack) -> Any:
    if stack.kafka_bootstrap not in _SERIALIZERS:
        registry = clients.schema_registry(stack.settings())
        _SERIALIZERS[stack.kafka_bootstrap] = clients.like_serializer(registry)
    return _SERIALIZERS[stack.kafka_bootstrap]


@contextmanager
def own_relays(stack: Stack) -> Iterator[tuple[Session, Publisher]]:
    """The stack's relay stopped (it would race ours for the rows; a clean stop gives its leases
    back), a session and a publisher for relays run in-process."""
    stack.cli("local", "stop", "outbox-relay")
    settings = stack.settings()
    cluster, session = clients.cassandra(settings)
    publisher = Publisher(clients.producer(settings))
    try:
        yield session, publisher
    finally:
        publisher.close()
        cluster.shutdown()
        stack.up()


def dead_letters(stack: Stack, event_id: str, timeout: float = 30) -> list[dict[str, bytes]]:
    """The headers of likes.dead-letter records that name this outbox event."""
    c = Consumer({**stack.kafka_config(), "group.id": f"t-{uuid.uuid4()}",
                  "auto.offset.reset": "earliest", "enable.auto.commit": False})  # fmt: skip
    md = c.list_topics(events.DEAD_LETTER, timeout=10).topics[events.DEAD_LETTER]
    parts = [TopicPartition(events.DEAD_LETTER, p, 0) for p in md.partitions]
    ends = {p.partition: c.get_watermark_offsets(p, timeout=10)[1] for p in parts}
    c.assign(parts)
    found: list[dict[str, bytes]] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        m = c.poll(0.5)
        if m is not None and m.error() is None:
            hs = dict(m.headers() or [])
            if hs.get("dlq.event_id") == event_id.encode():
                found.append(hs)
        pos = {tp.partition: tp.offset for tp in c.position(parts)}
        if all(pos[p] >= ends[p] for p in ends if ends[p] > 0):
            break
    c.close()
    return found


def test_a_marker_in_a_bucket_already_passed_is_still_published(stack: Stack, cql: Session) -> None:
    """Review D11: the relay moved its low-water mark past a bucket once it was empty and two
    minutes old; a writer whose clock lags by more wrote markers into buckets already passed,
    never read until the relay restarted. It keeps re-scanning MAX_CLOCK_SKEW_S of them."""
    with own_relays(stack) as (session, publisher):
        relay = OutboxRelay(session, publisher)
        relay.run_once()
        relay.run_once()  # drained: the low-water mark is as far as it goes
        # a writer lagging 2.5 minutes (within MAX_CLOCK_SKEW_S) commits a like now
        lag = min(150.0, convergence.MAX_CLOCK_SKEW_S)
        intent, event_id, _ = unpublished_row(
            stack, cql, datetime.now(UTC) - timedelta(seconds=lag)
        )
        relay.run_once()
        relay.run_once()
        # before the stack's relay is back: a restarted relay starts from the oldest bucket in
        # use, so it would find the marker (the only cure there was)
        got = [e.event_id for e in events_for(stack, {intent}, want=1, timeout=15)]
    assert got == [event_id]


def test_an_unpublishable_row_is_dead_lettered_and_stops_pinning_the_low_water_mark(
    stack: Stack, cql: Session
) -> None:
    """Review D11: a row Kafka refuses forever kept its marker, so the low-water mark stayed at
    its bucket and every pass scanned every bucket since (x16 shards). After a few attempts it
    goes to likes.dead-letter with its source, a reference to the row and the error; the row
    stays in the edge-store; the low-water mark moves on."""
    before = relay_core.DEAD_LETTERED._value.get()
    created = datetime.now(UTC) - timedelta(minutes=10)
    huge = b"\0" * 2_000_000  # larger than any message Kafka takes: refused for what it is
    user = f"u-{uuid.uuid4()}"
    intent, event_id, (bucket, shard) = unpublished_row(stack, cql, created, user=user,
                                                        payload=huge)  # fmt: skip
    with own_relays(stack) as (session, publisher):
        relay = OutboxRelay(session, publisher, dead_letter_attempts=3)
        passes = [relay.run_once() for _ in range(4)]
    assert [p.dead_lettered for p in passes][:3] == [0, 0, 1], passes  # the third attempt
    assert markers_of(cql, bucket, shard, uuid.UUID(event_id)) == 0
    assert relay.low_water[shard] > bucket  # no longer pinned
    assert [r.ref for r in outbox_rows(cql, user)] == [event_id]  # the record stays
    (hs,) = dead_letters(stack, event_id)
    assert hs["dlq.source"] == b"outbox" and hs["dlq.consumer"] == b"outbox-relay"
    assert hs["dlq.source.topic"] == events.COMMITTED.encode()
    assert hs["dlq.outbox.user_id"] == user.encode()
    assert (hs["dlq.outbox.bucket"], hs["dlq.outbox.shard"]) == (b"%d" % bucket, b"%d" % shard)
    assert hs["dlq.intent_uuid"] == intent.encode() and hs["dlq.attempts"] == b"3"
    assert b"MSG_SIZE_TOO_LARGE" in hs["dlq.error"]
    assert hs["dlq.reference"] == b"1"  # too large for the dead-letter topic too: a reference
    assert relay_core.DEAD_LETTERED._value.get() == before + 1


def test_relay_replicas_share_the_shards_and_take_over_a_dead_ones(
    stack: Stack, cql: Session
) -> None:
    """Several relays all scanned and republished the same rows (review D4/D11). With leases
    each shard has one owner: every stale row is republished once per pass across replicas, and
    a dead replica's shards (and the rows in them) are taken over once its leases lapse."""
    from services.relay.leases import SCOPE, ShardLeases

    class Robbed(ShardLeases):
        """Loses the lease on `rob` to another owner between its read of the lease table and
        its renewal: the one conditional batch that renews all its leases then applies none."""

        rob: int | None = None

        def _renew(self, shards: Sequence[int], ttl: int, trust_until: float) -> None:
            if self.rob is not None:
                cql.execute(
                    "UPDATE outbox_relay_leases USING TTL %s SET owner = 'thief' "
                    "WHERE scope = %s AND kind = 'shard' AND ref = %s",
                    (convergence.RELAY_LEASE_TTL_S, SCOPE, str(self.rob)),
                )
            super()._renew(shards, ttl, trust_until)

    with own_relays(stack) as (session, publisher):
        relays = [
            OutboxRelay(
                session, publisher,
                leases=(Robbed if i == 0 else ShardLeases)(
                    session, f"t{i}-{uuid.uuid4().hex[:6]}", OUTBOX_SHARDS
                ),
            )
            for i in range(3)
        ]  # fmt: skip

        def owners() -> list[frozenset[int]]:
            return [r.leases.refresh(force=True) for r in relays if r.leases is not None]

        def settled(live: list[OutboxRelay]) -> bool:
            owned = [r.leases.refresh(force=True) for r in live if r.leases is not None]
            flat = [s for o in owned for s in o]
            return sorted(flat) == list(range(OUTBOX_SHARDS)) and all(
                len(o) >= OUTBOX_SHARDS // len(live) for o in owned
            )

        wait_for(lambda: settled(relays), timeout=60, what="three replicas sharing the shards")
        print("shares:", [sorted(o) for o in owners()])

        # stale rows in every shard: one pass of each replica publishes each exactly once
        created = datetime.now(UTC) - timedelta(seconds=10)
        rows = {}
        while {outbox_shard(u) for u in rows} != set(range(OUTBOX_SHARDS)) or len(rows) < 32:
            u = f"u-{uuid.uuid4()}"
            rows[u] = unpublished_row(stack, cql, created, user=u)
        ours = {event_id for _, event_id, _ in rows.values()}
        shard_of = {ev: outbox_shard(u) for u, (_, ev, _) in rows.items()}
        # passes of each replica in turn until every row is out: each row published once, by the
        # replica whose pass held its shard. One round is not always enough: a pass stops at a
        # shard whose lease it can no longer trust (a renewal that took longer than its margin on
        # a loaded machine, CI), and the next pass drains it
        counted: Counter[str] = Counter()

        def all_out() -> bool:
            for r in relays:
                p = r.run_once()
                mine = [e for e in p.published_ids if e in ours]
                assert all(shard_of[e] in p.shards for e in mine), (p.shards, mine)
                counted.update(mine)
            return set(counted) == ours

        wait_for(all_out, timeout=60, what="every stale row published")
        assert counted == Counter(dict.fromkeys(ours, 1)), counted
        wait_for(lambda: settled(relays), timeout=60, what="the three shares, still")

        # a lease lost under a renewal costs that shard only: the others are renewed one by one
        robbed = relays[0].leases
        assert isinstance(robbed, Robbed)
        kept = robbed.refresh(force=True)
        robbed.rob = min(kept)
        try:
            assert robbed.refresh(force=True) == kept - {robbed.rob}
        finally:
            robbed.rob = None
        wait_for(lambda: settled(relays), timeout=60, what="the robbed shard back once it lapsed")
        shares = owners()
        assert all(shares), shares

        # the third replica dies (no clean stop: its leases lapse); rows in its shards wait
        dead, live = relays[2], relays[:2]
        orphan = sorted(shares[2])
        late = {}
        for s in orphan:
            u = next(
                u for u in (f"u-{uuid.uuid4()}" for _ in range(10_000)) if outbox_shard(u) == s
            )
            late[u] = unpublished_row(stack, cql, datetime.now(UTC) - timedelta(seconds=10), user=u)
        t0 = time.monotonic()
        published: list[str] = []

        def taken_over() -> bool:
            for r in live:
                published.extend(r.run_once().published_ids)
            return settled(live)

        wait_for(taken_over, timeout=60, what="the survivors taking the dead replica's shards")
        took = time.monotonic() - t0
        print(f"takeover after {took:.1f} s (lease TTL {convergence.RELAY_LEASE_TTL_S} s)")
        for r in live:
            published.extend(r.run_once().published_ids)
        assert dead.leases is not None and not any(s in dead.leases.owned() for s in orphan)
        late_ids = {ev for _, ev, _ in late.values()}
        assert Counter(e for e in published if e in late_ids) == Counter(dict.fromkeys(late_ids, 1))
        for r in live:
            if r.leases is not None:
                r.leases.release()
    intents = {i for i, _, _ in [*rows.values(), *late.values()]}
    assert len({e.intent_uuid for e in events_for(stack, intents, want=len(intents))}) == len(
        intents
    )


def test_a_clock_too_far_from_the_edge_stores_is_not_ready(cql: Session) -> None:
    """The skew the relay tolerates is enforced where it starts: the write service and the relay
    report not ready with a clock off by more than half MAX_CLOCK_SKEW_S (the edge-store's)."""
    from services.common.clock import EdgeStoreClock

    here = EdgeStoreClock(cql)
    assert here.ok() and here.offset_s is not None and abs(here.offset_s) < 5
    late = EdgeStoreClock(cql, clock=lambda: time.time() - convergence.MAX_CLOCK_SKEW_S)
    assert not late.ok()
    assert late.offset_s is not None and late.offset_s < -convergence.MAX_CLOCK_SKEW_S / 2


def test_a_marker_whose_user_the_edge_store_refuses_as_a_key_is_dropped(
    stack: Stack, cql: Session
) -> None:
    # Review D12: a marker naming a user id the edge-store refuses as a partition key (64 KiB;
    # its batch was refused, its writer died before taking the marker back) made every pass
    # raise InvalidRequest at its row lookup: the shard's later markers were never published.
    huge, poison = "u" * 65536, uuid.uuid4()
    # a publishable row behind it in the same (bucket, shard) partition
    user = next(u for u in (f"u-{uuid.uuid4()}" for _ in range(10_000))
                if outbox_shard(u) == outbox_shard(huge))  # fmt: skip
    with own_relays(stack) as (session, publisher):  # the stack's relay stopped first
        created = datetime.now(UTC) - timedelta(seconds=45 + convergence.MAX_CLOCK_SKEW_S)
        at = marker(cql, huge, poison, created)
        later = created + timedelta(milliseconds=1)
        intent, event_id, row_at = unpublished_row(stack, cql, later, user=user)
        assert row_at == at
        res = OutboxRelay(session, publisher).run_once()
    assert markers_of(cql, *at, poison) == 0
    assert markers_of(cql, *row_at, uuid.UUID(event_id)) == 0
    assert res.dropped_markers >= 1 and res.published >= 1
    assert [e.event_id for e in events_for(stack, {intent}, want=1)] == [event_id]


def test_the_oldest_rows_age_keeps_growing_while_a_pass_waits_on_a_hung_kafka(
    stack: Stack, cql: Session
) -> None:
    """The game day write-kafka-publish-timeout hung every broker for 40 s and OutboxEventsStale
    never fired: the relay set the oldest row's age when a pass ended, and a pass waits up to
    publish_wait_s per partition with rows, so the gauge froze exactly while Kafka hung. It is
    now read when scraped, from the oldest pending row the relay has met."""

    def oldest() -> float:  # as a scrape reads it
        (metric,) = relay_core.OLDEST.collect()
        return float(metric.samples[0].value)

    hung_broker = loopback.listener(loopback.hold)  # a SIGSTOPped broker, as a client sees one
    with own_relays(stack) as (session, publisher), hung_broker as (address, _):
        OutboxRelay(session, publisher).run_once()  # what is pending now goes out
        settings = stack.settings()
        stuck = Publisher(clients.producer(settings, **{"bootstrap.servers": address,
                                                        "message.timeout.ms": 8000}))  # fmt: skip
        age = 20.0
        intent, event_id, _ = unpublished_row(
            stack, cql, datetime.now(UTC) - timedelta(seconds=age)
        )
        hung = OutboxRelay(session, stuck, publish_wait_s=8.0)
        passing = threading.Thread(target=hung.run_once)
        passing.start()
        try:
            wait_for(lambda: oldest() >= age, 3, "the row's age while the pass waits on Kafka")
            seen = oldest()
            time.sleep(1.5)
            assert passing.is_alive(), "the pass did not wait on the hung broker"
            assert oldest() >= seen + 1.0  # it grows while the pass waits
        finally:
            passing.join()
            stuck.close()
        # Kafka back (the stack's): the next pass publishes the row and the age drops
        OutboxRelay(session, publisher).run_once()
        assert oldest() < age
    assert [e.event_id for e in events_for(stack, {intent}, want=1)] == [event_id]


def _relay_gauge(stack: Stack, name: str) -> float | None:
    """A gauge on the stack's relay's own /metrics (None: not exported, or the relay is down)."""
    try:
        text = httpx.get(f"http://{stack.host}:{stack.layout.ports.relay}/metrics", timeout=5).text
    except httpx.HTTPError:
        return None
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " ")]
    return values[0] if values else None


def _unowned_alerts(stack: Stack) -> list[dict[str, Any]]:
    """OutboxShardsUnowned as the stack's Prometheus evaluates it (pending or firing)."""
    r = httpx.get(f"{stack.prometheus_url}/api/v1/alerts", timeout=10)
    r.raise_for_status()
    return [
        a
        for a in r.json()["data"]["alerts"]
        if a["labels"]["alertname"] == alert_rules.OUTBOX_SHARDS_UNOWNED
    ]


def test_shards_no_relay_holds_are_reported_and_alerted_on_the_running_stack(
    stack: Stack, cql: Session
) -> None:
    # Shards nobody holds are shards nobody drains: their rows are never published. The stack's
    # relay reports them (the gauge the OutboxShardsUnowned alert reads) and its Prometheus
    # evaluates the rule: pending (its `for` has not run out), never waited into firing here.
    unowned = metric_names.OUTBOX_RELAY_UNOWNED_SHARDS
    wait_for(lambda: _relay_gauge(stack, unowned) == 0, 60, "the relay reporting no unowned shard")
    # 1. A member that heartbeats but takes no lease (hung between its heartbeat and its takes,
    # or its LWTs failing): the assignment gives it half the shards, so the stack's relay gives
    # those back at its next renewal and nobody drains them.
    ghost = f"ghost-{uuid.uuid4().hex[:8]}"
    cql.execute(
        "INSERT INTO outbox_relay_leases (scope, kind, ref, owner) "
        "VALUES ('outbox', 'member', %s, %s) USING TTL 300",
        (ghost, ghost),
    )
    try:
        half = OUTBOX_SHARDS // 2
        wait_for(lambda: _relay_gauge(stack, unowned) == half, 60, f"{half} unowned shards")
        assert _relay_gauge(stack, metric_names.OUTBOX_RELAY_OWNED_SHARDS) == half
        # Prometheus may have scraped the relay mid-change first (a value below `half`): the
        # alert's value follows the samples, so wait for the one the relay reports now
        (alert,) = wait_for(
            lambda: [a for a in _unowned_alerts(stack) if float(a["value"]) == half],
            120,
            f"OutboxShardsUnowned pending in Prometheus with {half} shards",
        )
        assert alert["state"] == "pending"
        assert alert["annotations"]["runbook"] == "outbox-shards-unowned"
    finally:
        cql.execute(
            "DELETE FROM outbox_relay_leases WHERE scope = 'outbox' AND kind = 'member' "
            "AND ref = %s",
            (ghost,),
        )
    # the member gone, the relay takes the shards back
    wait_for(lambda: _relay_gauge(stack, unowned) == 0, 60, "the shards taken back")
    wait_for(lambda: not _unowned_alerts(stack), 120, "OutboxShardsUnowned inactive again")
    # 2. No relay at all: nothing reports, every shard is undrained; the rule's absent() half
    stack.cli("local", "stop", "outbox-relay")
    try:
        (alert,) = wait_for(
            lambda: _unowned_alerts(stack), 120, "OutboxShardsUnowned pending, no relay"
        )
        assert alert["state"] == "pending"
        assert alert["annotations"]["summary"].startswith("No outbox relay replica")
    finally:
        stack.up()
    wait_for(lambda: _relay_gauge(stack, unowned) == 0, 60, "the restarted relay's leases")
