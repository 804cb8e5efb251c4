"""The reconciler's pure core: the truth of a post, its drift, the verdict, the correction.

How a recount decides (invariant 6: a count equals the post's distinct, non-void liked edges):

1. First reading, per post and in this order: the counter-store cells, the count-cache aggregate,
   then the post's edges (the by-post index on likes.edges.ref). Cells before edges: any event
   already folded into a cell comes from an edge change committed before the cells were read, so
   the edges read afterwards include it; the only difference left is events still in flight.
   A post whose first reading shows no drift is `ok`; nothing else is done for it.
2. Settle: wait until nothing of the first reading can still be in flight: the outbox holds no
   unpublished event of these posts created before the reading (plus MAX_CLOCK_SKEW_S), then
   the aggregator group's committed offsets reach the log-end offsets of likes.committed/voided/
   unvoided taken after that (every event of every edge read is then folded and in the cache).
3. Second reading, same order. The drift is persistent, and only then repairable, when the
   consumers settled, the post's edges are exactly the same rows in both readings (a digest over
   user, state, void, reaction and the intent that last changed each edge: any like/unlike/void in
   between changes it), and the drift is the same in both readings. A drift gone in the second
   reading was in flight (`transient`); a post that changed is `changing`, one whose consumers
   did not settle within the timeout `unsettled`: neither is touched, the next run sees them again.
4. Repair: the difference goes into the post's correction cell, region `<region>@recount`, shard
   0: a row like any other cell, so every reader's SUM over the partition includes it, and no
   event topic is named `recount`, so the aggregator (which writes only `cell_region(region,
   topic, partition)` slots) never folds into or overwrites it. The recount is its single
   writer, through the same compare-and-set on applied_window as the aggregator's cells. Here
   applied_window is a generation, not an offset: each repair raises it by at least 1, and by
   as much as it takes for the post's gen (SUM(applied_window + 1), see
   aggregator.core.aggregate) to beat the gen the count-cache holds, so the cache's gen-CAS
   accepts the rewritten aggregate even when the drift was in the cache alone. The reaction
   counts are corrected in the same cell.

Limits: run it from one region at a time (edges and cells replicate, so two regions' recounts of
the same drift would both correct it); it rewrites this region's count-cache only (another
region's follows at its next fold of the post) and purges no CDN object (its TTL is short); a
Scylla index lagging its base table by more than the settle wait would hide a user's first like
from both readings.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from services.aggregator.core import NO_ROW, CellKey, CellRow, CellState, aggregate

RECOUNT_SLOT = "recount"
CORRECTION_SHARD = 0

Status = Literal[
    "ok", "missing", "transient", "changing", "unsettled", "drift", "repaired", "conflict"
]
# a post that is settled and agrees (or agrees after repair); anything else is worth a look
GOOD: frozenset[str] = frozenset({"ok", "transient", "repaired"})
UNDECIDED: frozenset[str] = frozenset({"changing", "unsettled", "conflict"})


def correction_region(region: str) -> str:
    """The region column of the recount's correction cell of `region`: `<region>@recount`."""
    return f"{region}@{RECOUNT_SLOT}"


@dataclass(frozen=True, slots=True)
class Edge:
    user_id: str
    state: str | None  # 'liked' | 'unliked'
    void: bool
    reaction: str
    intent_uuid: str  # the intent that last changed the edge

    @property
    def counts(self) -> bool:
        return self.state == "liked" and not self.void


@dataclass(frozen=True)
class Truth:
    """What the edge-store says about one post."""

    count: int  # distinct, non-void liked edges
    reactions: Mapping[str, int]
    edges: int  # edge rows of any state
    digest: str  # order-independent fingerprint of every edge row

    @classmethod
    def of(cls, edges: Iterable[Edge]) -> Truth:
        count, n, acc = 0, 0, 0
        reactions: Counter[str] = Counter()
        for e in edges:
            n += 1
            if e.counts:
                count += 1
                reactions[e.reaction] += 1
            raw = "\x00".join((e.user_id, e.state or "", str(e.void), e.reaction, e.intent_uuid))
            # a sum of per-row hashes: the same rows give the same digest in any order
            acc = (acc + int.from_bytes(hashlib.blake2b(raw.encode(), digest_size=16).digest())) % (
                1 << 128
            )
        return cls(count, dict(reactions), n, f"{n}:{acc:032x}")


@dataclass(frozen=True)
class Cached:
    """The count-cache aggregate `count:{post}` (None in a Reading: no aggregate cached)."""

    count: int
    gen: int


@dataclass(frozen=True)
class Drift:
    """truth minus what a store shows; 0 (or empty, or None) is no drift."""

    counter_store: int
    reactions: Mapping[str, int]  # per reaction, non-zero entries only
    count_cache: int | None  # None: no aggregate cached (reads fall through to the cells)

    @property
    def any(self) -> bool:
        return bool(self.counter_store or self.reactions or self.count_cache)


