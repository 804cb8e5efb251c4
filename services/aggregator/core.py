"""The aggregator's pure core: validation, dedup, windows, folding and the offset filter.

No I/O here: the worker feeds messages in and takes windows out; the clock is injected.

Replay safety rests on three facts this module provides:
- a cell (post_id, region slot, shard) is fed by exactly one Kafka partition (the topic and
  the partition are part of the region slot, see `cell_region`), and
  the cell row stores the highest offset of that partition already folded into it;
- `fold` takes only the entries above that offset, so re-reading a window applies nothing twice;
- the dedup decision for an offset depends only on the log before it (bounded by count and by
  message age, both read from the log), so a consumer that re-reads the last `capacity` messages
  on assignment decides exactly as the one it replaces.
"""

from __future__ import annotations

import re
import uuid
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from services.contracts import events, keys

TP = tuple[str, int]  # (topic, partition)
NO_ROW = -1  # applied_window of a cell that has no row yet: every offset (>= 0) is fresh
TOP_REACTIONS = 5
CATCHUP_LAG_MS = 5_000  # events older than this when read: the consumer is behind (Windower)


_POST_ID = re.compile(keys.POST_ID_PATTERN)
_USER_ID = re.compile(keys.USER_ID_PATTERN)
_REACTION = re.compile(keys.REACTION_PATTERN)
_REGION = re.compile(r"^[a-z0-9\-]{1,32}$")
_HEX = "[0-9a-fA-F]"
_CANONICAL_UUID = re.compile(rf"^{_HEX}{{8}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{4}}-{_HEX}{{12}}\Z")


class Poison(Exception):
    """The message itself is bad (undecodable or invalid): retrying will not fix it."""


def validate(e: events.LikeEvent) -> None:
    """What the aggregator refuses to count; raises Poison with the reason."""
    if not _CANONICAL_UUID.match(e.intent_uuid or ""):  # what we write; the rest is parsed
        try:
            uuid.UUID(e.intent_uuid)
        except (ValueError, AttributeError, TypeError) as exc:
            raise Poison(f"intent_uuid is not a uuid: {e.intent_uuid!r}") from exc
    # what would break a key downstream (a 64 KiB Cassandra partition key, a Redis hash tag)
    # is refused here, at decode time, not found at flush time (review D9)
    if not _POST_ID.match(e.post_id or ""):
        raise Poison(f"post_id is not a post id: {e.post_id[:80]!r}")
    if not _USER_ID.match(e.user_id or ""):
        raise Poison(f"user_id is not a user id: {e.user_id[:80]!r}")
    if not _REACTION.match(e.reaction or ""):
        raise Poison(f"reaction is not a reaction: {e.reaction[:80]!r}")
    if not e.region or not _REGION.match(e.region):
        raise Poison(f"region is not a region: {e.region[:80]!r}")
    if e.delta not in (-1, 0, 1):
        raise Poison(f"delta out of range: {e.delta}")
    if not 0 <= e.shard < keys.SPLIT_FACTOR:
        raise Poison(f"shard out of range: {e.shard}")


def cell_region(region: str, base_topic: str, partition: int) -> str:
    """The `region` column of the cell an event of `base_topic` read from `partition` lands in.

    A cell row stores ONE applied offset, and offsets are per topic-partition, so a cell must be
    fed by a single topic-partition: likes.committed's partition 3 lands in `<region>#3`,
    likes.voided's in `<region>@likes.voided#3`. Every reader SUMs the post's partition (and
    sub-counters SUM over regions per shard), so the extra rows change no total; each is one
    more actor of the PN-counter.

    Why the partition (review D2): a key maps to another partition once partitions are added,
    and that partition's offsets are lower; with the partition left out, `fold` skipped every
    new event as a replay and the likes were lost without an error. Now a partition change
    starts a new cell, the old one keeps what it counted, and a late replay from the old
    partition still meets its own offset.
    """
    slot = region if base_topic == events.COMMITTED else f"{region}@{base_topic}"
    return f"{slot}#{partition}"


# CellKey and Entry are NamedTuples, not frozen dataclasses: one of each per event, and a frozen
# dataclass's __init__ (object.__setattr__ per field) with its Python __hash__/__eq__ was 15 % of
# the aggregator's per-event work (py-spy of bench/bench_aggregator.py); a tuple's are C.
class CellKey(NamedTuple):
    post_id: str
    region: str  # the row's region column (a region slot, see cell_region)
    shard: int


@dataclass(frozen=True, slots=True)
class CellState:
    value: int
    applied: int  # applied_window: highest offset of the cell's partition folded into value
    reactions: Mapping[str, int]

    @classmethod
    def empty(cls) -> CellState:
        return cls(0, NO_ROW, {})

    @property
    def exists(self) -> bool:
        return self.applied != NO_ROW


class Entry(NamedTuple):
    offset: int
    delta: int
    reaction: str


