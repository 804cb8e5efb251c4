"""Who the scorer degrades (services/abuse/scorer.StormWatch): STORM_VOIDS voids of one user's
likes within STORM_WINDOW_S of the likes' own time, once."""

from __future__ import annotations

from services.abuse.scorer import StormWatch
from services.contracts import degrade


def test_a_storm_of_voids_degrades_the_user_once_and_a_slow_trickle_never() -> None:
    degraded: list[str] = []
    watch = StormWatch(lambda u: degraded.append(u) is None)
    n, window = degrade.STORM_VOIDS, degrade.STORM_WINDOW_S
    for i in range(n - 1):
        assert not watch.voided("bot", 1000.0 + i)
    assert watch.voided("bot", 1000.0 + n)  # the n-th within the window
    assert degraded == ["bot"]
    # a user voided as often, but each void a window after the last: never a storm
    for i in range(3 * n):
        assert not watch.voided("slow", 5000.0 + i * (window / (n - 1) + 1))
    # another user's voids never count for this one
    for i in range(n - 1):
        assert not watch.voided(f"u{i}", 9000.0)
    assert degraded == ["bot"]
