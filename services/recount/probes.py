"""What the reconciler observes: readings of a post, the outbox, the aggregator's progress, and
which posts were active lately. Nothing here writes."""

from __future__ import annotations

import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from cassandra.cluster import Session
from cassandra.query import ConsistencyLevel
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from redis.cluster import RedisCluster

from services.aggregator import cache
from services.aggregator.store import CounterStore
from services.contracts import keys
from services.recount import core

TP = tuple[str, int]
PAGE = 5000  # edges per page of the by-post query


class ProbeError(Exception):
    """A store or Kafka could not be read; names which one and where."""


class EdgeStore:
    """The edges of one post through the by-post index `edges_by_ref` (002_tables.cql)."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.q = session.prepare(
            "SELECT user_id, kind, state, void, reaction, intent_uuid FROM edges WHERE ref = ?"
        )
        self.q.consistency_level = ConsistencyLevel.LOCAL_QUORUM
        self.q.fetch_size = PAGE

    def edges(self, post_id: str) -> list[core.Edge]:
        out = []
        # the index holds outbox (ref = event id) and intent (ref = intent uuid) rows too
        for r in self.session.execute(self.q, (post_id,)):
            if r.kind == "edge":
                out.append(
                    core.Edge(
                        r.user_id, r.state, bool(r.void), r.reaction or "", str(r.intent_uuid)
                    )
                )
        return out


class Readings:
    """One reading of many posts: every post's cells, then its cached aggregate, then its edges
    (the order the verdict relies on, see core)."""

    def __init__(self, session: Session, rc: RedisCluster) -> None:
        self.cells = CounterStore(session)
        self.edge_store = EdgeStore(session)
        self.rc = rc

    def read(self, post_ids: Sequence[str]) -> dict[str, core.Reading]:
        cells = self.cells.read_posts(post_ids)
        cached: dict[str, core.Cached | None] = {}
        for p in post_ids:
            try:
                a = cache.read_aggregate(self.rc, p)
            except (KeyError, ValueError) as e:  # a field missing or not a number
                raise ProbeError(f"count-cache: {keys.count_key(p)} is unreadable: {e!r}") from e
            cached[p] = None if a is None else core.Cached(int(a["count"]), int(a["gen"]))
        return {
            p: core.Reading(p, tuple(cells[p]), cached[p], core.Truth.of(self.edge_store.edges(p)))
            for p in post_ids
        }


class Outbox:
    """Unpublished outbox events of some posts: what the consumers cannot have seen yet."""

    def __init__(self, session: Session) -> None:
        self.session = session
        p = session.prepare
        self.q_partitions = "SELECT DISTINCT bucket, shard FROM outbox_pending"
        self.q_markers = p(
            "SELECT created_at, event_id, user_id FROM outbox_pending "
            "WHERE bucket = ? AND shard = ? AND created_at <= ?"
        )
        self.q_row = p(
            "SELECT post_id, published FROM edges WHERE user_id = ? AND kind = 'outbox' AND ref = ?"
        )

    def pending(self, post_ids: set[str], before: datetime) -> int:
        """Outbox rows of these posts created at or before `before` and not yet published.

        A marker without its row was published and cleaned up, or belongs to a batch that never
        applied: neither is in flight. The marker table only holds the relay's work list (drained
        buckets are deleted), so listing its partitions is cheap."""
        last_bucket = int(before.timestamp() // 60)
        n = 0
        for part in self.session.execute(self.q_partitions):
            if part.bucket > last_bucket:
                continue
            for m in self.session.execute(self.q_markers, (part.bucket, part.shard, before)):
                row = self.session.execute(self.q_row, (m.user_id, str(m.event_id))).one()
                if row is not None and not row.published and row.post_id in post_ids:
                    n += 1
        return n


class Consumers:
    """The aggregator group's committed offsets against the event topics' log-end offsets."""

    def __init__(
        self, kafka_conf: dict[str, Any], group: str, topics: Sequence[str], timeout: float = 10
    ):
        """`kafka_conf`: the connection settings (contracts.clients.kafka_config)."""
        self.bootstrap = str(kafka_conf["bootstrap.servers"])
        self.group = group
        self.topics = list(topics)
        self.timeout = timeout
        self.admin = AdminClient(kafka_conf)

    def _fail(self, what: str, e: BaseException) -> ProbeError:
        return ProbeError(f"kafka {self.bootstrap}: {what}: {e}")

    def partitions(self) -> list[TopicPartition]:
        try:
            md = self.admin.list_topics(timeout=self.timeout)
        except KafkaException as e:
            raise self._fail("no metadata", e) from e
        missing = [t for t in self.topics if t not in md.topics]
        if missing:
            raise ProbeError(f"kafka {self.bootstrap}: no topic {', '.join(missing)}")
        return [TopicPartition(t, p) for t in self.topics for p in sorted(md.topics[t].partitions)]

    def ends(self) -> dict[TP, int]:
        """Log-end offset of every partition, now."""
        req = {tp: OffsetSpec.latest() for tp in self.partitions()}
        try:
            futs = self.admin.list_offsets(req, request_timeout=self.timeout)
            return {(tp.topic, tp.partition): f.result().offset for tp, f in futs.items()}
        except KafkaException as e:
            raise self._fail("log-end offsets", e) from e

    def committed(self) -> dict[TP, int]:
        """The group's committed offset per partition (-1: none committed)."""
        req = [ConsumerGroupTopicPartitions(self.group, self.partitions())]
        try:
            fut = self.admin.list_consumer_group_offsets(req, request_timeout=self.timeout)
            res = fut[self.group].result()
        except KafkaException as e:
            raise self._fail(f"offsets of group {self.group}", e) from e
        return {(tp.topic, tp.partition): max(tp.offset, -1) for tp in res.topic_partitions}

    def behind(self, target: dict[TP, int]) -> dict[TP, int]:
        """Partitions where the group has not yet committed up to `target`: how far behind."""
        now = self.committed()
        return {
            tp: end - now.get(tp, -1)
            for tp, end in target.items()
            if end > 0 and now.get(tp, -1) < end
        }


