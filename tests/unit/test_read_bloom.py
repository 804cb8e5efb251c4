"""The has_liked filter format (services/contracts/bloom.py), free of servers: no false negatives,
the false-positive rate it promises, sizes that follow what a user holds, markers read as
"maybe", and a hash that is the same in every process. The Lua side is checked against a real
Redis in tests/integration/test_bloom.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from services.contracts import bloom


@pytest.mark.parametrize("n", [1, 16, 500, 5000])
def test_a_built_filter_holds_every_item_and_rejects_about_one_percent(n: int) -> None:
    items = [f"post-{i}" for i in range(n)]
    f = bloom.load(bloom.build(items))
    assert f is not None
    assert all(p in f for p in items)  # no false negatives, ever
    # built at half its capacity; even a full filter stays under ~1 %
    fp = sum(f"other-{i}" in f for i in range(20_000)) / 20_000
    assert fp < 0.01, fp


def test_a_full_filter_stays_near_one_percent() -> None:
    # the Lua add drops a filter once it holds `capacity` items: this is the worst it gets
    cap = 2048
    items = [f"p{i}" for i in range(cap)]
    full = bloom.load(bloom.MIN_FILTER_BYTES.to_bytes(4, "big") + _set_all(cap, items))
    assert full is not None and full.capacity == cap
    assert all(p in full for p in items)
    fp = sum(f"o{i}" in full for i in range(20_000)) / 20_000
    assert fp < 0.015, fp


def _set_all(cap: int, items: list[str]) -> bytes:
    """The bit array of a filter of capacity `cap` holding `items` (what the Lua adds produce)."""
    m = cap * bloom.BITS_PER_ITEM
    bits = bytearray(m // 8)
    for p in items:
        h1, h2 = bloom.probes(p)
        for i in range(bloom.K):
            pos = (h1 + i * h2) % m
            bits[pos >> 3] |= 0x80 >> (pos & 7)
    return bytes(bits)


def test_size_follows_what_the_user_holds() -> None:
    one = bloom.build(["p"])
    assert len(one) == bloom.MIN_FILTER_BYTES == 44  # was 4.9 KB for every liker
    assert len(bloom.build([f"p{i}" for i in range(1000)])) == 4 + 2048 * 10 // 8
    assert bloom.capacity_for(0) == bloom.MIN_CAPACITY
    assert bloom.capacity_for(17) == 64
    assert bloom.capacity_for(10**9) == bloom.MAX_CAPACITY
    with pytest.raises(ValueError, match="exceed"):
        bloom.build([f"p{i}" for i in range(bloom.MAX_CAPACITY + 1)])


def test_the_header_counts_the_items() -> None:
    raw = bloom.build(["a", "b", "c"])
    assert int.from_bytes(raw[:4], "big") == 3


def test_markers_missing_and_foreign_bytes_mean_maybe() -> None:
    for raw in (None, bloom.new_marker(), bloom.TOO_BIG, b"short", b"\x00" * 45):
        assert bloom.load(raw) is None, raw
        assert bloom.contains(bloom.load(raw), "anything")
    assert bloom.is_missing(None) and not bloom.is_missing(bloom.TOO_BIG)
    assert bloom.new_marker().startswith(bloom.BUILDING)
    assert bloom.new_marker() != bloom.new_marker()


def test_the_hash_is_stable_across_processes() -> None:
    # the Lua script recomputes positions from (h1, h2): they must not depend on the process
    code = "from services.contracts import bloom; print(bloom.build(['post-1', 'x']).hex())"
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            env={"PYTHONHASHSEED": seed},
            capture_output=True,
            text=True,
            check=True,
            cwd=Path(__file__).resolve().parents[2],
        ).stdout
        for seed in ("1", "2")
    }
    assert outs == {bloom.build(["post-1", "x"]).hex() + "\n"}
    h1, h2 = bloom.probes("post-1")
    assert 0 <= h1 < 2**32 and 0 < h2 < 2**32 and h2 % 2 == 1
