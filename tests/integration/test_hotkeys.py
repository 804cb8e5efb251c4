"""The hot-key loop on the real stack (etcd, Redis Cluster, hot pools, the sampler, the operator's
loop): a flash spike is flagged and replicated; replicas track the source; a split post's likes
sum exactly; the post is demoted after the spike; a killed sampler's flags expire. The data plane:
the read service (in-process) answers a hot post from its hot-pool copy and falls back to the
count-cache when that pool is down, and mirrors its reads to the sampler; the heat hints survive
an etcd outage for the grace period only. On-call's `likes hotkeys` against the real etcd.

The sampler and the operator's loop are the stack's rendered workloads; the hot pools are
`local.components.hotkeys`. The sampler receives what the gateway mirrors: copies of the read
requests themselves.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import socket
import ssl
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import httpx
import pytest
import redis
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from cli import audit
from cli.main import app as cli_app
from infra import envoy_config
from local import transforms
from local.components import hotkeys as hk_components
from local.components.base import ProbeFailed, Server
from operators.hotkeys import cli as hotkeys_cli
from operators.hotkeys.local_loop import POLICY_KEY
from operators.hotkeys.reconciler import RECONCILE_SPAN
from services.client import LikesClient
from services.contracts import hotkeys, keys, routes, workloads
from services.contracts.settings import Settings
from services.read.heat import COLD_TTL_S, HOT_TTL_S, EtcdHeat
from services.read.main import create_app
from tests.conftest import Stack
from tests.integration.test_traces import (
    TRACE_DEADLINE_S,
    span_attribute,
    stack_spans,
    wait_for_value,
)

pytestmark = pytest.mark.stack
T = TypeVar("T")

# short cool-down so that demotion is observable; rates are the sampler's (scaled) estimates
OPERATOR = "on-call-test"  # who the CLI tests act as (audit records)
POLICY = {"enterRate": 500, "exitRate": 250, "splitRate": 1000, "cooldownSeconds": 3}


def wait_for(check: Callable[[], T | None], timeout: float = 30, every: float = 0.05) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout}s")
        time.sleep(every)


def etcd_get(stack: Stack, key: str) -> bytes | None:
    async def get() -> bytes | None:
        client = stack.etcd()
        try:
            got = await client.get(key.encode())
            return None if got is None else got.value
        finally:
            await client.close()

    return asyncio.run(get())


def etcd_put(stack: Stack, key: str, value: bytes | None) -> None:
    async def put() -> None:
        client = stack.etcd()
        try:
            if value is None:
                await client.delete(key.encode())
            else:
                await client.put(key.encode(), value)
        finally:
            await client.close()

    asyncio.run(put())


def start(server: Server, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    env = {**server.env, **(extra_env or {})}  # a rendered workload's env is its whole env
    proc = subprocess.Popen(
        server.argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + server.start_timeout
    while True:
        try:
            server.probe()
            return proc
        except ProbeFailed:
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise
            time.sleep(0.2)


def sampler_url(stack: Stack) -> str:
    return stack.service_url(workloads.HOTKEY_SAMPLER.name)


@pytest.fixture(scope="module")
def loop(stack: Stack) -> Iterator[dict[str, Any]]:
    """The stack's hot-key loop, with the test policy in etcd."""
    etcd_put(stack, POLICY_KEY, json.dumps(POLICY).encode())
    yield {
        "sampler": sampler_url(stack),  # its API (what the gateway mirrors to)
        "sampler_ops": stack.ops_url(workloads.HOTKEY_SAMPLER.name),  # its metrics
        "verify": stack.service_verify,
    }
    etcd_put(stack, POLICY_KEY, None)


def pools(stack: Stack) -> list[redis.Redis]:
    return [
        redis.Redis(
            host=stack.host,
            port=p,
            password=stack.redis_password,
            decode_responses=True,
            socket_timeout=1,
        )
        for p in hk_components.hot_pool_ports(stack.layout)
    ]


def count_cache(stack: Stack) -> redis.RedisCluster:
    return redis.RedisCluster(
        startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in stack.count_cache_nodes],
        password=stack.redis_password,
        decode_responses=True,
    )


def zipf_batch(n: int, posts: int = 5000) -> list[str]:
    """Background traffic: Zipf-ish over many cold posts (none near the enter rate)."""
    return [f"cold-{min(int(10 * random.paretovariate(1.0)), posts)}" for _ in range(n)]


