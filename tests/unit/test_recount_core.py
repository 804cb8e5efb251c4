"""The reconciler's decisions (services/recount/core.py): pure, no store."""

from __future__ import annotations

import uuid

import pytest

from services.aggregator.core import CellRow, aggregate, cell_region
from services.contracts import events
from services.recount import core


def edge(user: str, state: str = "liked", void: bool = False, reaction: str = "like") -> core.Edge:
    return core.Edge(user, state, void, reaction, intent_uuid=f"i-{user}-{state}-{void}")


def reading(
    edges: list[core.Edge], cells: list[CellRow], cache: tuple[int, int] | None = None
) -> core.Reading:
    return core.Reading(
        "p", tuple(cells), None if cache is None else core.Cached(*cache), core.Truth.of(edges)
    )


def cell(value: int, region: str = "us", shard: int = 0, applied: int = 10) -> CellRow:
    return CellRow(region, shard, value, applied, {"like": value} if value else {})


THREE = [edge("a"), edge("b"), edge("c")]


def test_truth_counts_distinct_liked_non_void_edges_and_their_reactions() -> None:
    t = core.Truth.of(
        [edge("a"), edge("b", reaction="love"), edge("c", "unliked"), edge("d", void=True)]
    )
    assert (t.count, t.edges, dict(t.reactions)) == (2, 4, {"like": 1, "love": 1})


def test_the_digest_ignores_order_and_sees_any_change_of_an_edge() -> None:
    base = core.Truth.of(THREE).digest
    assert core.Truth.of(list(reversed(THREE))).digest == base
    # an unlike then a like again ends in the same state but under another intent
    relike = core.Edge("a", "liked", False, "like", str(uuid.uuid4()))
    assert core.Truth.of([relike, *THREE[1:]]).digest != base
    assert core.Truth.of([*THREE[:2], edge("c", void=True)]).digest != base
    assert core.Truth.of(THREE[:2]).digest != base


def test_drift_is_truth_minus_each_store() -> None:
    r = reading(THREE, [cell(2), cell(3, region="eu", applied=4)], cache=(4, 16))
    assert r.drift() == core.Drift(-2, {"like": -2}, -1)
    assert reading(THREE, [cell(3)]).drift() == core.Drift(0, {}, None)  # nothing cached
    assert not reading(THREE, [cell(3)], cache=(3, 11)).drift().any


def test_judge() -> None:
    clean = reading(THREE, [cell(3)], cache=(3, 11))
    drifted = reading(THREE, [cell(5)], cache=(5, 11))
    folded = reading(THREE, [cell(3, applied=12)], cache=(3, 13))
    changed = reading([*THREE, edge("d")], [cell(5)], cache=(5, 11))
    other_drift = reading(THREE, [cell(6)], cache=(6, 11))
    nothing = reading([], [])
    assert core.judge(clean, None, False).status == "ok"
    assert core.judge(nothing, None, False).status == "missing"
    assert core.judge(drifted, None, False).status == "unsettled"
    assert core.judge(drifted, drifted, settled=False).status == "unsettled"
    assert core.judge(drifted, folded, settled=True).status == "transient"
    assert core.judge(drifted, changed, settled=True).status == "changing"
    assert core.judge(drifted, other_drift, settled=True).status == "changing"
    assert core.judge(drifted, drifted, settled=True).status == "drift"


@pytest.mark.parametrize(
    ("cells", "cache"),
    [
        ([cell(5)], (5, 11)),  # double count in the store (and so in the cache)
        ([cell(2), cell(-1, region="x@recount", applied=0)], (1, 12)),  # an earlier correction
        ([cell(3)], (9, 11)),  # the cache alone, same gen
        ([cell(3)], (9, 10**9)),  # the cache alone, a bogus gen far ahead
        ([cell(3)], None),  # nothing cached
    ],
)
def test_the_correction_makes_the_sum_the_truth_and_the_gen_beat_the_cache(
    cells: list[CellRow], cache: tuple[int, int] | None
) -> None:
    r = reading(THREE, cells, cache)
    c = core.correction(r, "x")
    assert c.cell.region == "x@recount" and c.cell.shard == core.CORRECTION_SHARD
    after = [x for x in cells if x.region != c.cell.region]
    after.append(CellRow(c.cell.region, c.cell.shard, c.new.value, c.new.applied, c.new.reactions))
    a = aggregate(after)
    assert a.count == 3 and a.reactions == {"like": 3}
    assert a.gen == c.gen > r.store_gen
    assert cache is None or a.gen > cache[1]
    assert c.new.applied > c.old.applied  # the cell's own CAS always moves


def test_the_correction_cell_is_no_cell_the_aggregator_writes() -> None:
    for region in ("us-west-2", "eu", "local"):
        slots = {cell_region(region, t, p) for t in events.EVENT_TOPICS for p in range(64)}
        assert core.correction_region(region) not in slots


def test_summary_and_drift_ratio() -> None:
    r = reading(THREE, [cell(5)], (5, 11))
    vs = [
        core.Verdict("a", "ok", "", r),
        core.Verdict("b", "drift", "", r, r),
        core.Verdict("c", "repaired", "", r, r),
        core.Verdict("d", "transient", "", r, r),
        core.Verdict("e", "unsettled", "", r),
    ]
    s = core.summarize(vs)
    assert (s.checked, s.drift, s.repaired, s.transient, s.undecided) == (5, 2, 1, 1, 1)
    assert s.drift_ratio == 0.5  # 2 of the 4 decided
    assert [v.status in core.GOOD for v in vs] == [True, False, True, True, False]
