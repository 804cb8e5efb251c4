"""End to end through the service processes `likes local up` starts: write → outbox/Kafka →
aggregator → count-cache/counter-store → read. The invariants of DESIGN.md as the oracle.
The aggregator SIGKILLed mid-window under writes is the aggregator-crash game day, run as a test
in tests/integration/test_chaos.py (no lost like, counts converged, nothing applied twice)."""

from __future__ import annotations

import concurrent.futures as cf
import time
import uuid
from collections import Counter

import pytest
from cassandra.cluster import Session

from services.client import LikesClient
from services.contracts import convergence
from tests.conftest import Stack

pytestmark = pytest.mark.stack


@pytest.fixture(scope="module")
def api(stack: Stack) -> LikesClient:
    # through the gateway, as clients reach the API
    return LikesClient(stack.gateway_url, stack.gateway_url, attempts=8, vary_client_ip=True)


def liked_edges(
    cql: Session, pairs: list[tuple[str, str]], with_void: bool = False
) -> Counter[str]:
    """Distinct non-void liked edges per post: the truth a count must converge to (inv. 6);
    `with_void`: the void ones too (every like the store accepted)."""
    out: Counter[str] = Counter()
    for user, post in set(pairs):
        row = cql.execute(
            "SELECT state, void FROM edges WHERE user_id = %s AND kind = 'edge' AND ref = %s",
            (user, post),
        ).one()
        if row and row.state == "liked" and (with_void or not row.void):
            out[post] += 1
    return out


def converge(api: LikesClient, expected: dict[str, int], timeout: float = 60) -> dict[str, int]:
    """The counts once converged (equal to the truth and still equal after the hold of
    services/contracts/convergence.py); otherwise fails, saying how it went."""
    result = convergence.wait_converged(
        lambda: {p: api.count(p)["count"] for p in expected}, expected, timeout_s=timeout
    )
    assert result.converged, str(result)
    return {p: int(v or 0) for p, v in result.last_seen.items()}


def burst(
    stack: Stack, api: LikesClient, pairs: list[tuple[str, str]], replays: int = 1
) -> list[int]:
    def one(pair: tuple[str, str]) -> int:
        user, post = pair
        tok = stack.token(user)
        key = str(uuid.uuid4())
        codes = [api.like(post, idempotency_key=key, token=tok).status_code]
        codes += [
            api.like(post, idempotency_key=key, token=tok).status_code for _ in range(replays)
        ]
        return max(codes)

    with cf.ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, pairs))


def test_counts_converge_to_the_liked_edges_under_normal_traffic(
    stack: Stack, api: LikesClient, cql: Session
) -> None:
    posts = [f"e2e-{uuid.uuid4().hex[:8]}-{i}" for i in range(4)]
    pairs = [(f"u-{u}-{uuid.uuid4().hex[:6]}", posts[u % 4 if u % 3 else 0]) for u in range(60)]
    assert set(burst(stack, api, pairs)) == {202}
    assert liked_edges(cql, pairs, with_void=True).total() == 60  # every accepted like is an edge
    truth = liked_edges(cql, pairs)  # the stack's abuse scorer may void some: not counted
    assert converge(api, {p: truth[p] for p in posts}) == {p: truth[p] for p in posts}


def test_unlike_and_relike_counts_the_final_state(
    stack: Stack, api: LikesClient, cql: Session
) -> None:
    post = f"e2e-{uuid.uuid4().hex[:8]}"
    users = [f"u-{uuid.uuid4().hex[:8]}" for _ in range(6)]
    for i, u in enumerate(users):
        tok = stack.token(u)
        actions = ["like", "unlike", "like"] if i % 2 == 0 else ["like", "unlike"]
        for a in actions:
            assert api.like(post, a, token=tok).status_code == 202
    assert converge(api, {post: 3}) == {post: 3}
    assert liked_edges(cql, [(u, post) for u in users])[post] == 3


@pytest.mark.disruptive
def test_count_cache_primary_killed_reads_stay_200(stack: Stack, api: LikesClient) -> None:
    post = f"e2e-{uuid.uuid4().hex[:8]}"
    pairs = [(f"u-{uuid.uuid4().hex[:8]}", post) for _ in range(5)]
    assert set(burst(stack, api, pairs, 0)) == {202}
    # counted before the kill (a first match is enough here: the 15 s of reads below, every one
    # 5, are the hold, and the convergence hold's 29 s would only lengthen the suite)
    deadline = time.monotonic() + 60
    while api.count(post)["count"] != 5:
        assert time.monotonic() < deadline, api.count(post)
        time.sleep(0.2)
    from redis.cluster import ClusterNode, RedisCluster

    from services.contracts import keys

    rc = RedisCluster(
        startup_nodes=[ClusterNode(h, p) for h, p in stack.count_cache_nodes],
        password=stack.redis_password,
    )
    port = int(rc.get_node_from_key(keys.count_key(post)).port)
    rc.close()
    victim = f"count-cache-{stack.layout.ports.count_cache.index(port) + 1}"
    stack.cli("local", "stop", "--kill", victim)
    try:
        statuses = []
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            import httpx

            r = httpx.get(f"{stack.gateway_url}/v1/posts/{post}/likes", timeout=5)
            statuses.append(r.status_code)
            assert r.json()["count"] == 5  # from the counter-store behind the dead node (H10)
            time.sleep(0.2)
        assert set(statuses) == {200}
    finally:
        stack.up()