def spike(
    sampler: str,
    post: str,
    until: Callable[[], bool],
    per_batch: int = 20,
    verify: ssl.SSLContext | bool = True,
) -> float:
    """Send the sampler what the gateway's 1% mirror would for a viral post (feed-page batch
    reads, each id standing for 100 reads) plus a trickle of cold reads, until `until()`.
    `verify`: the gateway's client certificate in the --tls profile (stack.service_verify)."""
    t0 = time.monotonic()
    with httpx.Client(timeout=2, verify=verify) as http:
        while not until():
            http.post(f"{sampler}{routes.BATCH_READ_PATH}", json={"post_ids": [post] * per_batch})
            # background: one mirrored single read of a Zipf-ish cold post
            http.get(f"{sampler}{routes.read_path(zipf_batch(1)[0])}")
            time.sleep(0.02)
            if time.monotonic() - t0 > 30:
                raise AssertionError("spike not detected within 30 s")
    return time.monotonic() - t0


def test_flash_spike_is_flagged_replicated_tracked_then_demoted(
    stack: Stack, loop: dict[str, Any]
) -> None:
    post = f"viral-{uuid.uuid4().hex[:8]}"
    cc = count_cache(stack)
    cc.hset(keys.count_key(post), mapping={"count": 41, "gen": 1, "reactions": "{}"})

    t0 = time.monotonic()
    flagged = spike(
        loop["sampler"],
        post,
        lambda: bool(etcd_get(stack, keys.HOTKEYS_PREFIX + post)),
        verify=loop["verify"],
    )
    # the CDN heat hint (5 s TTL) follows once the rate passes the sampler's heat rate
    heat, hotpool = keys.HEAT_PREFIX + post, hotkeys.HOTPOOL_PREFIX + post
    spike(loop["sampler"], post, lambda: etcd_get(stack, heat) == b"hot", verify=loop["verify"])
    spike(loop["sampler"], post, lambda: bool(etcd_get(stack, hotpool)), verify=loop["verify"])
    replicated = time.monotonic() - t0
    print(f"\nspike → etcd flag {flagged:.2f}s, → replicated {replicated:.2f}s")

    addresses = hotkeys.decode_pools(etcd_get(stack, hotkeys.HOTPOOL_PREFIX + post) or b"")
    assert len(addresses) == 4  # the policy's replication factor
    for r in pools(stack):
        assert r.hget(keys.count_key(post), "count") == "41"
        assert r.ttl(keys.count_key(post)) > 0  # a replica nobody refreshes dies

    # replicas track the source (a newer gen); an older gen never rolls them back
    cc.hset(keys.count_key(post), mapping={"count": 57, "gen": 2})
    wait_for(lambda: all(r.hget(keys.count_key(post), "count") == "57" for r in pools(stack)))

    # the spike is also past splitRate: the operator split it
    split = hotkeys.decode_split(wait_for(lambda: etcd_get(stack, keys.SPLIT_PREFIX + post)))
    assert split is not None and (split.factor, split.by) == (8, "operator")

    # the spike ends: rates decay, the sampler drops the flag, the operator demotes after 3 s
    wait_for(lambda: etcd_get(stack, keys.HOTKEYS_PREFIX + post) is None, timeout=30)
    wait_for(lambda: etcd_get(stack, hotkeys.HOTPOOL_PREFIX + post) is None, timeout=30)
    assert etcd_get(stack, keys.SPLIT_PREFIX + post) is None
    assert all(not r.exists(keys.count_key(post)) for r in pools(stack))

    # the two passes that changed the hot set are the operator's spans; the quiet ones are not
    def changed() -> list[tuple[str, str]] | None:
        ours = [
            (key, s["name"])
            for s in stack_spans(stack)
            if s["service"] == workloads.HOTKEY_OPERATOR.name
            for key in ("likes.hotkeys.promoted", "likes.hotkeys.demoted")
            if post in (span_attribute(s, key) or [])
        ]
        return sorted(ours) if len(ours) == 2 else None

    assert wait_for_value(changed, TRACE_DEADLINE_S, "the operator's spans of the post") == [
        ("likes.hotkeys.demoted", RECONCILE_SPAN),
        ("likes.hotkeys.promoted", RECONCILE_SPAN),
    ]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_killed_samplers_flags_expire(stack: Stack, loop: dict[str, Any]) -> None:
    # a second sampler we can kill without touching the stack's
    port, ops_port = free_port(), free_port()
    base = next(
        p
        for p in transforms.processes(stack.layout, stack.layout.stack, check=False)
        if p.workload.name == workloads.HOTKEY_SAMPLER.name
    )
    server = Server(
        name="sampler-victim",
        argv=[
            {str(base.port): str(port), str(base.ops_port): str(ops_port)}.get(a, a)
            for a in base.argv
        ],
        address=f"{sampler_url(stack).rpartition(':')[0]}:{port}",
        probe=lambda: _http_ok(f"http://{stack.host}:{ops_port}/readyz"),
        env=base.env,
    )
    proc = start(server, {"LIKES_SAMPLER_LEASE_TTL_S": "3"})
    post = f"doomed-{uuid.uuid4().hex[:8]}"
    try:
        spike(
            server.address,
            post,
            lambda: bool(etcd_get(stack, keys.HEAT_PREFIX + post)),
            verify=stack.service_verify,
        )
        assert etcd_get(stack, keys.HOTKEYS_PREFIX + post)
        proc.send_signal(signal.SIGKILL)  # no clean shutdown: the lease must lapse on its own
        proc.wait(10)
        wait_for(lambda: etcd_get(stack, keys.HOTKEYS_PREFIX + post) is None, timeout=20)
        assert etcd_get(stack, keys.HEAT_PREFIX + post) is None
    finally:
        if proc.poll() is None:
            proc.kill()


