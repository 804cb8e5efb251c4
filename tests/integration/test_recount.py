"""`likes recount` against the real stack: the stack's write service, relay and aggregator make the
counts, the tests damage them by hand, the CLI (as a process, with the stack's LIKES_HOME and port
offset, so it reaches the stores as the stack's aggregator does) reports and repairs.

The truth each test compares with is read from the edges of the users it made like the post, by
primary key: not through the by-post index the reconciler itself uses.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from cassandra.cluster import Session
from fastapi.testclient import TestClient
from redis.cluster import RedisCluster

from services.aggregator import cache
from services.client import LikesClient
from services.contracts import clients, keys, workloads
from services.recount import core
from tests.conftest import LIKES, Stack
from tests.integration.test_aggregator import wait_for

pytestmark = pytest.mark.stack


# -- plumbing ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def rc(stack: Stack) -> RedisCluster:
    return clients.count_cache(stack.settings(), timeout=2.0)


@pytest.fixture(scope="module")
def region(stack: Stack) -> str:
    return stack.settings().region  # the stack's aggregator's region: its correction cell's too


def like(app: TestClient, stack: Stack, user: str, post: str) -> None:
    r = app.post(
        "/v1/likes",
        json={"post_id": post, "action": "like"},
        headers={
            "Authorization": f"Bearer {stack.token(user)}",
            "Idempotency-Key": str(uuid.uuid4()),
        },
    )
    assert r.status_code == 202, r.text


def truth(cql: Session, users: list[str], post: str) -> int:
    n = 0
    for u in users:
        row = cql.execute(
            "SELECT state, void FROM edges WHERE user_id = %s AND kind = 'edge' AND ref = %s",
            (u, post),
        ).one()
        n += bool(row and row.state == "liked" and not row.void)
    return n


def cells(cql: Session, post: str) -> dict[str, tuple[int, int]]:
    rows = cql.execute(
        "SELECT region, shard, value, applied_window FROM counter_cells WHERE post_id = %s", (post,)
    )
    return {f"{r.region}/{r.shard}": (r.value, r.applied_window) for r in rows}


def cached(rc: RedisCluster, post: str) -> dict[str, Any] | None:
    return cache.read_aggregate(rc, post)


def counted(rc: RedisCluster, cql: Session, post: str, n: int) -> Callable[[], bool]:
    """Both stores show n: the cells' sum and the cached aggregate."""

    def ok() -> bool:
        a = cached(rc, post)
        return (
            a is not None and a["count"] == n and sum(v for v, _ in cells(cql, post).values()) == n
        )

    return ok


def recount(stack: Stack, *args: str) -> tuple[int, dict[str, Any]]:
    proc = stack.cli("recount", *args, "--json", check=False, timeout=300)
    assert proc.stdout.strip(), proc.stderr
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1])


def liked_post(
    app: TestClient, stack: Stack, rc: RedisCluster, cql: Session, n: int, tag: str
) -> tuple[str, list[str]]:
    post = f"rc-{tag}-{uuid.uuid4().hex[:8]}"
    users = [f"u-{uuid.uuid4().hex[:10]}" for _ in range(n)]
    for u in users:
        like(app, stack, u, post)
    wait_for(counted(rc, cql, post, n), what=f"{post} counted")
    return post, users


# -- tests ------------------------------------------------------------------------------------
def test_no_drift_exits_0_with_drift_0(
    stack: Stack, app_client: TestClient, rc: RedisCluster, cql: Session
) -> None:
    post, users = liked_post(app_client, stack, rc, cql, 3, "clean")
    code, out = recount(stack, post)
    assert code == 0, out
    assert (out["checked"], out["drift"], out["repaired"], out["drift_ratio"]) == (1, 0, 0, 0.0)
    (p,) = out["posts"]
    assert p["status"] == "ok"
    assert (
        (p["truth"], p["counter_store"], p["count_cache"])
        == (3, 3, 3)
        == (truth(cql, users, post),) * 3
    )
    assert p["drift"] == {"counter_store": 0, "count_cache": 0, "reactions": {}}
    assert out["settle"] is None  # nothing drifted: no wait
    # the human form says the same, with the same exit status
    human = stack.cli("recount", post, check=False)
    assert human.returncode == 0 and post in human.stdout and "ok" in human.stdout


