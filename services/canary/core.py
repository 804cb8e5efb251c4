"""One canary turn on one post, with its calls injected (the gateway, the edge-store, the clock).

A turn: flip the canary user's like on the post (like if the truth says it does not like it,
else unlike), read the post's count through the gateway every read interval for the convergence
hold (services/contracts/convergence.HOLD_S), then compare the last read with the reconciler's
truth (the edge-store's distinct, non-void liked edges: services/recount/core.Truth).

- drift: after the hold the read path still answers a count other than the truth. The seed's
  canary_drift_ratio is drifted turns over judged turns.
- flicker: after its own like the user saw a count below one it had already seen in this turn
  (the optimistic "liked" heart followed by a lower number). The seed's count_flicker_per_user
  counts these per reading user.
- error: the turn could not be judged (the gateway or the edge-store refused or failed); it
  counts toward neither ratio, and the CanaryFailing alert watches the share of these.
- stopped: the process was asked to stop during the hold; the turn is dropped, not exported (a
  stop waits for no hold: `likes local stop canary` took the rest of one, 12 s).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

Action = Literal["like", "unlike"]
Result = Literal["match", "drift", "error", "stopped"]


class CanaryError(Exception):
    """A call of the turn failed; `step` names which (write, read, truth)."""

    def __init__(self, step: str, detail: str) -> None:
        super().__init__(f"{step}: {detail}")
        self.step = step


@dataclass(frozen=True)
class Turn:
    post_id: str
    action: Action | None  # None: the turn failed before the write
    result: Result
    reads: Sequence[int | None] = ()  # the counts read during the hold, in order
    flickers: int = 0
    truth: int | None = None
    error: str | None = None


def flickers(counts: Sequence[int | None]) -> int:
    """Reads (after one's own like) below the highest count already seen: each is a flicker.
    A read that answered no count (null: degraded) is not a number seen, nor a flicker."""
    highest: int | None = None
    n = 0
    for c in counts:
        if c is None:
            continue
        if highest is not None and c < highest:
            n += 1
        highest = c if highest is None else max(highest, c)
    return n


def judge(last_read: int | None, truth: int) -> Result:
    """After the hold: the read path's count is the truth, or it drifted (null drifts too)."""
    return "match" if last_read == truth else "drift"


@dataclass
class Canary:
    """Calls: `liked(post)` whether the edge-store holds the canary user's liked edge,
    `truth(post)` the post's true count, `write(post, action)` the like or unlike through the
    gateway, `read(post)` the count the gateway answers. Each raises CanaryError."""

    liked: Callable[[str], bool]
    truth: Callable[[str], int]
    write: Callable[[str, Action], None]
    read: Callable[[str], int | None]
    hold_s: float
    read_interval_s: float
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], object] = time.sleep
    stopped: Callable[[], bool] = lambda: False

    def turn(self, post_id: str) -> Turn:
        action: Action | None = None
        reads: list[int | None] = []
        try:
            action = "unlike" if self.liked(post_id) else "like"
            self.write(post_id, action)
            deadline = self.clock() + self.hold_s
            while True:
                reads.append(self.read(post_id))
                left = deadline - self.clock()
                if left <= 0:
                    break
                self.sleep(min(self.read_interval_s, left))
                if self.stopped():
                    return Turn(post_id, action, "stopped", tuple(reads))
            truth = self.truth(post_id)
        except CanaryError as e:
            return Turn(post_id, action, "error", tuple(reads), error=str(e))
        # the reads before the deadline may still be in flight; the one after it is judged
        seen = flickers(reads) if action == "like" else 0
        return Turn(post_id, action, judge(reads[-1], truth), tuple(reads), seen, truth)