def _http_ok(url: str) -> None:
    try:
        if httpx.get(url, timeout=1).status_code == 200:
            return
    except httpx.HTTPError as e:
        raise ProbeFailed(str(e)) from e
    raise ProbeFailed(url)


def test_a_split_posts_likes_still_sum_exactly(stack: Stack, loop: dict[str, Any]) -> None:
    post = f"split-{uuid.uuid4().hex[:8]}"
    env = cli_env(stack)
    result = CliRunner().invoke(hotkeys_cli.app, ["split", post, "--yes", "--json"], env=env)
    assert result.exit_code == 0, result.output
    shown = CliRunner().invoke(hotkeys_cli.app, ["show", post, "--json"], env=env)
    assert json.loads(shown.output)["split"] == {"factor": 8, "by": "manual"}
    time.sleep(1.5)  # the write service polls the split flags every 0.5 s

    api = LikesClient(stack.gateway_url, stack.gateway_url, attempts=8, vary_client_ip=True)
    users = [f"u-{uuid.uuid4().hex[:8]}" for _ in range(40)]
    for u in users:
        tok = stack.token(u)
        assert api.like(post, idempotency_key=str(uuid.uuid4()), token=tok).status_code == 202

    wait_for(lambda: api.count(post)["count"] == len(users), timeout=60, every=0.5)
    cc = count_cache(stack)
    shards = wait_for(
        lambda: [s for s in range(8) if int(cc.get(keys.sub_key(post, s)) or 0) > 0] or None,
        timeout=30,
    )
    assert len(shards) > 1  # the writes really spread over sub-keys
    assert sum(int(cc.get(keys.sub_key(post, s)) or 0) for s in range(8)) == len(users)

    result = CliRunner().invoke(hotkeys_cli.app, ["unsplit", post, "--yes", "--json"], env=env)
    assert json.loads(result.output) == {"post_id": post, "removed": True}


