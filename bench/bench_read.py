"""Read service throughput and latency, each scenario against its own baseline (issue 10's table),
on warm counts.

    LIKES_HOME=... LIKES_PORT_OFFSET=... .venv/bin/python bench/bench_read.py \
        [--concurrency 32] [--duration 10] [--posts 1000] [--rounds 1]

Needs a running local stack (`likes local up`). Seeds `--posts` aggregates (and a sub-counter per
post and a counter-store cell per post for the baselines), then serves, each with uvicorn in its
own process on the same machine, the same stack:
  1. the baseline: a bare ASGI app answering a GET with one Redis GET, and a batch with one MGET
     of its 50 keys (slot-grouped, as a cluster must: redis-py's mget_nonatomic), on the same
     count-cache cluster,
  2. the read service (`services.read.main:create_app`),
  3. the degraded baseline: a bare ASGI app making one counter-store SUM query per GET (the same
     prepared statement, the same login), and
  4. a second read service whose count-cache is down (a dead address),
and drives each with the same load generator, also a separate process (a minimal keep-alive
HTTP/1.1 client, so the client is not the bottleneck), at a fixed concurrency, every request
carrying the traceparent the gateway would put on it (`gateway_traceparent`; `--traceparent
none` sends none, and the service then traces every request):
  a. anonymous GET /v1/posts/{id}/likes (the CDN-miss shape)       vs one Redis GET,
  b. authenticated GET (JWT, the user's Bloom filter says "no")      vs one Redis GET (no goal),
  c. POST /v1/posts/likes:batch with 50 ids (per request)           vs one MGET of 50 keys,
  d. degraded: anonymous GET, every count a counter-store SUM       vs one SUM query,
and prints requests/s, p50, p99, the ratios to the baselines and whether each goal is met. At the
end every seeded count is read back from both services (batches and single GETs): `exact`. Non-2xx
answers are counted, never retried (`5xx` must stay 0). The last line is JSON. No assertions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# issue 10's goals, each against its own baseline run in the same process tree; a degraded read
# must also never 5xx (no scenario may: `5xx` is counted for each)
GOALS: dict[str, dict[str, float]] = {
    "read: anonymous GET": {"ratio": 0.6, "p99_ratio": 2.0},
    "read: batch of 50 (per request)": {"ratio": 0.5},
    "read: degraded (count-cache down)": {"ratio": 0.5},
}


# -- the baseline server ------------------------------------------------------------------------


def baseline_app() -> Any:
    """A bare ASGI app: one Redis GET per request (one MGET of 50 keys per batch), a tiny JSON
    body; nothing else."""
    from redis.asyncio.cluster import ClusterNode, RedisCluster

    from services.common import heap
    from services.contracts import keys
    from services.contracts.settings import HotPoolSettings

    settings = HotPoolSettings()
    rc = RedisCluster(
        startup_nodes=[ClusterNode(h, p) for h, p in settings.count_cache_startup],
        password=settings.redis_auth,
        socket_timeout=0.25,
        socket_connect_timeout=0.25,
    )

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await rc.initialize()
                    heap.settle()  # as the read service does (services/common/heap.py)
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await rc.aclose()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["path"].endswith("likes:batch"):  # one MGET of the 50 keys (slot-grouped)
            raw = b""
            while True:
                msg = await receive()
                raw += msg.get("body", b"")
                if not msg.get("more_body"):
                    break
            ids = json.loads(raw)["post_ids"]
            values = await rc.mget_nonatomic([keys.sub_key(p, 0) for p in ids])
            body = json.dumps(
                {"items": [{"count": int(v) if v else None} for v in values]}
            ).encode()
        else:
            post_id = scope["path"].split("/")[3] if scope["path"].count("/") >= 3 else "x"
            value = await rc.get(keys.sub_key(post_id, 0))
            body = b'{"count":' + (value if isinstance(value, bytes) else b"null") + b"}"
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

    return app


def sum_baseline_app() -> Any:
    """A bare ASGI app: one counter-store SUM (all of the post's cells, one partition read) per
    request, as the read service's degraded tier makes it."""
    from cassandra.query import PreparedStatement

    from services.common import heap
    from services.contracts import clients
    from services.contracts.settings import HotPoolSettings

    settings = HotPoolSettings()
    state: dict[str, Any] = {}

    async def query(post_id: str) -> int:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[Any] = loop.create_future()
        rf = state["session"].execute_async(state["q"], [post_id])
        rf.add_callbacks(
            lambda rows: loop.call_soon_threadsafe(fut.set_result, rows),
            lambda exc: loop.call_soon_threadsafe(fut.set_exception, exc),
        )
        rows = await fut
        return sum(r.value for r in rows)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    cluster, session = clients.cassandra(settings)
                    q: PreparedStatement = session.prepare(
                        "SELECT value, reactions FROM counter_cells WHERE post_id = ?"
                    )
                    state.update(cluster=cluster, session=session, q=q)
                    heap.settle()  # as the read service does (services/common/heap.py)
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    state["cluster"].shutdown()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        post_id = scope["path"].split("/")[3] if scope["path"].count("/") >= 3 else "x"
        body = json.dumps({"post_id": post_id, "count": await query(post_id)}).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


# -- the load generator (its own process) ---------------------------------------------------------


async def _worker(
    host: str, port: int, requests: list[bytes], deadline: float, warm_until: float,
    sent: set[int] | None = None,
) -> tuple[list[float], dict[int, int]]:  # fmt: skip
    """Latencies after the warm-up, and every answer's status (counted, not raised: a 5xx is a
    finding, reported, and the run goes on)."""
    reader, writer = await asyncio.open_connection(host, port)
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    i = random.randrange(len(requests))
    try:
        while True:
            t0 = time.perf_counter()
            if t0 >= deadline:
                break
            writer.write(requests[i % len(requests)])
            if sent is not None:
                sent.add(i % len(requests))
            i += 1
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = 0
            for line in head.split(b"\r\n"):
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:])
                elif line.lower() == b"transfer-encoding: chunked":
                    raise RuntimeError(f"a chunked response (unsupported here): {head[:300]!r}")
            await reader.readexactly(length)
            statuses[status] = statuses.get(status, 0) + 1
            if t0 >= warm_until and 200 <= status < 300:
                latencies.append(time.perf_counter() - t0)
    finally:
        writer.close()
    return latencies, statuses


