"""Voids and unvoids: how the abuse scorer takes a bot's like out of the count, and how
`likes abuse unvoid` puts it back (issue 13; the seed's "likes.voided" and "likes.unvoided").

The semantics, in DESIGN terms (invariant 6: a count equals the post's distinct, non-void liked
edges):

- A void is a compensating event on `likes.voided` (delta -1), never an edit of the like's
  event. It voids the edge's CURRENT intent only: the edge-store write is conditional
  (`IF state = 'liked' AND intent_uuid = <the like's intent> AND void = false`). A like the user
  took back, or liked again since (a new intent, scored on its own), is not voided.
- The void and its event are one single-partition batch in the edge-store: the edge's
  `void = true, void_id = <this void>` and an outbox row for the event, as the write path does
  for a like. The event is then published at once; if that fails or the process dies, the outbox
  relay publishes the row. So a void that applied always reaches the log, and a void is applied
  at most once (the condition), whoever retries it.
- Dedup keys live in their own space: a void's `intent_uuid` is uuid5(like intent, model version),
  an unvoid's is uuid5(void intent). Consumers dedup per topic-partition, so neither can swallow
  the like's intent (or each other), and a retried void or unvoid is the same intent again.
- An unvoid (a bad model deploy) is conditional on that void: `IF state = 'liked' AND void = true
  AND void_id = <the void>`, then `likes.unvoided` (delta +1). An edge the user unliked while it
  was void, or liked again (void = false), is not unvoided: neither took the void back into the
  count.
- An unlike of a voided edge subtracts nothing (services/write/core.py: its event has delta 0),
  so a like, its void and its unlike net to 0, once.
- The counts are PN-counters summed over cells, so the order the aggregator folds these events
  in does not matter: a void folded before its like (the voided topic's partition read ahead of
  the committed one) is held in its own cell (`<region>@likes.voided#p`) until the like lands,
  and the sum is exact once both are in. Readers never show a negative count meanwhile.
- The model's mistakes are voids of human likes (false positives) and bots' likes left in (false
  negatives): `likes abuse evaluate` reports them; neither is count drift, since a count follows
  the edges it voided, exactly.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any

from cassandra.cluster import Session
from cassandra.query import BatchStatement, BatchType, ConsistencyLevel
from confluent_kafka.serialization import MessageField, SerializationContext

from services.contracts import events, keys
from services.contracts.clients import CASSANDRA_ERRORS
from services.write.core import (
    Publisher,
    Statements,
    Unavailable,
    after_publish,
    drop_marker,
    outbox_shard,
)

log = logging.getLogger("abuse.voids")

# uuid5 namespace of void and unvoid intents (fixed forever: a retried void must be the same)
NAMESPACE = uuid.UUID("6f1d2a4e-58c3-4c1b-9a7e-3d2b1f0c9e11")
# voids of one user per conditional batch: each adds a condition and two rows (~0.5 KB with its
# event), so 10 stay under Cassandra's 5 KB batch warning; a bot's burst is a few batches
VOID_BATCH = 10


def void_intent(like_intent: str, model_version: str) -> str:
    return str(uuid.uuid5(NAMESPACE, f"void\x00{like_intent}\x00{model_version}"))


def unvoid_intent(void_intent_uuid: str) -> str:
    return str(uuid.uuid5(NAMESPACE, f"unvoid\x00{void_intent_uuid}"))


@dataclass(frozen=True)
class Result:
    """What a void or unvoid did: `applied` (this call changed the edge), `replayed` (an earlier
    attempt of the same void had: its outbox row carries the event), or neither, with `reason`."""

    applied: bool
    reason: str  # voided | unvoided | replayed | not-liked | superseded | already-void | not-void
    event: events.LikeEvent | None = None
    published: bool = False

    @property
    def done(self) -> bool:
        return self.applied or self.reason == "replayed"


class Voider:
    """The edge-store side of voids and unvoids, and their events (see the module docstring)."""

    def __init__(
        self,
        *,
        session: Session,
        publisher: Publisher,
        serialize: Callable[[events.LikeEvent, SerializationContext], bytes | None],
        region: str,
        publish_wait_s: float = 2.0,
        idem: Any = None,
    ) -> None:
        """`idem`: the idem-store, where a void Kafka acked but whose outbox row could not be
        deleted is noted, so the relay does not publish it again (write/core.py after_publish)."""
        self.session = session
        self.idem = idem
        self.publisher = publisher
        self.serialize = serialize
        self.region = region
        self.publish_wait_s = publish_wait_s
        self.q = Statements(session)
        p = session.prepare
        self.void_edge = p(
            "UPDATE edges SET void = true, void_id = ?, updated_at = ? "
            "WHERE user_id = ? AND kind = 'edge' AND ref = ? "
            "IF state = 'liked' AND intent_uuid = ? AND void = false"
        )
        self.unvoid_edge = p(
            "UPDATE edges SET void = false, updated_at = ? "
            "WHERE user_id = ? AND kind = 'edge' AND ref = ? "
            "IF state = 'liked' AND void = true AND void_id = ?"
        )
        self.edge = p(
            "SELECT state, intent_uuid, void, void_id FROM edges "
            "WHERE user_id = ? AND kind = 'edge' AND ref = ?"
        )

    def _void_event(self, like: events.LikeEvent, model_version: str, score: float) -> Any:
        """The void event of `like` and its conditional edge write, at `now`."""
        intent = void_intent(like.intent_uuid, model_version)
        event = replace(
            events.LikeEvent.new(
                intent_uuid=intent, user_id=like.user_id, post_id=like.post_id, action="void",
                reaction=like.reaction, delta=-1, region=self.region, shard=like.shard,
            ),
            subject_event_id=like.event_id, subject_intent_uuid=like.intent_uuid,
            model_version=model_version, abuse_score=score,
        )  # fmt: skip
        now = datetime.now(UTC)
        cond = self.void_edge.bind(
            (uuid.UUID(intent), now, like.user_id, like.post_id, uuid.UUID(like.intent_uuid))
        )
        return event, cond, now

    def void_many(
        self, likes: Sequence[tuple[events.LikeEvent, float]], model_version: str
    ) -> list[Result | Unavailable]:
        """One user's voids (likes with their scores), in order, each answered as `void` would:
        a Result, or the Unavailable that stopped it. Up to VOID_BATCH of them go in ONE
        conditional batch on the user's partition: one Paxos round instead of one per like, and
        a bot's likes come in bursts (bench/bench_abuse.py: a storm's voids one by one held the
        scorer's loop 85 % of the time). The batch applies only if every condition holds; if
        one does not (a like taken back or superseded, or a replay of voids already applied),
        nothing was written and each void of that chunk is written on its own, answering for
        itself. A chunk naming one post twice goes one by one too (two conditions on one row)."""
        out: list[Result | Unavailable] = []
        for start in range(0, len(likes), VOID_BATCH):
            chunk = likes[start : start + VOID_BATCH]
            users = {like.user_id for like, _ in chunk}
            if len(users) != 1:
                raise ValueError(f"void_many takes one user's likes, got {sorted(users)}")
            batched: list[Result] | None = None
            if len(chunk) > 1 and len({like.post_id for like, _ in chunk}) == len(chunk):
                try:
                    batched = self._void_batch(chunk, model_version)
                except Unavailable as exc:
                    out.extend([exc] * len(chunk))
                    continue
            if batched is not None:
                out.extend(batched)
                continue
            for like, score in chunk:
                try:
                    out.append(self.void(like, model_version, score))
                except Unavailable as exc:
                    out.append(exc)
        return out

    def _void_batch(
        self, chunk: Sequence[tuple[events.LikeEvent, float]], model_version: str
    ) -> list[Result] | None:
        """The chunk's voids in one conditional batch; None when it did not apply (nothing was
        written: the markers are taken back)."""
        made = [self._void_event(like, model_version, score) for like, score in chunk]
        now = made[0][2]
        user = chunk[0][0].user_id
        bucket, oshard = int(now.timestamp() // 60), outbox_shard(user)
        payloads = [self._serialize(event, events.VOIDED) for event, _, _ in made]
        markers = BatchStatement(batch_type=BatchType.UNLOGGED)  # one partition: (bucket, shard)
        batch = BatchStatement(
            batch_type=BatchType.UNLOGGED, serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL
        )
        batch.consistency_level = ConsistencyLevel.LOCAL_QUORUM
        for (event, cond, _), payload in zip(made, payloads, strict=True):
            markers.add(self.q.marker, (bucket, oshard, now, uuid.UUID(event.event_id), user))
            batch.add(cond)
            batch.add(
                self.q.outbox,
                (user, event.event_id, event.post_id, events.VOIDED,
                 keys.kafka_key(event.post_id, event.shard), payload, now,
                 uuid.UUID(event.intent_uuid), None),
            )  # fmt: skip
        try:
            self.session.execute(markers)
            rows = list(self.session.execute(batch))
        except CASSANDRA_ERRORS as e:  # markers without their rows: the relay drops them
            raise Unavailable("edge-store", str(e)) from e
        if not (rows and rows[0].applied):
            for event, _, _ in made:
                drop_marker(self.session, self.q, bucket, oshard, now, uuid.UUID(event.event_id))
            return None
        published = self._publish_all(
            [(event, payload) for (event, _, _), payload in zip(made, payloads, strict=True)],
            events.VOIDED, now,
        )  # fmt: skip
        return [
            Result(True, "voided", event, ok)
            for (event, _, _), ok in zip(made, published, strict=True)
        ]

    def void(self, like: events.LikeEvent, model_version: str, score: float) -> Result:
        """Void `like` (an event of likes.committed) if it is still the edge's current intent."""
        event, cond, now = self._void_event(like, model_version, score)
        intent = event.intent_uuid
        payload = self._apply(cond, event, events.VOIDED, now)
        if payload is not None:
            return Result(True, "voided", event, self._publish(event, payload, events.VOIDED, now))
        edge = self._edge(like.user_id, like.post_id)
        if edge is None or edge.state != "liked":
            return Result(False, "not-liked")
        if str(edge.intent_uuid) != like.intent_uuid:
            return Result(False, "superseded")
        if edge.void and str(edge.void_id) == intent:
            return Result(False, "replayed")  # our own earlier attempt: its outbox row publishes
        return Result(False, "already-void")

    def unvoid(self, void: events.LikeEvent) -> Result:
        """Take back `void` (an event of likes.voided) if the edge still holds exactly it."""
        if void.action != "void" or void.subject_intent_uuid is None:
            raise ValueError(f"not a void event: {void.action} {void.intent_uuid}")
        intent = unvoid_intent(void.intent_uuid)
        event = replace(
            events.LikeEvent.new(
                intent_uuid=intent, user_id=void.user_id, post_id=void.post_id, action="unvoid",
                reaction=void.reaction, delta=1, region=self.region, shard=void.shard,
            ),
            subject_event_id=void.subject_event_id, subject_intent_uuid=void.subject_intent_uuid,
            model_version=void.model_version,
        )  # fmt: skip
        now = datetime.now(UTC)
        cond = self.unvoid_edge.bind((now, void.user_id, void.post_id, uuid.UUID(void.intent_uuid)))
        payload = self._apply(cond, event, events.UNVOIDED, now)
        if payload is not None:
            return Result(
                True, "unvoided", event, self._publish(event, payload, events.UNVOIDED, now)
            )
        edge = self._edge(void.user_id, void.post_id)
        if edge is None or edge.state != "liked":
            return Result(False, "not-liked")
        if not edge.void:
            # replayed: an earlier unvoid of ours applied (or a re-like cleared the void); its
            # outbox row publishes, and a re-like is a new intent that counted by itself
            return Result(False, "not-void")
        return Result(False, "superseded")  # another void holds the edge now

    # -- the batch and the publish, as the write path does them (services/write/core.py) ------
    def _apply(self, cond: Any, event: events.LikeEvent, topic: str, now: datetime) -> bytes | None:
        """The marker, then the conditional batch (edge + outbox row); the event's bytes if it
        applied, else None (and the marker is taken back)."""
        payload = self._serialize(event, topic)
        bucket, oshard = int(now.timestamp() // 60), outbox_shard(event.user_id)
        event_id = uuid.UUID(event.event_id)
        try:
            self.session.execute(self.q.marker, (bucket, oshard, now, event_id, event.user_id))
            batch = BatchStatement(
                batch_type=BatchType.UNLOGGED,
                serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL,
            )
            batch.consistency_level = ConsistencyLevel.LOCAL_QUORUM
            batch.add(cond)
            batch.add(
                self.q.outbox,
                (event.user_id, event.event_id, event.post_id, topic,
                 keys.kafka_key(event.post_id, event.shard), payload, now,
                 uuid.UUID(event.intent_uuid), None),
            )  # fmt: skip
            rows = list(self.session.execute(batch))
        except CASSANDRA_ERRORS as e:  # a marker without its row: the relay drops it
            raise Unavailable("edge-store", str(e)) from e
        if rows and rows[0].applied:
            return payload
        drop_marker(self.session, self.q, bucket, oshard, now, event_id)
        return None

    def _serialize(self, event: events.LikeEvent, topic: str) -> bytes:
        try:
            payload = self.serialize(event, SerializationContext(topic, MessageField.VALUE))
        except Exception as e:
            raise Unavailable("schema-registry", str(e)) from e
        if payload is None:
            raise Unavailable("schema-registry", "the serializer produced no value")
        return payload

    def _publish(self, event: events.LikeEvent, payload: bytes, topic: str, now: datetime) -> bool:
        """Publish now and wait for the ack (the caller commits its offsets after it); a failure
        leaves the outbox row to the relay."""
        return self._publish_all([(event, payload)], topic, now)[0]

    def _publish_all(
        self, sent: Sequence[tuple[events.LikeEvent, bytes]], topic: str, now: datetime
    ) -> list[bool]:
        """Publish each at once, then wait for their acks (publish_wait_s in all)."""
        bucket = int(now.timestamp() // 60)
        futs = []
        for event, payload in sent:
            fut = self.publisher.publish(topic, keys.kafka_key(event.post_id, event.shard), payload)
            fut.add_done_callback(self._after_publish(event, bucket, now))
            futs.append(fut)
        deadline = time.monotonic() + self.publish_wait_s
        out = []
        for fut in futs:
            try:
                fut.result(timeout=max(0.0, deadline - time.monotonic()))
                out.append(True)
            except Exception as e:
                log.warning("void publish deferred to the outbox relay",
                            extra={"fields": {"error": str(e), "topic": topic}})  # fmt: skip
                out.append(False)
        return out

    def _after_publish(
        self, event: events.LikeEvent, bucket: int, now: datetime
    ) -> Callable[[Any], None]:
        oshard = outbox_shard(event.user_id)
        return lambda f: after_publish(
            self.session, self.q, f, event.user_id, event.event_id, bucket, oshard, now, self.idem
        )

    def _edge(self, user_id: str, post_id: str) -> Any:
        """The edge as the conditional writes see it (a serial read: after any in-flight one)."""
        stmt = self.edge.bind((user_id, post_id))
        stmt.consistency_level = ConsistencyLevel.LOCAL_SERIAL
        try:
            return self.session.execute(stmt).one()
        except CASSANDRA_ERRORS as e:
            raise Unavailable("edge-store", str(e)) from e
