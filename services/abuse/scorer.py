"""The abuse scorer's loop: consume likes.committed (its own group), compute each like's features,
ask the model server for probabilities, void what scores at or above the model's threshold, then
commit the offsets.

Failure modes (the seed's, issue 13):
- The model server is down or times out: the batch is held and retried with backoff, the
  partitions are paused (the consumer keeps polling, so it stays in its group), and nothing is
  committed. Kafka is the buffer: the events wait in likes.committed, which keeps 7 days
  (infra/config.py `retention_hours`). The seed buffers in Redis with a 24 h TTL; at its peak of
  93 K likes/s that is 8.0 billion events a day, ~1.6 TB at ~200 B an event, held three times
  over in a Redis cluster. The log already holds exactly those bytes, replicated, for a week, so
  a deferral costs consumer lag, not memory: the likes of the outage are counted meanwhile (they
  "leak") and voided when the model returns and the scorer catches up. Lag is alerted on
  (likes_consumer_lag_seconds of this group). What that week costs the brokers, measured on
  events with every signal set: 206 B of key and value each, 116 B once lz4 compresses a batch
  (the producers' compression.type), so ~1.0 TB a day of the peak held all day, ~7 TB a week,
  ~21 TB at replication factor 3: about 55 % of prod-us's 9 x 4,000 GiB (stacks/
  Pulumi.prod-us.yaml) for a week of peak traffic, and the other topics are small beside it.
- A crash between a void and the commit: the batch is read again and scored again; each void is
  idempotent (services/abuse/voids.py: conditional, with a deterministic intent), so none is
  applied twice, and a void that applied is in its outbox row, so none is lost. Offsets are
  committed only after every void of the batch is written and its publish acked (or left to the
  relay).
- The edge-store or the registry is down: as for the model, the batch is held and retried.

Features are computed once per batch, before its first Score call, and kept with the held batch,
so a retry is scored on the same rows. Where their state lives is the `abuse_feature_store`
setting: `memory` (services/abuse/features.py, this process's: it sees only the partitions it
owns, and likes.committed is keyed by post, so it is right for one replica only) or `shared`
(services/abuse/shared_features.py, in the feature-store, a Redis Cluster of its own: every
replica sees every like of a user; the program renders it whenever the scorer may run more than
one replica). The feature-store down or unreachable while a batch is observed: the batch is held
exactly as for the model (dependency `feature-store`), and observing it again once the store is
back counts nothing twice. Full, it evicts (keys.EVICTION_POLICY): a lost feature weakens a
score, it holds nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as KTP
from confluent_kafka.serialization import MessageField, SerializationContext
from redis.cluster import RedisCluster

from services.abuse import features, metrics
from services.abuse.model_server import ModelUnavailable, Verdicts
from services.abuse.settings import ScorerSettings
from services.abuse.shared_features import FeatureStoreUnavailable
from services.common.worker_http import LoopHealth
from services.contracts import clients, degrade, events, keys
from services.write.core import Unavailable

log = logging.getLogger("abuse.scorer")

MODEL = "model"
EDGE_STORE = "edge-store"
FEATURE_STORE = "feature-store"  # the shared feature state's Redis Cluster (infra/redis.py)
IDEM_STORE = "idem-store"  # the storm watch, beside the degraded list the write path reads
DEPENDENCIES = (MODEL, EDGE_STORE, FEATURE_STORE, IDEM_STORE)
for _dep in DEPENDENCIES:  # bound at start: "no failure" reads 0, not "No data"
    metrics.DEPENDENCY_FAILURES.labels(_dep)


class Model(Protocol):
    """The model server's client (services/abuse/model_server.ModelClient)."""

    def verdicts(self, rows: Sequence[Sequence[float]]) -> Verdicts: ...


class FeatureState(Protocol):
    """features.Features or shared_features.SharedFeatures: each like's row, in order; the
    shared one raises FeatureStoreUnavailable."""

    def observe_many(self, likes: Sequence[events.LikeEvent]) -> Sequence[Sequence[float]]: ...


class VoidWriter(Protocol):
    """services/abuse/voids.Voider: one user's voids in order, each answered by its result or
    the Unavailable that stopped it."""

    def void_many(
        self, likes: Sequence[tuple[events.LikeEvent, float]], model_version: str
    ) -> Sequence[Any]: ...


