"""A small circuit breaker per dependency, so a dead store costs one timeout, not one per request.

Closed: calls go through; `threshold` consecutive failures open it. Open: calls are refused for
`cooldown_s`. Then half-open: one trial call at a time; its success closes the breaker, its failure
reopens it. Partial failures (one dead Redis node among three) interleave with successes and so
never trip it: those reads fall through per key instead.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Literal

State = Literal["closed", "open", "half_open"]


class CircuitBreaker:
    def __init__(
        self,
        name: str,
        *,
        threshold: int = 5,
        cooldown_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.threshold = threshold
        self.cooldown_s = cooldown_s
        self.clock = clock
        self.failures = 0
        self.opened_at: float | None = None
        self._trial_in_flight = False

    @property
    def state(self) -> State:
        if self.opened_at is None:
            return "closed"
        if self.clock() - self.opened_at >= self.cooldown_s:
            return "half_open"
        return "open"

    def allow(self) -> bool:
        state = self.state
        if state == "closed":
            return True
        if state == "half_open" and not self._trial_in_flight:
            self._trial_in_flight = True
            return True
        return False

    def success(self) -> None:
        self.failures = 0
        self.opened_at = None
        self._trial_in_flight = False

    def failure(self) -> None:
        self.failures += 1
        if self._trial_in_flight or self.failures >= self.threshold:
            self.opened_at = self.clock()
        self._trial_in_flight = False
