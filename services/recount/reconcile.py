"""One recount: first reading, settle wait, second reading, verdicts; then, if asked, repairs.

The steps and why each is safe are in services/recount/core.py. This module only sequences the
I/O: readings and the waits (probes), corrections (actions)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from redis.cluster import RedisCluster

from services.aggregator.store import CounterStore
from services.contracts import convergence
from services.recount import actions, core, probes

POLL_S = 0.5


@dataclass(frozen=True)
class Settle:
    settled: bool
    waited_s: float
    detail: str  # what was still pending when it gave up; "" when settled


class Reconciler:
    def __init__(
        self,
        readings: probes.Readings,
        outbox: probes.Outbox,
        consumers: probes.Consumers,
        store: CounterStore,
        rc: RedisCluster,
        *,
        region: str,
        cache_ttl_s: int,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        wall_ms: Callable[[], int] = lambda: int(time.time() * 1000),
    ) -> None:
        self.readings = readings
        self.outbox = outbox
        self.consumers = consumers
        self.store = store
        self.rc = rc
        self.region = region
        self.cache_ttl_s = cache_ttl_s
        self.clock = clock
        self.sleep = sleep
        self.wall_ms = wall_ms

    def first_reading(self, post_ids: Sequence[str]) -> tuple[dict[str, core.Reading], datetime]:
        """The first reading and its moment (taken once every edge of it has been read)."""
        first = self.readings.read(post_ids)
        return first, datetime.now(UTC)

    def check(
        self, first: dict[str, core.Reading], at: datetime, timeout_s: float
    ) -> tuple[list[core.Verdict], Settle | None]:
        """Verdicts for the posts of `first`; the settle wait and second reading only for the
        posts whose first reading drifted (None: no post needed them)."""
        look = [p for p, r in first.items() if core.needs_second_look(r)]
        if not look:
            return [core.judge(r, None, False) for r in first.values()], None
        # The outbox's created_at comes from the writers' clocks: also wait for events stamped
        # up to the skew the platform tolerates after our reading (the one bound the write
        # service and relay enforce, review D11), so a writer whose clock runs ahead cannot slip
        # an edge past the wait. Only unpublished rows count: the wider margin costs nothing
        # once the outbox has drained.
        skew = timedelta(seconds=convergence.MAX_CLOCK_SKEW_S)
        settle = self.settle(set(look), at + skew, timeout_s)
        second = self.readings.read(look)
        verdicts = [core.judge(r, second.get(p), settle.settled) for p, r in first.items()]
        return verdicts, settle

    def settle(self, post_ids: set[str], before: datetime, timeout_s: float) -> Settle:
        """Wait until no event of an edge changed before `before` can still be in flight for
        these posts: the outbox has published them, then the aggregator group has committed past
        the log-end offsets taken after that."""
        t0 = self.clock()
        deadline = t0 + timeout_s
        while (n := self.outbox.pending(post_ids, before)) > 0:
            if self.clock() >= deadline:
                return Settle(False, self.clock() - t0, f"{n} outbox event(s) not yet published")
            self.sleep(POLL_S)
        target = self.consumers.ends()
        while behind := self.consumers.behind(target):
            if self.clock() >= deadline:
                lag = ", ".join(f"{t}[{p}] by {n}" for (t, p), n in sorted(behind.items()))
                detail = f"consumer group {self.consumers.group} behind on {lag}"
                return Settle(False, self.clock() - t0, detail)
            self.sleep(POLL_S)
        return Settle(True, self.clock() - t0, "")

    def repair(self, verdicts: Sequence[core.Verdict]) -> list[core.Verdict]:
        """Write the correction of every post with persistent drift; the others pass through."""
        out = []
        for v in verdicts:
            if v.status != "drift" or v.second is None:
                out.append(v)
                continue
            c = core.correction(v.second, self.region)
            done = actions.apply(self.store, self.rc, c, self.wall_ms(), self.cache_ttl_s)
            if done.written:
                out.append(replace(v, status="repaired", correction=c,
                                   cache_written=done.cache_written))  # fmt: skip
            else:
                why = "the correction cell changed since it was read (another recount?)"
                out.append(replace(v, status="conflict", reason=why, correction=c))
        return out
