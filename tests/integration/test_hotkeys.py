"""The hot-key loop on the real stack (etcd, Redis Cluster, hot pools, the sampler, the operator's
loop): a flash spike is flagged and replicated; replicas track the source; a split post's likes
sum exactly; the post is demoted after the spike; a killed sampler's flags expire.

The loop's processes are `local.components.hotkeys`; the fixture starts any that are not already
running (the stack's build list may not include them yet) and stops only those it started.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import aetcd
import httpx
import pytest
import redis
from typer.testing import CliRunner

from local.components import hotkeys as hk_components
from local.components.base import ProbeFailed, Server
from operators.hotkeys import cli as hotkeys_cli
from operators.hotkeys.local_loop import POLICY_KEY
from services.client import LikesClient
from services.contracts import auth, hotkeys, keys
from tests.conftest import Stack

pytestmark = pytest.mark.stack
T = TypeVar("T")

# short cool-down so that demotion is observable; rates are the sampler's (scaled) estimates
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
        client = aetcd.Client(host=stack.host, port=stack.etcd_port, timeout=2)
        try:
            got = await client.get(key.encode())
            return None if got is None else got.value
        finally:
            await client.close()

    return asyncio.run(get())


def etcd_put(stack: Stack, key: str, value: bytes | None) -> None:
    async def put() -> None:
        client = aetcd.Client(host=stack.host, port=stack.etcd_port, timeout=2)
        try:
            if value is None:
                await client.delete(key.encode())
            else:
                await client.put(key.encode(), value)
        finally:
            await client.close()

    asyncio.run(put())


def start(server: Server, extra_env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    env = {**os.environ, **server.env, **(extra_env or {})}
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


@pytest.fixture(scope="module")
def loop(stack: Stack) -> Iterator[dict[str, Any]]:
    """The hot-key loop's servers, with the test policy in etcd."""
    etcd_put(stack, POLICY_KEY, json.dumps(POLICY).encode())
    started: list[subprocess.Popen[bytes]] = []
    for comp in hk_components.build(stack.layout):
        for server in comp.servers():
            try:
                server.probe()
            except ProbeFailed:
                started.append(start(server))
    yield {"sampler": f"http://{stack.host}:{hk_components.sampler_port(stack.layout)}"}
    for proc in started:
        proc.terminate()
    for proc in started:
        proc.wait(10)
    etcd_put(stack, POLICY_KEY, None)


def pools(stack: Stack) -> list[redis.Redis]:
    return [
        redis.Redis(host=stack.host, port=p, decode_responses=True, socket_timeout=1)
        for p in hk_components.hot_pool_ports(stack.layout)
    ]


def count_cache(stack: Stack) -> redis.RedisCluster:
    return redis.RedisCluster(
        startup_nodes=[redis.cluster.ClusterNode(h, p) for h, p in stack.count_cache_nodes],
        decode_responses=True,
    )


def zipf_batch(n: int, posts: int = 5000) -> list[str]:
    """Background traffic: Zipf-ish over many cold posts (none near the enter rate)."""
    return [f"cold-{min(int(10 * random.paretovariate(1.0)), posts)}" for _ in range(n)]


def spike(sampler: str, post: str, until: Callable[[], bool], per_batch: int = 20) -> float:
    """Mirror a viral post (plus background) at ~fraction 1% until `until()`; seconds taken."""
    t0 = time.monotonic()
    with httpx.Client(timeout=2) as http:
        while not until():
            # the viral post as a 1% mirror (each sample weighs 100), the background unsampled
            http.post(
                f"{sampler}/v1/samples", json={"post_ids": [post] * per_batch, "fraction": 0.01}
            )
            http.post(
                f"{sampler}/v1/samples", json={"post_ids": zipf_batch(per_batch * 4), "fraction": 1}
            )
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
        loop["sampler"], post, lambda: bool(etcd_get(stack, keys.HOTKEYS_PREFIX + post))
    )
    # the CDN heat hint (5 s TTL) follows once the rate passes the sampler's heat rate
    spike(loop["sampler"], post, lambda: etcd_get(stack, keys.HEAT_PREFIX + post) == b"hot")
    spike(loop["sampler"], post, lambda: bool(etcd_get(stack, hotkeys.HOTPOOL_PREFIX + post)))
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
    flag = wait_for(lambda: etcd_get(stack, keys.SPLIT_PREFIX + post))
    assert hotkeys.decode_split(flag) == hotkeys.SplitFlag(
        8, "operator", hotkeys.decode_split(flag).since_ms
    )  # type: ignore[union-attr]

    # the spike ends: rates decay, the sampler drops the flag, the operator demotes after 3 s
    wait_for(lambda: etcd_get(stack, keys.HOTKEYS_PREFIX + post) is None, timeout=30)
    wait_for(lambda: etcd_get(stack, hotkeys.HOTPOOL_PREFIX + post) is None, timeout=30)
    assert etcd_get(stack, keys.SPLIT_PREFIX + post) is None
    assert all(not r.exists(keys.count_key(post)) for r in pools(stack))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_killed_samplers_flags_expire(stack: Stack, loop: dict[str, Any]) -> None:
    # a second sampler we can kill without touching the stack's
    port = free_port()
    base = hk_components.build(stack.layout)[1].servers()[0]
    server = Server(
        name="sampler-victim",
        argv=[a if a != str(hk_components.sampler_port(stack.layout)) else str(port)
              for a in base.argv],
        address=f"http://{stack.host}:{port}",
        probe=lambda: _http_ok(f"http://{stack.host}:{port}/readyz"),
        env=base.env,
    )  # fmt: skip
    proc = start(server, {"LIKES_SAMPLER_LEASE_TTL_S": "3"})
    post = f"doomed-{uuid.uuid4().hex[:8]}"
    try:
        spike(server.address, post, lambda: bool(etcd_get(stack, keys.HEAT_PREFIX + post)))
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
    env = {
        "LIKES_ETCD_HOST": stack.host,
        "LIKES_ETCD_PORT": str(stack.etcd_port),
    }
    result = CliRunner().invoke(hotkeys_cli.app, ["split", post, "--yes", "--json"], env=env)
    assert result.exit_code == 0, result.output
    shown = CliRunner().invoke(hotkeys_cli.app, ["show", post, "--json"], env=env)
    assert json.loads(shown.output)["split"] == {"factor": 8, "by": "manual"}
    time.sleep(1.5)  # the write service polls the split flags every 0.5 s

    api = LikesClient(stack.service_url("write"), stack.service_url("read"), attempts=8)
    settings = stack.settings()
    users = [f"u-{uuid.uuid4().hex[:8]}" for _ in range(40)]
    for u in users:
        tok = auth.issue_token(settings, u)
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
