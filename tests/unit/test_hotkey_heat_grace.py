"""EtcdHeat through an etcd outage: the last good hints for 5 minutes, then the cold defaults.

The outage is real (a port nothing listens on); the clock is patched: no sleeps."""

from __future__ import annotations

import socket

import pytest

from services.contracts.hotkeys import GRACE_S
from services.read.heat import COLD_TTL_S, HOT_TTL_S, EtcdHeat


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def dead_port() -> int:
    """A port nothing listens on (bound then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_grace_period_is_five_minutes() -> None:
    assert GRACE_S == 300.0
    assert EtcdHeat("127.0.0.1", 1).last_good.grace_s == GRACE_S


def test_no_successful_poll_yet_means_cold() -> None:
    heat = EtcdHeat("127.0.0.1", 1, clock=Clock())
    assert heat.ttl("anything") == COLD_TTL_S
    assert heat.hints == {}


def test_last_good_hints_are_served_for_the_grace_period_then_expire() -> None:
    clock = Clock()
    heat = EtcdHeat("127.0.0.1", 1, grace_s=300, clock=clock)
    heat.last_good.ok({"viral": "hot", "warm": "12"})  # what a successful poll stores
    assert (heat.ttl("viral"), heat.ttl("warm"), heat.ttl("cold")) == (HOT_TTL_S, 12, COLD_TTL_S)
    clock.t += 300  # etcd unreachable since: still the last good hints, at the boundary too
    assert (heat.ttl("viral"), heat.ttl("warm")) == (HOT_TTL_S, 12)
    clock.t += 0.001  # past the grace period: the defaults, as if nothing were hot
    assert (heat.ttl("viral"), heat.ttl("warm")) == (COLD_TTL_S, COLD_TTL_S)
    assert heat.hints == {}


def test_a_successful_poll_restarts_the_grace_period() -> None:
    clock = Clock()
    heat = EtcdHeat("127.0.0.1", 1, grace_s=300, clock=clock)
    heat.last_good.ok({"viral": "hot"})
    clock.t += 250
    heat.last_good.ok({"viral": "hot"})
    clock.t += 250  # 500 s after the first poll, 250 s after the last
    assert heat.ttl("viral") == HOT_TTL_S
    clock.t += 51
    assert heat.ttl("viral") == COLD_TTL_S


async def test_a_failed_poll_keeps_the_hints_until_they_expire() -> None:
    clock = Clock()
    heat = EtcdHeat("127.0.0.1", dead_port(), timeout_s=0.5, grace_s=300, clock=clock)
    heat.last_good.ok({"viral": "hot"})
    clock.t += 120
    with pytest.raises(Exception):  # noqa: B017 - whatever aetcd raises for a dead server
        await heat.refresh()
    assert heat.ttl("viral") == HOT_TTL_S  # the failure did not wipe them...
    clock.t += 181
    assert heat.ttl("viral") == COLD_TTL_S  # ...nor did it renew them
    await heat.close()
