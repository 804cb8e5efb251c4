"""The shared Bloom filter format: round trip, the byte-wise OR merge the writers rely on, and a
hash that is the same in every process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from services.contracts import bloom


def or_bytes(a: bytes, b: bytes) -> bytes:
    """What Redis `BITOP OR` does to two equal-length strings."""
    return bytes(x | y for x, y in zip(a, b, strict=True))


def test_round_trip_through_bytes() -> None:
    f = bloom.new_filter()
    for i in range(500):
        f.add(f"post-{i}")
    g = bloom.load(bytes(f.save_bytes()))
    assert g is not None
    assert all(bloom.contains(g, f"post-{i}") for i in range(500))  # no false negatives
    absent = sum(bloom.contains(g, f"other-{i}") for i in range(2000))
    assert absent < 2000 * 0.05  # "no" for almost everything else


def test_or_merging_one_item_filters_is_the_union() -> None:
    stored = bytes(bloom.new_filter().save_bytes())  # what BITOP OR on a missing key starts from
    for p in ("a", "b", "c"):
        stored = or_bytes(stored, bloom.one_item(p))
    f = bloom.load(stored)
    assert f is not None
    assert all(bloom.contains(f, p) for p in ("a", "b", "c"))
    assert not bloom.contains(f, "d")


def test_or_of_two_user_filters_contains_both() -> None:
    left, right = bloom.new_filter(), bloom.new_filter()
    left.update(f"l{i}" for i in range(100))
    right.update(f"r{i}" for i in range(100))
    merged = bloom.load(or_bytes(bytes(left.save_bytes()), bytes(right.save_bytes())))
    assert merged is not None
    assert all(
        bloom.contains(merged, f"l{i}") and bloom.contains(merged, f"r{i}") for i in range(100)
    )
    assert merged == left | right


def test_adding_twice_changes_nothing() -> None:
    once = or_bytes(bytes(bloom.new_filter().save_bytes()), bloom.one_item("p"))
    assert or_bytes(once, bloom.one_item("p")) == once  # a replayed window is harmless


def test_the_hash_is_stable_across_processes() -> None:
    # rbloom's default hash is Python's salted hash(); ours must agree between writer and reader
    code = "from services.contracts import bloom; print(bloom.one_item('post-1').hex())"
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
    assert outs == {bloom.one_item("post-1").hex() + "\n"}


def test_missing_or_foreign_bytes_mean_maybe() -> None:
    assert bloom.load(None) is None
    assert bloom.load(b"short") is None
    assert bloom.contains(None, "anything")
    other_size = bloom.Bloom(10, 0.1, hash_func=bloom.stable_hash)
    assert bloom.load(bytes(other_size.save_bytes())) is None
