"""The aggregator's pure core: dedup bound, windows, the offset filter, folding, aggregates."""

from __future__ import annotations

import random
import uuid

import pytest

from services.aggregator.core import (
    NO_ROW,
    CellKey,
    CellRow,
    CellState,
    Entry,
    PartitionDedup,
    Poison,
    Windower,
    aggregate,
    apply_fold,
    cell_region,
    fold,
    top_reactions,
    validate,
)
from services.aggregator.settings import AggregatorSettings
from services.contracts import convergence, events


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def ev(**kw: object) -> events.LikeEvent:
    base: dict[str, object] = dict(
        intent_uuid=str(uuid.uuid4()), user_id="u", post_id="p", action="like",
        reaction="like", delta=1, region="eu", shard=0,
    )  # fmt: skip
    base.update(kw)
    return events.LikeEvent.new(**base)  # type: ignore[arg-type]


# -- validation -------------------------------------------------------------------------------
def test_valid_event_passes() -> None:
    validate(ev())


@pytest.mark.parametrize(
    "bad",
    [
        {"intent_uuid": "not-a-uuid"},
        {"post_id": ""},
        {"region": ""},
        {"delta": 5},
        {"delta": -2},
        {"shard": 8},
        {"shard": -1},
        # what validated nothing before and broke a store at flush time (review D9)
        {"post_id": "x" * 70_000},  # longer than a Cassandra partition key may be
        {"post_id": "p{1}"},  # a Redis hash tag inside a key
        {"user_id": "u}1"},
        {"reaction": "Love!"},
        {"region": "eu@likes.voided"},  # a cell slot, not a region
    ],
)
def test_invalid_events_are_poison(bad: dict[str, object]) -> None:
    with pytest.raises(Poison):
        validate(ev(**bad))


def test_each_topic_and_partition_feeds_its_own_cell_slot() -> None:
    assert cell_region("eu", events.COMMITTED, 3) == "eu#3"
    slots = {cell_region("eu", t, p) for t in events.EVENT_TOPICS for p in (0, 1)}
    assert len(slots) == 6  # a partition's offsets never meet another's in one cell (D2)
    assert all(s.startswith("eu") for s in slots)


# -- dedup ------------------------------------------------------------------------------------
def test_dedup_counts_an_intent_once() -> None:
    d = PartitionDedup(capacity=10, max_age_ms=60_000)
    i = str(uuid.uuid4())
    assert d.check_and_add(i, 1) is False
    assert d.check_and_add(i, 2) is True
    assert d.check_and_add(str(uuid.uuid4()), 3) is False
    assert len(d) == 2


def test_dedup_is_bounded_by_count_oldest_first() -> None:
    d = PartitionDedup(capacity=3, max_age_ms=10**9)
    ids = [str(uuid.uuid4()) for _ in range(4)]
    for n, i in enumerate(ids):
        assert not d.check_and_add(i, n)
    assert len(d) == 3
    # the oldest fell out: beyond the bound a duplicate counts again
    assert d.check_and_add(ids[0], 10) is False
    # re-adding ids[0] evicted ids[1]; ids[2], ids[3] still dedup
    assert d.check_and_add(ids[3], 11) is True
    assert d.check_and_add(ids[2], 11) is True


def test_dedup_is_bounded_by_age_of_the_log_not_the_wall_clock() -> None:
    d = PartitionDedup(capacity=100, max_age_ms=1000)
    old = str(uuid.uuid4())
    d.check_and_add(old, 0)
    d.check_and_add(str(uuid.uuid4()), 999)
    assert d.check_and_add(old, 999) is True  # still within 1 s of the newest message
    d.check_and_add(str(uuid.uuid4()), 1001)
    assert d.check_and_add(old, 1001) is False  # aged out


def test_dedup_rebuilt_from_the_same_log_decides_the_same() -> None:
    """The warm-up argument: re-reading the last `capacity` messages before an offset gives a
    consumer the same dedup decisions from that offset on as the one that never stopped."""
    cap = 5
    pool = [str(uuid.uuid4()) for _ in range(8)]
    log = [(pool[(n * 7) % 8], n * 10) for n in range(40)]  # lots of repeats, some far apart
    cut = 23
    whole = PartitionDedup(cap, 10**9)
    expected = [whole.check_and_add(i, ts) for i, ts in log][cut:]
    fresh = PartitionDedup(cap, 10**9)
    for i, ts in log[max(0, cut - cap) : cut]:
        fresh.check_and_add(i, ts)
    assert [fresh.check_and_add(i, ts) for i, ts in log[cut:]] == expected


