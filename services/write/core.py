"""The write path in the seed's order: idem-store GET → edge + outbox in one partition-local
conditional BATCH → publish → idem SET → 202.

The edge-store is also the durable dedup: every applied intent leaves an `intent` row (24 h TTL)
in the user's partition, written in the same BATCH as the edge, so a retry whose idem key was never
SET (a crash between commit and SET) finds its intent and cannot apply a second time, even after
later intents changed the edge (invariant 7: like → unlike → like, any retry order).

Across regions (review D3) the batch is serialised per data centre (LOCAL_SERIAL). A retry that
lands in the other region before this region's intent row has replicated there (a failover, or a
severed link; the idem-store is regional too) finds neither the intent nor the liked edge and
applies again: both regions publish an event with the same intent_uuid and each region's
aggregator folds its own into its own cells, so the post counts one like twice. The edge rows
merge to one (last write wins), so has_liked and the edge count stay right. Decision: keep
LOCAL_SERIAL (SERIAL would put a cross-region Paxos round on every like and refuse every write
while the link is down, which the seed rules out) and let the reconciler repair it:
`likes recount` counts the distinct liked edges and writes the difference into the post's
correction cell (invariant 6). Bounded: only an intent whose first answer was lost and whose
retry crossed regions within the replication lag (milliseconds; the length of a link outage).
Not built: dedup across regions by intent_uuid (a region's aggregator would have to see the
peer's events before folding its own; the mirrored topics refresh aggregates and are never
counted).
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import redis
from cassandra.cluster import Session
from cassandra.query import UNSET_VALUE, BatchStatement, BatchType, ConsistencyLevel
from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.serialization import MessageField, SerializationContext

from services.common import observability
from services.contracts import bloom, degrade, events, keys
from services.contracts.clients import CASSANDRA_ERRORS, CASSANDRA_REFUSED, REDIS_ERRORS
from services.contracts.signals import NO_SIGNALS, Signals

log = logging.getLogger("write")

IDEM_TTL_S = 86400
OUTBOX_SHARDS = 16
Action = Literal["like", "unlike"]


class Unavailable(Exception):
    """A dependency the write must not proceed without is down: answer 503 + Retry-After."""

    def __init__(self, dependency: str, detail: str) -> None:
        super().__init__(f"{dependency} unavailable: {detail}")
        self.dependency = dependency


class KeyReused(Exception):
    """The Idempotency-Key was already used for a different request."""


class Degraded(Exception):
    """The user is degraded (services/contracts/degrade.py): one like per GATE_S; answer 429."""

    def __init__(self, retry_after_s: int) -> None:
        super().__init__(f"degraded account: next like in {retry_after_s} s")
        self.retry_after_s = retry_after_s


class Refused(Exception):
    """The edge-store refused the request itself (e.g. a user id longer than a partition key
    may be): nothing was written and a retry is refused again, so a 4xx, not a 503 (review D12)."""

    def __init__(self, detail: str) -> None:
        super().__init__(f"the edge-store refused the request: {detail}")


@dataclass(frozen=True)
class Intent:
    user_id: str
    post_id: str
    action: Action
    reaction: str
    intent_uuid: str
    # what the abuse scorer reads off the event; not part of the request's identity (a retry
    # from another IP is the same intent)
    signals: Signals = NO_SIGNALS

    @property
    def target_state(self) -> str:
        return "liked" if self.action == "like" else "unliked"

    @property
    def fingerprint(self) -> str:
        raw = f"{self.post_id}\x00{self.action}\x00{self.reaction}"
        return hashlib.sha256(raw.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Outcome:
    intent_uuid: str
    state: str
    changed: bool
    replayed: bool = False
    event_id: str | None = None
    published: bool = False

    def body(self) -> dict[str, Any]:
        return {"intent_uuid": self.intent_uuid, "state": self.state, "changed": self.changed}


def outbox_shard(user_id: str) -> int:
    return zlib.crc32(user_id.encode()) % OUTBOX_SHARDS


class Statements:
    """Prepared once per session."""

    def __init__(self, session: Session) -> None:
        p = session.prepare
        self.marker = p(
            "INSERT INTO outbox_pending (bucket, shard, created_at, event_id, user_id) "
            "VALUES (?, ?, ?, ?, ?)"
        )
        # the intent row remembers which post and which state its key asked for: a key reused
        # for another request is refused instead of answered with the first one's outcome. Its
        # `topic` names the topic of the event it produced (none: a no-op), so a replay answered
        # from it says `changed` as the first answer did (review D8).
        self.intent = p(
            "INSERT INTO edges (user_id, kind, ref, state, intent_uuid, updated_at, post_id, "
            "topic) VALUES (?, 'intent', ?, ?, ?, ?, ?, ?) IF NOT EXISTS USING TTL 86400"
        )
        # like: from no edge or 'unliked'; unlike: only from 'liked' (an unlike of nothing is a
        # no-op, never a -1)
        self.to_liked = p(
            "UPDATE edges SET state = 'liked', reaction = ?, void = false, updated_at = ?, "
            "intent_uuid = ? WHERE user_id = ? AND kind = 'edge' AND ref = ? IF state != 'liked'"
        )
        # conditional on the void flag read with the reaction: an unlike of a voided edge is
        # the transition without the -1 (the void took the like out of the count already)
        self.to_unliked = p(
            "UPDATE edges SET state = 'unliked', reaction = ?, updated_at = ?, intent_uuid = ? "
            "WHERE user_id = ? AND kind = 'edge' AND ref = ? "
            "IF state = 'liked' AND reaction = ? AND void = ?"
        )
        self.outbox = p(
            "INSERT INTO edges (user_id, kind, ref, post_id, topic, kafka_key, payload, "
            "created_at, published, intent_uuid, traceparent) "
            "VALUES (?, 'outbox', ?, ?, ?, ?, ?, ?, false, ?, ?)"
        )
        self.edge_state = p(
            "SELECT state FROM edges WHERE user_id = ? AND kind = 'edge' AND ref = ?"
        )
        self.edge_reaction = p(
            "SELECT reaction, void FROM edges WHERE user_id = ? AND kind = 'edge' AND ref = ?"
        )
        self.delete_outbox = p(
            "DELETE FROM edges WHERE user_id = ? AND kind = 'outbox' AND ref = ?"
        )
        self.delete_marker = p(
            "DELETE FROM outbox_pending WHERE bucket = ? AND shard = ? AND created_at = ? "
            "AND event_id = ?"
        )


class Publisher:
    """A Kafka producer with a poll thread; `publish` returns a future of the delivery."""

    def __init__(self, producer: Producer) -> None:
        self.producer = producer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="kafka-poll", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self.producer.poll(0.1)

    def publish(
        self, topic: str, key: str, value: bytes | None,
        headers: list[tuple[str, str | bytes | None]] | None = None,
    ) -> Future[None]:  # fmt: skip
        fut: Future[None] = Future()

        def done(err: KafkaError | None, _msg: Message) -> None:
            if err is None:
                fut.set_result(None)
            else:  # the KafkaError goes along: the relay tells a row's fault from a broker's
                fut.set_exception(KafkaException(err))

        try:
            self.producer.produce(
                topic, key=key.encode(), value=value, headers=headers, on_delivery=done
            )
        except (BufferError, KafkaException) as e:
            # local queue full, or the client refused the message: the like is committed, the
            # outbox relay will publish it; never a 500 after the commit (review D12)
            fut.set_exception(e)
        return fut

    def close(self, timeout: float = 5.0) -> None:
        self.producer.flush(timeout)
        self._stop.set()
        self._thread.join(timeout)


class LikeWriter:
    def __init__(
        self,
        *,
        session: Session,
        idem: redis.Redis | redis.RedisCluster,
        publisher: Publisher,
        serialize: Callable[[events.LikeEvent, SerializationContext], bytes | None],
        region: str,
        shard_for: Callable[[str], int] = lambda _post: 0,
        publish_wait_s: float = 2.0,
        count_cache: Any = None,
    ) -> None:
        self.session = session
        self.idem = idem
        self.publisher = publisher
        self.serialize = serialize
        self.region = region
        self.shard_for = shard_for  # split posts spread their events over sub-keys
        self.publish_wait_s = publish_wait_s
        self.count_cache = count_cache  # for the liker's Bloom filter bit
        self.q = Statements(session)

    # -- idem-store -------------------------------------------------------------------------
    def _idem_get(self, it: Intent) -> Outcome | None:
        try:
            raw = self.idem.get(keys.idem_key(it.user_id, it.post_id, it.intent_uuid))
        except REDIS_ERRORS as e:
            raise Unavailable("idem-store", str(e)) from e
        if raw is None:
            return None
        try:
            stored = json.loads(str(raw))
            fingerprint, state, changed = stored.get("fp"), stored["state"], stored["changed"]
        except (ValueError, KeyError, TypeError, AttributeError):
            # corrupt or from an older format: not an answer; the key's intent row decides
            # whether this is a replay (review D12: it was a 500)
            log.warning("unreadable idem value; deciding from the intent row")
            return None
        if fingerprint != it.fingerprint:
            raise KeyReused(it.intent_uuid)
        return Outcome(it.intent_uuid, state, changed, replayed=True)

    def _idem_set(self, it: Intent, out: Outcome) -> None:
        value = {
            "state": out.state,
            "changed": out.changed,
            "event_id": out.event_id,
            "fp": it.fingerprint,
            "ts": int(time.time()),
        }
        try:
            self.idem.set(
                keys.idem_key(it.user_id, it.post_id, it.intent_uuid), json.dumps(value),
                ex=IDEM_TTL_S,
            )  # fmt: skip
        except REDIS_ERRORS as e:
            # the like is committed and its intent row dedups any retry: still a 202
            log.warning("idem SET failed after commit", extra={"fields": {"error": str(e)}})

    # -- the write --------------------------------------------------------------------------
    def write(self, it: Intent) -> Outcome:
        cached = self._idem_get(it)  # 1. before any side effect; down → fail closed
        if cached is not None:
            return cached
        if it.action == "like":  # a degraded account's likes wait their turn (unlikes are free)
            try:
                wait = degrade.admit(self.idem, it.user_id)
            except REDIS_ERRORS as e:
                raise Unavailable("idem-store", str(e)) from e
            if wait:
                raise Degraded(wait)

        shard = self.shard_for(it.post_id)
        # An unlike takes back the reaction the edge holds, not the request's (review D5: like
        # "love" then unlike folded as love +1, like -1 forever). The batch is conditional on
        # that reaction, so a reaction read stale is caught by the LWT and retried with the
        # stored one. A like of an already-liked edge is a no-op whatever its reaction: to
        # change a reaction, unlike then like (each one event, each counted once).
        # The same for a void (services/abuse/voids.py): an unlike of a voided edge subtracts
        # nothing, so its event has delta 0.
        reaction, void = self._stored(it) if it.action == "unlike" else (it.reaction, False)
        # the outbox row keeps the request's trace: a relay that publishes it later continues it
        trace = observability.traceparent()
        for _ in range(3):
            rows, event, payload, bucket, oshard, now = self._commit(
                it, shard, reaction, void, trace
            )
            if rows and rows[0].applied:
                break
            edge = next((r for r in rows if getattr(r, "kind", None) == "edge"), None)
            if (
                it.action != "unlike"
                or any(getattr(r, "kind", None) == "intent" for r in rows)
                or edge is None
                or edge.state != "liked"
                or (edge.reaction, edge.void) == (reaction, void)
            ):
                break
            # changed between our read and the batch: take back what the edge holds now
            reaction, void = edge.reaction, edge.void

        applied = bool(rows and rows[0].applied)
        if not applied:
            out = self._not_applied(it, rows, now)
            self._idem_set(it, out)
            return out

        if it.action == "like" and self.count_cache is not None:
            # the liker's has_liked turns true at once; the aggregator sets the same bit again
            # before it commits the event, so a failure here is only a short delay
            try:
                bloom.add(self.count_cache, it.user_id, it.post_id)
            except Exception as e:
                log.warning(
                    "bloom add deferred to the aggregator", extra={"fields": {"error": str(e)}}
                )

        # 3. publish; a failure or a slow ack still answers 202: the outbox row stays for the relay
        published = False
        fut = self.publisher.publish(
            events.COMMITTED, keys.kafka_key(it.post_id, shard), payload,
            headers=observability.trace_headers(),  # the aggregator links its window to it
        )  # fmt: skip
        fut.add_done_callback(
            lambda f: self._after_publish(f, it.user_id, event.event_id, bucket, oshard, now)
        )
        try:
            fut.result(timeout=self.publish_wait_s)
            published = True
        except Exception as e:
            log.warning("publish deferred to the outbox relay", extra={"fields": {"error": str(e)}})
        out = Outcome(it.intent_uuid, it.target_state, True, event_id=event.event_id,
                      published=published)  # fmt: skip
        self._idem_set(it, out)  # 4.
        return out

    def _stored(self, it: Intent) -> tuple[str | None, bool | None]:
        """The edge's reaction and void flag (an unlike's conditions)."""
        try:
            row = self.session.execute(self.q.edge_reaction, (it.user_id, it.post_id)).one()
        except CASSANDRA_REFUSED as e:
            raise Refused(str(e)) from e
        except CASSANDRA_ERRORS as e:
            raise Unavailable("edge-store", str(e)) from e
        return (row.reaction, row.void) if row is not None else (it.reaction, False)

    def _commit(
        self, it: Intent, shard: int, reaction: str | None, void: bool | None, trace: str | None
    ) -> tuple[list[Any], events.LikeEvent, bytes, int, int, datetime]:
        """2. The event, its marker, and the conditional batch (intent + edge + outbox row)."""
        delta = 1 if it.action == "like" else 0 if void else -1
        event = events.LikeEvent.new(
            intent_uuid=it.intent_uuid, user_id=it.user_id, post_id=it.post_id,
            action=it.action, reaction=reaction or it.reaction, delta=delta, region=self.region,
            shard=shard, client_ip=it.signals.client_ip, device=it.signals.device,
            account_created=it.signals.account_created_ms,
        )  # fmt: skip
        try:  # serialize first: the outbox row keeps the exact bytes that get published
            payload = self.serialize(
                event, SerializationContext(events.COMMITTED, MessageField.VALUE)
            )
        except Exception as e:  # the registry is unreachable or refuses the schema
            raise Unavailable("schema-registry", str(e)) from e
        if payload is None:
            raise Unavailable("schema-registry", "the serializer produced no value")

        now = datetime.now(UTC)
        intent_id = uuid.UUID(it.intent_uuid)
        event_id = uuid.UUID(event.event_id)
        bucket = int(now.timestamp() // 60)
        oshard = outbox_shard(it.user_id)
        try:
            # 2a. the relay's work-list marker, before the batch (see 002_tables.cql)
            self.session.execute(self.q.marker, (bucket, oshard, now, event_id, it.user_id))
        except CASSANDRA_REFUSED as e:
            raise Refused(str(e)) from e
        except CASSANDRA_ERRORS as e:
            raise Unavailable("edge-store", str(e)) from e
        try:
            # 2b. intent + edge transition + outbox row: one partition, one Paxos round
            batch = BatchStatement(
                batch_type=BatchType.UNLOGGED,
                serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL,  # per region: docstring, D3
            )
            batch.consistency_level = ConsistencyLevel.LOCAL_QUORUM
            batch.add(
                self.q.intent,
                (it.user_id, it.intent_uuid, it.target_state, intent_id, now, it.post_id,
                 events.COMMITTED),
            )  # fmt: skip
            if it.action == "like":
                batch.add(self.q.to_liked, (it.reaction, now, intent_id, it.user_id, it.post_id))
            else:
                batch.add(
                    self.q.to_unliked,
                    (reaction, now, intent_id, it.user_id, it.post_id, reaction, void),
                )
            batch.add(
                self.q.outbox,
                (
                    it.user_id,
                    event.event_id,
                    it.post_id,
                    events.COMMITTED,
                    keys.kafka_key(it.post_id, shard),
                    payload,
                    now,
                    intent_id,
                    trace,
                ),
            )
            rows = list(self.session.execute(batch))
        except CASSANDRA_REFUSED as e:
            # refused before any replica applied it, so its marker points at nothing: take it
            # back now. The relay drops such a marker too, but can only look its row up under a
            # key the store refuses as well (services/relay/core.py).
            self._drop_marker(bucket, oshard, now, event_id)
            raise Refused(str(e)) from e
        except CASSANDRA_ERRORS as e:
            raise Unavailable("edge-store", str(e)) from e
        return rows, event, payload, bucket, oshard, now

    def _drop_marker(
        self, bucket: int, oshard: int, created: datetime, event_id: uuid.UUID
    ) -> None:
        drop_marker(self.session, self.q, bucket, oshard, created, event_id)

    def _not_applied(self, it: Intent, rows: list[Any], now: datetime) -> Outcome:
        """The batch did not apply: either this intent was applied before (a retry whose idem
        key is missing) or the edge is already in the target state (a no-op that counts nothing).
        """
        # a failed LWT returns the current rows it checked (none when a row does not exist)
        by_kind = {getattr(r, "kind", None): r for r in rows}
        if "intent" in by_kind:  # a replay: answer what the intent produced
            return self._replayed(it, by_kind["intent"])
        # a no-op; record the intent so a late retry of it cannot apply after a later change
        try:
            res = self.session.execute(
                self.q.intent,
                (
                    it.user_id, it.intent_uuid, it.target_state, uuid.UUID(it.intent_uuid),
                    now, it.post_id, UNSET_VALUE,  # a no-op: no event, no topic (no null cell)
                ),
            ).one()  # fmt: skip
        except CASSANDRA_ERRORS as e:
            raise Unavailable("edge-store", str(e)) from e
        if res is not None and not res.applied and res.state:
            return self._replayed(it, res)
        state = getattr(by_kind.get("edge"), "state", None) or "unliked"
        return Outcome(it.intent_uuid, state, False)

    def _replayed(self, it: Intent, intent_row: Any) -> Outcome:
        """The first answer, rebuilt from the key's intent row: an intent that produced an event
        changed the edge (DESIGN: a replay of the same key returns the first answer; review D8).
        Intent rows written before they named their topic answer `changed: false` (24 h TTL)."""
        self._same_request(it, intent_row)
        changed = getattr(intent_row, "topic", None) is not None
        return Outcome(it.intent_uuid, intent_row.state, changed, replayed=True)

    @staticmethod
    def _same_request(it: Intent, intent_row: Any) -> None:
        """A replay must be the same request: the key's intent row names its post and the state
        it asked for (rows written before they did carry no post: taken as the same request)."""
        post = getattr(intent_row, "post_id", None)
        if (post is not None and post != it.post_id) or intent_row.state != it.target_state:
            raise KeyReused(it.intent_uuid)

    def _after_publish(
        self, fut: Future[None], user_id: str, event_id: str, bucket: int, oshard: int,
        created: datetime,
    ) -> None:  # fmt: skip
        after_publish(
            self.session, self.q, fut, user_id, event_id, bucket, oshard, created, self.idem
        )

    def has_liked(self, user_id: str, post_id: str) -> bool:
        row = self.session.execute(self.q.edge_state, (user_id, post_id)).one()
        return bool(row and row.state == "liked")


def drop_marker(
    session: Session, q: Statements, bucket: int, oshard: int, created: datetime,
    event_id: uuid.UUID,
) -> None:  # fmt: skip
    """Take back the marker of a batch the store refused (it points at nothing)."""
    try:
        session.execute(q.delete_marker, (bucket, oshard, created, event_id))
    except CASSANDRA_ERRORS as e:  # the relay drops it once it is stale
        log.warning("refused write's marker left to the relay",
                    extra={"fields": {"error": str(e)}})  # fmt: skip


def after_publish(
    session: Session, q: Statements, fut: Future[None], user_id: str, event_id: str,
    bucket: int, oshard: int, created: datetime, idem: Any = None,
) -> None:  # fmt: skip
    """Once Kafka has an outbox event, its row and marker are done with (the write path's and
    the abuse scorer's voids alike). If the row cannot be deleted, a note in the idem-store
    (`idem`) tells the relay the event is already in Kafka (note_published).

    Runs on the producer's poll thread, which serves every delivery: fire the deletes
    asynchronously so one slow round trip does not hold up the other writes' acks."""
    if fut.exception() is not None:
        return

    def failed(e: BaseException) -> None:  # the marker alone: the relay drops it, no row left
        log.warning("outbox cleanup failed", extra={"fields": {"error": str(e)}})

    def row_left(e: BaseException) -> None:
        failed(e)
        if idem is not None:  # off the driver's IO thread, where an errback runs
            _NOTES.submit(note_published, idem, event_id)

    try:
        session.execute_async(q.delete_outbox, (user_id, event_id)).add_errback(row_left)
    except CASSANDRA_ERRORS as e:
        row_left(e)
    try:
        session.execute_async(
            q.delete_marker, (bucket, oshard, created, uuid.UUID(event_id))
        ).add_errback(failed)
    except CASSANDRA_ERRORS as e:
        failed(e)


# Outbox rows whose event Kafka acked but whose delete failed (the edge-store lost its quorum
# after the batch applied) used to be republished by the relay once the store came back, minutes
# later: past the aggregator's dedup horizon, so the like counted twice (the game day's
# edge-store-quorum-loss, invariant 2). The writer notes such an event in the idem-store, which
# does not share the edge-store's fault, and the relay cleans the row up instead of republishing.
# A note that cannot be written either (both stores failing at once) leaves the old behaviour:
# a republish, a double count if it is that late, which `likes recount` repairs.
_NOTES = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox-note")


def note_published(idem: Any, event_id: str) -> None:
    """Note in the idem-store that Kafka has this outbox event (keys.published_key): kept as
    long as an idempotency key, longer than an outbox row waits for a store to come back."""
    try:
        idem.set(keys.published_key(event_id), "1", ex=IDEM_TTL_S)
    except REDIS_ERRORS as e:
        log.warning(
            "no note of a published outbox event: the relay will republish it",
            extra={"fields": {"event_id": event_id, "error": str(e)}},
        )


def published_noted(idem: Any, event_ids: list[str]) -> set[str]:
    """The event ids among these that Kafka is noted to have (note_published). Raises what the
    idem-store raises (REDIS_ERRORS)."""
    if not event_ids:
        return set()
    pipe = idem.pipeline()
    for e in event_ids:
        pipe.exists(keys.published_key(e))
    return {e for e, n in zip(event_ids, pipe.execute(), strict=True) if n}
