"""Drain the outbox: find markers in `outbox_pending`, publish their outbox rows, clean up.

Safe to run more than once: two relays may publish the same row twice, which is fine because the
event keeps its event_id and intent_uuid and every consumer dedups on intent_uuid. With `leases`,
a replica drains only the shards it holds a lease on (leases.py), so replicas do not all scan and
republish the same rows; without, it drains every shard (a tool, a test).

Consumers dedup only within their horizon (the aggregator's: 2 x convergence.HOLD_S), and a row
can outlive it: its writer's copy was acked but the row's delete failed with the edge-store,
which then kept the relay from reading the row for minutes. Such a row is noted in the
idem-store (services/write/core.py note_published), and the relay cleans it up unpublished.
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from cassandra.cluster import Session
from cassandra.query import ConsistencyLevel
from confluent_kafka import KafkaError, KafkaException
from prometheus_client import Counter, Gauge

from services.common import observability
from services.contracts import convergence, dlq, events, workloads
from services.contracts import metrics as names
from services.contracts.clients import CASSANDRA_ERRORS, CASSANDRA_REFUSED, REDIS_ERRORS
from services.relay.leases import ShardLeases
from services.write.core import OUTBOX_SHARDS, Publisher, note_published, published_noted

log = logging.getLogger("relay")

BACKLOG = Gauge(names.OUTBOX_BACKLOG, "Outbox events waiting to be published (last pass)")
OLDEST = Gauge(names.OUTBOX_OLDEST_AGE, "Age of the oldest unpublished outbox event")
LOOP_TIMESTAMP = Gauge(
    names.OUTBOX_RELAY_LOOP_TIMESTAMP, "Unix time the relay's loop last went round (a heartbeat)"
)
PUBLISHED = Counter(names.OUTBOX_PUBLISHED, "Outbox events the relay published")
FAILED = Counter(names.OUTBOX_PUBLISH_FAILURES, "Relay publish attempts that failed")
# "likes_<who>_dead_letter_total": the DeadLetterGrowth alert sums every such counter
DEAD_LETTERED = Counter(
    "likes_outbox_dead_letter", "Outbox rows the relay gave up on and sent to likes.dead-letter"
)
DEAD_LETTER_FAILURES = Counter(
    "likes_outbox_dead_letter_failures",
    "Dead-letter sends the topic refused (the row stays and is retried)",
)
ALREADY_PUBLISHED = Counter(
    names.OUTBOX_ALREADY_PUBLISHED,
    "Outbox rows cleaned up without a republish: Kafka had acked them (noted in the idem-store)",
)
LOW_WATER_AGE = Gauge(
    "likes_outbox_low_water_age_seconds",
    "Age of the oldest bucket the relay still scans (grows when a row pins it)",
)

BUCKET_S = 60  # a marker's bucket is its created_at in epoch minutes (002_tables.cql)
# a drained bucket is passed only once no writer within MAX_CLOCK_SKEW_S of the relay's clock can
# still put a marker into it (review D11: a lagging writer wrote into passed buckets, never read)
TRAILING_BUCKETS = 1 + math.ceil(convergence.MAX_CLOCK_SKEW_S / BUCKET_S)
DEAD_LETTER_SOURCE = "outbox"  # dlq.source of the relay's dead letters
RELAY_PUBLISH_SPAN = "outbox publish"  # a republished event's span, in its write's trace
IDEM_RETRY_S = 10.0  # an idem-store that failed a call is asked again after this


@dataclass
class PassResult:
    published: int = 0
    pending: int = 0
    dropped_markers: int = 0
    dead_lettered: int = 0
    already_published: int = 0  # cleaned up, not republished: their event is noted as in Kafka
    shards: frozenset[int] = frozenset()  # the shards this pass drained
    published_ids: list[str] = field(default_factory=list)  # event ids, in publish order


@dataclass
class _Failures:
    shard: int
    attempts: int = 0
    error: str = ""
    retriable: bool = True


def _retriable(e: BaseException) -> bool:
    """Whether Kafka may take this row later (a broker or the network); a row it refuses for
    what it is (too large, invalid) or cannot even be sent (no topic, no value) never will be."""
    if isinstance(e, KafkaException) and e.args and isinstance(e.args[0], KafkaError):
        err: KafkaError = e.args[0]
        return bool(err.retriable()) or err.code() in (
            KafkaError._MSG_TIMED_OUT, KafkaError._TIMED_OUT, KafkaError._TRANSPORT,
            KafkaError._ALL_BROKERS_DOWN, KafkaError.NOT_ENOUGH_REPLICAS,
            KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION,
            KafkaError._QUEUE_FULL,
        )  # fmt: skip
    return isinstance(e, (TimeoutError, BufferError))


class OutboxRelay:
    def __init__(
        self,
        session: Session,
        publisher: Publisher,
        *,
        # a writer whose clock lags by up to MAX_CLOCK_SKEW_S makes a marker look that much
        # older: it is dropped only once its batch cannot still be in flight even then
        stale_marker_s: float = 30.0 + convergence.MAX_CLOCK_SKEW_S,
        min_age_s: float = convergence.RELAY_REPUBLISH_AFTER_S,
        batch: int = 500,
        publish_wait_s: float = convergence.RELAY_PUBLISH_TIMEOUT_S,
        leases: ShardLeases | None = None,
        dead_letter_topic: str = events.DEAD_LETTER,
        dead_letter_attempts: int = 5,
        dead_letter_after_s: float = 1800.0,
        clock: Callable[[], float] = time.time,
        idem: Callable[[], Any] | None = None,
    ) -> None:
        """`idem` makes the idem-store's client, where a writer notes an event Kafka acked but
        whose row it could not delete (services/write/core.py note_published); it is called
        when first needed, and again until it connects (a relay must drain the outbox while
        the idem-store is down). None: every row is published (a tool, a test)."""
        self.session = session
        self._idem_factory = idem
        self._idem: Any = None
        # after the idem-store failed a call: not asked again until then (monotonic s), so a
        # pass over many buckets does not wait out its timeouts once per bucket
        self._idem_down_until = 0.0
        self.publisher = publisher
        self.stale_marker_s = stale_marker_s
        # a younger row is most likely being published by its writer right now (it waits up to
        # 2 s for the ack, then cleans up): leave it, or nearly every like goes out twice
        self.min_age_s = min_age_s
        self.batch = batch
        self.publish_wait_s = publish_wait_s
        self.leases = leases
        # a row that fails `dead_letter_attempts` times and is refused for what it is, or keeps
        # failing for `dead_letter_after_s`, goes to the dead-letter topic: it would otherwise
        # pin its shard's low-water mark, and every pass would scan every bucket since (D11)
        self.dead_letter_topic = dead_letter_topic
        self.dead_letter_attempts = dead_letter_attempts
        self.dead_letter_after_s = dead_letter_after_s
        self.clock = clock
        self._failures: dict[uuid.UUID, _Failures] = {}
        # The oldest pending row this relay knows of: lowered the moment a pass meets an older
        # one, replaced by the pass's whole view when it ends. OLDEST reads it when scraped, so
        # the age keeps growing while a pass waits on a hung Kafka. (Set only at a pass's end,
        # the gauge froze exactly then: a pass waits up to publish_wait_s per partition with
        # rows, and OutboxEventsStale never fired with every broker hung for 40 s.) One relay
        # per process: the last one made is the one the gauge reads.
        self._oldest_pending: float | None = None
        OLDEST.set_function(self._oldest_age)
        p = session.prepare
        self.q_markers = p(
            "SELECT created_at, event_id, user_id FROM outbox_pending "
            "WHERE bucket = ? AND shard = ? LIMIT ?"
        )
        self.q_row = p(
            "SELECT topic, payload, published, kafka_key, intent_uuid, traceparent FROM edges "
            "WHERE user_id = ? AND kind = 'outbox' AND ref = ?"
        )
        self.q_row_serial = p(
            "SELECT topic, payload, published, kafka_key, intent_uuid, traceparent FROM edges "
            "WHERE user_id = ? AND kind = 'outbox' AND ref = ?"
        )
        self.q_row_serial.consistency_level = ConsistencyLevel.LOCAL_SERIAL
        self.q_del_row = p("DELETE FROM edges WHERE user_id = ? AND kind = 'outbox' AND ref = ?")
        self.q_del_marker = p(
            "DELETE FROM outbox_pending WHERE bucket = ? AND shard = ? AND created_at = ? "
            "AND event_id = ?"
        )
        self.low_water: dict[int, int] = {}  # shard -> oldest bucket that may still hold markers

    def _oldest_age(self) -> float:
        oldest = self._oldest_pending
        return 0.0 if oldest is None else max(0.0, self.clock() - oldest)

    def _find_low_water(self, shards: Iterable[int], now_bucket: int) -> None:
        """For shards taken on (at start, or from another replica): the oldest bucket in use.
        The partition keys in use are few: drained buckets hold only tombstones, gone after
        gc_grace."""
        rows = self.session.execute("SELECT DISTINCT bucket, shard FROM outbox_pending")
        oldest: dict[int, int] = {}
        for r in rows:
            oldest[r.shard] = min(r.bucket, oldest.get(r.shard, r.bucket))
        floor = now_bucket - TRAILING_BUCKETS
        for s in shards:
            self.low_water[s] = min(oldest.get(s, floor), floor)

    def run_once(self) -> PassResult:
        """One pass over every owned shard, from its low-water bucket to now."""
        shards = frozenset(range(OUTBOX_SHARDS)) if self.leases is None else self.leases.refresh()
        now = self.clock()
        now_bucket = int(now // BUCKET_S)
        for s in set(self.low_water) - shards:  # given back or lapsed: its new owner drains it
            del self.low_water[s]
        self._failures = {e: f for e, f in self._failures.items() if f.shard in shards}
        if shards - set(self.low_water):
            self._find_low_water(shards - set(self.low_water), now_bucket)
        res = PassResult(shards=shards)
        oldest: float | None = None
        for shard in sorted(shards):
            if self.leases is not None:
                self.leases.refresh()  # renews when due: a long pass (slow acks) keeps its leases
            for bucket in range(self.low_water[shard], now_bucket + 1):
                if self.leases is not None and not self.leases.holds(shard):
                    break  # the lease is about to lapse: stop before another replica takes it
                empty, o = self._drain(bucket, shard, now, res)
                if o is not None:
                    oldest = o if oldest is None else min(oldest, o)
                if (
                    empty
                    and bucket == self.low_water[shard]
                    and bucket < now_bucket - TRAILING_BUCKETS
                ):
                    self.low_water[shard] = bucket + 1  # drained, and no writer can reach it
        BACKLOG.set(res.pending - res.published)
        self._oldest_pending = oldest
        lw = min(self.low_water.values(), default=now_bucket)
        LOW_WATER_AGE.set(max(0.0, now - lw * BUCKET_S))
        return res

    def _drain(
        self, bucket: int, shard: int, now: float, res: PassResult
    ) -> tuple[bool, float | None]:
        """Publish one (bucket, shard) partition's rows; (whether it was empty, the oldest row
        still pending after it: too young to take, or its publish failed)."""
        markers = list(self.session.execute(self.q_markers, (bucket, shard, self.batch)))
        oldest: float | None = None
        inflight: list[tuple[Future[None], Any, Any]] = []
        take: list[tuple[Any, Any]] = []  # (marker, row) old enough to publish
        for m in markers:
            try:
                row = self.session.execute(self.q_row, (m.user_id, str(m.event_id))).one()
            except CASSANDRA_REFUSED as e:
                # the store refuses the marker's user as a key (longer than a partition key may
                # be): its batch was refused the same way, no row can exist. Left, the marker
                # would fail every pass here and pin its shard (the writer deletes its own;
                # this one outlived a writer that died first).
                self.session.execute(self.q_del_marker, (bucket, shard, m.created_at, m.event_id))
                res.dropped_markers += 1
                log.error(
                    "dropped a marker whose row the edge-store cannot hold",
                    extra={"fields": {"event_id": str(m.event_id), "error": str(e)}},
                )
                continue
            created = m.created_at.replace(tzinfo=UTC).timestamp()
            if row is None and now - created > self.stale_marker_s:
                # about to drop: a batch whose client saw a CAS timeout may still be an accepted
                # Paxos proposal that the next LWT on this user completes, maybe hours later,
                # when no marker is left (review D1). A SERIAL read finishes any such round now:
                # after it, the row exists or never will.
                row = self.session.execute(self.q_row_serial, (m.user_id, str(m.event_id))).one()
            if row is None or row.published:
                # published and cleaned, or a batch that never applied (its client got a 503):
                # drop the marker once no write can still be in flight
                if row is not None or now - created > self.stale_marker_s:
                    self.session.execute(
                        self.q_del_marker, (bucket, shard, m.created_at, m.event_id)
                    )
                    res.dropped_markers += 1
                continue
            res.pending += 1
            if self._oldest_pending is None or created < self._oldest_pending:
                self._oldest_pending = created  # known now: its publish may hang
            if now - created < self.min_age_s:
                oldest = created if oldest is None else min(oldest, created)
                continue
            take.append((m, row))
        noted = self._noted([str(m.event_id) for m, _ in take])
        for m, row in take:
            if str(m.event_id) in noted:
                # its writer's ack came, its delete did not: republished now, minutes after the
                # writer's copy, the like would count twice
                ALREADY_PUBLISHED.inc()
                res.already_published += 1
                res.pending -= 1
                self._cleanup(m, bucket, shard)
                continue
            if row.topic is None or row.payload is None or row.kafka_key is None:
                fut: Future[None] = Future()
                fut.set_exception(ValueError("outbox row without topic, key or payload"))
            else:
                fut = self._publish(row, m.event_id)
            inflight.append((fut, m, row))
        for fut, m, row in inflight:
            try:
                fut.result(timeout=self.publish_wait_s)
            except Exception as e:
                FAILED.inc()
                log.warning("relay publish failed", extra={"fields": {"error": str(e)}})
                created = m.created_at.replace(tzinfo=UTC).timestamp()
                if self._failed(m, row, bucket, shard, now - created, e):
                    res.dead_lettered += 1
                    res.pending -= 1
                else:
                    oldest = created if oldest is None else min(oldest, created)
                continue
            self._failures.pop(m.event_id, None)
            PUBLISHED.inc()
            res.published += 1
            res.published_ids.append(str(m.event_id))
            if not self._cleanup(m, bucket, shard):
                idem = self._idem_client()
                if idem is not None:  # as a writer does: not published again
                    note_published(idem, str(m.event_id))
        return not markers, oldest

    def _noted(self, event_ids: list[str]) -> set[str]:
        """The events noted as already in Kafka. An idem-store that does not answer notes
        nothing: the rows are published (a like never published is lost; one published twice
        is deduped, or repaired by the reconciler)."""
        if not event_ids:
            return set()
        idem = self._idem_client()
        if idem is None:
            return set()
        try:
            return published_noted(idem, event_ids)
        except REDIS_ERRORS as e:
            self._idem_down_until = time.monotonic() + IDEM_RETRY_S
            log.warning(
                "idem-store unreadable: publishing without checking for notes",
                extra={"fields": {"error": str(e), "rows": len(event_ids)}},
            )
            return set()

    def _publish(self, row: Any, event_id: uuid.UUID) -> Future[None]:
        """Publish an outbox row as its writer would have, in the writer's trace: a span of the
        relay's, child of the write request's, whose context the message carries."""
        span, headers = observability.continued_hop(
            RELAY_PUBLISH_SPAN,
            row.traceparent,
            {"messaging.destination.name": row.topic, "likes.event_id": str(event_id)},
        )
        fut = self.publisher.publish(row.topic, row.kafka_key, row.payload, headers=headers)
        if span is not None:
            fut.add_done_callback(lambda f: observability.end_hop(span, f.exception()))
        return fut

    def _failed(
        self, m: Any, row: Any, bucket: int, shard: int, age_s: float, e: BaseException
    ) -> bool:
        """Count a failed publish; dead-letter the row once it is clearly the row's fault or has
        failed too long. True if it was dead-lettered (its marker is then gone)."""
        f = self._failures.setdefault(m.event_id, _Failures(shard))
        f.attempts += 1
        f.error, f.retriable = f"{type(e).__name__}: {e}", _retriable(e)
        if f.attempts < self.dead_letter_attempts or (
            f.retriable and age_s < self.dead_letter_after_s
        ):
            return False
        if not self._dead_letter(m, row, bucket, shard, f):
            return False
        self._failures.pop(m.event_id, None)
        try:  # the outbox row stays, unpublished: the record the dead letter refers to
            self.session.execute(self.q_del_marker, (bucket, shard, m.created_at, m.event_id))
        except CASSANDRA_ERRORS as err:  # the next pass finds it again and dead-letters again
            log.warning("relay marker delete failed", extra={"fields": {"error": str(err)}})
        return True

    def _dead_letter(self, m: Any, row: Any, bucket: int, shard: int, f: _Failures) -> bool:
        """Publish a dead letter for the row and wait for its ack. It carries the event itself
        (a replay publishes it to dlq.source.topic) or, if Kafka refuses that too (too large),
        only the reference to the outbox row, which stays in the edge-store."""
        hs: list[tuple[str, str | bytes | None]] = [
            (dlq.SOURCE, DEAD_LETTER_SOURCE.encode()),
            (dlq.SOURCE_TOPIC, (row.topic or "").encode()),
            (dlq.CONSUMER, workloads.OUTBOX_RELAY.name.encode()),
            (dlq.ERROR, f.error[: dlq.ERROR_MAX].encode()),
            (dlq.ATTEMPTS, str(f.attempts).encode()),
            (dlq.EVENT_ID, str(m.event_id).encode()),
            (dlq.OUTBOX_USER_ID, str(m.user_id).encode()),
            (dlq.OUTBOX_BUCKET, str(bucket).encode()),
            (dlq.OUTBOX_SHARD, str(shard).encode()),
        ]
        if row.intent_uuid is not None:
            hs.append((dlq.INTENT_UUID, str(row.intent_uuid).encode()))
        if row.traceparent is not None:  # a replay continues the write's trace
            hs.append(("traceparent", row.traceparent.encode()))
        key = row.kafka_key or str(m.user_id)
        reference: list[tuple[str, str | bytes | None]] = [(dlq.REFERENCE, b"1")]
        for value, extra in ((row.payload, []), (None, reference)):
            fut = self.publisher.publish(self.dead_letter_topic, key, value, headers=hs + extra)
            try:
                fut.result(timeout=self.publish_wait_s)
            except Exception as e:
                last = e
                continue
            DEAD_LETTERED.inc()
            log.error(
                "outbox row dead-lettered",
                extra={"fields": {"user_id": m.user_id, "event_id": str(m.event_id),
                                  "error": f.error, "attempts": f.attempts}},
            )  # fmt: skip
            return True
        DEAD_LETTER_FAILURES.inc()
        log.error(
            "dead-letter topic refused an outbox row; it stays and is retried",
            extra={"fields": {"user_id": m.user_id, "event_id": str(m.event_id),
                              "error": f.error, "dlq_error": str(last)}},
        )  # fmt: skip
        return False

    def _idem_client(self) -> Any:
        """The idem-store's client; None without one, or while it is taken as down."""
        if time.monotonic() < self._idem_down_until:
            return None
        if self._idem is None and self._idem_factory is not None:
            try:
                self._idem = self._idem_factory()
            except REDIS_ERRORS as e:
                self._idem_down_until = time.monotonic() + IDEM_RETRY_S
                log.warning("idem-store unreachable", extra={"fields": {"error": str(e)}})
        return self._idem

    def _cleanup(self, m: Any, bucket: int, shard: int) -> bool:
        """Delete a published row and its marker; False if the row may be left."""
        try:
            self.session.execute(self.q_del_row, (m.user_id, str(m.event_id)))
        except CASSANDRA_ERRORS as e:  # the next pass finds it again
            log.warning("relay cleanup failed", extra={"fields": {"error": str(e)}})
            return False
        try:
            self.session.execute(self.q_del_marker, (bucket, shard, m.created_at, m.event_id))
        except CASSANDRA_ERRORS as e:  # a marker without its row: a later pass drops it
            log.warning("relay cleanup failed", extra={"fields": {"error": str(e)}})
        return True


def now_utc() -> datetime:
    return datetime.now(UTC)
