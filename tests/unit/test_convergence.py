"""The one definition of "converged" (services/contracts/convergence.py): equal to the truth and
still equal after the hold, so a double count landing after the first match is caught (H9)."""

from __future__ import annotations

from collections.abc import Iterator

from services.contracts import convergence


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def run(reads: Iterator[int], clock: Clock, **kw: float) -> convergence.Convergence:
    return convergence.wait_converged(
        lambda: {"p": next(reads)}, {"p": 3}, clock=clock, sleep=clock.sleep, poll_s=1.0, **kw
    )


def reads_then(values: list[int], then: int) -> Iterator[int]:
    yield from values
    while True:
        yield then


def test_the_hold_covers_every_late_duplicate_source() -> None:
    c = convergence
    assert c.HOLD_S >= c.RELAY_REPUBLISH_AFTER_S + c.WRITER_PUBLISH_TIMEOUT_S + 2 * c.AGG_WINDOW_S


def test_converged_only_after_holding_the_truth() -> None:
    clock = Clock()
    r = run(reads_then([1, 2], 3), clock, hold_s=15)
    assert r.converged and r.first_match_s == 2.0
    assert clock.t >= 2 + 15  # it kept reading for the whole hold


def test_a_double_count_after_the_first_match_fails() -> None:
    clock = Clock()
    # equal at 2 s, then a republished duplicate is folded at 9 s: the old converge() passed
    r = run(reads_then([1, 2, 3, 3, 3, 3, 3, 3, 3], 4), clock, hold_s=15)
    assert not r.converged and r.first_match_s == 2.0 and r.broke == {"p": 4}
    assert "drifted" in str(r)


def test_never_matching_times_out() -> None:
    clock = Clock()
    r = run(reads_then([], 2), clock, timeout_s=10, hold_s=15)
    assert not r.converged and r.first_match_s is None and "never matched" in str(r)