@dataclass(frozen=True, slots=True)
class Fold:
    delta: int
    reactions: Mapping[str, int]
    max_offset: int
    events: int


def fold(entries: Sequence[Entry], applied: int) -> Fold | None:
    """The offset filter and the fold: sum only entries above `applied`; None if none are.

    Columns, not entries: one pass of zip(*) and C builtins (sum, max, Counter's counting) over
    them, and a likes-only cell (every delta +1, the common case) counts its reactions in C.
    Folding entry by entry was 15 % of a 200 k-event window's flush (py-spy of
    bench/bench_aggregator.py: 0.87 s)."""
    if not entries:
        return None
    offsets, deltas, names = zip(*entries, strict=True)
    if min(offsets) <= applied:  # replays in the window: keep what is above the cell
        kept = [e for e in entries if e.offset > applied]
        if not kept:
            return None
        offsets, deltas, names = zip(*kept, strict=True)
    reactions: Counter[str]
    if min(deltas) == 1 == max(deltas):
        reactions = Counter(names)
    else:
        reactions = Counter()
        for name, d in zip(names, deltas, strict=True):
            reactions[name] += d
    return Fold(sum(deltas), dict(reactions), max(offsets), len(offsets))


def apply_fold(state: CellState, f: Fold) -> CellState:
    reactions = Counter(state.reactions)
    reactions.update(f.reactions)
    # zero entries dropped: the frozen map stays small and "top reactions" never lists a 0
    return CellState(
        state.value + f.delta, f.max_offset, {k: v for k, v in reactions.items() if v != 0}
    )


def _uuid_bytes(s: str) -> bytes:
    """uuid.UUID(s).bytes, at a third of its cost for the canonical form events carry."""
    try:
        b = bytes.fromhex(s.replace("-", ""))
    except ValueError:
        return uuid.UUID(s).bytes  # braces, a urn: prefix (validate() accepted it)
    return b if len(b) == 16 else uuid.UUID(s).bytes


class PartitionDedup:
    """Intents seen on one partition, bounded by count and by age, first occurrence wins.

    Bound: an intent is remembered while fewer than `capacity` newer distinct intents have been
    seen on the partition AND its message timestamp is within `max_age_ms` of the newest one.
    Beyond that a duplicate publication counts again (a duplicate that late is outside the write
    path's retry budget; the reconciler repairs it). Eviction is FIFO by first occurrence and
    driven only by the log (order and message timestamps), never by the wall clock, so replaying
    the same log rebuilds the same set.
    """

    def __init__(self, capacity: int, max_age_ms: int) -> None:
        self.capacity = capacity
        self.max_age_ms = max_age_ms
        self._seen: OrderedDict[bytes, int] = OrderedDict()  # intent bytes -> timestamp ms
        self._newest_ts = 0
        self._first_ts = 0  # the timestamp of the first (oldest inserted) intent held

    def __len__(self) -> int:
        return len(self._seen)

    def check_and_add(self, intent_uuid: str, ts_ms: int) -> bool:
        """True if the intent was seen already (a duplicate); otherwise remember it."""
        k = _uuid_bytes(intent_uuid)  # 16 bytes, not a 36-char str: 4x more per MB
        seen = self._seen
        if k in seen:
            return True
        if not seen:
            self._first_ts = ts_ms
        seen[k] = ts_ms
        if ts_ms > self._newest_ts:
            self._newest_ts = ts_ms
        # _evict's first test, inline: most adds evict nothing (one call per event saved)
        if len(seen) > self.capacity or self._first_ts < self._newest_ts - self.max_age_ms:
            self._evict()
        return False

    def horizon_ms(self) -> int:
        """How far back (message time) the set remembers: newest minus oldest held."""
        if not self._seen:
            return 0
        return self._newest_ts - next(iter(self._seen.values()))

    def _evict(self) -> None:
        floor = self._newest_ts - self.max_age_ms
        while self._seen:
            first_ts = next(iter(self._seen.values()))
            if len(self._seen) > self.capacity or first_ts < floor:
                self._seen.popitem(last=False)
            else:
                break
        self._first_ts = next(iter(self._seen.values())) if self._seen else self._newest_ts


