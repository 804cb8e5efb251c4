"""Whether this host's clock agrees with the edge-store's within the skew the outbox tolerates
(contracts/convergence.py MAX_CLOCK_SKEW_S): a readiness check of the write service and the relay.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from services.contracts import convergence

log = logging.getLogger("clock")


class EdgeStoreClock:
    """Measured at most every `every_s` (a probe must not cost a query each time); a failed
    measurement keeps the last verdict (the edge-store check reports an unreachable store)."""

    def __init__(
        self, session: Any, every_s: float = 30.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.session, self.every_s, self.clock = session, every_s, clock
        self._at: float | None = None
        self._ok = True
        self.offset_s: float | None = None

    def _query_ms(self) -> float:
        return float(self.session.execute(convergence.EDGE_STORE_NOW).one().ms)

    def ok(self) -> bool:
        now = time.monotonic()
        if self._at is not None and now - self._at < self.every_s:
            return self._ok
        self._at = now
        try:
            self.offset_s = convergence.clock_offset_s(self._query_ms, self.clock)
        except Exception as e:  # unreachable, or no answer: keep the last verdict
            log.warning("clock check failed", extra={"fields": {"error": str(e)}})
            return self._ok
        self._ok = convergence.clock_within_skew(self.offset_s)
        if not self._ok:
            log.error(
                "clock too far from the edge-store's: markers would land outside the buckets "
                "the relay re-scans",
                extra={"fields": {"offset_s": round(self.offset_s, 3),
                                  "max_s": convergence.MAX_CLOCK_SKEW_S / 2}},
            )  # fmt: skip
        return self._ok
