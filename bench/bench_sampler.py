"""Sampler throughput against the bare sketch on the same Zipf key stream, and detection latency
for spikes of different steepness (simulated clock: the window's own arithmetic, no sleeping).

    .venv/bin/python bench/bench_sampler.py
"""

from __future__ import annotations

import random
import time

import datasketches as ds

from services.hotkey_sampler.window import DecayingTopK


def stream(n: int, posts: int = 100_000, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [f"p{min(int(rng.paretovariate(1.1)), posts)}" for _ in range(n)]


def throughput(keys: list[str]) -> None:
    bare = ds.frequent_strings_sketch(10)
    t0 = time.perf_counter()
    for k in keys:
        bare.update(k, 100)
    t_bare = time.perf_counter() - t0
    w = DecayingTopK()
    t0 = time.perf_counter()
    for i in range(0, len(keys), 200):  # the mirror posts batches
        w.update_many(keys[i : i + 200], 100)
    t_win = time.perf_counter() - t0
    n = len(keys)
    print(f"bare sketch   {n / t_bare:>12,.0f} updates/s")
    print(f"sampler window{n / t_win:>12,.0f} updates/s  ({t_bare / t_win:.2f}x of bare)")
    t0 = time.perf_counter()
    for _ in range(20):
        w.top(100, min_rate=200)
    print(f"top-100 query {(time.perf_counter() - t0) / 20 * 1000:>9.2f} ms")


def detection(ramp_s: float, peak: float, enter: float = 2000.0) -> float:
    """Seconds from the spike's start until the window's rate crosses `enter` (1% sampling)."""

    class Clock:
        t = 0.0

        def __call__(self) -> float:
            return self.t

    clock = Clock()
    w = DecayingTopK(clock=clock)
    rng = random.Random(2)
    dt = 0.01
    start = 10.0  # a quiet window first: the spike starts at t=10 s
    while clock.t < start + 30:
        clock.t += dt
        since = clock.t - start
        if since < 0:
            w.update("background", 1)
            continue
        rate = peak * min(1.0, since / ramp_s) if ramp_s > 0 else peak
        samples = rng.random() < rate * 0.01 * dt * 10  # expected count per tick, /10 batches
        for _ in range(int(rate * 0.01 * dt) + int(samples)):
            w.update("viral", 100)
        if int(clock.t / 0.25) != int((clock.t - dt) / 0.25) and w.top(1, enter):
            return since
    return float("inf")


if __name__ == "__main__":
    throughput(stream(500_000))
    print("detection latency (enter 2000/s, 1% sample):")
    for ramp in (0.0, 1.0, 5.0, 20.0):
        for peak in (5_000, 50_000):
            print(f"  ramp {ramp:>4.0f}s to {peak:>6,}/s: {detection(ramp, peak):5.2f}s")
