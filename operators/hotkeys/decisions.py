"""The reconcile decision, pure: observed hot set + current state + clock → actions + next state.

- promote a post whose rate reaches `enter_rate`; a hot post stays hot while at or above
  `exit_rate`, and is demoted only after `cooldown_s` below it (the band and the cool-down
  together stop a post hovering at the threshold from flapping);
- split a hot post whose rate reaches `split_rate`; a split stays until the post is demoted
  (un-splitting mid-spike would concentrate the writes again);
- cap the hot set at `max_hot_keys`, ranking by rate with a bonus for incumbents, so that two
  posts of similar heat do not swap places on every tick.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from operators.hotkeys.policy import Policy

INCUMBENT_BONUS = 1.25  # a newcomer must be 25% hotter to evict a hot post at the cap


@dataclass(frozen=True)
class HotEntry:
    since: float  # promoted at (clock seconds)
    last_hot: float  # last tick at or above exit_rate
    rate: float
    split: bool = False


@dataclass(frozen=True)
class Plan:
    promote: list[str] = field(default_factory=list)
    demote: list[str] = field(default_factory=list)
    split: list[str] = field(default_factory=list)
    unsplit: list[str] = field(default_factory=list)
    refresh: list[str] = field(default_factory=list)  # every hot post after this tick
    capped: list[str] = field(default_factory=list)  # hot enough, but left out by the cap
    state: dict[str, HotEntry] = field(default_factory=dict)

    @property
    def changes(self) -> int:
        return len(self.promote) + len(self.demote) + len(self.split) + len(self.unsplit)


def decide(
    policy: Policy, observed: Mapping[str, float], state: Mapping[str, HotEntry], now: float
) -> Plan:
    """`observed`: post → estimated reads/s from the sampler (absent = not in its top-K)."""
    kept: dict[str, HotEntry] = {}
    cooled: list[str] = []
    for post, entry in state.items():
        rate = observed.get(post, 0.0)
        last_hot = now if rate >= policy.exit_rate else entry.last_hot
        if now - last_hot >= policy.cooldown_s:
            cooled.append(post)
        else:
            kept[post] = replace(entry, last_hot=last_hot, rate=rate)

    newcomers = {
        p: HotEntry(since=now, last_hot=now, rate=r)
        for p, r in observed.items()
        if p not in state and r >= policy.enter_rate
    }

    def score(post: str) -> tuple[float, str]:
        entry = kept.get(post) or newcomers[post]
        bonus = INCUMBENT_BONUS if post in kept else 1.0
        return (-entry.rate * bonus, post)  # post id breaks ties: the same input, same answer

    ranked = sorted([*kept, *newcomers], key=score)
    winners, losers = ranked[: policy.max_hot_keys], ranked[policy.max_hot_keys :]

    hot: dict[str, HotEntry] = {}
    promote, split, capped = [], [], []
    demote = sorted(cooled)
    for post in winners:
        entry = kept.get(post) or newcomers[post]
        if post in newcomers:
            promote.append(post)
        if not entry.split and policy.split_factor > 1 and entry.rate >= policy.split_rate:
            entry = replace(entry, split=True)
            split.append(post)
        hot[post] = entry
    for post in losers:
        if post in kept:
            demote.append(post)  # evicted by the cap
        else:
            capped.append(post)
    unsplit = sorted(p for p in demote if state[p].split)
    return Plan(
        promote=sorted(promote),
        demote=sorted(demote),
        split=sorted(split),
        unsplit=unsplit,
        refresh=sorted(hot),
        capped=sorted(capped),
        state=hot,
    )