@dataclass(frozen=True)
class Reading:
    post_id: str
    cells: Sequence[CellRow]
    cache: Cached | None
    truth: Truth

    @property
    def store_count(self) -> int:
        return sum(c.value for c in self.cells)

    @property
    def store_gen(self) -> int:
        return aggregate(self.cells).gen

    @property
    def missing(self) -> bool:
        """Nothing anywhere names the post: no edge, no cell, no cached aggregate."""
        return self.truth.edges == 0 and not self.cells and self.cache is None

    def drift(self) -> Drift:
        stored: Counter[str] = Counter()
        for c in self.cells:
            stored.update(c.reactions)
        want = Counter(self.truth.reactions)
        reactions = {r: want[r] - stored[r] for r in set(want) | set(stored)}
        return Drift(
            self.truth.count - self.store_count,
            {r: d for r, d in sorted(reactions.items()) if d},
            None if self.cache is None else self.truth.count - self.cache.count,
        )


@dataclass(frozen=True)
class Correction:
    """The correction cell's compare-and-set: from `old` (as read) to `new`."""

    cell: CellKey
    old: CellState
    new: CellState
    delta: int  # added to the count
    gen: int  # the post's gen once written (beats the cached gen)


@dataclass(frozen=True)
class Verdict:
    post_id: str
    status: Status
    reason: str
    first: Reading
    second: Reading | None = None
    correction: Correction | None = None
    cache_written: bool | None = None  # after a repair: did the cache take the new aggregate

    @property
    def last(self) -> Reading:
        return self.second or self.first


def needs_second_look(first: Reading) -> bool:
    return not first.missing and first.drift().any


def judge(first: Reading, second: Reading | None, settled: bool) -> Verdict:
    """The verdict for one post from its two readings (see the module docstring)."""
    p = first.post_id
    if first.missing and (second is None or second.missing):
        return Verdict(p, "missing", "no edge, counter cell or cached count names this post", first)
    d1 = first.drift()
    if not d1.any:
        return Verdict(p, "ok", "the counts equal the edge-store", first, second)
    if second is None or not settled:
        why = "the consumers did not get past the first reading in time: events may be in flight"
        return Verdict(p, "unsettled", why, first, second)
    if first.truth.digest != second.truth.digest:
        return Verdict(p, "changing", "its edges changed between the readings", first, second)
    d2 = second.drift()
    if not d2.any:
        why = "the drift was in flight: gone once the consumers passed the first reading"
        return Verdict(p, "transient", why, first, second)
    if d1 != d2:
        return Verdict(p, "changing", "the drift changed between the readings", first, second)
    return Verdict(p, "drift", "the same drift in both readings, consumers settled", first, second)


def correction(reading: Reading, region: str) -> Correction:
    """The write that makes `reading`'s counter-store sum equal its truth, with a gen above both
    the counter-store's and the count-cache's."""
    key = CellKey(reading.post_id, correction_region(region), CORRECTION_SHARD)
    row = next((c for c in reading.cells if (c.region, c.shard) == (key.region, key.shard)), None)
    old = CellState(row.value, row.applied, row.reactions) if row else CellState.empty()
    d = reading.drift()
    store_gen = reading.store_gen
    cached_gen = reading.cache.gen if reading.cache is not None else NO_ROW
    bump = max(1, cached_gen - store_gen + 1)
    reactions: Counter[str] = Counter(old.reactions)
    reactions.update(d.reactions)
    new = CellState(
        old.value + d.counter_store,
        old.applied + bump,
        {r: n for r, n in sorted(reactions.items()) if n},
    )
    return Correction(key, old, new, d.counter_store, store_gen + bump)


@dataclass
class Summary:
    checked: int = 0
    drift: int = 0  # posts whose drift persisted (repaired or not)
    repaired: int = 0
    transient: int = 0
    undecided: int = 0
    missing: int = 0
    by_status: dict[str, int] = field(default_factory=dict)

    @property
    def drift_ratio(self) -> float:
        """Posts with persistent drift per post checked (the canary_drift_ratio basis)."""
        decided = self.checked - self.undecided - self.missing
        return self.drift / decided if decided > 0 else 0.0


def summarize(verdicts: Iterable[Verdict]) -> Summary:
    s = Summary()
    for v in verdicts:
        s.checked += 1
        s.by_status[v.status] = s.by_status.get(v.status, 0) + 1
        s.drift += v.status in ("drift", "repaired")
        s.repaired += v.status == "repaired"
        s.transient += v.status == "transient"
        s.undecided += v.status in UNDECIDED
        s.missing += v.status == "missing"
    return s
