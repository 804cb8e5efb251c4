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


def test_only_a_loop_that_stopped_turning_is_dead_not_one_retrying_an_outage() -> None:
    # review D10: /healthz was always 200, so a hung aggregator was never restarted
    clock = Clock()
    loop = LoopHealth(["flush"], hung_after_s=120, clock=clock)
    clock.t += 119
    assert loop.alive()  # starting up: not turned yet, within the bound
    clock.t += 1
    assert not loop.alive()
    loop.turned()
    assert loop.alive()
    with loop.retrying("flush"):
        for _ in range(10):  # ten minutes of a store outage, one failed attempt a minute
            clock.t += 60
            loop.failed("flush")
            assert loop.alive() and not loop.checks()["flush"]
    clock.t += 120
    assert not loop.alive()  # a call that never returns


def test_healthz_answers_503_when_the_loop_is_hung() -> None:
    import json
    import socket
    import urllib.error
    import urllib.request

    from services.common import worker_http
    from services.contracts import workloads

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    hung = {"now": False}
    server = worker_http.serve("127.0.0.1", port, dict, lambda: not hung["now"])
    url = f"http://127.0.0.1:{port}{workloads.HEALTH_PATH}"
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            assert r.status == 200
        hung["now"] = True
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url, timeout=5)
        assert e.value.code == 503 and json.loads(e.value.read())["status"] == "hung"
    finally:
        server.shutdown()
