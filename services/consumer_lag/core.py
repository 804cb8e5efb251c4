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

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from services.contracts import kafka as kafka_contract

Key = tuple[str, int]  # topic, partition
RETRY_AFTER_S = 0.5  # before a partition refused with a retriable error is asked again
# a leader that just moved or came back: librdkafka does not mark these retriable in what
# list_offsets gives back
LEADER_MOVING = frozenset({
    KafkaError.LEADER_NOT_AVAILABLE, KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.UNKNOWN_LEADER_EPOCH, KafkaError.FENCED_LEADER_EPOCH,
})  # fmt: skip


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


@dataclass(frozen=True)
class Unread:
    """A partition whose lag one read could not learn, for one group, and why (its leader or
    the group's coordinator did not answer)."""

    group: str
    topic: str
    partition: int
    reason: str


@dataclass(frozen=True)
class LagRead:
    """One read: the lag of every partition it could learn, and the partitions it could not.
    A broker that does not answer hides only the partitions it leads (and every partition of a
    group whose coordinator it is), not the lag of the partitions the others lead."""

    lags: list[PartitionLag]
    unread: list[Unread]


class LagError(Exception):
    """Kafka did not answer the read at all (no topic metadata, ever): nothing is known."""


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
        partitions: Sequence[Key] | None = None,
    ) -> None:
        """`topics_of`: a group's own topics, where it reads fewer than `topics`. `partitions`:
        a listing an earlier reader made, used until this one lists them itself."""
        self._admin = admin
        self._topics_of = {g: frozenset(ts) for g, ts in (topics_of or {}).items()}
        self._consumer = consumer(kafka_contract.LAG_READER_GROUP)
        self._group_consumers = {g: consumer(g) for g in groups}
        self.groups = tuple(groups)
        self.topics = tuple(topics)
        self._timeout = timeout_s
        self._clock = clock
        self._stamps: dict[tuple[str, int, int], float] = {}  # topic, partition, offset -> s
        self._keys = None if partitions is None else list(partitions)  # as last listed

    @property
    def known_partitions(self) -> list[Key] | None:
        """The partitions as last listed (None before the first listing)."""
        return self._keys

    def _reads(self, group: str, topic: str) -> bool:
        own = self._topics_of.get(group)
        return own is None or topic in own

    def partitions(self) -> list[Key]:
        """The watched topics' partitions. A metadata request that fails (it went to the one
        broker that does not answer) reuses the last listing: a topic's partitions change only
        by an operator's hand, and one silent broker must not hide every partition's lag."""
        try:
            md = self._admin.list_topics(timeout=self._timeout)
        except Exception as e:
            if self._keys is None:
                raise LagError(f"list_topics: {e!r}") from e
            return self._keys
        out = []
        for topic in self.topics:
            t = md.topics.get(topic)
            if t is None or t.error is not None:
                continue  # not created yet: nothing to lag behind
            out += [(topic, p) for p in sorted(t.partitions)]
        self._keys = out
        return out

    def _offsets(self, keys: list[Key], spec: OffsetSpec, failed: dict[Key, str]) -> dict[Key, int]:
        """Each partition's offset at `spec`; a partition whose leader did not answer goes in
        `failed` with the reason, and the others are still read. A partition refused with a
        retriable error (its leader just moved or came back: LEADER_NOT_AVAILABLE,
        UNKNOWN_LEADER_EPOCH, measured after a broker rejoined) is asked once more."""
        mine: dict[Key, str] = {}  # this call's: `failed` may hold another spec's already
        out, retry = self._list_offsets(keys, spec, mine)
        if retry:
            time.sleep(RETRY_AFTER_S)  # librdkafka refreshes the leaders' metadata meanwhile
            again, _ = self._list_offsets(retry, spec, mine)
            out.update(again)
        for key, why in mine.items():
            if key not in out:  # a retry that succeeded clears its first failure
                failed.setdefault(key, why)
        return out

    def _list_offsets(
        self, keys: list[Key], spec: OffsetSpec, failed: dict[Key, str]
    ) -> tuple[dict[Key, int], list[Key]]:
        futures = self._admin.list_offsets(
            {TopicPartition(t, p): spec for t, p in keys}, request_timeout=self._timeout
        )
        # the request is bounded by request_timeout: every future completes by then (the grace
        # keeps a future that completes on the dot from timing out here first)
        deadline = time.monotonic() + self._timeout + 2.0
        out, retry = {}, []
        for tp, fut in futures.items():
            key = (tp.topic, tp.partition)
            try:
                offset = fut.result(timeout=max(0.0, deadline - time.monotonic())).offset
            except KafkaException as e:
                failed[key] = f"list_offsets: {e!r}"
                err = e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None
                if err is not None and (err.retriable() or err.code() in LEADER_MOVING):
                    retry.append(key)
                continue
            except Exception as e:  # the future's own timeout
                failed[key] = f"list_offsets: {e!r}"
                continue
            if offset < 0:
                # librdkafka 2.16 answers a partition whose leader did not reply within the
                # request timeout with OFFSET_INVALID (-1001) and no error (measured with the
                # leader SIGSTOPped): read as an offset it would show the lag as 0
                failed[key] = f"list_offsets: no offset from the leader ({offset})"
                continue
            out[key] = offset
        return out, retry

    def _committed(self, group: str, keys: list[Key], failed: dict[Key, str]) -> dict[Key, int]:
        """The group's committed offsets of `keys`; those it could not learn go in `failed`
        (all of them when the group's coordinator does not answer)."""
        try:
            result = self._group_consumers[group].committed(
                [TopicPartition(t, p) for t, p in keys], timeout=self._timeout
            )
        except Exception as e:
            for key in keys:
                failed.setdefault(key, f"committed offsets of {group}: {e!r}")
            return {}
        out = {}
        for tp in result:
            key = (tp.topic, tp.partition)
            if tp.error is not None:
                failed.setdefault(key, f"committed offset of {group}: {tp.error}")
            else:
                out[key] = -1 if tp.offset == OFFSET_INVALID else tp.offset
        return out

    def _timestamps(self, wanted: dict[tuple[str, int, int], None], failed: dict[Key, str]) -> None:
        """Fetch the timestamp of each (topic, partition, offset) not cached yet; forget the
        offsets no group waits on any more. A partition whose fetch failed goes in `failed`."""
        for k in [k for k in self._stamps if k not in wanted]:
            del self._stamps[k]
        missing = [k for k in wanted if k not in self._stamps]
        while missing:
            # one offset per partition per assignment (two groups may wait at two offsets)
            batch: dict[Key, int] = {}
            for t, p, o in missing:
                batch.setdefault((t, p), o)
            failed.update(self._fetch(batch))
            missing = [k for k in missing if k not in self._stamps and k[:2] not in failed]

    def _fetch(self, pending: dict[Key, int]) -> dict[Key, str]:
        """Fetch the message at each partition's offset; returns the partitions that failed,
        with why (an error, or no message within the timeout: its leader did not answer)."""
        self._consumer.assign([TopicPartition(t, p, o) for (t, p), o in pending.items()])
        pending = dict(pending)
        failed: dict[Key, str] = {}
        deadline = time.monotonic() + self._timeout
        try:
            while pending and time.monotonic() < deadline:
                for msg in self._consumer.consume(len(pending), timeout=0.5):
                    err = msg.error()
                    key = (msg.topic(), msg.partition())
                    if err is not None and err.code() != KafkaError._PARTITION_EOF:
                        if key in pending:
                            del pending[key]
                            failed[key] = f"fetch: {err}"
                        continue
                    if err is not None or key not in pending:
                        continue
                    # the first message at or after the offset asked for (a compacted or
                    # retention-deleted offset reads the next one kept)
                    _, ms = msg.timestamp()
                    self._stamps[(key[0], key[1], pending.pop(key))] = ms / 1000.0
        finally:
            self._consumer.unassign()
        for key in pending:
            failed[key] = f"fetch: no message within {self._timeout} s"
        return failed

    def close(self) -> None:
        for c in (self._consumer, *self._group_consumers.values()):
            c.close()

    def read(self) -> LagRead:
        """Every watched group's lag on every partition it reads, as far as Kafka answers.
        LagError only when no partition list was ever read."""
        keys = self.partitions()
        if not keys:
            return LagRead([], [])
        broken: dict[Key, str] = {}  # partitions no group's lag can be read on
        start = self._offsets(keys, OffsetSpec.earliest(), broken)
        end = self._offsets(keys, OffsetSpec.latest(), broken)
        keys_of = {g: [k for k in keys if self._reads(g, k[0])] for g in self.groups}
        unread_of: dict[str, dict[Key, str]] = {g: {} for g in self.groups}
        committed = {
            g: self._committed(g, [k for k in ks if k not in broken], unread_of[g])
            for g, ks in keys_of.items()
            if ks
        }
        wanted: dict[tuple[str, int, int], None] = {}
        for group, offsets in committed.items():
            for key in keys_of[group]:
                if key in broken or key in unread_of[group]:
                    continue
                nxt = max(offsets.get(key, -1), start[key])
                if nxt < end[key]:
                    wanted[(key[0], key[1], nxt)] = None
        self._timestamps(wanted, broken)
        now = self._clock()
        lags, unread = [], []
        for group, offsets in committed.items():
            for key in keys_of[group]:
                why = broken.get(key) or unread_of[group].get(key)
                if why is not None:
                    unread.append(Unread(group, key[0], key[1], why))
                    continue
                c = offsets.get(key, -1)
                nxt = max(c, start[key])
                age = 0.0
                if nxt < end[key]:
                    age = max(0.0, now - self._stamps[(key[0], key[1], nxt)])
                lags.append(PartitionLag(group, key[0], key[1], c, start[key], end[key], age))
        return LagRead(lags, unread)