async def _load(
    host: str, port: int, requests: list[bytes], concurrency: int, duration: float, warmup: float,
    record: bool = False,
) -> dict[str, Any]:  # fmt: skip
    """Throughput and latencies of the 2xx answers after the warm-up, the count of other answers
    (`non_2xx`, `5xx`: warm-up included); with `record`, also the indices of every request sent."""
    start = time.perf_counter()
    warm_until = start + warmup
    deadline = warm_until + duration
    sent: set[int] | None = set() if record else None
    parts = await asyncio.gather(
        *(_worker(host, port, requests, deadline, warm_until, sent) for _ in range(concurrency))
    )
    lat = sorted(x for p, _ in parts for x in p)
    statuses: dict[int, int] = {}
    for _, st in parts:
        for code, n in st.items():
            statuses[code] = statuses.get(code, 0) + n
    out: dict[str, Any] = {"rps": 0.0, "p50_ms": float("nan"), "p99_ms": float("nan"), "n": 0}
    if lat:
        out = {
            "rps": len(lat) / duration,
            "p50_ms": statistics.median(lat) * 1000,
            "p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] * 1000,
            "n": len(lat),
        }
    out["non_2xx"] = sum(n for code, n in statuses.items() if not 200 <= code < 300)
    out["5xx"] = sum(n for code, n in statuses.items() if code >= 500)
    if sent is not None:
        out["sent"] = sorted(sent)
    return out


def loadgen_main(spec: dict[str, Any]) -> None:
    reqs = [bytes.fromhex(r) for r in spec["requests"]]
    out = asyncio.run(
        _load(
            spec["host"],
            spec["port"],
            reqs,
            spec["concurrency"],
            spec["duration"],
            spec["warmup"],
            spec.get("record", False),
        )
    )
    print(json.dumps(out))


