"""Read a topic from a point in time to the end it had when the read started: what `likes dlq`
and `likes abuse unvoid` look back through (the log is the record of what was dead-lettered and
what was voided)."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from services.contracts import kafka

READ_TIMEOUT_S = 30.0


class ReadError(Exception):
    """Kafka failed us, or the topic is missing: nothing was read."""


@dataclass
class Record:
    """One record of a topic (cli/dlq.py's Letter adds what a dead letter carries)."""

    partition: int
    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, Any]]


def consumer(kafka_conf: dict[str, Any], tool: str) -> Any:
    from confluent_kafka import Consumer

    return Consumer({
        **kafka_conf,
        # never commits (partitions are assigned, not subscribed): the name only has to pass the
        # ACLs' group prefix
        "group.id": f"{kafka.GROUP_PREFIX}{tool}-{uuid.uuid4().hex[:8]}",
        "enable.auto.commit": False,
    })  # fmt: skip


def read_since(
    kafka_conf: dict[str, Any], topic: str, since_s: float, tool: str,
    timeout_s: float = READ_TIMEOUT_S,
) -> list[Record]:  # fmt: skip
    """Every record of `topic` newer than `since_s` seconds, up to the end the topic had when the
    read started, in (partition, offset) order."""
    from confluent_kafka import TopicPartition

    c = consumer(kafka_conf, tool)
    try:
        md = c.list_topics(topic, timeout=10).topics.get(topic)
        if md is None or md.error is not None:
            raise ReadError(f"topic {topic}: {getattr(md, 'error', 'missing')}")
        since_ms = int((time.time() - since_s) * 1000)
        starts = c.offsets_for_times(
            [TopicPartition(topic, p, since_ms) for p in md.partitions], timeout=10
        )
        todo: dict[int, int] = {}
        assign = []
        for tp in starts:
            _low, high = c.get_watermark_offsets(TopicPartition(topic, tp.partition), timeout=10)
            start = tp.offset if tp.offset >= 0 else high  # -1: nothing that new
            if start < high:
                todo[tp.partition] = high
                assign.append(TopicPartition(topic, tp.partition, start))
        c.assign(assign)
        out: list[Record] = []
        deadline = time.monotonic() + timeout_s
        while todo and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None:
                continue
            if m.error() is not None:
                raise ReadError(f"reading {topic}: {m.error()}")
            p, o = m.partition() or 0, m.offset() or 0
            if o < todo.get(p, -1):
                out.append(Record(p, o, m.timestamp()[1], m.key(), m.value(),
                                  list(m.headers() or [])))  # fmt: skip
            if o + 1 >= todo.get(p, 0):
                todo.pop(p, None)
        if todo:
            raise ReadError(f"{topic}: not read to its end in {timeout_s:.0f} s")
    except ReadError:
        raise
    except Exception as e:  # KafkaException: brokers unreachable, auth refused
        raise ReadError(f"Kafka: {e}") from e
    finally:
        c.close()
    return out
