"""Who the scorer degrades (services/abuse/scorer.StormWatch), on the stack's real idem-store:
STORM_VOIDS voids of one user's likes within STORM_WINDOW_S of the likes' own time, once, however
many replicas share the user's voids and however often a like is voided again."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from redis.cluster import RedisCluster

from services.abuse.scorer import StormWatch
from services.contracts import clients, degrade, keys
from tests.conftest import Stack

pytestmark = pytest.mark.stack

N, WINDOW = degrade.STORM_VOIDS, degrade.STORM_WINDOW_S


@pytest.fixture(scope="module")
def idem(stack: Stack) -> Iterator[RedisCluster]:
    rc = clients.idem_store(stack.settings(), timeout=5.0)
    yield rc
    rc.close()


def user(name: str) -> str:
    """A user of this run only: a degradation lasts a day in the stack's idem-store."""
    return f"{name}-{uuid.uuid4().hex[:8]}"


def void(watch: StormWatch, user_id: str, like_id: str, at_s: float) -> bool:
    (degraded,) = watch.voided_many([(user_id, like_id, at_s)])
    return degraded


def test_a_storm_of_voids_degrades_the_user_once_and_a_slow_trickle_never(
    idem: RedisCluster,
) -> None:
    watch = StormWatch(idem)
    bot, slow = user("bot"), user("slow")
    first = [(bot, f"l{i}", 1000.0 + i) for i in range(N - 1)]
    assert watch.voided_many(first) == [False] * len(first)
    # an idle user's set goes away: it expires a window after its last void
    assert 0 < idem.pttl(keys.storm_key(bot)) <= WINDOW * 1000
    assert void(watch, bot, f"l{N}", 1000.0 + N)  # the N-th within the window
    assert degrade.is_degraded(idem, bot)
    assert not idem.exists(keys.storm_key(bot))  # degraded: counted afresh after
    # degraded once: another storm's worth of voids while degraded does not degrade again
    assert not any(void(watch, bot, f"m{i}", 2000.0 + i) for i in range(N))
    # a user voided as often, but each void a window after the last: never a storm
    for i in range(3 * N):
        assert not void(watch, slow, f"s{i}", 5000.0 + i * (WINDOW / (N - 1) + 1))
    assert not degrade.is_degraded(idem, slow)
    # another user's voids never count for this one
    others = [user(f"u{i}") for i in range(N - 1)]
    assert watch.voided_many([(u, "l", 9000.0) for u in others]) == [False] * (N - 1)
    assert not any(degrade.is_degraded(idem, u) for u in others)


def test_two_replicas_sharing_a_users_voids_degrade_it_at_exactly_storm_voids(
    stack: Stack,
) -> None:
    """likes.committed is keyed by post: each replica voids a share of a bot's likes. Two
    scorers' watches (each on its own client), fed alternate voids: the STORM_VOIDS-th void in
    total degrades the bot, and only it."""
    replicas = [clients.idem_store(stack.settings(), timeout=5.0) for _ in range(2)]
    try:
        watches = [StormWatch(rc) for rc in replicas]
        bot = user("bot")
        said = [void(watches[i % 2], bot, f"like-{i}", 1000.0 + i) for i in range(2 * N)]
        assert said == [False] * (N - 1) + [True] + [False] * N
        assert degrade.is_degraded(replicas[0], bot)
    finally:
        for rc in replicas:
            rc.close()


def test_a_like_voided_again_counts_once(idem: RedisCluster) -> None:
    """A batch retried after a failure, or handed to another replica by a rebalance, voids its
    likes again (each answers "replayed"): they must not add up to a storm."""
    bot = user("bot")
    first = [(bot, f"like-{i}", 1000.0 + i) for i in range(N - 1)]
    assert StormWatch(idem).voided_many(first) == [False] * (N - 1)
    assert StormWatch(idem).voided_many(first + first) == [False] * (2 * N - 2)
    assert not degrade.is_degraded(idem, bot)
    # the first voids are still counted: one new like's void makes the storm
    assert void(StormWatch(idem), bot, "like-new", 1000.0 + N)