def run_load(
    port: int, requests: list[bytes], concurrency: int, duration: float, warmup: float,
    record: bool = False,
) -> dict[str, Any]:  # fmt: skip
    spec = {
        "host": "127.0.0.1",
        "port": port,
        "requests": [r.hex() for r in requests],
        "concurrency": concurrency,
        "duration": duration,
        "warmup": warmup,
        "record": record,
    }
    proc = subprocess.run(
        [sys.executable, __file__, "--loadgen"],
        input=json.dumps(spec),
        capture_output=True,
        text=True,
        timeout=duration + warmup + 120,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"the load generator failed:\n{proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def gateway_traceparent() -> str:
    """The traceparent the gateway puts on a read it routes: Envoy's own head-sampling decision,
    sampled for otel_config.READ_TRACE_PERCENT of reads (infra/envoy_config.py), a new trace id
    each. Every read reaches a read pod through the gateway, so a benchmark that calls the
    service directly sends what the gateway would: without it the service starts and exports a
    trace for every request, a cost (~100 us of CPU a read, bench/cpu_read.py --traceparent
    none) no production read pays."""
    from infra import otel_config

    sampled = random.random() * 100 < otel_config.READ_TRACE_PERCENT
    parent = f"00-{random.getrandbits(128):032x}-{random.getrandbits(64):016x}-"
    return parent + ("01" if sampled else "00")


def _trace(headers: dict[str, str] | None, traced: bool) -> dict[str, str]:
    return {**(headers or {}), **({"traceparent": gateway_traceparent()} if traced else {})}


def get(path: str, headers: dict[str, str] | None = None, *, traced: bool = True) -> bytes:
    """One request's bytes, with the gateway's traceparent unless `traced` is False (the
    baselines ignore it: the same bytes reach both)."""
    extra = "".join(f"{k}: {v}\r\n" for k, v in _trace(headers, traced).items())
    return f"GET {path} HTTP/1.1\r\nHost: bench\r\n{extra}\r\n".encode()


def post_json(path: str, body: dict[str, Any], *, traced: bool = True) -> bytes:
    raw = json.dumps(body).encode()
    extra = "".join(f"{k}: {v}\r\n" for k, v in _trace(None, traced).items())
    head = (
        f"POST {path} HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\n"
        f"{extra}Content-Length: {len(raw)}\r\n\r\n"
    )
    return head.encode() + raw


def _tier_counts(port: int) -> dict[str, float]:
    import httpx

    out: dict[str, float] = {}
    for line in httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text.splitlines():
        if line.startswith(("likes_read_tier_total{", "likes_read_has_liked_total{")):
            name, value = line.rsplit(" ", 1)
            out[name.split('"')[1]] = float(value)
    return out


def _exact(port: int, post_ids: list[str]) -> bool:
    """After the load: the service answers every seeded count exactly (post i has count i), in
    batches of 50 and, for a sample, one GET at a time (the two shapes take different code)."""
    import httpx

    for i in range(0, len(post_ids), max(1, len(post_ids) // 100)):
        r = httpx.get(f"http://127.0.0.1:{port}/v1/posts/{post_ids[i]}/likes", timeout=10)
        if r.status_code != 200 or r.json()["count"] != i:
            return False
    for i in range(0, len(post_ids), 50):
        chunk = post_ids[i : i + 50]
        r = httpx.post(f"http://127.0.0.1:{port}/v1/posts/likes:batch",
                       json={"post_ids": chunk}, timeout=10)  # fmt: skip
        got = [item["count"] for item in r.json()["items"]]
        if r.status_code != 200 or got != list(range(i, i + len(chunk))):
            return False
    return True


# -- orchestration --------------------------------------------------------------------------------


def read_env(lay: Any) -> dict[str, str]:
    """The read service's env exactly as the stack runs it (its rendered spec, transformed)."""
    from local import transforms

    proc = next(
        p for p in transforms.processes(lay, lay.stack, check=False) if p.workload.name == "read"
    )
    return {**proc.env, "LIKES_LOG_LEVEL": "WARNING", "PYTHONPATH": str(REPO)}


def read_settings(lay: Any, env: dict[str, str] | None = None) -> Any:
    """The read service's settings on this stack (a HotPoolSettings)."""
    from services.contracts.settings import HotPoolSettings

    env = env if env is not None else read_env(lay)
    return HotPoolSettings.model_validate(
        {k.removeprefix("LIKES_").lower(): v for k, v in env.items() if k.startswith("LIKES_")}
    )


def serve(argv: list[str], env: dict[str, str], port: int) -> subprocess.Popen[bytes]:
    import httpx

    proc = subprocess.Popen(
        argv, env=env, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code < 500:
                return proc
        except httpx.HTTPError:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"{argv} exited {proc.returncode}")
        time.sleep(0.2)
    proc.terminate()
    raise RuntimeError(f"{argv} did not come up on {port}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--posts", type=int, default=1000)
    ap.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every scenario this many times, interleaved; a ratio is the median of each "
        "round's (the machine is shared: a baseline and its service run minutes apart otherwise)",
    )
    ap.add_argument(
        "--port",
        type=int,
        default=18480,
        help="baseline port; the service's is +1, the SUM baseline's +2, the degraded service's +3",
    )
    ap.add_argument(
        "--traceparent",
        choices=("gateway", "none"),
        default="gateway",
        help="gateway: each request carries the traceparent the gateway sends (sampled for "
        "READ_TRACE_PERCENT of reads); none: no traceparent, so the service traces every request",
    )
    ap.add_argument("--loadgen", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.loadgen:
        loadgen_main(json.loads(sys.stdin.read()))
        return

    import json as _json

    from redis.cluster import ClusterNode, RedisCluster

    from local import layout, transforms
    from services.contracts import bloom, keys

    lay = layout.for_benchmark()
    env = read_env(lay)
    settings = read_settings(lay, env)

    # warm counts: the aggregate the service reads, and a plain key the baseline GETs
    rc = RedisCluster(
        startup_nodes=[ClusterNode(h, p) for h, p in settings.count_cache_startup],
        password=settings.redis_auth,
        decode_responses=True,
    )
    run = uuid.uuid4().hex[:8]
    post_ids = [f"bench-{run}-{i}" for i in range(args.posts)]
    pipe = rc.pipeline()
    now_ms = int(time.time() * 1000)
    for i, p in enumerate(post_ids):
        pipe.hset(
            keys.count_key(p),
            mapping={
                "count": i,
                "gen": 1,
                "reactions": _json.dumps({"like": i, "love": i // 3}),
                "last_fresh": now_ms,
            },
        )
        pipe.set(keys.sub_key(p, 0), i)
    pipe.execute()
    # the same counts as counter-store cells: what the degraded tier (and its baseline) SUMs
    from services.contracts import clients

    cluster, session = clients.cassandra(settings, request_timeout=10.0)
    insert = session.prepare(
        "INSERT INTO counter_cells (post_id, region, shard, value, applied_window, reactions, "
        "updated_at) VALUES (?, 'bench', 0, ?, 0, ?, toTimestamp(now()))"
    )
    for i, p in enumerate(post_ids):
        session.execute(insert, [p, i, {"like": i}])
    user = f"bench-user-{run}"
    # a filter that says "no" to every bench post (writers only add to existing filters)
    rc.set(keys.bloom_key(user), bloom.build([f"not-a-bench-post-{run}"]), ex=3600)
    token = transforms.sign_token(lay, user)

    uvicorn = [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--no-access-log"]
    uvicorn += ["--log-level", "warning"]
    base_port, read_port, sum_port, degraded_port = (args.port + i for i in range(4))
    dead = socket.socket()  # a port bound and never listened on: the count-cache "down"
    dead.bind(("127.0.0.1", 0))
    degraded_env = {**env, "LIKES_COUNT_CACHE_NODES": f"127.0.0.1:{dead.getsockname()[1]}"}
    traced = args.traceparent == "gateway"
    batches = [
        post_json("/v1/posts/likes:batch", {"post_ids": random.sample(post_ids, 50)}, traced=traced)
        for _ in range(200)
    ]
    # one set of bytes for a service and its baseline (the baselines ignore the traceparent)
    gets = [get(f"/v1/posts/{p}/likes", traced=traced) for p in post_ids]
    bearer = {"Authorization": f"Bearer {token}"}
    # each service scenario right after its baseline
    scenarios: list[tuple[str, int, list[bytes]]] = [
        ("baseline: one Redis GET", base_port, gets),
        ("read: anonymous GET", read_port, gets),
        (
            "read: authenticated GET",
            read_port,
            [get(f"/v1/posts/{p}/likes", bearer, traced=traced) for p in post_ids],
        ),
        ("baseline: one MGET of 50", base_port, batches),
        ("read: batch of 50 (per request)", read_port, batches),
        ("baseline: one counter-store SUM", sum_port, gets),
        ("read: degraded (count-cache down)", degraded_port, gets),
    ]
    # each service scenario against its own baseline (issue 10's table)
    baseline_of = {
        "read: anonymous GET": "baseline: one Redis GET",
        "read: authenticated GET": "baseline: one Redis GET",
        "read: batch of 50 (per request)": "baseline: one MGET of 50",
        "read: degraded (count-cache down)": "baseline: one counter-store SUM",
    }
    procs = []
    try:
        procs.append(
            serve(
                [*uvicorn, "--port", str(base_port), "--factory", "bench.bench_read:baseline_app"],
                env,
                base_port,
            )
        )
        procs.append(
            serve(
                [
                    *uvicorn,
                    "--port",
                    str(read_port),
                    "--factory",
                    "services.read.main:create_app",
                ],
                env,
                read_port,
            )
        )
        procs.append(
            serve(
                [
                    *uvicorn,
                    "--port",
                    str(sum_port),
                    "--factory",
                    "bench.bench_read:sum_baseline_app",
                ],
                env,
                sum_port,
            )
        )
        procs.append(
            serve(
                [
                    *uvicorn,
                    "--port",
                    str(degraded_port),
                    "--factory",
                    "services.read.main:create_app",
                ],
                degraded_env,
                degraded_port,
            )
        )
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in scenarios}
        for n in range(args.rounds):
            for name, port, reqs in scenarios:
                r = run_load(port, reqs, args.concurrency, args.duration, args.warmup)
                runs[name].append(r)
                print(
                    f"[{n + 1}/{args.rounds}] {name:34s} {r['rps']:9.0f} req/s  "
                    f"p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  "
                    f"non-2xx {r['non_2xx']}  (load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
        # which tiers answered: a fall-through under load (a missed Redis deadline) shows here
        tiers = _tier_counts(read_port)
        degraded_tiers = _tier_counts(degraded_port)
        exact = _exact(read_port, post_ids) and _exact(degraded_port, post_ids)
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
        rc.delete(*[keys.bloom_key(user)])
        for i in range(0, len(post_ids), 200):
            for p in post_ids[i : i + 200]:
                rc.delete(keys.count_key(p), keys.sub_key(p, 0))
        rc.close()
        delete = session.prepare("DELETE FROM counter_cells WHERE post_id = ?")
        for p in post_ids:
            session.execute(delete, [p])
        cluster.shutdown()
        dead.close()

    print("\nread service answers by tier:", ", ".join(f"{t}={n:.0f}" for t, n in tiers.items()))
    print(
        "degraded service, by tier:", ", ".join(f"{t}={n:.0f}" for t, n in degraded_tiers.items())
    )
    print(f"\nconcurrency {args.concurrency}, {args.duration:.0f} s per scenario, "
          f"{args.rounds} round(s), warm counts")  # fmt: skip
    summary: dict[str, Any] = {}
    for name, base_name in baseline_of.items():
        mine, theirs = runs[name], runs[base_name]
        # paired by round: a service and its baseline ran back to back
        pairs = list(zip(mine, theirs, strict=True))
        ratios = [a["rps"] / b["rps"] if b["rps"] else 0.0 for a, b in pairs]
        p99s = [a["p99_ms"] / b["p99_ms"] for a, b in pairs]
        r, base = _median_run(mine), _median_run(theirs)
        ratio, p99 = statistics.median(ratios), statistics.median(p99s)
        goal = GOALS.get(name, {})
        met = (
            ratio >= goal.get("ratio", 0.0)
            and p99 <= goal.get("p99_ratio", float("inf"))
            and r["5xx"] == 0
        )
        summary[name] = {**r, "ratio": round(ratio, 3), "p99_ratio": round(p99, 3),
                         "ratio_runs": [round(x, 3) for x in ratios], "goal": goal,
                         "met": met}  # fmt: skip
        print(f"{name:34s} throughput {ratio:5.2f}x {base_name}, "
              f"p50 {r['p50_ms'] / base['p50_ms']:5.2f}x, p99 {p99:5.2f}x"
              f"{'' if not goal else ('  goal met' if met else '  goal NOT met')}")  # fmt: skip
    never_5xx = all(r["5xx"] == 0 for name in baseline_of for r in runs[name])
    print(f"exact: {exact}, never 5xx: {never_5xx}")
    baselines = {b: _median_run(runs[b]) for b in set(baseline_of.values())}
    print(json.dumps({"scenarios": summary, "baselines": baselines, "exact": exact,
                      "never_5xx": never_5xx, "load_avg": os.getloadavg()}))  # fmt: skip


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The round with the median throughput, with every round's throughput and their 5xx."""
    ranked = sorted(runs, key=lambda r: r["rps"])
    mid = dict(ranked[(len(ranked) - 1) // 2])
    mid["rps_runs"] = [round(r["rps"]) for r in runs]
    mid["non_2xx"] = sum(r["non_2xx"] for r in runs)
    mid["5xx"] = sum(r["5xx"] for r in runs)
    return mid


if __name__ == "__main__":
    main()
