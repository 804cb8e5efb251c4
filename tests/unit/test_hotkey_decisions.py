"""The hot-key reconcile decisions and the data plane's last-good grace: pure, patched clock."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest

from operators.hotkeys.decisions import HotEntry, Plan, decide
from operators.hotkeys.policy import InvalidPolicy, Policy
from services.contracts import hotkeys

P = Policy(enter_rate=100, exit_rate=50, split_rate=400, max_hot_keys=3, cooldown_s=30)


def run(
    observations: Sequence[Mapping[str, float]], policy: Policy = P, step: float = 1.0
) -> list[Plan]:
    """Feed one observation per tick; return every plan."""
    state: dict[str, HotEntry] = {}
    plans = []
    for i, obs in enumerate(observations):
        plan = decide(policy, dict(obs), state, now=i * step)
        state = plan.state
        plans.append(plan)
    return plans


def test_a_post_reaching_the_enter_rate_is_promoted_and_refreshed():
    (plan,) = run([{"viral": 150, "cold": 20}])
    assert plan.promote == ["viral"]
    assert plan.refresh == ["viral"]
    assert plan.split == []
    assert "cold" not in plan.state


def test_a_post_reaching_the_split_rate_is_split_once():
    plans = run([{"p": 500}, {"p": 900}])
    assert plans[0].promote == ["p"] and plans[0].split == ["p"]
    assert plans[1].split == []  # already split: no second action
    assert plans[1].state["p"].split


def test_within_the_band_a_hot_post_stays_hot_and_a_cold_one_stays_cold():
    # hovering at 60..90 (between exit 50 and enter 100): no flapping either way
    plans = run([{"a": 120, "b": 90}] + [{"a": 60, "b": 90}, {"a": 90, "b": 60}] * 30)
    assert plans[0].promote == ["a"]
    assert all(p.promote == [] and p.demote == [] for p in plans[1:])
    assert list(plans[-1].state) == ["a"]


def test_demotion_only_after_the_cooldown_below_the_exit_rate():
    plans = run([{"p": 200}] + [{}] * 31)
    demoted_at = [i for i, p in enumerate(plans) if p.demote]
    assert demoted_at == [30]  # last hot at t=0, cool-down 30 s
    assert plans[30].state == {}


def test_a_brief_dip_restarts_the_cooldown():
    obs = [{"p": 200}] + [{}] * 20 + [{"p": 60}] + [{}] * 29
    plans = run(obs)
    assert all(not p.demote for p in plans[:50])
    assert plans[-1].demote == [] and "p" in plans[-1].state
    plans = run([*obs, {}])
    assert plans[-1].demote == ["p"]


def test_demoting_a_split_post_unsplits_it():
    plans = run([{"p": 500}] + [{}] * 30)
    assert plans[-1].demote == ["p"] and plans[-1].unsplit == ["p"]


def test_the_cap_keeps_the_hottest():
    (plan,) = run([{"a": 300, "b": 200, "c": 150, "d": 120, "e": 110}])
    assert plan.promote == ["a", "b", "c"]
    assert plan.capped == ["d", "e"]
    assert len(plan.state) == 3


def test_at_the_cap_a_newcomer_must_be_clearly_hotter_to_evict():
    base = {"a": 300, "b": 200, "c": 150}
    plans = run([base, {**base, "d": 170}])  # 170 < 150 * 1.25: no swap
    assert plans[1].promote == [] and plans[1].demote == [] and plans[1].capped == ["d"]
    plans = run([base, {**base, "d": 400}])
    assert plans[1].promote == ["d"] and plans[1].demote == ["c"]


def test_cap_zero_disables_promotion():
    (plan,) = run([{"a": 5000}], policy=Policy(max_hot_keys=0))
    assert plan.promote == [] and plan.capped == ["a"]


def test_the_same_input_gives_the_same_plan():
    obs = [{"x": 120, "y": 120, "z": 120, "w": 120}]
    assert run(obs)[0].promote == run(obs)[0].promote == ["w", "x", "y"]


def test_policy_from_spec_names_bad_fields():
    assert Policy.from_spec({"enterRate": 10, "exitRate": 5, "splitRate": 20}).enter_rate == 10
    with pytest.raises(InvalidPolicy, match="bogus"):
        Policy.from_spec({"bogus": 1})
    with pytest.raises(InvalidPolicy, match="enterRate"):
        Policy.from_spec({"enterRate": "fast"})
    with pytest.raises(InvalidPolicy, match="exitRate"):
        Policy.from_spec({"enterRate": 10, "exitRate": 20, "splitRate": 30})
    with pytest.raises(InvalidPolicy, match="splitFactor"):
        Policy.from_spec({"splitFactor": 9})


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_last_good_survives_an_etcd_outage_for_five_minutes_then_expires():
    clock = Clock()
    view: hotkeys.LastGood[dict[str, int]] = hotkeys.LastGood({}, clock=clock)
    assert view.get() == {}  # never loaded: nothing is hot
    view.ok({"p": 8})
    clock.t += 299  # etcd unreachable since: no ok() call
    assert view.get() == {"p": 8}
    clock.t += 2
    assert view.get() == {} and view.expired
    view.ok({"q": 8})  # etcd back
    assert view.get() == {"q": 8}


def test_split_flag_values():
    flag = hotkeys.SplitFlag(8, "manual", 5)
    assert hotkeys.decode_split(flag.encode()) == flag
    assert hotkeys.decode_split(b"4") == hotkeys.SplitFlag(4, "manual", 0)
    # clamped to the aggregator's shards
    assert hotkeys.decode_split(b"99") == hotkeys.SplitFlag(8, "manual", 0)
    assert hotkeys.decode_split(b"garbage") is None
    assert hotkeys.decode_hot(hotkeys.encode_hot(12.34, 1)) == 12.3
    assert hotkeys.decode_hot(b"{") == 0.0