class Storms(Protocol):
    """StormWatch (a test may record the voids instead)."""

    def voided_many(self, voids: Sequence[tuple[str, str, float]]) -> Sequence[bool]: ...


# KEYS: the user's storm set, their degraded key; ARGV: the like's id, its time (s), window (s),
# storm voids, degraded TTL (s), set TTL (ms). 1: degraded the user just now.
_STORM = r"""
redis.call('ZADD', KEYS[1], 'NX', ARGV[2], ARGV[1])
local newest = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')[2]
local horizon = tonumber(newest) - tonumber(ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', '(' .. string.format('%.17g', horizon))
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[4]) then
  redis.call('PEXPIRE', KEYS[1], ARGV[6])
  return 0
end
redis.call('DEL', KEYS[1])
if redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[5]) then return 1 end
return 0
"""


class StormWatch:
    """Who is storming: a user whose likes were voided `degrade.STORM_VOIDS` times within
    `degrade.STORM_WINDOW_S` (by the likes' own time, so a replay finds the same storms) is
    degraded once (services/contracts/degrade.py).

    The count lives in the idem-store beside the degraded key (keys.storm_key, the user's slot),
    not in the process: likes.committed is keyed by post, so each replica voids a share of a
    user's likes, and with per-process counts a bot would need N times the voids on N. One
    script per void, atomic on the user's node: it adds the like's id (a like voided again, by a
    retried batch or the replica a rebalance handed it to, counts once), drops the ids older
    than the window before the newest, and at STORM_VOIDS deletes the set (degraded for
    DEGRADED_TTL_S: the count starts afresh after) and sets the degraded key unless it is set.
    Memory: under STORM_VOIDS ids a user, and a set expires a window after its last void (a
    scorer held longer than that by an outage forgets those few voids: the storm's next ones
    make them up)."""

    def __init__(self, rc: RedisCluster) -> None:
        self.rc = rc

    def voided_many(self, voids: Sequence[tuple[str, str, float]]) -> list[bool]:
        """Count voids (user, the like's intent, its time in epoch seconds) in order, pipelined per
        node; for each, True when it degraded its user just now. Raises REDIS_ERRORS (counting
        the same voids again is safe)."""
        args = (degrade.STORM_WINDOW_S, degrade.STORM_VOIDS, degrade.DEGRADED_TTL_S,
                int(degrade.STORM_WINDOW_S * 1000))  # fmt: skip
        calls = [
            ((keys.storm_key(user), keys.degraded_key(user)), (like_id, repr(at_s), *args))
            for user, like_id, at_s in voids
        ]
        return [bool(r) for r in clients.eval_per_node(self.rc, _STORM, calls)]


@dataclass
class Held:
    """A batch read, not yet scored and voided: retried as it is. Its likes are featurized
    once, at its first attempt (`pending` until then), and keep those rows through retries."""

    likes: list[tuple[events.LikeEvent, Sequence[float]]]
    positions: dict[tuple[str, int], int]  # next offset per partition, committed once done
    pending: list[events.LikeEvent] = field(default_factory=list)  # read, not yet featurized


