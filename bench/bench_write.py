"""Write service throughput and p99 against a bare client doing the same store work.

    LIKES_HOME=... LIKES_PORT_OFFSET=... .venv/bin/python bench/bench_write.py \
        [--concurrency 16] [--duration 10]

Needs a running local stack (`likes local up`). Runs, on the same stack, one after the other:
  1. the baseline (issue 10's table): a bare asyncio client, in this process, doing per like
     exactly the store work the write path must do: idem GET, the relay marker, the conditional
     intent + edge + outbox BATCH (the write service's own prepared statements), the publish with
     acks=all awaited, idem SET. No HTTP, no JWT, no validation;
  2. the write service (`services.write.main:create_app` under uvicorn, the stack's rendered env),
     driven over HTTP with RS256 tokens from the stack's issuer by bench_read's load generator (a
     separate process). No gateway.
  3. like → visible: an open loop at half the rate the write service just reached, each like
     on a post of its own, the time from sending the like to the stack's read service answering
     count 1 (polled every 25 ms through the batch route): p50/p99 per stage, `accept` (sent →
     202), `visible` (202 → count 1) and `total` (issue 10's goal: total p99 ≤ 1.5 s), and the
     rate actually sent against the rate offered (a loop that falls behind offers less load
     than it claims, and its late sends are not in the latencies).
Every token is signed before any clock starts (one key load: issuer.Signer; RS256 signing inside
the loop cost ~0.65 s a token under load and was measured as latency). Every like is distinct
(its own user; 500 posts). At the end every like the service accepted must be a liked edge, and
every bench post's count must converge to its distinct likers (the one definition in
services/contracts/convergence.py). Prints likes/s, p50, p99, and one JSON line:
{"baseline": {...}, "write": {...}, "ratio": write/baseline likes/s, "visible": {...},
"exact": true|false}.
No assertions: a benchmark reports.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_read import post_json, run_load, serve  # noqa: E402
from local import layout  # noqa: E402
from local import tls as local_tls  # noqa: E402
from services.contracts import tls  # noqa: E402


async def baseline(settings: Any, users: list[str], posts: list[str], concurrency: int,
                   duration: float, warmup: float) -> dict[str, float]:  # fmt: skip
    """The write path's store work per like, with no service around it."""
    import itertools
    import statistics
    import time
    from datetime import UTC, datetime

    from cassandra.query import BatchStatement, BatchType, ConsistencyLevel
    from confluent_kafka.serialization import MessageField, SerializationContext
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    from services.common import heap
    from services.contracts import clients, events, keys
    from services.read.stores import _aio
    from services.write.core import Publisher, Statements, outbox_shard

    cluster, session = clients.cassandra(settings)
    q = Statements(session)
    idem = RedisCluster(
        startup_nodes=[ClusterNode(h, p) for h, p in settings.idem_store_startup],
        password=settings.redis_auth,
    )
    publisher = Publisher(clients.producer(settings))
    heap.settle()  # as the write service does once started (services/common/heap.py)
    serialize = clients.like_serializer(clients.schema_registry(settings))
    loop = asyncio.get_running_loop()

    stages: dict[str, list[float]] = {s: [] for s in STAGES}

    async def one(user: str, post: str, record: bool) -> None:
        t = [time.perf_counter()]
        intent = uuid.uuid4()
        key = keys.idem_key(user, post, str(intent))
        if await idem.get(key) is not None:
            return
        t.append(time.perf_counter())
        event = events.LikeEvent.new(
            intent_uuid=str(intent), user_id=user, post_id=post, action="like",
            reaction="like", delta=1, region=settings.region, shard=0,
        )  # fmt: skip
        payload = serialize(event, SerializationContext(events.COMMITTED, MessageField.VALUE))
        assert payload is not None
        now = datetime.now(UTC)
        bucket, oshard, event_id = int(now.timestamp() // 60), outbox_shard(user), event.event_id
        marker = (bucket, oshard, now, uuid.UUID(event_id), user)
        await _aio(session.execute_async(q.marker, marker))
        t.append(time.perf_counter())
        batch = BatchStatement(batch_type=BatchType.UNLOGGED,
                               serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL)  # fmt: skip
        batch.consistency_level = ConsistencyLevel.LOCAL_QUORUM
        batch.add(q.intent, (user, str(intent), "liked", intent, now, post, events.COMMITTED))
        batch.add(q.to_liked, ("like", now, intent, user, post))
        batch.add(q.outbox, (user, event_id, post, events.COMMITTED, post, payload, now, intent))
        await _aio(session.execute_async(batch))
        t.append(time.perf_counter())
        await asyncio.wrap_future(publisher.publish(events.COMMITTED, post, payload), loop=loop)
        t.append(time.perf_counter())
        await idem.set(key, '{"state":"liked"}', ex=600)
        t.append(time.perf_counter())
        if record:
            for stage, (a, b) in zip(STAGES, itertools.pairwise(t), strict=True):
                stages[stage].append(b - a)

    await idem.initialize()  # the slot map once, before 16 workers race to connect
    start = time.perf_counter()
    warm_until, deadline = start + warmup, start + warmup + duration
    lat: list[float] = []
    it = iter(zip(users, posts, strict=True))

    async def worker() -> None:
        for user, post in it:
            t0 = time.perf_counter()
            if t0 >= deadline:
                return
            await one(user, post, t0 >= warm_until)
            if t0 >= warm_until:
                lat.append(time.perf_counter() - t0)

    try:
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        exhausted = next(it, None) is None
    finally:
        publisher.close()
        await idem.aclose()
        cluster.shutdown()
    lat.sort()
    per_stage = {
        stage: {"p50_ms": _p(sorted(v), 0.5), "p99_ms": _p(sorted(v), 0.99)}
        for stage, v in stages.items()
        if v
    }
    return {
        "rps": len(lat) / duration,
        "p50_ms": statistics.median(lat) * 1000 if lat else float("nan"),
        "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000 if lat else float("nan"),
        "n": len(lat),
        "stages": per_stage,
        # the pairs ran out before the clock: the rate above is then a floor, not a measure
        "exhausted": exhausted,
    }


POSTS = 500
# the baseline's store work per like, in order (its per-stage p50/p99 say where the time goes)
STAGES = ("idem_get", "marker", "batch", "publish", "idem_set")


def signer() -> Any:
    """The stack's token signer, its key loaded once (callable: user -> token)."""
    from local import issuer, layout, transforms

    lay = layout.from_env()
    iss, aud = transforms.token_claims(lay)
    return issuer.Signer(lay.home, iss, aud)


def like_requests(n: int, run: str, sign: Any) -> tuple[list[bytes], list[tuple[str, str]]]:
    """n distinct likes as raw HTTP requests, and their (user, post)."""
    out, pairs = [], []
    for i in range(n):
        user, post = f"bench-{run}-u{i}", f"bench-{run}-p{i % POSTS}"
        tok = sign(user)
        req = post_json("/v1/likes", {"post_id": post, "action": "like"})
        head, _, body = req.partition(b"\r\n\r\n")
        extra = f"\r\nAuthorization: Bearer {tok}\r\nIdempotency-Key: {uuid.uuid4()}"
        out.append(head + extra.encode() + b"\r\n\r\n" + body)
        pairs.append((user, post))
    return out, pairs


def settings_from(env: dict[str, str]) -> Any:
    """The write service's Settings, built from exactly its env."""
    from services.contracts.settings import Settings

    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(env)
        return Settings()
    finally:
        os.environ.clear()
        os.environ.update(saved)


def stack_read(lay: layout.Layout) -> tuple[str, ssl.SSLContext | bool]:
    """The stack's read service as a caller inside the platform reaches it: in the --tls
    profile https, with the gateway's client certificate (the services require one)."""
    if not lay.tls:
        return f"http://{layout.HOST}:{lay.ports.read}", True
    ctx = tls.mtls_client_context(str(local_tls.workload_dir(lay, tls.GATEWAY)))
    return f"https://{layout.HOST}:{lay.ports.read}", ctx


def exact(
    settings: Any, liked: list[tuple[str, str]], read: tuple[str, ssl.SSLContext | bool]
) -> tuple[bool, str]:
    """Every accepted like is a liked edge, and every post's count converges to its likers."""
    from collections import Counter

    from services.client import LikesClient
    from services.contracts import clients, convergence

    cluster, session = clients.cassandra(settings, request_timeout=10.0)
    try:
        q = session.prepare(
            "SELECT state FROM edges WHERE user_id = ? AND kind = 'edge' AND ref = ?"
        )
        missing = [
            p for p in liked if (r := session.execute(q, p).one()) is None or r.state != "liked"
        ]
    finally:
        cluster.shutdown()
    if missing:
        return False, f"{len(missing)} accepted likes have no liked edge, e.g. {missing[:3]}"
    truth = Counter(post for _u, post in liked)
    api = LikesClient(write_url="", read_url=read[0], verify=read[1])
    result = convergence.wait_converged(
        lambda: {p: api.count(p)["count"] for p in truth}, dict(truth), timeout_s=120
    )
    return result.converged, str(result)


def _p(values: list[float], q: float) -> float:
    """The q-quantile (nearest rank) of sorted seconds, in ms."""
    return round(values[min(len(values) - 1, int(len(values) * q))] * 1000, 1)


async def like_to_visible(
    write_url: str,
    read: tuple[str, ssl.SSLContext | bool],
    tokens: list[str],
    rate: float,
    duration: float,
    run: str,
) -> dict[str, Any]:
    """Open loop at `rate` likes/s for `duration` s, each on its own post, with tokens signed
    beforehand (`tokens`: at least rate x duration). Per like, seconds from sending it to its 202
    (`accept`), from the 202 to the read path answering count >= 1 (`visible`), and in all
    (`total`); a like not visible within 30 s counts as 30 s (and in `late`). Reports the rate
    offered and the rate actually sent."""
    import time

    import httpx

    sent: dict[str, float] = {}
    acked: dict[str, float] = {}
    seen: dict[str, float] = {}
    refused = 0

    async def like(client: httpx.AsyncClient, i: int) -> None:
        nonlocal refused
        post = f"bench-{run}-v{i}"
        headers = {"Authorization": f"Bearer {tokens[i]}", "Idempotency-Key": str(uuid.uuid4())}
        sent[post] = time.perf_counter()
        r = await client.post(
            f"{write_url}/v1/likes", json={"post_id": post, "action": "like"}, headers=headers
        )
        if r.status_code != 202:
            refused += 1
            sent.pop(post, None)
        else:
            acked[post] = time.perf_counter()

    async def look(client: httpx.AsyncClient, chunk: list[str]) -> None:
        r = await client.post(f"{read[0]}/v1/posts/likes:batch", json={"post_ids": chunk})
        now = time.perf_counter()
        for post, item in zip(chunk, r.json()["items"], strict=True):
            if (item.get("count") or 0) >= 1:
                seen.setdefault(post, now)

    async def poll(client: httpx.AsyncClient, done: asyncio.Event) -> None:
        while not (done.is_set() and len(seen) >= len(sent)):
            pending = [p for p in sent if p not in seen]
            # a turn's pages at once: one after the other, a turn took one page's latency per
            # 50 pending likes, and that wait was measured as the like's "visible" time
            chunks = [pending[i : i + 50] for i in range(0, len(pending), 50)]
            await asyncio.gather(*(look(client, chunk) for chunk in chunks))
            now = time.perf_counter()
            if done.is_set() and pending and now - max(sent[p] for p in pending) > 30:
                break
            await asyncio.sleep(0.025)

    limits = httpx.Limits(max_connections=64)
    async with (
        httpx.AsyncClient(timeout=10, limits=limits) as w,
        httpx.AsyncClient(timeout=10, verify=read[1]) as r,
    ):
        done = asyncio.Event()
        poller = asyncio.create_task(poll(r, done))
        tasks = []
        start = time.perf_counter()
        i = 0
        while time.perf_counter() - start < duration and i < len(tokens):
            tasks.append(asyncio.create_task(like(w, i)))
            i += 1
            await asyncio.sleep(max(0.0, start + i / rate - time.perf_counter()))
        sending_s = time.perf_counter() - start
        await asyncio.gather(*tasks)
        done.set()
        await poller
    total = sorted(seen.get(p, sent[p] + 30) - sent[p] for p in sent)
    accept = sorted(acked[p] - sent[p] for p in acked)
    visible = sorted(seen[p] - acked[p] for p in acked if p in seen)
    late = sum(1 for p in sent if p not in seen)
    out: dict[str, Any] = {
        "rate_offered": round(rate, 1),
        "rate_sent": round(i / sending_s, 1),
        "n": len(total),
        "late": late,
        "refused": refused,
    }
    for stage, lat in (("accept", accept), ("visible", visible), ("total", total)):
        if lat:
            out[stage] = {"p50_ms": _p(lat, 0.5), "p99_ms": _p(lat, 0.99)}
    if total:  # the headline figures: sent → visible
        out["p50_ms"], out["p99_ms"] = out["total"]["p50_ms"], out["total"]["p99_ms"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--requests", type=int, default=20000, help="distinct likes prepared")
    ap.add_argument("--port", type=int, default=18581, help="the write service's port")
    ap.add_argument(
        "--visible-duration", type=float, default=10.0, help="seconds of the like → visible run"
    )
    args = ap.parse_args()

    from local import transforms

    lay = layout.for_benchmark()
    procs_by_name = {p.workload.name: p for p in transforms.processes(lay, lay.stack, check=False)}
    # the write service's env exactly as the stack runs it (its rendered spec, transformed)
    env = {**procs_by_name["write"].env, "LIKES_LOG_LEVEL": "WARNING"}
    settings = settings_from(env)
    run = uuid.uuid4().hex[:8]

    print("baseline: bare asyncio client, same store work per like ...", flush=True)
    users = [f"bench-{run}-b{i}" for i in range(args.requests)]
    posts = [f"bench-{run}-bp{i % POSTS}" for i in range(args.requests)]
    base = asyncio.run(
        baseline(settings, users, posts, args.concurrency, args.duration, args.warmup)
    )
    print(f"{'baseline: store work':28s} {base['rps']:8.0f} likes/s  p50 {base['p50_ms']:7.2f} ms"
          f"  p99 {base['p99_ms']:7.2f} ms", flush=True)  # fmt: skip
    for stage, f in base["stages"].items():
        print(f"  {stage:10s} p50 {f['p50_ms']:7.1f} ms  p99 {f['p99_ms']:7.1f} ms", flush=True)

    sign = signer()  # every token below is signed here, before any clock starts
    reqs, pairs = like_requests(args.requests, run, sign)
    uvicorn = [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--no-access-log"]
    uvicorn += ["--log-level", "warning", "--factory", "--port", str(args.port)]
    proc = serve([*uvicorn, "services.write.main:create_app"], env, args.port)
    try:
        w = run_load(args.port, reqs, args.concurrency, args.duration, args.warmup, record=True)
        rate = max(1.0, w["rps"] / 2)
        print(f"like → visible at half that rate ({rate:.1f}/s) ...", flush=True)
        n = int(rate * args.visible_duration) + 1
        tokens = [sign(f"bench-{run}-vu{i}") for i in range(n)]
        visible = asyncio.run(
            like_to_visible(
                f"http://127.0.0.1:{args.port}",
                stack_read(lay),
                tokens,
                rate,
                args.visible_duration,
                run,
            )
        )
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
    sent = w.pop("sent")
    print(f"{'write: POST /v1/likes':28s} {w['rps']:8.0f} likes/s  p50 {w['p50_ms']:7.2f} ms"
          f"  p99 {w['p99_ms']:7.2f} ms", flush=True)  # fmt: skip
    ok, why = exact(settings, [pairs[i] for i in sent], stack_read(lay))
    print(f"{'like → visible count':28s} {visible['rate_sent']:8.1f} likes/s sent "
          f"(offered {visible['rate_offered']:.1f}), n={visible['n']}, not visible in 30 s: "
          f"{visible['late']}, refused: {visible['refused']}", flush=True)  # fmt: skip
    nan = {"p50_ms": float("nan"), "p99_ms": float("nan")}
    for stage, what in (("accept", "sent → 202"), ("visible", "202 → count 1"),
                        ("total", "sent → count 1")):  # fmt: skip
        f = visible.get(stage, nan)
        print(f"  {stage:8s} {what:18s} p50 {f['p50_ms']:7.1f} ms  p99 {f['p99_ms']:7.1f} ms",
              flush=True)  # fmt: skip
    print(f"exact: {ok} ({len(sent)} likes sent; {why})")
    ratio = w["rps"] / base["rps"] if base["rps"] else float("nan")
    p99 = w["p99_ms"] / base["p99_ms"]
    print(f"\nconcurrency {args.concurrency}, {args.duration:.0f} s each, distinct likes: "
          f"{ratio:.2f}x the baseline's likes/s, p99 {p99:.2f}x")  # fmt: skip
    print(json.dumps({"baseline": base, "write": w, "ratio": round(ratio, 3), "visible": visible,
                      "exact": ok}))  # fmt: skip


if __name__ == "__main__":
    main()
