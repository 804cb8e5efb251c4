"""The consumer-lag exporter (services/consumer_lag) against the stack's Kafka: exact readings on
a test topic with known message times, and the running exporter's series when the stack's own
aggregator stops consuming (the case its own gauges cannot show)."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator

import httpx
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from prometheus_client.parser import text_string_to_metric_families

from services.consumer_lag.core import LagRead, LagReader, consumer_factory
from services.contracts import events, workloads
from services.contracts import kafka as kafka_contract
from services.contracts import metrics as names
from tests.conftest import Stack
from tests.integration.faults import produce_like

T0 = 1_700_000_000.0  # the test messages' timestamps, seconds


@pytest.fixture
def topic(stack: Stack) -> Iterator[str]:
    admin = AdminClient(stack.kafka_config())
    name = f"likes.test-lag-{uuid.uuid4().hex[:8]}"
    for fut in admin.create_topics([NewTopic(name, 2, 1)], operation_timeout=30).values():
        fut.result(30)
    yield name
    admin.delete_topics([name], operation_timeout=30)


def _produce(stack: Stack, topic: str, stamps: list[float]) -> None:
    p = Producer(stack.kafka_config())
    for ts in stamps:
        p.produce(topic, value=b"x", partition=0, timestamp=int(ts * 1000))
    assert p.flush(30) == 0


def _commit(stack: Stack, group: str, topic: str, offset: int) -> None:
    c = Consumer({**stack.kafka_config(), "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, 0, offset)], asynchronous=False)
    finally:
        c.close()


def _reader(stack: Stack, groups: list[str], topic: str, now: float) -> LagReader:
    conf = stack.kafka_config()
    return LagReader(
        AdminClient(conf), consumer_factory(conf), groups, [topic], 10.0, clock=lambda: now
    )


def test_lag_is_the_age_of_the_next_unconsumed_message_per_group_and_partition(
    stack: Stack, topic: str
) -> None:
    _produce(stack, topic, [T0, T0 + 1, T0 + 2])
    behind, never, caught_up = (f"likes-test-{n}-{uuid.uuid4().hex[:6]}" for n in "abc")
    _commit(stack, behind, topic, 1)  # consumed the first message only
    _commit(stack, caught_up, topic, 3)
    reader = _reader(stack, [behind, never, caught_up], topic, now=T0 + 10)
    read = reader.read()
    assert read.unread == []
    got = {(r.group, r.partition): (r.messages, r.seconds) for r in read.lags}
    assert got == {
        (behind, 0): (2, 9.0),  # the message at offset 1 was produced at T0 + 1
        (behind, 1): (0, 0.0),  # an empty partition lags nothing
        (never, 0): (3, 10.0),  # never committed: it reads from the log start
        (never, 1): (0, 0.0),
        (caught_up, 0): (0, 0.0),
        (caught_up, 1): (0, 0.0),
    }
    # the group moves on: the reading follows (cached timestamps are per offset, not per group)
    _commit(stack, behind, topic, 2)
    got = {(r.group, r.partition): r.seconds for r in reader.read().lags}
    assert got[(behind, 0)] == 8.0 and got[(never, 0)] == 10.0


def _scrape(stack: Stack) -> str:
    return httpx.get(f"{stack.ops_url(workloads.CONSUMER_LAG.name)}/metrics", timeout=10).text


def _samples(text: str, name: str, group: str) -> list[tuple[dict[str, str], float]]:
    """One metric's samples for one group in a scrape of the exporter: (labels, value)."""
    return [
        (s.labels, s.value)
        for family in text_string_to_metric_families(text)
        if family.name == name
        for s in family.samples
        if s.labels["group"] == group
    ]


def _series(stack: Stack, group: str, text: str | None = None) -> dict[tuple[str, str], float]:
    """The running exporter's likes_consumer_lag_seconds for a group: (topic, partition) -> s."""
    return {
        (labels["topic"], labels["partition"]): value
        for labels, value in _samples(text or _scrape(stack), names.CONSUMER_LAG_SECONDS, group)
    }


