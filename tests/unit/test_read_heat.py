"""Heat hint → Cache-Control max-age of anonymous answers."""

from __future__ import annotations

import pytest

from services.read.heat import COLD_TTL_S, HOT_TTL_S, StaticHeat, ttl_for


@pytest.mark.parametrize(
    ("hint", "ttl"),
    [
        ("hot", 5),
        (" HOT\n", 5),
        ("viral", 5),
        (None, 30),
        ("", 30),
        ("cold", 30),
        ("garbage", 30),
        ("10", 10),
        ("12.7", 12),
        ("1", 5),  # below the floor: the edge still absorbs a viral burst
        ("0", 5),
        ("-3", 5),
        ("3600", 30),  # above the ceiling: the 30 s natural TTL is the purge safety net
    ],
)
def test_ttl_for(hint: str | None, ttl: int) -> None:
    assert ttl_for(hint) == ttl


def test_bounds() -> None:
    assert (HOT_TTL_S, COLD_TTL_S) == (5, 30)


def test_static_heat_defaults_to_cold() -> None:
    h = StaticHeat({"viral-post": "hot", "warm-post": "15"})
    assert (h.ttl("viral-post"), h.ttl("warm-post"), h.ttl("other")) == (5, 15, 30)
