"""What "a count has converged" means, once, for the tests, the benchmarks and the game days.

A count has converged when it equals the truth and STILL equals it after `HOLD_S`: the relay's
republish horizon + the writer's producer retry time + two aggregation windows. A duplicate
publication can arrive that late (the writer's producer retries for WRITER_PUBLISH_TIMEOUT_S,
the relay republishes rows older than RELAY_REPUBLISH_AFTER_S and waits RELAY_PUBLISH_TIMEOUT_S
for its ack) and is folded within two windows; a check that returns at the first match cannot
see a double count that lands after it (review H9: a one-sided oracle).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

RELAY_REPUBLISH_AFTER_S = 3.0  # the relay leaves younger outbox rows to their writer
RELAY_PUBLISH_TIMEOUT_S = 5.0  # the relay's producer message.timeout.ms
WRITER_PUBLISH_TIMEOUT_S = 10.0  # the write service's producer message.timeout.ms
AGG_WINDOW_S = 1.0  # the aggregator's default window (AggregatorSettings.agg_window_ms)

HOLD_S = (
    RELAY_REPUBLISH_AFTER_S
    + RELAY_PUBLISH_TIMEOUT_S
    + WRITER_PUBLISH_TIMEOUT_S
    + 2 * (AGG_WINDOW_S)
)


@dataclass
class Convergence:
    converged: bool
    first_match_s: float | None  # when the count first equalled the truth
    last_seen: dict[str, int | None] = field(default_factory=dict)
    broke: dict[str, int | None] = field(default_factory=dict)  # what it read when it broke

    def __str__(self) -> str:
        if self.converged:
            return f"converged after {self.first_match_s:.1f} s, held {HOLD_S:.0f} s"
        if self.first_match_s is None:
            return f"never matched the truth; last read {self.last_seen}"
        return f"matched at {self.first_match_s:.1f} s, then drifted to {self.broke}"


def wait_converged(
    read: Callable[[], Mapping[str, int | None]],
    truth: Mapping[str, int],
    *,
    timeout_s: float = 60.0,
    hold_s: float = HOLD_S,
    poll_s: float = 0.5,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Convergence:
    """Poll `read()` until it equals `truth`, then keep reading for `hold_s`: converged only if
    every read in the hold equals the truth too (a drift during the hold fails at once)."""
    want = dict(truth)
    start = clock()
    matched_at: float | None = None
    seen: dict[str, int | None] = {}
    while True:
        seen = dict(read())
        now = clock()
        if seen == want:
            if matched_at is None:
                matched_at = now
            if now - matched_at >= hold_s:
                return Convergence(True, matched_at - start, seen)
        elif matched_at is not None:
            return Convergence(False, matched_at - start, seen, seen)
        elif now - start >= timeout_s:
            return Convergence(False, None, seen)
        sleep(poll_s)
