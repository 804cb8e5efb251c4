"""The canary's turn, over calls a test scripts (the gateway's answers, the edge-store's truth)
and a fake clock: what it writes, when it reads, and how it judges."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from services.canary.core import Action, Canary, CanaryError, flickers, judge


class Script:
    """Scripted answers: the counts the gateway returns in order, the truth after the hold."""

    def __init__(self, counts: list[int | None], truth: int, liked: bool = False) -> None:
        self.counts: Iterator[int | None] = iter(counts)
        self.truth_count = truth
        self.is_liked = liked
        self.now = 0.0
        self.writes: list[tuple[str, Action]] = []
        self.read_times: list[float] = []
        self.fail: str | None = None

    def canary(self, hold_s: float = 10.0, interval_s: float = 2.0) -> Canary:
        return Canary(
            liked=lambda p: self._step("liked", self.is_liked),
            truth=lambda p: self._step("truth", self.truth_count),
            write=lambda p, a: self._step("write", self.writes.append((p, a))),
            read=self.read,
            hold_s=hold_s,
            read_interval_s=interval_s,
            clock=lambda: self.now,
            sleep=self.sleep,
        )

    def _step(self, name: str, value):  # type: ignore[no-untyped-def]
        if self.fail == name:
            raise CanaryError(name, "refused")
        return value

    def read(self, post: str) -> int | None:
        self.read_times.append(self.now)
        self._step("read", None)
        return next(self.counts)

    def sleep(self, s: float) -> None:
        self.now += s


def test_a_turn_likes_an_unliked_post_reads_through_the_hold_and_judges_the_last_read() -> None:
    s = Script([0, 0, 1, 1, 1, 1], truth=1)
    turn = s.canary(hold_s=10, interval_s=2).turn("canary-local-0")
    assert s.writes == [("canary-local-0", "like")]
    # a read at once, one every interval, and one at the deadline: 0, 2, ..., 10
    assert s.read_times == [0, 2, 4, 6, 8, 10]
    assert (turn.action, turn.result, turn.truth, turn.flickers) == ("like", "match", 1, 0)
    assert turn.reads == (0, 0, 1, 1, 1, 1)


def test_the_last_read_decides_not_the_first_match() -> None:
    """The count matched mid-hold, then a duplicate landed: a drift, not a match."""
    turn = Script([0, 1, 1, 2, 2, 2], truth=1).canary().turn("p")
    assert turn.result == "drift"


def test_a_liked_post_is_unliked_and_a_drop_after_an_unlike_is_no_flicker() -> None:
    s = Script([1, 1, 0, 0, 0, 0], truth=0, liked=True)
    turn = s.canary().turn("p")
    assert s.writes == [("p", "unlike")]
    assert (turn.result, turn.flickers) == ("match", 0)


def test_a_count_below_one_seen_after_ones_own_like_is_a_flicker() -> None:
    # 1 seen, then 0 (an older answer), then 1 again, then 0 again: two flickers
    turn = Script([0, 1, 0, 1, 0, 1], truth=1).canary().turn("p")
    assert (turn.result, turn.flickers) == ("match", 2)


@pytest.mark.parametrize("step", ["liked", "write", "read", "truth"])
def test_a_failed_call_is_an_error_turn_not_a_verdict(step: str) -> None:
    s = Script([0, 1, 1, 1, 1, 1], truth=1)
    s.fail = step
    turn = s.canary().turn("p")
    assert turn.result == "error" and turn.error == f"{step}: refused"
    assert turn.truth is None and turn.flickers == 0
    if step in ("liked", "write"):
        assert s.read_times == []  # nothing read for a write that did not happen


@pytest.mark.parametrize(
    ("counts", "expected"),
    [
        ([], 0),
        ([3, 3, 3], 0),
        ([3, 4, 5], 0),
        ([5, 4], 1),
        ([None, 5, None, 4, 5, 3], 2),  # nulls (degraded answers) are neither seen nor flickers
        ([2, 5, 4, 4], 2),  # each read below the highest seen counts
    ],
)
def test_flickers(counts: list[int | None], expected: int) -> None:
    assert flickers(counts) == expected


def test_judge() -> None:
    assert judge(3, 3) == "match"
    assert judge(2, 3) == "drift"
    assert judge(None, 0) == "drift"  # no count after the hold is not the truth


def test_a_stop_during_the_hold_ends_the_turn_at_once_and_judges_nothing() -> None:
    stop = {"set": False}
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        stop["set"] = True  # SIGTERM arrives during the first wait

    canary = Canary(
        liked=lambda p: False, truth=lambda p: 1, write=lambda p, a: None, read=lambda p: 0,
        hold_s=30.0, read_interval_s=2.0, sleep=sleep, stopped=lambda: stop["set"],
    )  # fmt: skip
    turn = canary.turn("p")
    assert turn.result == "stopped" and slept == [2.0] and turn.truth is None
