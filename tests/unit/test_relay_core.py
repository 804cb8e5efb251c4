"""The relay's pure decisions: the shard assignment every replica computes, which publish
failures are the row's fault, and the clock bound writers and relays share."""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

from services.contracts import convergence
from services.relay import core
from services.relay.leases import assign


def test_every_replica_computes_the_same_balanced_assignment() -> None:
    for n in range(1, 20):
        members = [f"r{i:02d}" for i in range(n)]
        a = assign(members, 16)
        assert a == assign(list(reversed(members)), 16)  # order of discovery does not matter
        shards = sorted(s for v in a.values() for s in v)
        assert shards == list(range(16))  # each shard exactly once
        sizes = [len(v) for v in a.values()]
        assert max(sizes) - min(sizes) <= 1


def test_a_row_refused_for_what_it_is_is_not_retriable_a_broker_outage_is() -> None:
    assert not core._retriable(KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)))
    assert not core._retriable(ValueError("outbox row without topic, key or payload"))
    for code in (KafkaError._MSG_TIMED_OUT, KafkaError._ALL_BROKERS_DOWN,
                 KafkaError.NOT_ENOUGH_REPLICAS):  # fmt: skip
        assert core._retriable(KafkaException(KafkaError(code)))
    assert core._retriable(TimeoutError())


def test_the_relay_keeps_scanning_as_far_back_as_a_writer_can_lag() -> None:
    # a writer lagging by MAX_CLOCK_SKEW_S writes into a bucket at most this many minutes back
    assert core.TRAILING_BUCKETS * core.BUCKET_S >= convergence.MAX_CLOCK_SKEW_S + core.BUCKET_S
    ms = 1_000_000_000_000.0
    assert convergence.clock_offset_s(lambda: ms, clock=lambda: ms / 1000 + 5) == 5
    assert convergence.clock_within_skew(convergence.MAX_CLOCK_SKEW_S / 2)
    assert not convergence.clock_within_skew(-convergence.MAX_CLOCK_SKEW_S / 2 - 1)
