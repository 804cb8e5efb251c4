"""The dead-letter topic: a poison message keeps its key, value and headers, plus where it came
from and why it was quarantined."""

from __future__ import annotations

import base64
import logging
from typing import Any

from confluent_kafka import KafkaError, Message, Producer

from services.aggregator import metrics
from services.contracts import dlq, kafka, workloads
from services.contracts.events import LikeEvent

log = logging.getLogger("aggregator.dlq")


def headers(
    msg_topic: str,
    partition: int,
    offset: int,
    error: str,
    attempts: int,
    event: LikeEvent | None,
    original: list[tuple[str, Any]] | None = None,
    group: str = kafka.AGGREGATOR_GROUP,
) -> list[tuple[str, str | bytes | None]]:
    out: list[tuple[str, str | bytes | None]] = list(original or [])
    out += [
        (dlq.SOURCE_TOPIC, msg_topic.encode()),
        (dlq.SOURCE_PARTITION, str(partition).encode()),
        (dlq.SOURCE_OFFSET, str(offset).encode()),
        (dlq.ERROR, error[: dlq.ERROR_MAX].encode()),
        (dlq.ATTEMPTS, str(attempts).encode()),
        (dlq.CONSUMER, workloads.AGGREGATOR.name.encode()),
        (dlq.GROUP, group.encode()),
    ]
    if event is not None:
        out += [
            (dlq.EVENT_ID, event.event_id.encode()),
            (dlq.INTENT_UUID, event.intent_uuid.encode()),
        ]
    return out


def _original_headers(msg: Message) -> list[tuple[str, Any]]:
    hs = msg.headers() or []
    return list(hs.items()) if isinstance(hs, dict) else list(hs)


class DeadLetter:
    def __init__(
        self,
        producer: Producer,
        topic: str,
        timeout_s: float = 10.0,
        group: str = kafka.AGGREGATOR_GROUP,
    ) -> None:
        self.producer = producer
        self.topic = topic
        self.timeout_s = timeout_s
        self.group = group  # the consumer group a replay goes back to

    def send_reference(
        self, topic: str, partition: int, offset: int, key: bytes, error: str
    ) -> bool:
        """A message found poison after it was decoded (at flush time: the window holds no
        message bytes): the record carries where it is (`dlq.source.*`) and an empty value;
        the source topic still holds the message for `likes dlq replay`."""
        hs = [
            *headers(topic, partition, offset, error, 1, None, group=self.group),
            (dlq.REFERENCE, b"1"),
        ]
        return self._publish(key, None, hs, topic, partition, offset, error)

    def send(self, msg: Message, error: str, attempts: int, event: LikeEvent | None) -> bool:
        """Publish and wait for the ack. False if the DLQ refused it: the message is then logged
        in full (the last resort the seed names) and the partition still moves on."""
        hs = headers(
            msg.topic() or "", msg.partition() or 0, msg.offset() or 0, error, attempts, event,
            _original_headers(msg), self.group,
        )  # fmt: skip
        return self._publish(
            msg.key(), msg.value(), hs, msg.topic() or "", msg.partition() or 0,
            msg.offset() or 0, error,
        )  # fmt: skip

    def _publish(
        self, key: bytes | None, value: bytes | None, hs: list[tuple[str, str | bytes | None]],
        topic: str, partition: int, offset: int, error: str,
    ) -> bool:  # fmt: skip
        result: dict[str, Any] = {}

        def done(err: KafkaError | None, _m: Message) -> None:
            result["err"] = err

        try:
            self.producer.produce(self.topic, key=key, value=value, headers=hs, on_delivery=done)
            self.producer.flush(self.timeout_s)
        except Exception as e:  # BufferError, KafkaException
            result["err"] = e
        err = result.get("err", "no delivery report")
        if err is None:
            metrics.DLQ.inc()
            log.warning(
                "message dead-lettered",
                extra={"fields": {"topic": topic, "partition": partition, "offset": offset,
                                  "error": error}},
            )  # fmt: skip
            return True
        metrics.DLQ_FAILURES.inc()
        log.error(
            "dead-letter topic refused a poison message; skipping it",
            extra={"fields": {
                "topic": topic, "partition": partition, "offset": offset,
                "error": error, "dlq_error": str(err),
                "key_b64": base64.b64encode(key or b"").decode(),
                "value_b64": base64.b64encode(value or b"").decode(),
            }},
        )  # fmt: skip
        return False
