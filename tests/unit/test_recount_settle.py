"""The recount's settle wait (services/recount/reconcile.py) with fake probes: no store."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, cast

from services.aggregator.core import CellRow
from services.contracts import convergence
from services.recount import core, probes, reconcile


def drifted(post: str) -> core.Reading:
    """Three liked edges, cells that count two: a drift the recount looks at twice."""
    edges = [core.Edge(u, "liked", False, "like", f"i-{u}") for u in "abc"]
    cells = (CellRow("us", 0, 2, 10, {"like": 2}),)
    return core.Reading(post, cells, None, core.Truth.of(edges))


class Outbox:
    """Unpublished outbox rows as (post, created_at by the writer's clock); the relay publishes
    each one after the settle has seen it pending once."""

    def __init__(self, rows: list[tuple[str, datetime]]) -> None:
        self.rows = rows
        self.seen_pending = 0

    def pending(self, post_ids: set[str], before: datetime) -> int:
        due = [r for r in self.rows if r[0] in post_ids and r[1] <= before]
        self.seen_pending += len(due)
        for r in due:
            self.rows.remove(r)  # published by the next poll
        return len(due)


class Consumers:
    group = "aggregator"

    def ends(self) -> dict[Any, int]:
        return {}

    def behind(self, target: dict[Any, int]) -> dict[Any, int]:
        return {}


class Readings:
    def read(self, post_ids: Sequence[str]) -> dict[str, core.Reading]:
        return {p: drifted(p) for p in post_ids}


def _reconciler(outbox: Outbox) -> reconcile.Reconciler:
    return reconcile.Reconciler(
        cast(probes.Readings, Readings()),
        cast(probes.Outbox, outbox),
        cast(probes.Consumers, Consumers()),
        cast(Any, None),
        cast(Any, None),
        region="us",
        cache_ttl_s=60,
        clock=lambda: 0.0,
        sleep=lambda _s: None,
    )


def test_the_settle_waits_for_a_writer_whose_clock_runs_ahead_within_the_tolerated_skew() -> None:
    # A writer may run up to MAX_CLOCK_SKEW_S ahead of this host (the write service and relay
    # refuse readiness beyond MAX_CLOCK_SKEW_S/2 each way from the edge-store): its outbox row is
    # stamped in our future. The recount had its own 5 s margin, so an unpublished like stamped
    # 60 s ahead was not waited for, and a drift in flight could be "repaired" into a double count.
    at = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    ahead = at + timedelta(seconds=convergence.MAX_CLOCK_SKEW_S / 2)
    outbox = Outbox([("p", ahead)])
    rec = _reconciler(outbox)
    verdicts, settle = rec.check({"p": drifted("p")}, at, timeout_s=10)
    assert settle is not None and settle.settled
    assert outbox.seen_pending == 1, "the settle did not wait for the writer-ahead outbox row"
    assert [v.status for v in verdicts] == ["drift"]


def test_a_row_stamped_beyond_the_tolerated_skew_is_not_waited_for() -> None:
    # the bound is the platform's, not unbounded: a clock further off is a broken NTP the
    # writers' readiness refuses, and the recount does not wait for its rows
    at = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
    beyond = at + timedelta(seconds=convergence.MAX_CLOCK_SKEW_S + 1)
    outbox = Outbox([("p", beyond)])
    rec = _reconciler(outbox)
    rec.check({"p": drifted("p")}, at, timeout_s=10)
    assert outbox.seen_pending == 0