@dataclass
class Window:
    """One tumbling window: per-cell entries, and how far each partition has been consumed."""

    window_id: int
    opened_ms: int = 0
    cells: dict[CellKey, list[Entry]] = field(default_factory=dict)
    cell_tp: dict[CellKey, TP] = field(default_factory=dict)
    positions: dict[TP, int] = field(default_factory=dict)  # next offset to commit, per TP
    events: int = 0
    duplicates: int = 0
    # (user_id, post_id) of each like: OR-ed into the users' Bloom filters before the offsets
    # commit, so has_liked's "no" can never miss a counted like for long
    likers: set[tuple[str, str]] = field(default_factory=set)
    # posts a peer region's (mirrored) event touched: their aggregate is re-read from the cells
    refresh: set[str] = field(default_factory=set)
    # while tracing: the span contexts the first counted events carried (their requests' spans),
    # which the window's flush span links to
    links: list[Any] = field(default_factory=list)

    def add(self, tp: TP, offset: int, cell: CellKey, delta: int, reaction: str) -> None:
        entries = self.cells.get(cell)
        if entries is None:
            self.cells[cell] = [Entry(offset, delta, reaction)]
            self.cell_tp[cell] = tp  # one partition feeds a cell (cell_region)
        else:
            entries.append(Entry(offset, delta, reaction))
        self.events += 1
        self.consumed(tp, offset)

    def consumed(self, tp: TP, offset: int) -> None:
        """The message at `offset` is dealt with (counted, a duplicate, or dead-lettered)."""
        self.positions[tp] = max(self.positions.get(tp, 0), offset + 1)

    def posts(self) -> dict[str, list[CellKey]]:
        out: dict[str, list[CellKey]] = {}
        for c in self.cells:
            out.setdefault(c.post_id, []).append(c)
        return out

    def drop_partitions(self, tps: Iterable[TP]) -> None:
        gone = set(tps)
        for c in [c for c, tp in self.cell_tp.items() if tp in gone]:
            self.events -= len(self.cells.pop(c))
            del self.cell_tp[c]
        for tp in gone:
            self.positions.pop(tp, None)

    @property
    def empty(self) -> bool:
        return not self.positions


class Windower:
    """Processing-time tumbling windows aligned on multiples of `window_ms`.

    Processing time, not event time: the count is a running sum, so which window an event falls
    in changes only the batching, never the result; and every key's window closes at the same
    tick, so after a flush the whole consumed range can be committed.

    Back-pressure: `stretch(ms)` (the last flush's duration) keeps a window open at least that
    long, up to `max_stretch_ms`. When the stores slow down, windows grow and collapse more
    events per write instead of the consumer falling further behind one small window at a time.

    Catching up (`catching_up`, set by the worker while each read returns a full batch of
    events older than CATCHUP_LAG_MS: a backlog after a restart or an outage, not a few late
    events, which still close on the tick): windows stay open `max_stretch_ms`
    (or to `max_events`). Those events are late already; a tenth of the writes per event is what
    brings the consumer back to the head (issue 10's benchmark reads a backlog: 1 s windows
    wrote 2.3 cells per post, the stretched ones 1.1). At the head the 1 s tick is back.
    """

    def __init__(
        self,
        clock: Callable[[], float],
        window_ms: int = 1000,
        max_events: int = 200_000,
        max_stretch_ms: int = 10_000,
    ) -> None:
        self.clock = clock  # seconds, like time.monotonic
        self.window_ms = window_ms
        self.max_events = max_events
        self.max_stretch_ms = max_stretch_ms
        self.min_span_ms = 0
        self.catching_up = False
        self._current: Window | None = None

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)

    def stretch(self, last_flush_ms: float) -> None:
        self.min_span_ms = int(min(max(last_flush_ms, 0), self.max_stretch_ms))

    @property
    def current(self) -> Window:
        if self._current is None:
            now = self._now_ms()
            self._current = Window(now // self.window_ms, now)
        return self._current

    def due(self) -> bool:
        w = self._current
        if w is None or w.empty:
            return False
        if w.events >= self.max_events:
            return True
        now = self._now_ms()
        span = self.max_stretch_ms if self.catching_up else self.min_span_ms
        return now // self.window_ms > w.window_id and now - w.opened_ms >= span

    def take(self) -> Window:
        w = self.current
        self._current = None
        return w

    def peek(self) -> Window | None:
        return self._current


@dataclass(frozen=True)
class Aggregate:
    count: int
    gen: int
    reactions: dict[str, int]  # top reactions, highest first
    subcounters: dict[int, int]  # shard -> SUM over the post's regions


@dataclass(frozen=True, slots=True)
class CellRow:
    region: str
    shard: int
    value: int
    applied: int
    reactions: Mapping[str, int]


def top_reactions(counts: Mapping[str, int], k: int = TOP_REACTIONS) -> dict[str, int]:
    ranked = sorted(((r, n) for r, n in counts.items() if n > 0), key=lambda x: (-x[1], x[0]))
    return dict(ranked[:k])


def aggregate(rows: Iterable[CellRow]) -> Aggregate:
    """The post's aggregate from ALL its cells (every region slot, every shard).

    gen = SUM(applied_window + 1): each cell's applied offset only grows, so a later read of the
    partition has a gen >= an earlier one, and an equal gen means the same cells. (+1 so that a
    new cell whose first offset is 0 still moves gen.)
    """
    count = 0
    gen = 0
    reactions: Counter[str] = Counter()
    subs: dict[int, int] = {}
    for r in rows:
        count += r.value
        gen += r.applied + 1 if r.applied != NO_ROW else 0
        reactions.update(r.reactions)
        subs[r.shard] = subs.get(r.shard, 0) + r.value
    return Aggregate(count, gen, top_reactions(reactions), subs)
