"""The per-dependency circuit breaker, on an injected clock."""

from __future__ import annotations

from services.read.breaker import CircuitBreaker


class Clock:
    t = 0.0

    def __call__(self) -> float:
        return self.t


def test_opens_after_consecutive_failures_and_half_opens_after_the_cooldown() -> None:
    clock = Clock()
    b = CircuitBreaker("x", threshold=3, cooldown_s=2.0, clock=clock)
    for _ in range(2):
        assert b.allow()
        b.failure()
    assert b.state == "closed"
    b.failure()
    assert b.state == "open" and not b.allow()
    clock.t = 2.0
    assert b.state == "half_open"
    assert b.allow()  # one trial...
    assert not b.allow()  # ...at a time
    b.failure()  # the trial failed: open again for a full cooldown
    assert b.state == "open" and not b.allow()
    clock.t = 4.0
    assert b.allow()
    b.success()
    assert b.state == "closed" and b.allow() and b.allow()


def test_a_success_resets_the_failure_count() -> None:
    b = CircuitBreaker("x", threshold=3, clock=Clock())
    for _ in range(10):  # a partial outage: failures interleaved with successes
        b.failure()
        b.failure()
        b.success()
    assert b.state == "closed"