def _wait(check: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_a_group_narrowed_to_its_topics_reports_only_those(stack: Stack, topic: str) -> None:
    _produce(stack, topic, [T0])
    group = f"likes-test-narrow-{uuid.uuid4().hex[:6]}"
    conf = stack.kafka_config()
    reader = LagReader(AdminClient(conf), consumer_factory(conf), [group],
                       [topic, events.VOIDED], 10.0, clock=lambda: T0 + 5,
                       topics_of={group: [topic]})  # fmt: skip
    try:
        got = {(r.topic, r.partition): r.seconds for r in reader.read().lags}
    finally:
        reader.close()
    assert got == {(topic, 0): 5.0, (topic, 1): 0.0}


def _leaders(admin: AdminClient, topic: str, partitions: int) -> dict[int, int]:
    """partition -> its leader's broker id, once every partition has one."""
    leaders: dict[int, int] = {}

    def known() -> bool:
        md = admin.list_topics(topic, timeout=10).topics[topic]
        leaders.clear()
        leaders.update({p: m.leader for p, m in md.partitions.items() if m.leader >= 0})
        return len(leaders) == partitions

    _wait(known, f"a leader for each of {topic}'s partitions")
    return dict(leaders)


def _in_sync(admin: AdminClient) -> bool:
    """Every partition of the event topics has a leader and all its replicas in sync."""
    md = admin.list_topics(timeout=10)
    return all(
        m.leader >= 0 and sorted(m.isrs) == sorted(m.replicas)
        for t in events.EVENT_TOPICS
        for m in md.topics[t].partitions.values()
    )


def test_a_silent_broker_hides_only_the_partitions_it_leads(stack: Stack) -> None:
    """A broker that stops answering (SIGSTOP: its connections stay open, nothing replies)
    hides the lag of the partitions it leads, and of those only: the others' lag is still read
    exactly. Before, one unanswered call failed the whole read and the exporter dropped every
    series. The listing of partitions is the one the reader made before the broker went
    silent (a metadata request may go to that broker); librdkafka answers the silent leader's
    partition with OFFSET_INVALID and no error, which must not read as 'caught up'."""
    conf = stack.kafka_config()
    admin = AdminClient(conf)
    brokers = stack.layout.kafka_brokers
    name = f"likes.test-lag-cut-{uuid.uuid4().hex[:8]}"
    for fut in admin.create_topics([NewTopic(name, brokers, 1)], operation_timeout=30).values():
        fut.result(30)
    group = f"likes-test-cut-{uuid.uuid4().hex[:6]}"
    reader = LagReader(AdminClient(conf), consumer_factory(conf), [group], [name], 2.0,
                       clock=lambda: T0 + 10)  # fmt: skip
    try:
        leaders = _leaders(admin, name, brokers)
        p = Producer(conf)
        for partition in leaders:
            p.produce(name, value=b"x", partition=partition, timestamp=int(T0 * 1000))
        assert p.flush(30) == 0
        coordinator = admin.describe_consumer_groups([group])[group].result(30).coordinator.id
        # the group's coordinator answers: only the partitions' leaders are in question
        victim = next(b for b in sorted(set(leaders.values())) if b != coordinator)
        silent = {part for part, b in leaders.items() if b == victim}
        assert len(silent) < len(leaders), f"broker {victim} leads every partition: {leaders}"

        # a new topic's leaders take a moment to be known to every broker (LEADER_NOT_AVAILABLE)
        reads = [reader.read()]
        _wait(lambda: not reads.append(reader.read()) and not reads[-1].unread, "a whole read")
        before = reads[-1]
        assert {(x.partition, x.seconds) for x in before.lags} == {(q, 10.0) for q in leaders}

        pid = stack.pid(f"kafka-{victim}")
        hidden = {(group, q) for q in silent}
        during: list[LagRead] = []
        os.kill(pid, signal.SIGSTOP)
        try:
            # a read whose metadata or coordinator request librdkafka sends to the silent broker
            # loses more than its partitions, that once: up to three reads while it is silent
            while len(during) < 3 and (
                not during or {(u.group, u.partition) for u in during[-1].unread} != hidden
            ):
                during.append(reader.read())
        finally:
            os.kill(pid, signal.SIGCONT)
        for read in during:
            # never a lag for a partition that could not be read (librdkafka's -1001 taken as
            # the log end showed 0 s), never a wrong one for those that could
            assert {(u.group, u.partition) for u in read.unread} >= hidden, read
            assert {x.partition for x in read.lags}.isdisjoint(silent), read
            assert all(x.seconds == 10.0 for x in read.lags), read
        # and it hides only those: the other brokers' partitions are read exactly
        assert {(x.partition, x.seconds) for x in during[-1].lags} == {
            (q, 10.0) for q in leaders if q not in silent
        }, during
        assert {(u.group, u.partition) for u in during[-1].unread} == hidden, during

        # the broker answers again: every partition reads, and keeps reading
        _wait(lambda: not reader.read().unread, "every partition read again")
        for _ in range(3):
            after = reader.read()
            assert after.unread == [] and len(after.lags) == len(leaders)
    finally:
        reader.close()
        admin.delete_topics([name], operation_timeout=30)
        # the next tests find the event topics whole again (the silent broker may have been
        # fenced and dropped from their ISR)
        _wait(lambda: _in_sync(admin), "every event topic's replicas back in sync", 120)


def test_the_exporter_watches_the_abuse_scorer_on_the_topic_it_reads(stack: Stack) -> None:
    """The abuse scorer's group is watched (a stalled scorer shows as lag: its alert), on
    likes.committed only; the aggregator's on every event topic."""
    groups = (kafka_contract.ABUSE_GROUP, kafka_contract.AGGREGATOR_GROUP)
    scrapes: list[str] = []

    def whole() -> bool:
        # a read that overlapped the previous test's silent broker leaves some partitions
        # unread (no lag series) until the exporter's next read: wait for one that read all
        scrapes.append(_scrape(stack))
        return all(_samples(scrapes[-1], names.CONSUMER_LAG_UNREAD, g) == [({"group": g}, 0.0)]
                   for g in groups)  # fmt: skip

    _wait(whole, "an exporter read with no partition unread")
    abuse = {t for t, _ in _series(stack, kafka_contract.ABUSE_GROUP, scrapes[-1])}
    agg = {t for t, _ in _series(stack, kafka_contract.AGGREGATOR_GROUP, scrapes[-1])}
    assert abuse == {events.COMMITTED}
    assert agg == set(events.EVENT_TOPICS)


def test_a_stopped_aggregator_shows_growing_lag_and_none_once_it_resumes(stack: Stack) -> None:
    group = kafka_contract.AGGREGATOR_GROUP
    _wait(lambda: any(t == events.COMMITTED for t, _ in _series(stack, group)),
          "the exporter's series of the aggregator's group")  # fmt: skip
    pid = stack.pid(workloads.AGGREGATOR.name)
    os.kill(pid, signal.SIGSTOP)  # hung: alive to the kernel, consuming nothing, reporting nothing
    try:
        partition = produce_like(stack)
        key = (events.COMMITTED, str(partition))
        _wait(lambda: _series(stack, group).get(key, 0) > 5, "lag above 5 s")
        first = _series(stack, group)[key]
        time.sleep(6)
        assert _series(stack, group)[key] > first  # still growing: a clock, not a frozen gauge
    finally:
        os.kill(pid, signal.SIGCONT)
    _wait(lambda: _series(stack, group).get(key) == 0, "lag back to 0 once it resumed")