def recent_posts(
    kafka_conf: dict[str, Any], topic: str, n: int, timeout: float = 10.0
) -> list[str]:
    """The `n` posts with the latest events on `topic`, most recent first.

    Read from the tail of each partition, from the message keys alone (`post_id` or
    `post_id:<shard>`, see contracts.keys.kafka_key; ':' never occurs in a post id): no decoding,
    no registry, no scan of any store."""
    bootstrap = kafka_conf["bootstrap.servers"]
    c = Consumer(
        {
            **kafka_conf,
            "group.id": "likes-recount-sample",  # never joins, never commits: assign() only
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        try:
            md = c.list_topics(topic, timeout=timeout)
        except KafkaException as e:
            raise ProbeError(f"kafka {bootstrap}: no metadata: {e}") from e
        t = md.topics.get(topic)
        if t is None or t.error is not None:
            raise ProbeError(f"kafka {bootstrap}: no topic {topic}")
        per_partition = max(50, 4 * n)
        assign, ends = [], {}
        for p in sorted(t.partitions):
            lo, hi = c.get_watermark_offsets(TopicPartition(topic, p), timeout=timeout)
            if hi > lo:
                assign.append(TopicPartition(topic, p, max(lo, hi - per_partition)))
                ends[p] = hi
        if not assign:
            return []
        c.assign(assign)
        seen: dict[str, int] = {}
        done: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(done) < len(ends) and time.monotonic() < deadline:
            for m in c.consume(500, timeout=0.5):
                p = m.partition() or 0
                if m.error() is not None or (m.offset() or 0) + 1 >= ends[p]:
                    done.add(p)  # EOF, or the last message there was at the start
                if m.error() is None and m.key():
                    post = (m.key() or b"").decode(errors="replace").split(":", 1)[0]
                    seen[post] = max(seen.get(post, 0), m.timestamp()[1])
        return sorted(seen, key=lambda p: (-seen[p], p))[:n]
    finally:
        c.close()
