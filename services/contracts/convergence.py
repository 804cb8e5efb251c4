"""What "a count has converged" means, once, for the tests, the benchmarks and the game days.

A count has converged when it equals the truth and STILL equals it after `HOLD_S`: the relay's
republish horizon + the writer's producer retry time + two aggregation windows. A duplicate
publication can arrive that late (the writer's producer retries for WRITER_PUBLISH_TIMEOUT_S,
the relay republishes rows older than RELAY_REPUBLISH_AFTER_S, RELAY_TAKEOVER_S later when the
replica owning their shard died, and waits RELAY_PUBLISH_TIMEOUT_S for its ack) and is folded
within two windows; a check that returns at the first match cannot
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

# Each relay replica drains the outbox shards it holds a lease on (services/relay/leases.py). A
# replica renews its leases every RELAY_LEASE_RENEW_S; a dead one's leases and membership lapse
# after RELAY_LEASE_TTL_S, and the survivors take its shards at their next renewal: a row it owned
# waits at most RELAY_TAKEOVER_S longer for its republish (so a duplicate can arrive that late).
RELAY_LEASE_TTL_S = 6
RELAY_LEASE_RENEW_S = RELAY_LEASE_TTL_S / 3
RELAY_TAKEOVER_S = RELAY_LEASE_TTL_S + RELAY_LEASE_RENEW_S
# A relay pass that found no outbox row waits this long before the next, not its busy interval
# (LIKES_RELAY_INTERVAL_S): even idle, a pass reads 16 shards x 4 minute buckets, and at 0.5 s
# that was a quarter of a core per stack (Cassandra's share included). It is no longer than a
# renewal, so the leases keep their cadence and RELAY_TAKEOVER_S holds; and no longer than
# RELAY_REPUBLISH_AFTER_S, so a row written just after an idle pass is seen while still too young
# to take, and is republished no later than at the busy interval: HOLD_S is unchanged.
RELAY_IDLE_INTERVAL_S = RELAY_LEASE_RENEW_S
assert RELAY_IDLE_INTERVAL_S <= RELAY_REPUBLISH_AFTER_S

# The largest clock difference between a writer and the relay that the outbox tolerates: a writer
# puts its marker in the minute bucket of ITS clock, and the relay keeps re-scanning the buckets of
# the last MAX_CLOCK_SKEW_S (+ one minute) after they drained, so a marker a lagging writer puts
# into a bucket the relay has passed is still found (review D11). A larger skew is a broken NTP:
# the write service refuses to be ready with a clock this far from the edge-store's.
MAX_CLOCK_SKEW_S = 120.0
EDGE_STORE_NOW = "SELECT toUnixTimestamp(now()) AS ms FROM system.local"  # the coordinator's clock


def clock_offset_s(query_ms: Callable[[], float], clock: Callable[[], float] = time.time) -> float:
    """This host's clock minus the edge-store's (`query_ms` runs EDGE_STORE_NOW), within half a
    round trip."""
    before = clock()
    theirs = query_ms() / 1000
    after = clock()
    return (before + after) / 2 - theirs


def clock_within_skew(offset_s: float) -> bool:
    """Writers and relays each keep within half of MAX_CLOCK_SKEW_S of the edge-store's clock,
    so any writer and any relay are within MAX_CLOCK_SKEW_S of each other."""
    return abs(offset_s) <= MAX_CLOCK_SKEW_S / 2


HOLD_S = (
    RELAY_REPUBLISH_AFTER_S
    + RELAY_TAKEOVER_S
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
