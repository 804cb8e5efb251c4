"""The sampler's decaying window and its etcd diff: pure, patched clock."""

from __future__ import annotations

from services.hotkey_sampler.publisher import Published, diff
from services.hotkey_sampler.window import DecayingTopK


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def feed(w: DecayingTopK, clock: Clock, seconds: float, per_tick: dict[str, int]) -> None:
    for _ in range(int(seconds / 0.05)):
        clock.t += 0.05
        for post, n in per_tick.items():
            w.update(post, n)


def test_a_steady_rate_reads_as_itself_and_a_spike_shows_within_a_second() -> None:
    clock = Clock()
    w = DecayingTopK(clock=clock)
    feed(w, clock, 5, {"steady": 5})  # 100/s
    assert 80 <= w.rate("steady") <= 120
    feed(w, clock, 1, {"steady": 5, "viral": 100})  # 2000/s from nothing
    top = w.top(1, min_rate=500)
    assert top[0][0] == "viral"
    feed(w, clock, 5, {"steady": 5})  # spike over: decays below the threshold
    assert [p for p, _ in w.top(5, min_rate=500)] == []


def test_diff_writes_only_changes() -> None:
    pub = Published(rates={"a": 100.0, "b": 100.0}, heat={"a"})
    d = diff(pub, [("a", 110.0), ("c", 2000.0)], heat_rate=1000)
    assert d.put_hot == {"c": 2000.0}  # a moved <25%: not rewritten
    assert d.delete_hot == ["b"]
    assert d.put_heat == ["c"] and d.delete_heat == ["a"]
