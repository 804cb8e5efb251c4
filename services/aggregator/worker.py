"""The aggregator's Kafka loop: consume, dedup, window, flush (cells → aggregates → purge), commit.

The counter-store cells are the record: offsets are committed only after a window's cells are
written, and a failing counter-store retries the window with backoff and never skips it.
Replaying a window is safe (see services/aggregator/core.py): cells skip offsets they already
hold, aggregates lose to a stored generation that is not older.

The count-cache is not the record, so it never holds the offsets (issue 10, hole 2: a full cache
once failed every aggregate write, the window was retried forever, the consumer left its group
and every count froze). A refused aggregate write or Bloom add is held in a bounded set and
retried by each later window (an aggregate is re-read from the cells, so the retry writes the
newest count); meanwhile readers see the previous aggregate, which is older, never wrong
(invariant 4). A full set drops the oldest: the post's next event or `likes recount` repairs
an aggregate, the filter's TTL bounds a lost Bloom add.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from confluent_kafka import OFFSET_INVALID, Consumer, KafkaError, KafkaException, Message
from confluent_kafka import TopicPartition as KTP
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.serialization import MessageField, SerializationContext
from opentelemetry import trace
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_when_event_set,
    wait_exponential,
)

from services.aggregator import metrics
from services.aggregator.cache import AggregateWriter, HotPoolMirror
from services.aggregator.core import (
    CATCHUP_LAG_MS,
    TP,
    CellKey,
    CellState,
    PartitionDedup,
    Poison,
    Window,
    Windower,
    aggregate,
    apply_fold,
    cell_region,
    fold,
    validate,
)
from services.aggregator.dlq import DeadLetter
from services.aggregator.purge import Purger, surrogate_key
from services.aggregator.settings import AggregatorSettings
from services.aggregator.store import CellRow, CounterStore, Plan, PoisonPosts
from services.common import observability
from services.common.worker_http import LoopHealth
from services.contracts import bloom, dlq
from services.contracts.events import LikeEvent

log = logging.getLogger("aggregator")

CONSUME_BATCH = 1000  # messages per consume() call
UNSYNCED_MAX = 100_000  # held cache writes per kind (posts; (user, post) Bloom adds)
RETRY_CHUNK = 5_000  # held posts retried per window: a long outage must not make windows slow
# Cold posts (a cell not in the cell cache) read while their window is still open, this many a
# read: their cells' states are then at hand when the window flushes (see _prefetch_cold).
PREFETCH_CHUNK = 500
PREFETCH_WAIT_S = 2.0  # what a flush waits for reads still under way (the store may be down)
# A count-cache failover may lose the writes its replica had not received yet (asynchronous
# replication; the seed: "5 s of recent INCRs may be lost"). The worker watches the cluster epoch
# and, when it moves, writes the last REDRIVE_S of aggregates and Bloom adds again (review D6).
# The window covers node timeout + election + the 1 s watch with room to spare.
REDRIVE_S = 30.0
REDRIVE_MAX_LIKERS = 200_000
# what the loop can be stuck retrying (a /readyz check each)
REGISTRY = "schema-registry"
WINDOW_FLUSH = "window-flush"
_tracer = trace.get_tracer("likes.aggregator")  # a proxy: follows the provider set at start-up


class Transient(Exception):
    """A dependency (not the message) failed: retry the same message, never dead-letter it."""


def _is_transient(e: BaseException) -> bool:
    if isinstance(e, SchemaRegistryError):
        return e.http_status_code >= 500 or e.http_status_code in (408, 429)
    # httpx (or httpx2) TransportError: the registry is unreachable
    return isinstance(e, OSError) or any(c.__name__ == "TransportError" for c in type(e).__mro__)


def _hold(held: OrderedDict[Any, None], items: Iterable[Any], what: str) -> None:
    for it in items:
        held[it] = None
        held.move_to_end(it)
    dropped = 0
    while len(held) > UNSYNCED_MAX:
        held.popitem(last=False)
        dropped += 1
    if dropped:
        metrics.CACHE_DROPPED.labels(what).inc(dropped)
    metrics.CACHE_UNSYNCED.labels(what).set(len(held))


Plans = dict[str, Plan]  # post -> its cells a window wrote: (cell, state read, state written)


def _patched(
    read: dict[str, list[CellRow]], plans: Plans, post_ids: Iterable[str]
) -> dict[str, list[CellRow]]:
    """`read` (every cell of each post, read while the window's cells were being written) as a
    read after that write returns it: a cell the window wrote shows the written state unless
    the read saw one further along its partition's log (a later owner's)."""
    out: dict[str, list[CellRow]] = {}
    for pid in post_ids:
        rows = {(r.region, r.shard): r for r in read.get(pid, ())}
        for cell, _old, new in plans.get(pid, ()):
            seen = rows.get((cell.region, cell.shard))
            if seen is None or seen.applied < new.applied:
                rows[cell.region, cell.shard] = CellRow(
                    cell.region, cell.shard, new.value, new.applied, dict(new.reactions)
                )
        out[pid] = list(rows.values())
    return out


@dataclass
class PartitionState:
    dedup: PartitionDedup
    warm_until: int  # offsets below this were applied by a previous owner: dedup-only re-read
    last_ts_ms: int = 0


class Aggregator:
    def __init__(
        self,
        settings: AggregatorSettings,
        *,
        consumer: Consumer,
        deserialize: Callable[[bytes, SerializationContext], Any],
        store: CounterStore,
        cache: AggregateWriter,
        purger: Purger,
        dead_letter: DeadLetter,
        mirror: HotPoolMirror | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.s = settings
        self.consumer = consumer
        self.deserialize = deserialize
        self.store = store
        self.cache = cache
        self.purger = purger
        self.dead_letter = dead_letter
        self.mirror = mirror
        self.wall_ms = wall_ms
        self.sleep = sleep
        self.windower = Windower(
            clock,
            settings.agg_window_ms,
            settings.agg_window_max_events,
            settings.agg_window_max_stretch_ms,
        )
        self.parts: dict[TP, PartitionState] = {}
        self.cells: OrderedDict[CellKey, tuple[TP, CellState]] = OrderedDict()  # LRU
        # count-cache writes refused, retried by later windows (insertion order = age)
        self.unsynced_posts: OrderedDict[str, None] = OrderedDict()
        self.unsynced_likers: OrderedDict[tuple[str, str], None] = OrderedDict()
        self.clock = clock
        self._held_retried_at = 0.0
        # positions of flushed windows whose offset commit failed: committed with the next
        # window, or alone once a window passes without one (a partition that went quiet after
        # a failed commit would otherwise show its lag, and replay, for as long as it is quiet)
        self.uncommitted: dict[TP, int] = {}
        self._commit_retried_at = 0.0
        # what each recent window wrote to the count-cache, to re-drive after a failover
        self.recent: deque[tuple[float, frozenset[str], frozenset[tuple[str, str]]]] = deque()
        self._epoch: int | None = None
        self._epoch_checked_at = 0.0
        self._base = {t: t[len(settings.agg_topic_prefix) :] for t in settings.source_topics}
        self._mirrored = set(settings.mirrored_topics)
        # per (region, topic, partition): the cell's region slot (cell_region, once each)
        self._slots: dict[tuple[str, str, int], str] = {}
        self._contexts: dict[str, SerializationContext] = {}  # per topic, for the decoder
        # posts to re-read once more after a peer's event (its cells may replicate after it)
        self.recheck: OrderedDict[str, float] = OrderedDict()
        self._crash = settings.agg_test_crash
        self.stop = threading.Event()
        # the flush's calls that overlap the cells' write (see _flush_window)
        self._pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="aggregator-flush")
        # the hot-pool copies of the last window's aggregates, in flight while the loop goes on
        # (best effort by design, see HotPoolMirror): at most one; the next waits for it
        self._copy_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hot-pool-mirror")
        self._copying: Future[None] | None = None
        # the open window's cold posts: seen, not yet submitted, and the reads under way
        self._cold_seen: set[str] = set()
        self._cold: list[str] = []
        self._prefetch: list[Future[dict[str, list[CellRow]]]] = []
        # their own thread: a read hanging on a paused store must not queue the flush's calls
        self._prefetch_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="prefetch")
        self.loop = LoopHealth((REGISTRY, WINDOW_FLUSH), clock=clock)

    # -- lifecycle ----------------------------------------------------------------------------
    def run(self, stop: threading.Event | None = None) -> None:
        """Consume until `stop` is set; then flush what is pending (once) and close."""
        if stop is not None:
            self.stop = stop
        self.consumer.subscribe(
            [*self.s.source_topics, *self.s.mirrored_topics],
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )
        log.info("aggregator started", extra={"fields": {"topics": self.s.source_topics}})
        # the flush's threads start now, not at the first window's submits: a thread's start
        # waits for the GIL, and the first flush waited 0.36 s for two (py-spy, bench_aggregator)
        both = threading.Barrier(2)
        for f in [self._pool.submit(both.wait, 10) for _ in range(2)]:
            f.result()
        try:
            while not self.stop.is_set():
                self.step()
            w = self.windower.peek()
            if w is not None and not w.empty:
                try:
                    self._flush(self.windower.take())
                except Exception as e:
                    log.warning("final flush failed; the next owner replays it",
                                extra={"fields": {"error": str(e)}})  # fmt: skip
        finally:
            self._pool.shutdown()
            self._prefetch_pool.shutdown(cancel_futures=True)
            self._copy_pool.shutdown()  # lets the copies in flight land
            self.consumer.close()

    def step(self, timeout: float = 0.1) -> None:
        self.loop.turned()
        metrics.LOOP_TIMESTAMP.set_to_current_time()
        msgs = self.consumer.consume(num_messages=CONSUME_BATCH, timeout=timeout)
        self._handle_batch(msgs)
        self._watch_failover()
        if self.windower.due():
            self._flush_with_retry(self.windower.take())
        elif self.unsynced_posts or self.unsynced_likers or self.recheck:
            self._retry_held()
        if (
            self.uncommitted
            and self.clock() - self._commit_retried_at >= self.s.agg_window_ms / 1000
        ):
            self._commit_positions({})

    def _watch_failover(self) -> None:
        now = self.clock()
        if now - self._epoch_checked_at < 1.0:
            return
        self._epoch_checked_at = now
        try:
            epoch = self.cache.epoch()
        except Exception:
            return  # unreachable: the writes themselves fail and are held
        moved = self._epoch is not None and epoch != self._epoch
        self._epoch = epoch
        if not moved:
            return
        while self.recent and self.recent[0][0] < now - REDRIVE_S:
            self.recent.popleft()
        posts = set().union(*(r[1] for r in self.recent)) if self.recent else set()
        likers = set().union(*(r[2] for r in self.recent)) if self.recent else set()
        metrics.CACHE_REDRIVES.inc()
        log.warning("count-cache failover: re-driving recent writes",
                    extra={"fields": {"epoch": epoch, "posts": len(posts),
                                      "likes": len(likers)}})  # fmt: skip
        with contextlib.suppress(Exception):
            self.cache.refresh()
        try:
            self._purge(self._sync_aggregates(sorted(posts)))
            self._sync_likers(likers)
        except Exception as e:  # the counter-store: the posts' next events repair them
            log.warning("re-drive failed", extra={"fields": {"error": str(e)}})

    def _remember(self, posts: set[str], likers: set[tuple[str, str]]) -> None:
        now = self.clock()
        self.recent.append((now, frozenset(posts), frozenset(likers)))
        while self.recent and self.recent[0][0] < now - REDRIVE_S:
            self.recent.popleft()
        while sum(len(r[2]) for r in self.recent) > REDRIVE_MAX_LIKERS and len(self.recent) > 1:
            self.recent.popleft()  # the filters' TTL bounds what is lost beyond this

    def _retry_held(self) -> None:
        """Held cache writes, retried once a window even when no event arrives."""
        now = self.clock()
        if now - self._held_retried_at < self.s.agg_window_ms / 1000:
            return
        self._held_retried_at = now
        due = []
        while self.recheck and next(iter(self.recheck.values())) <= now:
            due.append(self.recheck.popitem(last=False)[0])
        try:
            self._purge(self._sync_aggregates(due))
            self._sync_likers(set())
        except Exception as e:  # the counter-store: the next turn tries again
            log.warning("retrying held cache writes failed", extra={"fields": {"error": str(e)}})

    # -- rebalance ----------------------------------------------------------------------------
    def _on_assign(self, consumer: Consumer, partitions: list[KTP]) -> None:
        """Start each partition a dedup horizon before its committed offset: those messages
        are re-read into the dedup set only, so it holds what the previous owner's held.

        "A horizon before" is found by time (the first offset at now - 2 x horizon: the last
        minute or so of a caught-up partition, a few messages of a cold one) and bounded by the
        capacity; a group lagging further than that re-reads `capacity` messages."""
        committed = consumer.committed(partitions, timeout=30)
        n = self.s.dedup_capacity
        horizon_ms = int(self.s.agg_dedup_horizon_s * 1000)
        since = self.wall_ms() - 2 * horizon_ms
        by_time = {
            (t.topic, t.partition): t.offset
            for t in consumer.offsets_for_times(
                [KTP(tp.topic, tp.partition, since) for tp in committed], timeout=10
            )
        }
        for tp in committed:
            lo, hi = consumer.get_watermark_offsets(tp, timeout=10)
            if tp.offset == OFFSET_INVALID or tp.offset < 0:
                start = lo if self.s.agg_auto_offset_reset == "earliest" else hi
            else:
                start = max(tp.offset, lo)
            recent = by_time.get((tp.topic, tp.partition), -1)
            recent = hi if recent < 0 else recent  # nothing that young: none to remember
            warm_from = max(lo, start - n, recent) if recent <= start else max(lo, start - n)
            self.parts[(tp.topic, tp.partition)] = PartitionState(
                PartitionDedup(n, horizon_ms), warm_until=start
            )
            tp.offset = warm_from
        consumer.assign(committed)
        metrics.ASSIGNED.set(len(self.parts))
        ranges = [
            f"{t.topic}[{t.partition}] from {t.offset}, counting from "
            f"{self.parts[(t.topic, t.partition)].warm_until}"
            for t in committed
        ]
        log.info("partitions assigned", extra={"fields": {"partitions": ranges}})

    def _on_revoke(self, consumer: Consumer, partitions: list[KTP]) -> None:
        # hand over cleanly: one flush attempt; if it fails the next owner replays, safely
        w = self.windower.peek()
        if w is not None and not w.empty:
            try:
                self._flush(self.windower.take())
            except Exception as e:
                log.warning("flush on revoke failed; the next owner replays the window",
                            extra={"fields": {"error": str(e)}})  # fmt: skip
        self._drop([(p.topic, p.partition) for p in partitions])

    def _on_lost(self, consumer: Consumer, partitions: list[KTP]) -> None:
        self._drop([(p.topic, p.partition) for p in partitions])

    def _drop(self, tps: list[TP]) -> None:
        gone = set(tps)
        self._forget_prefetch()  # read before the change of owners: no longer what we hold
        w = self.windower.peek()
        if w is not None:
            w.drop_partitions(gone)
        for tp in gone:
            self.parts.pop(tp, None)
            with contextlib.suppress(KeyError):
                metrics.LAG.remove(tp[0], str(tp[1]))
            with contextlib.suppress(KeyError):
                metrics.DEDUP_HORIZON.remove(tp[0], str(tp[1]))
        for c in [c for c, (tp, _) in self.cells.items() if tp in gone]:
            del self.cells[c]
        metrics.ASSIGNED.set(len(self.parts))
        log.info("partitions revoked", extra={"fields": {"partitions": sorted(gone)}})

    # -- messages -----------------------------------------------------------------------------
    def _handle_batch(self, msgs: list[Message]) -> None:
        if not msgs:
            for (topic, part), _ in self.parts.items():
                metrics.LAG.labels(topic, str(part)).set(0)
            self.windower.catching_up = False  # at the head
            return
        counts: dict[str, int] = {}
        touched: set[TP] = set()
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.code() != KafkaError._PARTITION_EOF:
                    if err.fatal():
                        raise KafkaException(err)
                    log.warning("consumer error", extra={"fields": {"error": str(err)}})
                continue
            topic = m.topic() or ""
            counts[topic] = counts.get(topic, 0) + 1
            tp = (topic, m.partition() or 0)
            if tp in self.parts:
                self._handle(m, tp)
                touched.add(tp)
        for topic, n in counts.items():
            metrics.EVENTS.labels(topic).inc(n)
        now = self.wall_ms()
        behind = 0
        for tp in touched:
            st = self.parts.get(tp)
            if st is not None:
                lag_ms = max(0, now - st.last_ts_ms)
                behind = max(behind, lag_ms)
                metrics.LAG.labels(tp[0], str(tp[1])).set(lag_ms / 1000)
        # a backlog, not a few late events: a full batch came back and it is old
        self.windower.catching_up = len(msgs) >= CONSUME_BATCH and behind > CATCHUP_LAG_MS
        metrics.DEDUP_SIZE.set(sum(len(p.dedup) for p in self.parts.values()))
        if len(self._cold) >= PREFETCH_CHUNK:
            self._prefetch.append(self._prefetch_pool.submit(self.store.read_posts, self._cold))
            self._cold = []
        for tp in touched:
            st = self.parts.get(tp)
            if st is not None:
                metrics.DEDUP_HORIZON.labels(tp[0], str(tp[1])).set(st.dedup.horizon_ms() / 1000)

    def _handle(self, m: Message, tp: TP) -> None:
        st = self.parts[tp]
        offset = m.offset() or 0
        if dlq.replay_for_another_group(m.headers(), self.s.agg_group_id):
            # another group's replay (`likes dlq replay`): this group had the original
            if offset >= st.warm_until:
                self.windower.current.consumed(tp, offset)
            return
        ts_type, ts = m.timestamp()
        warm = offset < st.warm_until
        try:
            event = self._process(m, warm)
        except Transient:  # the registry, not the message: wait for it, never dead-letter
            event = self._retry_transient(lambda: self._process(m, warm))
        if event is not None and ts_type == 0:  # TIMESTAMP_NOT_AVAILABLE
            ts = event.occurred_at
        st.last_ts_ms = ts
        if warm:  # applied by the previous owner: only rebuild the dedup set
            if event is not None:
                st.dedup.check_and_add(event.intent_uuid, ts)
            return
        w = self.windower.current
        if event is None:  # dead-lettered: the partition moves past it
            w.consumed(tp, offset)
            return
        if tp[0] in self._mirrored:  # a peer region's event: refresh, never count (D3)
            w.consumed(tp, offset)
            w.refresh.add(event.post_id)
            if event.action == "like" and event.delta > 0:
                w.likers.add((event.user_id, event.post_id))
            return
        if st.dedup.check_and_add(event.intent_uuid, ts):
            metrics.DEDUP_HITS.inc()
            w.duplicates += 1
            w.consumed(tp, offset)
            return
        slot = self._slots.get((event.region, *tp))
        if slot is None:
            slot = self._slots[event.region, *tp] = cell_region(
                event.region, self._base[tp[0]], tp[1]
            )
        cell = CellKey(event.post_id, slot, event.shard)
        if cell not in self.cells and cell.post_id not in self._cold_seen:
            self._cold_seen.add(cell.post_id)
            self._cold.append(cell.post_id)
        w.add(tp, offset, cell, event.delta, event.reaction)
        if event.action == "like" and event.delta > 0:
            w.likers.add((event.user_id, event.post_id))
        if observability.tracing_on() and len(w.links) < observability.MAX_LINKS:
            sc = observability.span_context_from(m.headers())
            if sc is not None:
                w.links.append(sc)

    def _retry_transient(self, fn: Callable[[], LikeEvent | None]) -> LikeEvent | None:
        retrying = Retrying(
            retry=retry_if_exception_type(Transient),
            wait=wait_exponential(multiplier=0.2, max=5),
            stop=stop_when_event_set(self.stop),
            reraise=True,
            sleep=self.sleep,
            before_sleep=self._registry_failed,
        )
        with self.loop.retrying(REGISTRY):  # not ready while this waits (see LoopHealth)
            event = retrying(fn)
        attempts = retrying.statistics.get("attempt_number", 1)
        if attempts > 1:
            log.info("registry reachable again; resuming", extra={"fields": {"attempts": attempts}})
        return event

    def _registry_failed(self, rs: RetryCallState) -> None:
        self.loop.failed(REGISTRY)
        error = rs.outcome.exception() if rs.outcome else None
        log.warning(
            "registry unreachable; retrying the message",
            extra={"fields": {"attempt": rs.attempt_number, "error": str(error)}},
        )

    def _decode(self, m: Message) -> LikeEvent:
        value = m.value()
        if not value:
            raise Poison("empty value")
        topic = m.topic() or ""
        ctx = self._contexts.get(topic)
        if ctx is None:
            ctx = self._contexts[topic] = SerializationContext(topic, MessageField.VALUE)
        try:
            event = self.deserialize(value, ctx)
        except Exception as e:
            if _is_transient(e):
                raise Transient(str(e)) from e
            raise Poison(f"undecodable: {type(e).__name__}: {e}") from e
        if not isinstance(event, LikeEvent):
            raise Poison(f"decoded to {type(event).__name__}")
        return event

    def _process(self, m: Message, warm: bool) -> LikeEvent | None:
        """Decode and validate, up to N attempts; the message is poison after the last one."""
        attempts = self.s.agg_poison_attempts
        error = ""
        event: LikeEvent | None = None
        for attempt in range(1, attempts + 1):
            try:
                event = self._decode(m)
                validate(event)
                return event
            except Transient:
                raise
            except Exception as e:
                error = str(e) if isinstance(e, Poison) else f"{type(e).__name__}: {e}"
                if warm:
                    return None  # the previous owner already dead-lettered it
                if attempt < attempts:
                    self.sleep(0.01 * attempt)
        self.dead_letter.send(m, error, attempts, event)
        return None

    # -- flush --------------------------------------------------------------------------------
    def _flush_with_retry(self, w: Window) -> None:
        retrying = Retrying(
            wait=wait_exponential(multiplier=0.2, max=5),
            stop=stop_when_event_set(self.stop),
            reraise=True,
            sleep=self.sleep,
            before_sleep=self._flush_failed,
        )
        with self.loop.retrying(WINDOW_FLUSH):
            retrying(self._flush, w)

    def _flush_failed(self, rs: RetryCallState) -> None:
        self.loop.failed(WINDOW_FLUSH)
        metrics.FLUSH_FAILURES.inc()
        error = rs.outcome.exception() if rs.outcome else None
        log.warning(
            "window flush failed; retrying (offsets not committed)",
            extra={"fields": {"attempt": rs.attempt_number, "error": str(error)}},
        )

    def _flush(self, w: Window) -> None:
        """One span per window while tracing, linked to the requests its first events came
        from: a like's trace leads to the window that counted it."""
        if not observability.tracing_on():
            self._flush_window(w)
            return
        links = [trace.Link(sc) for sc in w.links]
        with _tracer.start_as_current_span(WINDOW_FLUSH, links=links) as span:
            span.set_attribute("likes.window.events", w.events)
            span.set_attribute("likes.window.posts", len(w.cells))
            self._flush_window(w)

    def _prefetch_cold(self) -> dict[str, list[CellRow]]:
        """The cells of the window's cold posts, read while the window was open, and forget
        them (the next window starts its own). Why: the first window after a start or a
        rebalance finds every cell cold, and its flush waited for their read before it could
        write a cell (0.7 s of a 3.2 s flush of 9 k posts in bench_aggregator, the counter-store
        idle meanwhile). Reading them earlier is as safe as reading them at the flush: the
        cells are fed only by partitions this worker owns (a change of owners drops what was
        read, `_drop`), this worker writes them only in flushes, which run between windows,
        and a previous owner's late write is met as at the flush (the offset filter, last write
        wins by offset: store.py). A read that failed or did not end within PREFETCH_WAIT_S
        (a paused store) leaves its posts to the flush's own read."""
        if self._cold and self._prefetch:  # the last few of a big window, read now: a small
            # read, not the window's whole one. A window with fewer cold posts than a chunk (a
            # window at the head) reads none ahead: its states come from the flush's one read,
            # which its aggregates need anyway (reading them twice doubled the store's reads)
            self._prefetch.append(self._prefetch_pool.submit(self.store.read_posts, self._cold))
        done, _ = wait(self._prefetch, timeout=PREFETCH_WAIT_S)
        out: dict[str, list[CellRow]] = {}
        for f in self._prefetch:
            if f in done and f.exception() is None:
                out.update(f.result())
            else:
                f.cancel()  # a read not started yet is not needed any more
        self._forget_prefetch()
        return out

    def _forget_prefetch(self) -> None:
        self._cold_seen = set()
        self._cold = []
        self._prefetch = []

    def _flush_window(self, w: Window) -> None:
        """Cells, then aggregates, Bloom bits, purge, commit. Two steps overlap the cells'
        write, the counter-store's slowest call (its commitlog syncs before it answers): the
        Bloom adds (idempotent, and the likes they record are already edges) and the read of
        every cell of the window's posts for their aggregates, which `_patched` then brings up
        to what this window wrote (last write wins by offset, so the row further along the log
        is the one a read after the write returns). Both are joined before the flush goes on
        or fails; a failed read is retried after the write, as before."""
        t0 = time.perf_counter()
        posts = w.posts()
        ids = [*posts, *(w.refresh - posts.keys())]
        prefetched = self._prefetch_cold()
        bloom_done = self._pool.submit(self._sync_likers, w.likers)
        read_done = self._pool.submit(self.store.read_posts, ids)
        try:
            while True:
                try:
                    cells_written, plans = self._write_cells(w, posts, read_done, prefetched)
                    break
                except PoisonPosts as e:  # refused for good: dead-letter them, flush the rest
                    self._quarantine(w, e.errors)
                    posts = w.posts()
        finally:
            bloom_done.result()  # never raises: a refused add is held for the next window
            read_error = read_done.exception()
        if self._crash == "after-cells" and cells_written:
            os._exit(17)  # test hook: cells written, count-cache and offsets not
        ids = [*posts, *(w.refresh - posts.keys())]
        rows = None if read_error is not None else _patched(read_done.result(), plans, ids)
        changed = self._sync_aggregates(ids, rows)
        self._remember({*posts, *w.refresh}, w.likers)
        due = self.clock() + self.s.agg_remote_recheck_s
        for p in w.refresh:
            self.recheck[p] = due
            self.recheck.move_to_end(p)
        if self._crash == "after-cache" and cells_written:
            os._exit(17)
        self._purge(changed)
        self._commit(w)
        metrics.WINDOWS.inc()
        if cells_written:
            metrics.COLLAPSE.set(w.events / cells_written)
        took = time.perf_counter() - t0
        metrics.FLUSH_SECONDS.observe(took)
        self.windower.stretch(took * 1000)
        log.debug(
            "window flushed",
            extra={"fields": {"events": w.events, "duplicates": w.duplicates, "posts": len(posts),
                              "cells_written": cells_written, "purged": len(changed)}},
        )  # fmt: skip

    def _quarantine(self, w: Window, errors: dict[str, str]) -> None:
        """Dead-letter (by reference) every event of these posts in the window, and drop their
        cells; their offsets still commit with the window, as for decode-time poison."""
        for c in [c for c in w.cells if c.post_id in errors]:
            topic, partition = w.cell_tp[c]
            for entry in w.cells[c]:
                self.dead_letter.send_reference(
                    topic, partition, entry.offset, c.post_id.encode()[:1024],
                    f"flush-time poison: {errors[c.post_id]}",
                )  # fmt: skip
            w.events -= len(w.cells.pop(c))
            del w.cell_tp[c]
            self.cells.pop(c, None)
        w.likers = {(u, p) for u, p in w.likers if p not in errors}

    def _sync_aggregates(
        self, post_ids: list[str], read: dict[str, list[CellRow]] | None = None
    ) -> list[str]:
        """The window's posts (their cells `read` already, or read here), then up to
        RETRY_CHUNK held ones, into the count-cache; refused ones are held. Returns the posts
        whose aggregate changed (to purge)."""
        changed: list[str] = []
        for batch, fresh in ((post_ids, True), (list(self.unsynced_posts)[:RETRY_CHUNK], False)):
            if not batch:
                continue
            rows = read if fresh and read is not None else self.store.read_posts(batch)
            # (read_posts raises: retry the window; the cells are the record)
            try:
                changed += self._write_aggregates(batch, rows)
            except Exception as e:  # anything the cache raises (mid-failover, a slot map in
                # flux can fail inside the client): the cells are the record, so hold and go on
                metrics.CACHE_FAULTS.labels("aggregate").inc()
                log.warning("count-cache refused the aggregates; held for a later window",
                            extra={"fields": {"posts": len(batch), "error": str(e)}})  # fmt: skip
                if fresh:
                    _hold(self.unsynced_posts, batch, "aggregate")
                return changed  # the cache is failing: the held ones wait for the next window
            for p in batch:  # written now (or a newer gen was there): no longer owed
                self.unsynced_posts.pop(p, None)
            metrics.CACHE_UNSYNCED.labels("aggregate").set(len(self.unsynced_posts))
        return changed

    def _sync_likers(self, likers: set[tuple[str, str]]) -> None:
        """Bloom bits for the window's likes (and held ones), added only to filters that exist
        (see services/contracts/bloom.py); idempotent, so a replay is harmless."""
        todo = list(dict.fromkeys([*likers, *self.unsynced_likers]))
        if not todo:
            return
        try:
            bloom.add_many(self.cache.rc, todo)
        except Exception as e:  # as for aggregates: never a reason to stall
            metrics.CACHE_FAULTS.labels("bloom").inc()
            log.warning("count-cache refused the Bloom adds; held for the next window",
                        extra={"fields": {"likes": len(todo), "error": str(e)}})  # fmt: skip
            with contextlib.suppress(Exception):
                self.cache.refresh()
            _hold(self.unsynced_likers, likers, "bloom")
            return
        self.unsynced_likers.clear()
        metrics.CACHE_UNSYNCED.labels("bloom").set(0)

    def _cache_get(self, c: CellKey) -> CellState | None:
        hit = self.cells.get(c)
        if hit is None:
            return None
        self.cells.move_to_end(c)
        return hit[1]

    def _cache_put(self, c: CellKey, tp: TP, st: CellState) -> None:
        self.cells[c] = (tp, st)
        self.cells.move_to_end(c)
        while len(self.cells) > self.s.agg_cell_cache_size:
            self.cells.popitem(last=False)

    def _write_cells(
        self,
        w: Window,
        posts: dict[str, list[CellKey]],
        read: Future[dict[str, list[CellRow]]] | None = None,
        prefetched: dict[str, list[CellRow]] | None = None,
    ) -> tuple[int, Plans]:
        """Fold the window into each cell it touched and write them (store.write_cells: last
        write wins by offset, so no read-compare-retry: a row another owner wrote further along
        the log shadows ours, and our cached state is still the true state at our offset).

        Cells not in the cell cache (every cell of the first window after a start or a
        rebalance) take their state from `prefetched` (read while the window was open:
        _prefetch_cold), else from `read` (the flush's read of every cell of the window's
        posts, for their aggregates) when it succeeded: it is the same query, and reading the
        same rows twice was a quarter of a cold window's flush (bench_aggregator, probed)."""
        states: dict[CellKey, CellState] = {}
        need: list[str] = []
        for pid, cs in posts.items():
            for c in cs:
                st = self._cache_get(c)
                if st is None:
                    need.append(pid)
                    break
                states[c] = st
        if need:
            rows = prefetched or {}
            missing = [p for p in need if p not in rows]
            if missing:
                got = read.result() if read is not None and read.exception() is None else {}
                if not all(p in got for p in missing):
                    got = self.store.read_posts(missing)
                rows = {**rows, **{p: got[p] for p in missing}}
            for pid in need:
                by = {(r.region, r.shard): r for r in rows[pid]}
                for c in posts[pid]:
                    r = by.get((c.region, c.shard))
                    st = CellState(r.value, r.applied, r.reactions) if r else CellState.empty()
                    states[c] = st
                    # what the store holds is what the cache holds from now on, even for a cell
                    # this window leaves alone: a write of ours that landed although its flush
                    # failed (Cassandra killed before the next step) puts the store ahead of the
                    # cache; the retry then skips those events as replays, and a stale cached
                    # state would be written back over them at the next window (the
                    # edge-store-quorum-loss game day lost three likes of one post that way)
                    self._cache_put(c, w.cell_tp[c], st)
        plans: Plans = {}
        applied = skipped = 0
        for pid, cs in posts.items():
            plan = []
            for c in cs:
                f = fold(w.cells[c], states[c].applied)
                n = f.events if f is not None else 0
                applied += n
                skipped += len(w.cells[c]) - n
                if f is not None:
                    plan.append((c, states[c], apply_fold(states[c], f)))
            if plan:
                plans[pid] = plan
        if skipped:
            metrics.REPLAYED.inc(skipped)
        self.store.write_cells(plans)  # raises: the window is retried (nothing cached yet)
        metrics.APPLIED.inc(applied)
        written = 0
        for done in plans.values():
            for c, _old, new in done:
                self._cache_put(c, w.cell_tp[c], new)
            written += len(done)
        metrics.STORE_WRITES.inc(written)
        metrics.STORE_BATCHES.inc(len(plans))
        return written, plans

    def _write_aggregates(self, post_ids: list[str], rows: dict[str, list[CellRow]]) -> list[str]:
        """CAS each post's aggregate + sub-counters, from its whole partition `rows` (other
        regions and shards have other writers), into the count-cache. Returns the posts written."""
        now = self.wall_ms()
        items = []
        for pid in post_ids:
            a = aggregate(rows[pid])
            items.append((pid, a.count, a.gen, a.reactions, now, a.subcounters))
        try:
            results = self.cache.write_many(items)
        except Exception:
            with contextlib.suppress(Exception):
                self.cache.refresh()  # a failover moved slots: re-learn the topology
            raise
        written = [pid for pid, ok in zip(post_ids, results, strict=True) if ok]
        metrics.CACHE_WRITES.labels("applied").inc(len(written))
        metrics.CACHE_WRITES.labels("stale").inc(len(post_ids) - len(written))
        if self.mirror is not None:
            done = set(written)
            copies = [it[:5] for it in items if it[0] in done]
            if self._copying is not None:
                self._copying.result()  # one window's copies in flight at most
            self._copying = self._copy_pool.submit(self._copy, self.mirror, copies)
        return written

    @staticmethod
    def _copy(mirror: HotPoolMirror, copies: list[Any]) -> None:
        """Off the loop: the copies are best effort and hold nothing (no offset, no retry),
        so the next window's consume need not wait for four pools to answer (a cold window of
        9 k posts spent 0.5 s of its 5 s flush here)."""
        try:
            with metrics.HOT_POOL_COPY_SECONDS.time():
                copied = mirror.copy_many(copies)
        except Exception as e:  # copy_many counts a failed pool itself; anything else here too
            metrics.HOT_POOL_COPIES.labels("failed").inc(len(copies))
            log.warning("hot-pool copies failed", extra={"fields": {"error": str(e)}})
            return
        for result, n in copied.items():
            metrics.HOT_POOL_COPIES.labels(result).inc(n)

    def _purge(self, post_ids: list[str]) -> None:
        # best effort: the CDN's own short TTL is the safety net; never hold offsets for it.
        # The purger counts what it purged (in prod on its own thread: purge.BackgroundPurger).
        if not post_ids:
            return
        try:
            self.purger.purge([surrogate_key(p) for p in post_ids])
        except Exception as e:
            metrics.PURGE_FAILURES.inc()
            log.warning("CDN purge failed", extra={"fields": {"error": str(e)}})

    def _commit(self, w: Window) -> None:
        self._commit_positions(w.positions)

    def _commit_positions(self, positions: dict[TP, int]) -> None:
        """Commit `positions` with those a failed commit left (a window's newer position wins);
        the partitions this worker no longer owns are the new owner's to commit."""
        self._commit_retried_at = self.clock()
        pending = {tp: off for tp, off in {**self.uncommitted, **positions}.items()
                   if tp in self.parts}  # fmt: skip
        self.uncommitted = {}
        if not pending:
            return
        try:
            self.consumer.commit(
                offsets=[KTP(t, p, off) for (t, p), off in pending.items()], asynchronous=False
            )
        except KafkaException as e:  # the coordinator refused or moved: the next turn retries
            metrics.COMMIT_FAILURES.inc()
            log.warning("offset commit failed", extra={"fields": {"error": str(e)}})
            self.uncommitted = pending

    # -- health -------------------------------------------------------------------------------
    def ready(self) -> dict[str, bool]:
        # a member that holds no partitions right now (a rebalance, more workers than partitions)
        # is healthy; a poll loop that stopped turning, or is stuck retrying, is not
        checks = self.loop.checks()
        try:
            checks["counter-store"] = self.store.reachable()
        except Exception:
            checks["counter-store"] = False
        try:
            checks["count-cache"] = bool(self.cache.rc.ping())
        except Exception:
            checks["count-cache"] = False
        return checks