# -- the read service's side ----------------------------------------------------------------------
def local_metric(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def sampler_samples(sampler: str) -> float:
    text = httpx.get(f"{sampler}/metrics", timeout=2).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "likes_sampler_samples_total":
                return sample.value
    return 0.0


@pytest.fixture
def read_app(stack: Stack, loop: dict[str, Any]) -> Iterator[TestClient]:
    """The read service in-process on the stack (its settings as the stack renders them)."""
    with TestClient(create_app(stack.settings())) as client:
        yield client


def seed_hot_post(stack: Stack, post: str, source: int, copy: int, ports: list[int]) -> None:
    """`source` in the count-cache, a different `copy` in the given hot pools, and the hot-pool
    flag pointing readers there (as the operator would, but with a copy that differs)."""
    count_cache(stack).hset(keys.count_key(post), mapping={"count": source, "gen": 1})
    for port in ports:
        r = redis.Redis(host=stack.host, port=port, password=stack.redis_password, socket_timeout=1)
        r.hset(keys.count_key(post), mapping={"count": copy, "gen": 1})
        r.expire(keys.count_key(post), 120)
    addresses = [f"{stack.host}:{p}" for p in ports]
    etcd_put(stack, hotkeys.HOTPOOL_PREFIX + post, hotkeys.encode_pools(addresses, 0))


def count_of(client: TestClient, post: str) -> tuple[int | None, str]:
    r = client.get(f"/v1/posts/{post}/likes")
    assert r.status_code == 200
    return r.json()["count"], r.headers["x-read-tier"]


def test_a_hot_post_is_answered_from_its_hot_pool_copy(stack: Stack, read_app: TestClient) -> None:
    post, cold = f"hotread-{uuid.uuid4().hex[:8]}", f"coldread-{uuid.uuid4().hex[:8]}"
    count_cache(stack).hset(keys.count_key(cold), mapping={"count": 7, "gen": 1})
    try:
        seed_hot_post(stack, post, source=41, copy=999, ports=hk_components.hot_pool_ports(
            stack.layout))  # fmt: skip
        hits = local_metric("likes_read_hot_pool_total", result="hit")
        # the service polls /likes/hotpool/ every 0.5 s: the copy's count once it has seen it
        wait_for(lambda: count_of(read_app, post) == (999, "aggregate"), timeout=10)
        assert local_metric("likes_read_hot_pool_total", result="hit") > hits
        assert count_of(read_app, cold) == (7, "aggregate")  # not hot: the count-cache
        batch = read_app.post("/v1/posts/likes:batch", json={"post_ids": [cold, post]}).json()
        assert [i["count"] for i in batch["items"]] == [7, 999]
    finally:
        etcd_put(stack, hotkeys.HOTPOOL_PREFIX + post, None)
        for r in pools(stack):
            r.delete(keys.count_key(post))
    # the flag is gone: back to the count-cache
    wait_for(lambda: count_of(read_app, post) == (41, "aggregate"), timeout=10)


@pytest.mark.disruptive
def test_a_down_hot_pool_falls_back_to_the_count_cache(stack: Stack, read_app: TestClient) -> None:
    post = f"hotdown-{uuid.uuid4().hex[:8]}"
    victim = hk_components.hot_pool_ports(stack.layout)[-1]
    name = f"hot-pool-{hk_components.HOT_POOLS}"
    try:
        seed_hot_post(stack, post, source=41, copy=999, ports=[victim])
        wait_for(lambda: count_of(read_app, post) == (999, "aggregate"), timeout=10)
        stack.cli("local", "stop", name)
        errors = local_metric("likes_read_hot_pool_total", result="error")
        r = read_app.get(f"/v1/posts/{post}/likes")
        body = r.json()
        assert (body["count"], body["stale"], r.headers["x-read-tier"]) == (41, False, "aggregate")
        assert local_metric("likes_read_hot_pool_total", result="error") == errors + 1
    finally:
        etcd_put(stack, hotkeys.HOTPOOL_PREFIX + post, None)
        stack.up()
        redis.Redis(host=stack.host, port=victim, password=stack.redis_password).delete(
            keys.count_key(post)
        )


def test_a_pool_miss_is_filled_from_the_count_cache_and_later_reads_hit(
    stack: Stack, read_app: TestClient
) -> None:
    """A post routed to the pools whose copies are gone (liked long ago: always-replicate's copies
    aged out; or a pool restarted) is read from the count-cache on each miss, and the pool that
    missed gets the count-cache's hash (gen and TTL included), so reads move onto the pools."""
    post = f"hotfill-{uuid.uuid4().hex[:8]}"
    key = keys.count_key(post)
    count_cache(stack).hset(key, mapping={"count": 41, "gen": 5, "last_fresh": 1})
    replicas = pools(stack)
    addresses = [f"{stack.host}:{p}" for p in hk_components.hot_pool_ports(stack.layout)]
    try:
        etcd_put(stack, hotkeys.HOTPOOL_PREFIX + post, hotkeys.encode_pools(addresses, 0))

        def filled() -> bool:
            assert count_of(read_app, post) == (41, "aggregate")  # a miss falls back, exact
            return all(r.exists(key) for r in replicas)

        wait_for(filled, timeout=15)
        for r in replicas:
            assert r.hgetall(key) == {"count": "41", "gen": "5", "last_fresh": "1"}
            assert 0 < r.ttl(key) <= hotkeys.ALWAYS_REPLICATE_TTL_S
        # from here every read is a pool hit, none a miss (a hold over many reads, not a first)
        hits = local_metric("likes_read_hot_pool_total", result="hit")
        misses = local_metric("likes_read_hot_pool_total", result="miss")
        for _ in range(40):
            assert count_of(read_app, post) == (41, "aggregate")
        assert local_metric("likes_read_hot_pool_total", result="hit") == hits + 40
        assert local_metric("likes_read_hot_pool_total", result="miss") == misses
        assert local_metric("likes_read_hot_pool_fills_total", result="written") >= len(replicas)
    finally:
        etcd_put(stack, hotkeys.HOTPOOL_PREFIX + post, None)
        count_cache(stack).delete(key)
        for r in replicas:
            r.delete(key)


def test_a_fill_never_rolls_back_a_newer_copy_and_copies_nothing_for_an_uncounted_post(
    stack: Stack,
) -> None:
    """The race a fill can lose: it read the count-cache (gen 5) before the aggregator or the
    operator wrote a newer copy (gen 9) into the pool; its copy is refused. A post with nothing
    counted has nothing to copy: the pool stays without it."""
    from services.read.hotkeys import HotPoolCountCache
    from services.read.stores import RedisCountCache

    post, uncounted = f"hotrace-{uuid.uuid4().hex[:8]}", f"hotnone-{uuid.uuid4().hex[:8]}"
    key = keys.count_key(post)
    count_cache(stack).hset(key, mapping={"count": 41, "gen": 5})
    (pool, *_) = pools(stack)
    pool.hset(key, mapping={"count": 50, "gen": 9})
    address = f"{stack.host}:{hk_components.hot_pool_ports(stack.layout)[0]}"
    settings = stack.settings()

    async def fills() -> None:
        source = RedisCountCache(settings)
        cache = HotPoolCountCache(
            source,
            hotkeys.PrefixView(stack.host, 1, hotkeys.HOTPOOL_PREFIX, hotkeys.decode_pools),
            password=settings.redis_auth,
            timeout_s=1.0,
            fill_from=source.aggregate_hash,
        )
        try:
            await cache._fill(post, address)
            await cache._fill(uncounted, address)
        finally:
            await cache.close()
            await source.close()

    stale = local_metric("likes_read_hot_pool_fills_total", result="stale")
    empty = local_metric("likes_read_hot_pool_fills_total", result="empty")
    try:
        asyncio.run(fills())
        assert pool.hgetall(key) == {"count": "50", "gen": "9"}
        assert not pool.exists(keys.count_key(uncounted))
        assert local_metric("likes_read_hot_pool_fills_total", result="stale") == stale + 1
        assert local_metric("likes_read_hot_pool_fills_total", result="empty") == empty + 1
    finally:
        count_cache(stack).delete(key)
        pool.delete(key)


# -- always-replicate: every liked post is in every pool before any flag -------------------------
def aggregator_metric(stack: Stack, name: str, **labels: str) -> float:
    text = httpx.get(f"http://{stack.host}:{stack.layout.ports.aggregator}/metrics", timeout=5).text
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def like_n(stack: Stack, post: str, n: int) -> None:
    api = LikesClient(stack.gateway_url, stack.gateway_url, attempts=8, vary_client_ip=True)
    for _ in range(n):
        tok = stack.token(f"u-{uuid.uuid4().hex[:8]}")
        assert api.like(post, idempotency_key=str(uuid.uuid4()), token=tok).status_code == 202


def nudging(stack: Stack, check: Callable[[], bool], hold_s: float = 3.0) -> Callable[[], bool]:
    """`check`, after a like of a post of its own: the aggregator's next window copies into
    the pools, and sends a pool back from a cool-down what it missed."""

    def nudged() -> bool:
        like_n(stack, f"always-other-{uuid.uuid4().hex[:8]}", 1)
        deadline = time.monotonic() + hold_s
        while time.monotonic() < deadline:
            if check():
                return True
            time.sleep(0.3)
        return False

    return nudged


def copies(stack: Stack, post: str) -> list[tuple[int, int] | None]:
    """(count, gen) of the post's copy in each hot pool, None where there is none."""
    out: list[tuple[int, int] | None] = []
    for r in pools(stack):
        raw = r.hgetall(keys.count_key(post))
        out.append((int(raw["count"]), int(raw["gen"])) if raw else None)
    return out


class _NoFlags:
    def current(self) -> dict[str, list[str]]:
        return {}


def test_every_liked_post_is_in_every_hot_pool_before_any_flag(stack: Stack) -> None:
    """The seed's flash-spike mitigation: the aggregator copies each aggregate it writes into the
    4 pools (for hotkeys.ALWAYS_REPLICATE_TTL_S); a read pod that sees a burst of reads answers
    from a pool at once, without the sampler's window or the operator's flag."""
    post = f"always-{uuid.uuid4().hex[:8]}"
    like_n(stack, post, 3)
    cc = count_cache(stack)

    def source() -> tuple[int, int] | None:
        raw = cc.hgetall(keys.count_key(post))
        return (int(raw["count"]), int(raw["gen"])) if raw and raw["count"] == "3" else None

    truth = wait_for(source, timeout=60, every=0.2)
    # every pool holds the count-cache's aggregate, same generation, and it ages out on its own.
    # A pool an earlier test stopped may still be cooling down in the aggregator: it gets the
    # copy it missed with the next copy, which other posts' likes bring (never this post's)
    wait_for(
        nudging(stack, lambda: copies(stack, post) == [truth] * hk_components.HOT_POOLS),
        timeout=30,
        every=0.1,
    )
    assert int(cc.hget(keys.count_key(post), "count")) == 3
    for r in pools(stack):
        assert 0 < r.ttl(keys.count_key(post)) <= hotkeys.ALWAYS_REPLICATE_TTL_S
    assert etcd_get(stack, hotkeys.HOTPOOL_PREFIX + post) is None  # nobody flagged it
    # it keeps matching as the post moves (a later like overwrites every copy, never rolls back)
    like_n(stack, post, 1)
    wait_for(lambda: {c and c[0] for c in copies(stack, post)} == {4}, timeout=60, every=0.2)
    assert {c and c[1] for c in copies(stack, post)} == {int(cc.hget(keys.count_key(post), "gen"))}

    # the read side: reads of the post cross the pod's threshold, the next second is a pool hit
    from services.read.hotkeys import HotPoolCountCache, LocalHeat
    from services.read.stores import RedisCountCache

    async def read() -> tuple[list[object], float]:
        settings = stack.settings()
        clock = [0.0]
        hot = HotPoolCountCache(
            RedisCountCache(settings, timeout_s=2.0),
            _NoFlags(),  # type: ignore[arg-type]
            password=stack.redis_password,
            pools=[f"{h}:{p}" for h, p in settings.hot_pool_addresses],
            local_heat=LocalHeat(threshold=5, clock=lambda: clock[0]),
        )
        try:
            for _ in range(5):
                await hot.aggregates([post])
            hits = local_metric("likes_read_hot_pool_total", result="hit")
            clock[0] = 1.0
            got = await hot.aggregates([post])
            return got, local_metric("likes_read_hot_pool_total", result="hit") - hits
        finally:
            await hot.close()

    got, pool_hits = asyncio.run(read())
    assert pool_hits == 1
    assert [getattr(a, "count", a) for a in got] == [4]


@pytest.mark.disruptive
def test_a_down_hot_pool_never_holds_the_aggregator(stack: Stack) -> None:
    """Always-replicate is best effort: with a pool down, counts still converge in the
    count-cache and the other pools; the dead pool is counted and skipped, and once it is back
    it catches up on the copies it missed, though the post gets no new like."""
    post = f"always-down-{uuid.uuid4().hex[:8]}"
    name = f"hot-pool-{hk_components.HOT_POOLS}"
    failed = aggregator_metric(stack, "likes_aggregator_hot_pool_copies_total", result="failed")
    stack.cli("local", "stop", name)
    try:
        like_n(stack, post, 2)
        cc = count_cache(stack)
        wait_for(lambda: cc.hget(keys.count_key(post), "count") == "2", timeout=60, every=0.2)
        live = pools(stack)[: hk_components.HOT_POOLS - 1]
        wait_for(
            lambda: all(r.hget(keys.count_key(post), "count") == "2" for r in live), timeout=10
        )
        assert (
            aggregator_metric(stack, "likes_aggregator_hot_pool_copies_total", result="failed")
            > failed
        )
        # counted while the pool is still down: other traffic (the canary's likes) can bring
        # the aggregator's next copy, and the re-drive, while `up` is still restarting it
        redriven = aggregator_metric(
            stack, "likes_aggregator_hot_pool_copies_total", result="redriven"
        )
    finally:
        stack.up()
    # back: the restarted pool gets the copy it missed with the aggregator's next copy after
    # the cool-down, which other posts' likes bring; this post is liked no more
    back = pools(stack)[-1]
    truth = cc.hgetall(keys.count_key(post))

    def caught_up() -> bool:
        got = back.hgetall(keys.count_key(post))
        if got:
            assert (got["count"], got["gen"]) == (truth["count"], truth["gen"])
        return bool(got)

    wait_for(nudging(stack, caught_up), timeout=60, every=0.1)
    assert cc.hgetall(keys.count_key(post)) == truth  # no new like: the copy was the missed one
    assert (
        aggregator_metric(stack, "likes_aggregator_hot_pool_copies_total", result="redriven")
        > redriven
    )


def test_the_gateway_mirrors_reads_to_the_sampler(stack: Stack, loop: dict[str, Any]) -> None:
    """Reads through the rendered Envoy reach the sampler as mirrored copies it serves (C8).
    The mirror fraction is raised to 100 % through Envoy's runtime admin (the same knob on-call
    has), so the counts are exact rather than 1 % samples."""
    post = f"mirrored-{uuid.uuid4().hex[:8]}"
    sampler, sampler_ops = loop["sampler"], loop["sampler_ops"]
    admin = f"http://{stack.host}:{stack.layout.ports.gateway_admin}"
    key = envoy_config.MIRROR_RUNTIME_KEY
    assert httpx.post(f"{admin}/runtime_modify", params={key: "100"}).status_code == 200
    try:
        received = sampler_samples(sampler_ops)
        with httpx.Client(base_url=stack.gateway_url, timeout=5) as api:
            for _ in range(30):
                assert api.get(routes.read_path(post)).status_code == 200
            r = api.post(routes.BATCH_READ_PATH, json={"post_ids": [post] * 10})
            assert r.status_code == 200
        # fire and forget: the copies arrive shortly after the answers
        wait_for(lambda: sampler_samples(sampler_ops) >= received + 40, timeout=10)
        top = httpx.get(
            f"{sampler}/v1/top", params={"k": 1000}, timeout=2, verify=loop["verify"]
        ).json()
        assert post in {t["post_id"] for t in top}
    finally:
        httpx.post(f"{admin}/runtime_modify", params={key: ""})


def test_heat_hints_survive_an_etcd_outage_for_the_grace_period_only(stack: Stack) -> None:
    hot = f"heat-{uuid.uuid4().hex[:8]}"
    clock = {"t": 0.0}
    heat = EtcdHeat(
        stack.host,
        stack.etcd_port,
        timeout_s=1,
        clock=lambda: clock["t"],
        credentials=stack.etcd_credentials,
        ca_file=stack.ca_file,
    )

    async def refresh() -> None:
        try:
            await heat.refresh()
        finally:
            await heat.close()  # a client per event loop (asyncio.run)

    etcd_put(stack, keys.HEAT_PREFIX + hot, b"hot")
    try:
        asyncio.run(refresh())
        assert heat.ttl(hot) == HOT_TTL_S
    finally:
        etcd_put(stack, keys.HEAT_PREFIX + hot, None)
    heat.port = free_port()  # etcd unreachable from here on
    clock["t"] += hotkeys.GRACE_S
    with pytest.raises(Exception):  # noqa: B017 - whatever aetcd raises for a dead server
        asyncio.run(refresh())
    assert heat.ttl(hot) == HOT_TTL_S  # the last good hints, for 5 minutes
    clock["t"] += 1
    assert heat.ttl(hot) == COLD_TTL_S  # then the defaults


# -- on-call's CLI --------------------------------------------------------------------------------
def cli_env(stack: Stack) -> dict[str, str]:
    """The settings on-call's shell has in a pod (the shared LIKES_* variables the program
    renders: etcd's address and login, the CA in the --tls profile, the edge-store the audit
    records go to), and who they are."""
    shared = Settings.env_names()
    env = {k: v for k, v in stack.workload_env(workloads.AGGREGATOR.name).items() if k in shared}
    return {**env, audit.OPERATOR_ENV: OPERATOR}


def test_cli_top_lists_the_hot_set_hottest_first_as_json(stack: Stack) -> None:
    tag = uuid.uuid4().hex[:8]
    # rates below any enter rate: the operator leaves them alone
    hi, lo, split_only = f"top-hi-{tag}", f"top-lo-{tag}", f"top-split-{tag}"
    etcd_put(stack, keys.HOTKEYS_PREFIX + hi, hotkeys.encode_hot(90.0, 0))
    etcd_put(stack, keys.HOTKEYS_PREFIX + lo, hotkeys.encode_hot(30.0, 0))
    etcd_put(stack, keys.HEAT_PREFIX + hi, b"hot")
    etcd_put(stack, keys.SPLIT_PREFIX + split_only, hotkeys.SplitFlag(4, "manual", 0).encode())
    try:
        result = CliRunner().invoke(
            hotkeys_cli.app, ["top", "--json", "--limit", "1000"], env=cli_env(stack)
        )
        assert result.exit_code == 0, result.output
        rows = json.loads(result.output)
        mine = [r for r in rows if r["post_id"].endswith(tag)]
        assert mine == [
            {"post_id": hi, "rate": 90.0, "heat": "hot", "split": None, "hot_pools": []},
            {"post_id": lo, "rate": 30.0, "heat": None, "split": None, "hot_pools": []},
            {"post_id": split_only, "rate": None, "heat": None,
             "split": {"factor": 4, "by": "manual"}, "hot_pools": []},
        ]  # fmt: skip
        rates = [r["rate"] or 0.0 for r in rows]
        assert rates == sorted(rates, reverse=True)
        limited = CliRunner().invoke(
            hotkeys_cli.app, ["top", "--json", "-n", "1"], env=cli_env(stack)
        )
        assert len(json.loads(limited.output)) == 1
        table = CliRunner().invoke(hotkeys_cli.app, ["top"], env=cli_env(stack))
        assert table.exit_code == 0 and "rate/s" in table.output
    finally:
        for key in (keys.HOTKEYS_PREFIX + hi, keys.HOTKEYS_PREFIX + lo, keys.HEAT_PREFIX + hi,
                    keys.SPLIT_PREFIX + split_only):  # fmt: skip
            etcd_put(stack, key, None)


def test_cli_mutations_change_etcd_only_when_confirmed(stack: Stack) -> None:
    post, env = f"confirm-{uuid.uuid4().hex[:8]}", cli_env(stack)
    key = keys.SPLIT_PREFIX + post
    try:
        declined = CliRunner().invoke(hotkeys_cli.app, ["split", post], input="n\n", env=env)
        assert declined.exit_code == 1 and "Aborted" in declined.output
        assert etcd_get(stack, key) is None

        accepted = CliRunner().invoke(
            hotkeys_cli.app, ["split", post, "--factor", "4"], input="y\n", env=env
        )
        assert accepted.exit_code == 0, accepted.output
        flag = hotkeys.decode_split(etcd_get(stack, key) or b"")
        assert flag is not None and (flag.factor, flag.by) == (4, "manual")

        kept = CliRunner().invoke(hotkeys_cli.app, ["unsplit", post], input="n\n", env=env)
        assert kept.exit_code == 1
        assert etcd_get(stack, key) is not None

        forced = CliRunner().invoke(hotkeys_cli.app, ["split", post, "--yes", "--json"], env=env)
        assert json.loads(forced.output) == {
            "post_id": post,
            "split": {"factor": 8, "by": "manual"},
        }
        shown = CliRunner().invoke(hotkeys_cli.app, ["show", post, "--json"], env=env)
        assert json.loads(shown.output)["split"] == {"factor": 8, "by": "manual"}

        removed = CliRunner().invoke(hotkeys_cli.app, ["unsplit", post, "-y", "--json"], env=env)
        assert json.loads(removed.output) == {"post_id": post, "removed": True}
        assert etcd_get(stack, key) is None
        again = CliRunner().invoke(hotkeys_cli.app, ["unsplit", post, "-y", "--json"], env=env)
        assert json.loads(again.output) == {"post_id": post, "removed": False}
    finally:
        etcd_put(stack, key, None)
    # each confirmed mutation left an audit record, newest first; the declined ones none
    trail = CliRunner().invoke(cli_app, ["audit", "--since", "10m", "--json"], env=env)
    assert trail.exit_code == 0, trail.output
    ours = [r for r in json.loads(trail.stdout) if r["args"].get("post_id") == post]
    assert [(r["command"], r["args"], r["result"], r["detail"], r["who"]) for r in ours] == [
        ("hotkeys unsplit", {"post_id": post}, "ok", False, OPERATOR),
        ("hotkeys unsplit", {"post_id": post}, "ok", True, OPERATOR),
        ("hotkeys split", {"post_id": post, "factor": 8}, "ok", None, OPERATOR),
        ("hotkeys split", {"post_id": post, "factor": 4}, "ok", None, OPERATOR),
    ]
