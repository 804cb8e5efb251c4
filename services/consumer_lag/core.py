"""Consumer lag as Kafka sees it: per group and partition, the messages between the group's
committed offset and the log end, and the age of the oldest of them (now minus the timestamp of
the message at the committed offset). Read from the brokers, so a consumer that died or hung
keeps showing lag, growing with the clock; the consumers' own gauges
(likes_aggregator_consumer_lag_seconds) vanish with them or freeze.

The seed's `consumer_lag_seconds`: the alert rules read the gauge this module exports
(services/contracts/metrics.py CONSUMER_LAG_SECONDS)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from services.contracts import kafka as kafka_contract

Key = tuple[str, int]  # topic, partition


@dataclass(frozen=True)
class PartitionLag:
    group: str
    topic: str
    partition: int
    committed: int  # the next offset the group reads; -1 when it never committed (reads from start)
    start: int  # the log's first offset still kept
    end: int  # the high watermark: the offset the next produced message gets
    seconds: float  # 0 when caught up

    @property
    def messages(self) -> int:
        return max(0, self.end - self.next_offset)

    @property
    def next_offset(self) -> int:
        """Where the group resumes: its committed offset, or the log start (never committed, or
        committed below what retention kept: the aggregator's `auto.offset.reset` earliest)."""
        return max(self.committed, self.start)


class LagError(Exception):
    """Kafka did not answer one of the reads; nothing is exported from a partial read."""


def consumer_factory(conf: dict[str, Any]) -> Callable[[str], Consumer]:
    """The LagReader's consumers, from a client config: none subscribes or commits."""

    def consumer(group_id: str) -> Consumer:
        return Consumer(
            {
                **conf,
                "group.id": group_id,
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": True,  # an offset at the log end answers at once
            }
        )

    return consumer


class LagReader:
    """One read of every watched group's lag. `consumer(group_id)` makes the consumers, none of
    which ever subscribes or commits: one in LAG_READER_GROUP fetches the timestamp of the
    message each lagging group would read next (cached by offset: a message's timestamp never
    changes, so a group stuck on one offset costs no fetch after the first); one in each watched
    group reads that group's committed offsets.

    Committed offsets are read by a consumer of the group, not the admin client's
    list_consumer_group_offsets: librdkafka 2.16's admin client dereferences a null group handle
    when the broker answers that call NOT_COORDINATOR (as after a coordinator move; dmesg showed
    "segfault at 58" in rdk:main, confluent-kafka-javascript#374 has the backtrace), which killed
    the exporter. A consumer's own group handle looks the coordinator up again."""

    def __init__(
        self,
        admin: AdminClient,
        consumer: Callable[[str], Consumer],
        groups: Sequence[str],
        topics: Sequence[str],
        timeout_s: float = 5.0,
        clock: Callable[[], float] = time.time,
        topics_of: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        """`topics_of`: a group's own topics, where it reads fewer than `topics`."""
        self._admin = admin
        self._topics_of = {g: frozenset(ts) for g, ts in (topics_of or {}).items()}
        self._consumer = consumer(kafka_contract.LAG_READER_GROUP)
        self._group_consumers = {g: consumer(g) for g in groups}
        self.groups = tuple(groups)
        self.topics = tuple(topics)
        self._timeout = timeout_s
        self._clock = clock
        self._stamps: dict[tuple[str, int, int], float] = {}  # topic, partition, offset -> s

    def _reads(self, group: str, topic: str) -> bool:
        own = self._topics_of.get(group)
        return own is None or topic in own

    def partitions(self) -> list[Key]:
        md = self._admin.list_topics(timeout=self._timeout)
        out = []
        for topic in self.topics:
            t = md.topics.get(topic)
            if t is None or t.error is not None:
                continue  # not created yet: nothing to lag behind
            out += [(topic, p) for p in sorted(t.partitions)]
        return out

    def _offsets(self, keys: list[Key], spec: OffsetSpec) -> dict[Key, int]:
        futures = self._admin.list_offsets(
            {TopicPartition(t, p): spec for t, p in keys}, request_timeout=self._timeout
        )
        out = {}
        for tp, fut in futures.items():
            try:
                out[(tp.topic, tp.partition)] = fut.result(timeout=self._timeout).offset
            except Exception as e:
                raise LagError(f"list_offsets {tp.topic}/{tp.partition}: {e!r}") from e
        return out

    def _committed(self, group: str, keys: list[Key]) -> dict[Key, int]:
        try:
            result = self._group_consumers[group].committed(
                [TopicPartition(t, p) for t, p in keys], timeout=self._timeout
            )
        except Exception as e:
            raise LagError(f"committed offsets of {group}: {e!r}") from e
        out = {}
        for tp in result:
            if tp.error is not None:
                raise LagError(f"committed offset of {group} {tp.topic}/{tp.partition}: {tp.error}")
            out[(tp.topic, tp.partition)] = -1 if tp.offset == OFFSET_INVALID else tp.offset
        return out

    def _timestamps(self, wanted: dict[tuple[str, int, int], None]) -> None:
        """Fetch the timestamp of each (topic, partition, offset) not cached yet; forget the
        offsets no group waits on any more."""
        for k in [k for k in self._stamps if k not in wanted]:
            del self._stamps[k]
        missing = [k for k in wanted if k not in self._stamps]
        while missing:
            # one offset per partition per assignment (two groups may wait at two offsets)
            batch: dict[Key, int] = {}
            for t, p, o in missing:
                batch.setdefault((t, p), o)
            self._fetch(batch)
            missing = [k for k in missing if k not in self._stamps]

    def _fetch(self, pending: dict[Key, int]) -> None:
        self._consumer.assign([TopicPartition(t, p, o) for (t, p), o in pending.items()])
        pending = dict(pending)
        deadline = time.monotonic() + self._timeout
        try:
            while pending and time.monotonic() < deadline:
                for msg in self._consumer.consume(len(pending), timeout=0.5):
                    err = msg.error()
                    if err is not None and err.code() != KafkaError._PARTITION_EOF:
                        raise LagError(f"fetch {msg.topic()}/{msg.partition()}: {err}")
                    key = (msg.topic(), msg.partition())
                    if err is not None or key not in pending:
                        continue
                    # the first message at or after the offset asked for (a compacted or
                    # retention-deleted offset reads the next one kept)
                    _, ms = msg.timestamp()
                    self._stamps[(key[0], key[1], pending.pop(key))] = ms / 1000.0
        finally:
            self._consumer.unassign()
        if pending:
            raise LagError(f"no message fetched from {sorted(pending)} in {self._timeout} s")

    def close(self) -> None:
        for c in (self._consumer, *self._group_consumers.values()):
            c.close()

    def read(self) -> list[PartitionLag]:
        keys = self.partitions()
        if not keys:
            return []
        start = self._offsets(keys, OffsetSpec.earliest())
        end = self._offsets(keys, OffsetSpec.latest())
        keys_of = {g: [k for k in keys if self._reads(g, k[0])] for g in self.groups}
        committed = {g: self._committed(g, keys_of[g]) for g in self.groups if keys_of[g]}
        wanted: dict[tuple[str, int, int], None] = {}
        for group, offsets in committed.items():
            for key in keys_of[group]:
                nxt = max(offsets.get(key, -1), start[key])
                if nxt < end[key]:
                    wanted[(key[0], key[1], nxt)] = None
        self._timestamps(wanted)
        now = self._clock()
        out = []
        for group, offsets in committed.items():
            for key in keys_of[group]:
                c = offsets.get(key, -1)
                nxt = max(c, start[key])
                age = 0.0
                if nxt < end[key]:
                    age = max(0.0, now - self._stamps[(key[0], key[1], nxt)])
                out.append(PartitionLag(group, key[0], key[1], c, start[key], end[key], age))
        return out
