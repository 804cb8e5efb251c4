"""Drain the outbox: find markers in `outbox_pending`, publish their outbox rows, clean up.

Safe to run more than once: two relays may publish the same row twice, which is fine because the
event keeps its event_id and intent_uuid and every consumer dedups on intent_uuid.
"""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime

from cassandra.cluster import Session
from cassandra.query import ConsistencyLevel
from prometheus_client import Counter, Gauge

from services.contracts import convergence
from services.contracts.clients import CASSANDRA_ERRORS
from services.write.core import OUTBOX_SHARDS, Publisher

log = logging.getLogger("relay")

BACKLOG = Gauge("likes_outbox_backlog", "Outbox events waiting to be published (last pass)")
OLDEST = Gauge("likes_outbox_oldest_age_seconds", "Age of the oldest unpublished outbox event")
PUBLISHED = Counter("likes_outbox_published_total", "Outbox events the relay published")
FAILED = Counter("likes_outbox_publish_failures_total", "Relay publish attempts that failed")


@dataclass
class PassResult:
    published: int = 0
    pending: int = 0
    dropped_markers: int = 0


class OutboxRelay:
    def __init__(
        self,
        session: Session,
        publisher: Publisher,
        *,
        stale_marker_s: float = 30.0,
        min_age_s: float = convergence.RELAY_REPUBLISH_AFTER_S,
        batch: int = 500,
        publish_wait_s: float = convergence.RELAY_PUBLISH_TIMEOUT_S,
    ) -> None:
        self.session = session
        self.publisher = publisher
        self.stale_marker_s = stale_marker_s
        # a younger row is most likely being published by its writer right now (it waits up to
        # 2 s for the ack, then cleans up): leave it, or nearly every like goes out twice
        self.min_age_s = min_age_s
        self.batch = batch
        self.publish_wait_s = publish_wait_s
        p = session.prepare
        self.q_markers = p(
            "SELECT created_at, event_id, user_id FROM outbox_pending "
            "WHERE bucket = ? AND shard = ? LIMIT ?"
        )
        self.q_row = p(
            "SELECT topic, payload, published, kafka_key FROM edges "
            "WHERE user_id = ? AND kind = 'outbox' AND ref = ?"
        )
        self.q_row_serial = p(
            "SELECT topic, payload, published, kafka_key FROM edges "
            "WHERE user_id = ? AND kind = 'outbox' AND ref = ?"
        )
        self.q_row_serial.consistency_level = ConsistencyLevel.LOCAL_SERIAL
        self.q_del_row = p("DELETE FROM edges WHERE user_id = ? AND kind = 'outbox' AND ref = ?")
        self.q_del_marker = p(
            "DELETE FROM outbox_pending WHERE bucket = ? AND shard = ? AND created_at = ? "
            "AND event_id = ?"
        )
        self.low_water: int | None = None  # oldest bucket that may still hold markers

    def _find_low_water(self) -> int:
        # once per start: the partition keys in use (few: drained buckets are deleted)
        rows = self.session.execute("SELECT DISTINCT bucket, shard FROM outbox_pending")
        buckets = [r.bucket for r in rows]
        return min(buckets) if buckets else int(time.time() // 60)

    def run_once(self) -> PassResult:
        """One pass over every bucket from the low-water mark to now."""
        if self.low_water is None:
            self.low_water = self._find_low_water()
        now = time.time()
        now_bucket = int(now // 60)
        res = PassResult()
        oldest: float | None = None
        for bucket in range(self.low_water, now_bucket + 1):
            bucket_empty = True
            for shard in range(OUTBOX_SHARDS):
                markers = list(self.session.execute(self.q_markers, (bucket, shard, self.batch)))
                if markers:
                    bucket_empty = False
                inflight: list[tuple[Future[None], object, int, int]] = []
                for m in markers:
                    row = self.session.execute(self.q_row, (m.user_id, str(m.event_id))).one()
                    created = m.created_at.replace(tzinfo=UTC).timestamp()
                    if row is None and now - created > self.stale_marker_s:
                        # about to drop: a batch whose client saw a CAS timeout may still be an
                        # accepted Paxos proposal that the next LWT on this user completes,
                        # maybe hours later, when no marker is left (review D1). A SERIAL read
                        # finishes any such round now: after it, the row exists or never will.
                        row = self.session.execute(
                            self.q_row_serial, (m.user_id, str(m.event_id))
                        ).one()
                    if row is None or row.published:
                        # published and cleaned, or a batch that never applied (its client got
                        # a 503): drop the marker once no write can still be in flight
                        if row is not None or now - created > self.stale_marker_s:
                            self.session.execute(
                                self.q_del_marker, (bucket, shard, m.created_at, m.event_id)
                            )
                            res.dropped_markers += 1
                        continue
                    res.pending += 1
                    oldest = created if oldest is None else min(oldest, created)
                    if now - created < self.min_age_s:
                        continue
                    fut = self.publisher.publish(row.topic, row.kafka_key, row.payload)
                    inflight.append((fut, m, bucket, shard))
                for fut, m, b, s in inflight:
                    try:
                        fut.result(timeout=self.publish_wait_s)
                    except Exception as e:
                        FAILED.inc()
                        log.warning("relay publish failed", extra={"fields": {"error": str(e)}})
                        continue
                    PUBLISHED.inc()
                    res.published += 1
                    self._cleanup(m, b, s)
            if bucket_empty and bucket < now_bucket - 1 and bucket == self.low_water:
                self.low_water = bucket + 1  # drained and too old to get new markers
        BACKLOG.set(res.pending - res.published)
        OLDEST.set(0 if oldest is None else max(0.0, now - oldest))
        return res

    def _cleanup(self, m: object, bucket: int, shard: int) -> None:
        try:
            self.session.execute(self.q_del_row, (m.user_id, str(m.event_id)))  # type: ignore[attr-defined]
            self.session.execute(
                self.q_del_marker,
                (bucket, shard, m.created_at, m.event_id),  # type: ignore[attr-defined]
            )
        except CASSANDRA_ERRORS as e:  # the next pass sees it published or republishes (dedup)
            log.warning("relay cleanup failed", extra={"fields": {"error": str(e)}})


def now_utc() -> datetime:
    return datetime.now(UTC)