class Scorer:
    def __init__(
        self,
        settings: ScorerSettings,
        *,
        consumer: Consumer,
        deserialize: Callable[[bytes, SerializationContext], Any],
        features: FeatureState,
        model: Model,
        voider: VoidWriter,
        storms: Storms | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.s = settings
        self.consumer = consumer
        self.deserialize = deserialize
        self.features = features
        self.model = model
        self.voider = voider
        self.storms = storms
        self.clock = clock
        self.held: Held | None = None
        self._retry_at = 0.0
        self._backoff = 0.0
        # positions whose commit failed: committed again (merged with newer ones) until one takes
        self._uncommitted: dict[tuple[str, int], int] = {}
        self._commit_retry_at = 0.0
        self.stop = threading.Event()
        self.loop = LoopHealth(DEPENDENCIES, clock=clock)
        self.assigned: list[KTP] = []
        # the driver and the producer are thread-safe; each void is conditional on its own like
        # (services/abuse/voids.py), so a batch's voids may run in any order and at once
        self._voiding = ThreadPoolExecutor(settings.abuse_void_concurrency, "abuse-void")

    def run(self, stop: threading.Event | None = None) -> None:
        if stop is not None:
            self.stop = stop
        self.consumer.subscribe(
            [self.s.source_topic], on_assign=self._on_assign, on_revoke=self._on_revoke
        )
        try:
            while not self.stop.is_set():
                self.step()
        finally:
            self.consumer.close()
            self._voiding.shutdown(wait=True)

    def _on_assign(self, _c: Consumer, parts: list[KTP]) -> None:
        self.assigned = list(parts)
        log.info("partitions assigned", extra={"fields": {"partitions": len(parts)}})

    def _on_revoke(self, _c: Consumer, _parts: list[KTP]) -> None:
        # the next owner reads from the committed offsets: a held batch is theirs now
        if self.held is not None:
            self.consumer.resume(self.assigned)
            # nothing waits on the dependency now: /readyz must not say so until a batch of the
            # new assignment fails again (an idle partition would keep it unready for good)
            self.loop.waiting_for = None
            metrics.DEFERRED.set(0)
        self.held = None
        self.assigned = []

    def step(self, timeout: float = 0.2) -> None:
        self.loop.turned()
        metrics.LOOP_TIMESTAMP.set_to_current_time()
        if self.held is not None:
            self.consumer.poll(0)  # stay in the group (max.poll.interval.ms) while paused
            if self.clock() < self._retry_at:
                time.sleep(min(timeout, max(0.0, self._retry_at - self.clock())))
                return
            self._finish(self.held)
            return
        msgs = self.consumer.consume(num_messages=self.s.abuse_batch, timeout=timeout)
        if msgs:
            self._finish(self._read(msgs))
        elif self._uncommitted and self.clock() >= self._commit_retry_at:
            self._commit({})  # an idle partition must not keep a failed commit's lag forever

    def _read(self, msgs: list[Message]) -> Held:
        held = Held([], {})
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF and err.fatal():
                    raise KafkaException(err)
                continue
            held.positions[(m.topic() or "", m.partition() or 0)] = (m.offset() or 0) + 1
            try:
                e = self.deserialize(
                    m.value() or b"", SerializationContext(m.topic() or "", MessageField.VALUE)
                )
            except Exception as exc:  # the aggregator dead-letters it; nothing to score here
                metrics.UNREADABLE.inc()
                log.warning("unreadable event skipped", extra={"fields": {"error": str(exc)}})
                continue
            metrics.EVENTS.inc()
            if isinstance(e, events.LikeEvent) and e.action == "like" and e.delta > 0:
                held.pending.append(e)
        return held

    def _finish(self, held: Held) -> None:
        """Score, void and commit; on a dependency's failure hold the batch and back off."""
        try:
            if held.pending:
                rows = self.features.observe_many(held.pending)
                held.likes.extend(zip(held.pending, rows, strict=True))
                held.pending = []
            if held.likes:
                self._score_and_void(held)
        except (ModelUnavailable, Unavailable, FeatureStoreUnavailable) as e:
            dep = (MODEL if isinstance(e, ModelUnavailable)
                   else FEATURE_STORE if isinstance(e, FeatureStoreUnavailable)
                   else IDEM_STORE if e.dependency == IDEM_STORE
                   else EDGE_STORE)  # fmt: skip
            if self.held is None:
                self.consumer.pause(self.assigned)
                log.warning("scoring deferred", extra={"fields": {"waiting_for": dep,
                                                                  "error": str(e)}})  # fmt: skip
            self.held = held
            self.loop.failed(dep)
            metrics.DEFERRED.set(1)
            metrics.DEPENDENCY_FAILURES.labels(dep).inc()
            self._backoff = min(self.s.abuse_retry_max_s, max(0.2, self._backoff * 2))
            self._retry_at = self.clock() + self._backoff
            return
        self._commit(held.positions)
        if self.held is not None:
            log.info("scoring resumed", extra={"fields": {"likes": len(held.likes)}})
            self.consumer.resume(self.assigned)
            self.loop.waiting_for = None
        self.held = None
        self._backoff = 0.0
        metrics.DEFERRED.set(0)

    def _score_and_void(self, held: Held) -> None:
        verdicts = self.model.verdicts([row for _, row in held.likes])
        flagged: list[tuple[events.LikeEvent, Sequence[float], float]] = []
        for (e, row), p in zip(held.likes, verdicts.probabilities, strict=True):
            metrics.SCORES.observe(p)
            if p >= verdicts.threshold:
                flagged.append((e, row, p))

        # the held batch keeps what it voided: a retry after a failure voids again, idempotently
        # (an applied void answers "replayed"). Users' voids run at once, each user's in one
        # call, in order: a void is a lightweight transaction on the user's partition, and a
        # bot's likes come in bursts, so concurrent voids of one user would contend in Paxos;
        # the voider puts a user's voids in conditional batches, one Paxos round for several
        # (services/abuse/voids.Voider.void_many). Every void is waited for before a failure is
        # raised, so the storm watch sees each one that is done.
        def void_each(indices: list[int]) -> list[Any]:
            likes = [(flagged[i][0], flagged[i][2]) for i in indices]
            try:
                return list(self.voider.void_many(likes, verdicts.version))
            except (Unavailable, ModelUnavailable) as exc:
                return [exc] * len(indices)

        by_user: dict[str, list[int]] = {}
        for i, (e, _, _) in enumerate(flagged):
            by_user.setdefault(e.user_id, []).append(i)
        results: list[Any] = [None] * len(flagged)
        running = [(ix, self._voiding.submit(void_each, ix)) for ix in by_user.values()]
        for ix, fut in running:
            for i, r in zip(ix, fut.result(), strict=True):
                results[i] = r
        failed: Unavailable | ModelUnavailable | None = None
        done: list[events.LikeEvent] = []
        for (e, row, p), result in zip(flagged, results, strict=True):
            if isinstance(result, Unavailable | ModelUnavailable):
                failed = failed or result
                continue
            metrics.VOIDS.labels(result.reason).inc()
            # a replayed void (this batch held, or handed over by a rebalance, after it applied)
            # counts for the storm too: the count may have missed it, and counts each like once
            if result.done:
                done.append(e)
            if not result.applied:
                continue
            # the answer to "why did my like vanish?", with its evidence
            evidence = dict(zip(features.FEATURE_NAMES, row, strict=True))
            log.info("like voided", extra={"fields": {
                "user_id": e.user_id, "post_id": e.post_id, "intent": e.intent_uuid,
                "score": round(p, 4), "model": verdicts.version,
                "features": evidence}})  # fmt: skip
        if self.storms is not None and done:
            try:
                degraded = self.storms.voided_many(
                    [(e.user_id, e.intent_uuid, e.occurred_at / 1000) for e in done]
                )
            except clients.REDIS_ERRORS as exc:  # the voids stand; the retry counts them again
                failed = failed or Unavailable(IDEM_STORE, str(exc))
            else:
                for e, now in zip(done, degraded, strict=True):
                    if now:
                        metrics.DEGRADED.inc()
                        log.warning("account degraded: a storm of voided likes",
                                    extra={"fields": {"user_id": e.user_id}})  # fmt: skip
        if failed is not None:
            raise failed
        metrics.SCORED.inc(len(held.likes))

    def _commit(self, positions: dict[tuple[str, int], int]) -> None:
        """Commit `positions` with any earlier ones whose commit failed. A failure (a rebalance,
        the coordinator moved, the offsets topic refusing writes) keeps them for the next try:
        the next owner would re-read and void again, idempotently, but a partition that goes idle
        would otherwise show its lag forever (the consumer-lag exporter found it)."""
        pending = {**self._uncommitted}
        for k, o in positions.items():
            pending[k] = max(o, pending.get(k, o))
        if not pending:
            return
        try:
            self.consumer.commit(
                offsets=[KTP(t, p, o) for (t, p), o in pending.items()], asynchronous=False
            )
            self._uncommitted = {}
        except KafkaException as e:
            self._uncommitted = pending
            self._commit_retry_at = self.clock() + 1.0
            log.warning("offset commit failed", extra={"fields": {"error": str(e)}})

    def ready(self) -> dict[str, bool]:
        return self.loop.checks()
