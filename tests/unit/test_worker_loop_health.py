"""What a Kafka worker's /readyz says about its own loop (services.common.worker_http.LoopHealth),
and that the aggregator's retries report through it. Pure logic: a fake clock, no servers.

Prevents: an aggregator blocked retrying the schema registry read as ready for 30 s (its
freshness stamp predates the blocking call) and then flipped to not ready with nothing having
changed, so `likes local up` saw it ready and its final status, a moment later, did not.
"""

from __future__ import annotations

import pytest

from services.aggregator import worker
from services.aggregator.settings import AggregatorSettings
from services.common.worker_http import LoopHealth


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_a_loop_that_never_turned_or_stopped_turning_is_not_ready() -> None:
    clock = Clock()
    loop = LoopHealth(["registry"], stale_after_s=30, clock=clock)
    assert loop.checks() == {"poll-loop": False, "registry": True}
    loop.turned()
    assert loop.checks() == {"poll-loop": True, "registry": True}
    clock.t += 30
    assert loop.checks()["poll-loop"] is False


def test_a_retry_is_not_ready_at_once_keeps_the_loop_fresh_and_clears_when_it_ends() -> None:
    clock = Clock()
    loop = LoopHealth(["registry", "flush"], stale_after_s=30, clock=clock)
    loop.turned()
    with loop.retrying("registry"):
        loop.failed("registry")
        assert loop.checks() == {"poll-loop": True, "registry": False, "flush": True}
        for _ in range(10):  # a long outage: each failed attempt is a turn of the loop
            clock.t += 5
            loop.failed("registry")
        assert loop.checks() == {"poll-loop": True, "registry": False, "flush": True}
    assert loop.checks() == {"poll-loop": True, "registry": True, "flush": True}
    with pytest.raises(ValueError):
        loop.failed("count-cache")


def test_the_aggregator_waiting_on_the_registry_is_not_ready_until_the_message_decodes() -> None:
    clock = Clock()
    seen: list[dict[str, bool]] = []
    agg = worker.Aggregator(
        AggregatorSettings(),
        consumer=None,  # type: ignore[arg-type]  # _retry_transient touches no client
        deserialize=lambda *_: None,
        store=None,  # type: ignore[arg-type]
        cache=None,  # type: ignore[arg-type]
        purger=None,  # type: ignore[arg-type]
        dead_letter=None,  # type: ignore[arg-type]
        clock=clock,
        sleep=lambda s: (seen.append(agg.loop.checks()), setattr(clock, "t", clock.t + s)),
    )
    agg.loop.turned()
    outcomes: list[Exception | None] = [worker.Transient("registry down")] * 12 + [None]

    def decode() -> None:
        error = outcomes.pop(0)
        if error is not None:
            raise error

    assert agg._retry_transient(decode) is None
    assert len(seen) == 12  # the outage outlasted the 30 s freshness bound
    assert all(s[worker.REGISTRY] is False and s["poll-loop"] is True for s in seen)
    assert agg.loop.checks()[worker.REGISTRY] is True