def test_bad_missing_and_ambiguous_posts_are_errors(stack: Stack) -> None:
    ghost = f"rc-ghost-{uuid.uuid4().hex[:8]}"
    code, out = recount(stack, ghost)
    assert code == 2 and ghost in out["error"] and "no post" in out["error"]
    code, out = recount(stack, "bad{id}")
    assert code == 2 and "not a post id" in out["error"]
    code, out = recount(stack, ghost, "--sample", "3")
    assert code == 2 and "one POST, or --sample" in out["error"]


def test_drift_in_a_cell_and_in_the_cache_is_reported_then_repaired_for_good(
    stack: Stack, app_client: TestClient, rc: RedisCluster, cql: Session, region: str
) -> None:
    in_cell, cell_users = liked_post(app_client, stack, rc, cql, 3, "cell")
    in_cache, cache_users = liked_post(app_client, stack, rc, cql, 3, "cache")
    # a cell counting two likes that no edge backs (e.g. a duplicate beyond the dedup window, or
    # a replayed peer region's cell), and a cache aggregate from an emitter with a bogus gen
    cql.execute(
        "INSERT INTO counter_cells (post_id, region, shard, value, applied_window, reactions) "
        "VALUES (%s, 'eu-west-9', 0, 2, 41, {'like': 2})",
        (in_cell,),
    )
    bogus_gen = 10**9
    rc.hset(keys.count_key(in_cache), mapping={"count": 10, "gen": bogus_gen})
    cells_before = {p: cells(cql, p) for p in (in_cell, in_cache)}

    # reported, nothing written
    code, out = recount(stack, in_cell)
    assert code == 1, out
    (p,) = out["posts"]
    assert p["status"] == "drift" and p["correction"] is None
    assert (p["truth"], p["counter_store"], p["count_cache"]) == (3, 5, 3)
    assert p["drift"] == {"counter_store": -2, "count_cache": 0, "reactions": {"like": -2}}
    assert p["first_reading"] == {"truth": 3, "counter_store": 5, "count_cache": 3}
    assert out["drift"] == 1 and out["drift_ratio"] == 1.0 and out["settle"]["settled"] is True
    code, out = recount(stack, in_cache)
    assert code == 1 and out["posts"][0]["drift"]["count_cache"] == -7, out
    assert {p: cells(cql, p) for p in (in_cell, in_cache)} == cells_before
    assert cached(rc, in_cache)["count"] == 10  # type: ignore[index]

    # repaired
    code, out = recount(stack, in_cell, "--repair", "--yes")
    assert code == 0, out
    (p,) = out["posts"]
    assert p["status"] == "repaired" and out["repaired"] == 1 and out["drift"] == 1
    fix = p["correction"]
    assert fix["region"] == core.correction_region(region) and fix["delta"] == -2, fix
    assert fix["cache_written"] is True
    code, out = recount(stack, in_cache, "--repair", "--yes")
    assert code == 0, out
    fix = out["posts"][0]["correction"]
    assert out["posts"][0]["status"] == "repaired" and fix["delta"] == 0 and fix["gen"] > bogus_gen
    # each repair left an audit record (`likes audit`), newest first
    trail = json.loads(stack.cli("audit", "--since", "10m", "--json").stdout)
    ours = [r for r in trail if r["command"] == "recount --repair"
            and r["args"]["posts"] in ([in_cell], [in_cache])]  # fmt: skip
    assert [(r["args"]["posts"], r["result"], r["detail"]) for r in ours] == [
        ([in_cache], "ok", {in_cache: "repaired"}),
        ([in_cell], "ok", {in_cell: "repaired"}),
    ]

    url = stack.service_url("read")
    read = LikesClient(url, url, verify=stack.service_verify)
    for post, users in ((in_cell, cell_users), (in_cache, cache_users)):
        want = truth(cql, users, post)
        assert want == 3
        assert counted(rc, cql, post, want)(), (post, cells(cql, post), cached(rc, post))
        assert read.count(post)["count"] == want
    assert cells(cql, in_cell)[f"{core.correction_region(region)}/0"][0] == -2

    # still true a few aggregator windows later, and the aggregator's next folds keep the
    # correction (it never writes the correction cell) and win the cache's gen-CAS
    time.sleep(3)
    for post in (in_cell, in_cache):
        assert counted(rc, cql, post, 3)(), (post, cells(cql, post), cached(rc, post))
    # the canary's likes would be the latest events of the sample below: it rests meanwhile
    stack.cli("local", "stop", workloads.CANARY.name)
    try:
        more = {post: f"u-{uuid.uuid4().hex[:10]}" for post in (in_cell, in_cache)}
        for post, user in more.items():
            like(app_client, stack, user, post)
        for post, users in ((in_cell, cell_users), (in_cache, cache_users)):
            want = truth(cql, [*users, more[post]], post)
            assert want == 4
            wait_for(counted(rc, cql, post, want), what=f"{post} counted after the repair")
            assert read.count(post)["count"] == want
        assert cells(cql, in_cell)[f"{core.correction_region(region)}/0"][0] == -2
        code, out = recount(stack, in_cell)
        assert code == 0 and out["posts"][0]["status"] == "ok", out

        # the sample: the posts with the latest events are these two
        code, out = recount(stack, "--sample", "2")
        assert code == 0, out
        assert {p["post_id"] for p in out["posts"]} == {in_cell, in_cache}
        assert "likes.committed" in out["source"]
    finally:
        stack.up()


