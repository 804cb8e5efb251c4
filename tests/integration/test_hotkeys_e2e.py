"""End to end through the gateway's mirror: a Zipf read load over ~200 seeded posts, then a
sudden viral post, through the rendered Envoy, which mirrors 1 % of reads (the stack's value) to
the stack's sampler; the stack's operator loop replicates into the real hot pools. Measured: the
spike's start → the post's `/likes/hotkeys/` flag in etcd → its `count:{post}` copy, with the
source count, in every hot pool (→ the `/likes/hotpool/` flag that points readers there, → the
first read answered from a replica). The figures are printed (`pytest -s`); only correctness is
asserted, with a generous bound, never the timing.

The sampler publishes posts at or above its own min rate (200 est. reads/s by default); the test
lowers the operator's policy (`/likes/flags/hotkey-policy`) to that and restores it after, and
paces the load so that the cold posts stay well under it and the viral post well over it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import threading
import time
import uuid
from dataclasses import dataclass, field

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from operators.hotkeys.local_loop import POLICY_KEY
from services.contracts import hotkeys, keys, routes, workloads
from tests.conftest import Stack
from tests.integration.test_hotkeys import count_cache, etcd_get, etcd_put
from tests.integration.test_hotkeys import pools as hot_pool_clients

pytestmark = pytest.mark.stack

COLD_POSTS = 200
ZIPF_S = 1.0  # rank 1 gets ~1/H(200) ≈ 17% of the cold reads
# the mirror's sample fraction is the stack's (1 %): each copy weighs 100 at the sampler
THREADS = 8
BASELINE_S, BASELINE_RATE = 3.0, 300.0  # reads/s: the hottest cold post at ~50/s
SPIKE_RATE, VIRAL_SHARE = 600.0, 0.85  # a target; through Envoy ~400 reads/s is the ceiling
MAX_REQUESTS = 60_000  # the load's hard cap, whatever happens
BOUND_S = 60.0  # generous: flagged and replicated within this, or the test fails
POLL_S = 0.02
# the sampler publishes at >= 200 est. reads/s; promote at that, never split (writes untouched)
POLICY = {"enterRate": 200, "exitRate": 100, "splitRate": 1_000_000, "cooldownSeconds": 3}
SOURCE_COUNT = 4242


@dataclass
class Load:
    """Paced reads from a few threads: Zipf over the cold posts, then mostly the viral post."""

    client: httpx.Client  # the gateway
    cold: list[str]
    viral: str
    stop: threading.Event = field(default_factory=threading.Event)
    spike_at: float | None = None  # monotonic instant of the switch
    rate: float = BASELINE_RATE
    sent: itertools.count[int] = field(default_factory=itertools.count)
    reads: list[tuple[float, str, int]] = field(default_factory=list)  # (t, post, status)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        self.cum = list(itertools.accumulate(1 / (k**ZIPF_S) for k in range(1, len(self.cold) + 1)))

    def pick(self, rng: random.Random) -> str:
        if self.spike_at is not None and rng.random() < VIRAL_SHARE:
            return self.viral
        return rng.choices(self.cold, cum_weights=self.cum)[0]

    def worker(self, seed: int) -> None:
        rng = random.Random(seed)
        next_at = time.monotonic()
        while not self.stop.is_set() and next(self.sent) < MAX_REQUESTS:
            post = self.pick(rng)
            status = self.client.get(routes.read_path(post)).status_code
            now = time.monotonic()
            with self.lock:
                self.reads.append((now, post, status))
            next_at = max(next_at + THREADS / self.rate, now - 0.1)  # paced, no catch-up burst
            if next_at > now:
                time.sleep(next_at - now)

    def achieved(self, since: float, until: float, post: str | None = None) -> float:
        with self.lock:
            n = sum(1 for t, p, _ in self.reads if since <= t < until and post in (None, p))
        return n / max(until - since, 1e-9)


def require_up(url: str) -> None:
    try:
        ok = httpx.get(f"{url}/readyz", timeout=2).status_code == 200
    except httpx.HTTPError:
        ok = False
    if not ok:
        pytest.fail(f"{url} is not ready: this test needs the stack's hot-key loop")


def read_metric(url: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(httpx.get(f"{url}/metrics", timeout=2).text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return 0.0


def test_zipf_load_with_a_viral_post_through_the_gateway_mirror(stack: Stack) -> None:
    sampler = stack.ops_url(workloads.HOTKEY_SAMPLER.name)  # readiness: the ops port
    require_up(sampler)
    require_up(f"http://{stack.host}:{stack.layout.ports.hotkey_operator}")
    tag = uuid.uuid4().hex[:8]
    cold = [f"zipf-{tag}-{i}" for i in range(COLD_POSTS)]
    viral = f"viral-{tag}"
    cc = count_cache(stack)
    for i, post in enumerate(cold):
        cc.hset(keys.count_key(post), mapping={"count": 10 + i, "gen": 1})
    cc.hset(keys.count_key(viral), mapping={"count": SOURCE_COUNT, "gen": 1})
    pools = hot_pool_clients(stack)
    previous = etcd_get(stack, POLICY_KEY)
    etcd_put(stack, POLICY_KEY, json.dumps(POLICY).encode())

    read = stack.ops_url(workloads.READ.name)  # its metrics
    loop = asyncio.new_event_loop()
    etcd = stack.etcd()

    def flagged(prefix: str) -> set[str]:
        got = loop.run_until_complete(etcd.get_prefix(prefix.encode()))
        return {hotkeys.post_of(kv.key, prefix) for kv in got}

    def replicated() -> bool:
        return all(r.hget(keys.count_key(viral), "count") == str(SOURCE_COUNT) for r in pools)

    def pool_hits() -> float:
        return read_metric(read, "likes_read_hot_pool_total", result="hit")

    mine = {viral, *cold}
    seen_cold: set[str] = set()
    marks: dict[str, float] = {}
    threads: list[threading.Thread] = []
    try:
        with httpx.Client(base_url=stack.gateway_url, timeout=5) as client:
            load = Load(client, cold, viral)
            threads = [
                threading.Thread(target=load.worker, args=(seed,), daemon=True)
                for seed in range(THREADS)
            ]
            for t in threads:
                t.start()
            start = time.monotonic()
            while time.monotonic() - start < BASELINE_S:  # the cold phase, watched too
                seen_cold |= flagged(keys.HOTKEYS_PREFIX) & set(cold)
                time.sleep(0.1)
            hits_before = pool_hits()
            load.rate = SPIKE_RATE
            load.spike_at = t0 = time.monotonic()  # the spike starts now
            while len(marks) < 4 and time.monotonic() - t0 < BOUND_S:
                now = time.monotonic()
                hot = flagged(keys.HOTKEYS_PREFIX) & mine
                seen_cold |= hot - {viral}
                if "flag" not in marks and viral in hot:
                    marks["flag"] = now - t0
                if "replicated" not in marks and replicated():
                    marks["replicated"] = now - t0
                if "hotpool" not in marks and viral in flagged(hotkeys.HOTPOOL_PREFIX):
                    marks["hotpool"] = now - t0
                if "served" not in marks and pool_hits() > hits_before:
                    marks["served"] = now - t0
                time.sleep(POLL_S)
            end = time.monotonic()
            load.stop.set()
            for t in threads:
                t.join(10)
    finally:
        load_stopped = all(not t.is_alive() for t in threads)
        etcd_put(stack, POLICY_KEY, previous)
        loop.run_until_complete(etcd.close())
        loop.close()
        for post in cold:
            cc.delete(keys.count_key(post))

    def fmt(name: str) -> str:
        return f"{marks[name]:.2f}s" if name in marks else f"not within {BOUND_S:.0f}s"

    print(
        f"\nZipf load {load.achieved(start, t0):.0f} reads/s over {COLD_POSTS} posts "
        f"(hottest cold post {load.achieved(start, t0, cold[0]):.0f}/s); spike "
        f"{load.achieved(t0, end):.0f} reads/s, viral post {load.achieved(t0, end, viral):.0f}/s; "
        f"mirror 1 %, {len(load.reads)} reads, poll every {POLL_S * 1000:.0f} ms"
        f"\nspike start → etcd flag {fmt('flag')}, → replicated in all {len(pools)} hot pools "
        f"{fmt('replicated')} (→ hotpool flag {fmt('hotpool')}, → first read from a replica "
        f"{fmt('served')}); cold posts ever flagged: {len(seen_cold)}/{COLD_POSTS}"
    )
    assert load_stopped
    assert all(s == 200 for _, _, s in load.reads)
    assert "flag" in marks, "the viral post was never flagged in etcd"
    assert "replicated" in marks, "the viral post was never replicated into every hot pool"
    for r in pools:
        assert r.ttl(keys.count_key(viral)) > 0  # a replica, refreshed by the operator, not pinned
    assert len(seen_cold) <= COLD_POSTS // 20, f"cold posts flagged: {sorted(seen_cold)}"