# -- fold and the offset filter ---------------------------------------------------------------
def test_fold_sums_deltas_and_reactions() -> None:
    f = fold([Entry(3, 1, "like"), Entry(4, 1, "love"), Entry(7, -1, "like")], NO_ROW)
    assert f is not None
    assert (f.delta, f.max_offset, f.events) == (1, 7, 3)
    assert f.reactions == {"like": 0, "love": 1}


def test_fold_skips_offsets_the_cell_already_holds() -> None:
    entries = [Entry(3, 1, "like"), Entry(4, 1, "like"), Entry(7, 1, "like")]
    f = fold(entries, applied=4)
    assert f is not None
    assert (f.delta, f.max_offset, f.events) == (1, 7, 1)
    assert fold(entries, applied=7) is None  # a full replay applies nothing


def test_replaying_a_window_twice_applies_it_once() -> None:
    entries = [Entry(o, 1, "like") for o in range(10, 20)]
    st = CellState.empty()
    for _ in range(3):  # the same window replayed after crashes
        f = fold(entries, st.applied)
        if f is not None:
            st = apply_fold(st, f)
    assert (st.value, st.applied) == (10, 19)


def test_fold_agrees_with_entry_by_entry_folding() -> None:
    """fold works on columns with a likes-only fast path; the oracle is the plain loop."""
    rnd = random.Random(11)
    for _ in range(500):
        n = rnd.randint(1, 40)
        likes_only = rnd.random() < 0.5
        entries = [
            Entry(o, 1 if likes_only else rnd.choice((-1, 0, 1)), rnd.choice(("like", "wow")))
            for o in sorted(rnd.sample(range(100), n))
        ]
        applied = rnd.choice((NO_ROW, rnd.randint(0, 100)))
        fresh = [e for e in entries if e.offset > applied]
        want: dict[str, int] = {}
        for e in fresh:
            want[e.reaction] = want.get(e.reaction, 0) + e.delta
        f = fold(entries, applied)
        if not fresh:
            assert f is None
            continue
        assert f is not None
        assert (f.delta, f.max_offset, f.events) == (
            sum(e.delta for e in fresh), max(e.offset for e in fresh), len(fresh),
        )  # fmt: skip
        assert f.reactions == want


def test_apply_fold_drops_zeroed_reactions() -> None:
    st = CellState(2, 5, {"like": 1, "love": 1})
    f = fold([Entry(6, -1, "love")], st.applied)
    assert f is not None
    new = apply_fold(st, f)
    assert new == CellState(1, 6, {"like": 1})


# -- windows ----------------------------------------------------------------------------------
def test_window_closes_on_the_next_tick_not_before() -> None:
    clock = Clock(1000.2)
    w = Windower(clock, window_ms=1000)
    assert not w.due()
    w.current.add(("t", 0), 5, CellKey("p", "eu", 0), 1, "like")
    clock.t = 1000.99
    assert not w.due()
    clock.t = 1001.0
    assert w.due()
    taken = w.take()
    assert taken.events == 1 and taken.positions == {("t", 0): 6}
    assert w.peek() is None and not w.due()


def test_slow_flushes_stretch_the_next_window_up_to_a_cap() -> None:
    clock = Clock(10.0)
    w = Windower(clock, window_ms=1000, max_stretch_ms=5000)
    w.stretch(3500)  # the last flush took 3.5 s
    w.current.add(("t", 0), 1, CellKey("p", "eu", 0), 1, "like")
    clock.t = 12.0
    assert not w.due()  # past the tick, but open for less than 3.5 s
    clock.t = 13.5
    assert w.due()
    w.take()
    w.stretch(60_000)
    w.current.add(("t", 0), 2, CellKey("p", "eu", 0), 1, "like")
    clock.t = 18.4
    assert not w.due()
    clock.t = 18.5
    assert w.due()  # capped at 5 s
    w.take()
    w.stretch(10)  # fast again: back to the 1 s tick
    w.current.add(("t", 0), 3, CellKey("p", "eu", 0), 1, "like")
    clock.t = 19.0
    assert w.due()