def test_a_like_in_flight_is_never_repaired(
    stack: Stack, app_client: TestClient, rc: RedisCluster, cql: Session, region: str
) -> None:
    post = f"rc-flight-{uuid.uuid4().hex[:8]}"
    users = [f"u-{uuid.uuid4().hex[:10]}" for _ in range(2)]
    stack.cli("local", "stop", "aggregator")  # the likes reach Kafka, nothing folds them
    try:
        for u in users:
            like(app_client, stack, u, post)
        assert truth(cql, users, post) == 2 and cells(cql, post) == {}

        # the consumers never get past the first reading: left alone, exit 1
        code, out = recount(stack, post, "--repair", "--yes", "--timeout", "3")
        assert code == 1, out
        (p,) = out["posts"]
        assert p["status"] == "unsettled" and p["correction"] is None
        assert out["settle"]["settled"] is False and "likes-aggregator" in out["settle"]["detail"]
        assert cells(cql, post) == {} and cached(rc, post) is None

        # a recount that waits: the aggregator comes back while it waits, folds the likes, and
        # the drift of the first reading is gone from the second
        proc = subprocess.Popen(
            [LIKES, "recount", post, "--repair", "--yes", "--timeout", "120", "--json"],
            env=stack.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        time.sleep(3)
    finally:
        stack.up()
    stdout, stderr = proc.communicate(timeout=180)
    assert proc.returncode == 0, (stdout, stderr)
    out = json.loads(stdout.strip().splitlines()[-1])
    (p,) = out["posts"]
    assert p["status"] == "transient" and p["correction"] is None, p
    assert p["first_reading"]["counter_store"] == 0 and p["counter_store"] == 2
    assert out["repaired"] == 0 and out["settle"]["settled"] is True

    wait_for(counted(rc, cql, post, 2), what="the in-flight likes counted")
    time.sleep(3)
    assert counted(rc, cql, post, 2)(), (cells(cql, post), cached(rc, post))
    assert not any(k.startswith(core.correction_region(region)) for k in cells(cql, post))
