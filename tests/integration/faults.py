"""Small pieces the fault tests share (the alert tests, the consumer-lag tests)."""

from __future__ import annotations

import os
import signal
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
from confluent_kafka import Producer
from confluent_kafka.serialization import MessageField, SerializationContext

from chaos import kafka_faults
from services.contracts import clients, events, keys
from tests.conftest import Stack


def produce_like(stack: Stack) -> int:
    """One like event of a new post on likes.committed, as the write path publishes it;
    returns its partition. A stopped aggregator's lag then grows with the clock."""
    settings = stack.settings()
    ser = clients.like_serializer(clients.schema_registry(settings))
    post = f"post-{uuid.uuid4()}"
    e = events.LikeEvent.new(intent_uuid=str(uuid.uuid4()), user_id=f"u-{uuid.uuid4().hex[:6]}",
                             post_id=post, action="like", reaction="like", delta=1,
                             region=settings.region, shard=0)  # fmt: skip
    value = ser(e, SerializationContext(events.COMMITTED, MessageField.VALUE))
    partition: list[int] = []
    p = Producer(stack.kafka_config())
    p.produce(events.COMMITTED, key=keys.kafka_key(post, 0).encode(), value=value,
              on_delivery=lambda _err, m: partition.append(m.partition()))  # fmt: skip
    assert p.flush(30) == 0 and len(partition) == 1
    return partition[0]


def produce_poison(stack: Stack, n: int = 1) -> None:
    """`n` messages on likes.committed that no consumer can decode (chaos/kafka_faults.py)."""
    kafka_faults.produce_poison(stack.kafka_config(), n)


@contextmanager
def records_refused(stack: Stack, *topics: str) -> Iterator[None]:
    """The brokers refuse every record written to `topics` until the block ends
    (chaos/kafka_faults.py)."""
    with kafka_faults.records_refused(stack.kafka_config(), *topics):
        yield


def set_sink_outage(stack: Stack, receiver: str, status: int | None) -> None:
    """The local stand-in of an external endpoint (local/webhook_sink.py) answers `status` to
    every call for `receiver` from now on; None ends the outage."""
    url = f"http://{stack.host}:{stack.layout.ports.webhook_sink}/-/outage/{receiver}"
    if status is None:
        httpx.delete(url, timeout=5).raise_for_status()
    else:
        httpx.put(url, json={"status": status}, timeout=5).raise_for_status()


@contextmanager
def stop_the_world_pauses(pid: int, pause_s: float = 0.3, run_s: float = 0.1) -> Iterator[None]:
    """The process stops for `pause_s` out of every `pause_s + run_s` (SIGSTOP, SIGCONT): long
    stop-the-world garbage-collection pauses of a JVM, as the seed's "Cassandra slow" has them.
    Calls still complete, within their timeouts, but late; no breaker opens on them."""
    done = threading.Event()

    def cycle() -> None:
        while not done.is_set():
            os.kill(pid, signal.SIGSTOP)
            done.wait(pause_s)
            os.kill(pid, signal.SIGCONT)
            done.wait(run_s)

    t = threading.Thread(target=cycle, daemon=True)
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join(timeout=10)
        os.kill(pid, signal.SIGCONT)
