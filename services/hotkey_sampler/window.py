"""A frequent-items sketch (datasketches) over a decaying window: post → estimated reads/s.

The window is a ring of short buckets, one sketch each. A post's rate weighs each bucket by
0.5^(age / half_life) and divides by the weighted time covered, so a steady rate reads as itself
and a spike shows within a fraction of a second (the seed's count-min sketch over a long window
missed sub-30-second viral curves). Sampled traffic carries its weight (1/fraction), so rates are
of the full traffic. Not thread-safe: one event loop feeds it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

import datasketches as ds

# ~0.75 * 2^lg counters per bucket; a post above ~1/768 of a bucket's weight is always tracked
DEFAULT_LG_MAP = 10


@dataclass
class _Bucket:
    start: float
    sketch: ds.frequent_strings_sketch


class DecayingTopK:
    def __init__(
        self,
        *,
        bucket_s: float = 0.25,
        buckets: int = 20,
        half_life_s: float = 1.0,
        lg_map: int = DEFAULT_LG_MAP,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.bucket_s, self.half_life_s, self.lg_map = bucket_s, half_life_s, lg_map
        self.clock = clock
        self._ring: deque[_Bucket] = deque(maxlen=buckets)
        self._ring.append(self._new(clock()))
        self.updates = 0

    def _new(self, start: float) -> _Bucket:
        return _Bucket(start, ds.frequent_strings_sketch(self.lg_map))

    def _current(self) -> ds.frequent_strings_sketch:
        now = self.clock()
        head = self._ring[-1]
        if now - head.start >= self.bucket_s:
            # skip empty buckets after a quiet spell, but keep the grid aligned
            start = head.start + self.bucket_s * int((now - head.start) / self.bucket_s)
            self._ring.append(self._new(start))
        return self._ring[-1].sketch

    def update(self, post_id: str, weight: int = 1) -> None:
        self._current().update(post_id, weight)
        self.updates += 1

    def update_many(self, post_ids: Iterable[str], weight: int = 1) -> None:
        sketch = self._current()  # one clock read per batch
        n = 0
        for p in post_ids:
            sketch.update(p, weight)
            n += 1
        self.updates += n

    def _weights(self, now: float) -> list[tuple[_Bucket, float, float]]:
        """(bucket, decay weight, seconds covered) for the live buckets."""
        out = []
        for b in self._ring:
            covered = min(self.bucket_s, max(now - b.start, 1e-3))
            age = max(0.0, now - (b.start + covered / 2))
            out.append((b, 0.5 ** (age / self.half_life_s), covered))
        return out

    def rate(self, post_id: str) -> float:
        now = self.clock()
        weighted = self._weights(now)
        denom = sum(w * c for _, w, c in weighted)
        return sum(w * b.sketch.get_estimate(post_id) for b, w, _ in weighted) / denom

    def top(self, k: int, min_rate: float = 0.0) -> list[tuple[str, float]]:
        """The k posts with the highest rate at or above min_rate, hottest first."""
        self._current()  # rotate, so a quiet sampler's rates decay
        now = self.clock()
        weighted = self._weights(now)
        denom = sum(w * c for _, w, c in weighted)
        candidates: set[str] = set()
        for b, w, _ in weighted:
            # pigeonhole: a post at min_rate has, in some bucket, at least 1/n of that rate
            threshold = max(0, int(min_rate * denom / max(len(weighted), 1) / max(w, 1e-9)))
            for row in b.sketch.get_frequent_items(
                ds.frequent_items_error_type.NO_FALSE_NEGATIVES, threshold
            ):
                candidates.add(row[0])
        rates = []
        for p in candidates:
            r = sum(w * b.sketch.get_estimate(p) for b, w, _ in weighted) / denom
            if r >= min_rate:
                rates.append((p, r))
        rates.sort(key=lambda pr: (-pr[1], pr[0]))
        return rates[:k]


def with_hysteresis(
    candidates: list[tuple[str, float]],
    published: Collection[str],
    k: int,
    enter_rate: float,
    exit_rate: float,
) -> list[tuple[str, float]]:
    """What to publish: a post enters at `enter_rate` and, once published, stays while at or
    above `exit_rate` (below it). Without the band, a post whose estimate wobbled around the
    floor appeared and vanished every second or two. `candidates` are (post, rate), any order,
    taken at exit_rate or lower; the hottest k are kept."""
    if not 0 <= exit_rate <= enter_rate:
        raise ValueError("exit_rate must be within [0, enter_rate]")
    keep = [(p, r) for p, r in candidates if r >= enter_rate or (p in published and r >= exit_rate)]
    keep.sort(key=lambda pr: (-pr[1], pr[0]))
    return keep[:k]