def test_a_consumer_catching_up_keeps_its_window_open_to_the_cap() -> None:
    clock = Clock(10.0)
    w = Windower(clock, window_ms=1000, max_stretch_ms=5000)
    w.catching_up = True
    w.current.add(("t", 0), 1, CellKey("p", "eu", 0), 1, "like")
    clock.t = 14.9
    assert not w.due()  # ticks passed, but the backlog is read in long windows
    clock.t = 15.0
    assert w.due()
    w.take()
    w.catching_up = False  # at the head again: the next window closes on the tick
    w.current.add(("t", 0), 2, CellKey("p", "eu", 0), 1, "like")
    clock.t = 16.0
    assert w.due()


def test_window_flushes_early_at_max_events() -> None:
    clock = Clock(5.0)
    w = Windower(clock, window_ms=1000, max_events=3)
    for o in range(3):
        w.current.add(("t", 0), o, CellKey("p", "eu", 0), 1, "like")
    assert w.due()


def test_window_with_only_duplicates_still_commits_their_offsets() -> None:
    clock = Clock(5.0)
    w = Windower(clock, window_ms=1000)
    w.current.consumed(("t", 1), 41)
    clock.t = 6.0
    assert w.due()
    assert w.take().positions == {("t", 1): 42}


def test_window_groups_cells_by_post_and_drops_revoked_partitions() -> None:
    w = Windower(Clock(), 1000).current
    a0, a1, b0 = CellKey("a", "eu", 0), CellKey("a", "eu", 1), CellKey("b", "us", 0)
    w.add(("t", 0), 1, a0, 1, "like")
    w.add(("t", 1), 1, a1, 1, "like")
    w.add(("t", 0), 2, b0, -1, "like")
    w.add(("t", 0), 3, a0, 1, "like")
    assert {p: sorted(c, key=str) for p, c in w.posts().items()} == {
        "a": sorted([a0, a1], key=str),
        "b": [b0],
    }
    assert len(w.cells[a0]) == 2
    w.drop_partitions([("t", 0)])
    assert list(w.cells) == [a1] and w.events == 1 and w.positions == {("t", 1): 2}


# -- aggregates -------------------------------------------------------------------------------
def test_aggregate_sums_regions_and_shards_into_count_and_subcounters() -> None:
    rows = [
        CellRow("eu", 0, 5, 10, {"like": 4, "love": 1}),
        CellRow("us", 0, 3, 2, {"like": 3}),
        CellRow("eu", 3, 2, 0, {"wow": 2}),
        CellRow("eu@likes.voided", 0, -1, 4, {"like": -1}),
    ]
    a = aggregate(rows)
    assert a.count == 9
    assert a.subcounters == {0: 7, 3: 2}
    assert a.gen == (10 + 1) + (2 + 1) + (0 + 1) + (4 + 1)
    assert a.reactions == {"like": 6, "wow": 2, "love": 1}


def test_gen_grows_with_any_cell_and_with_a_new_cell_at_offset_zero() -> None:
    before = aggregate([CellRow("eu", 0, 1, 0, {})])
    grown = aggregate([CellRow("eu", 0, 2, 1, {})])
    new_cell = aggregate([CellRow("eu", 0, 1, 0, {}), CellRow("us", 1, 1, 0, {})])
    assert grown.gen > before.gen
    assert new_cell.gen > before.gen


def test_top_reactions_ranks_and_caps() -> None:
    counts = {"a": 1, "b": 5, "c": 5, "d": 0, "e": -1, "f": 2, "g": 3, "h": 4}
    assert top_reactions(counts, k=3) == {"b": 5, "c": 5, "h": 4}
    assert list(top_reactions(counts)) == ["b", "c", "h", "g", "f"]


def test_the_default_dedup_remembers_a_hot_partition_for_the_whole_republish_horizon() -> None:
    # review D4: 100 k intents were ~16 s of a partition at 6 k events/s, less than the time a
    # duplicate publication can take (contracts/convergence.HOLD_S): it counted twice
    s = AggregatorSettings()
    d = PartitionDedup(s.dedup_capacity, int(s.agg_dedup_horizon_s * 1000))
    rate, seconds = s.agg_dedup_peak_rate, int(convergence.HOLD_S) + 2
    first = [str(uuid.uuid4()) for _ in range(rate)]  # second 0
    for ms, intent in enumerate(first):
        d.check_and_add(intent, ms * 1000 // rate)
    for t in range(1, seconds):
        for i in range(rate):
            d.check_and_add(str(uuid.UUID(int=t * rate + i)), t * 1000 + i * 1000 // rate)
    assert d.horizon_ms() >= convergence.HOLD_S * 1000
    assert d.check_and_add(first[0], seconds * 1000)  # a republish of second 0: caught
