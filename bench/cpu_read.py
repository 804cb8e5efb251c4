"""The read service's CPU cost per request, in-process: the ASGI app called directly (no HTTP
server, no client), one request at a time, against the stack's real count-cache.

    LIKES_HOME=... LIKES_PORT_OFFSET=... .venv/bin/python bench/cpu_read.py \
        [--requests 2000] [--rounds 3] [--profile anonymous|authenticated|batch|...] [--no-traces]
        [--traceparent gateway|none]

`time.process_time` per request (every thread of this process: the Redis client's work and the
Cassandra driver's idle loop included), for an anonymous GET, an authenticated GET whose Bloom
filter says "no", and a batch of 50, all on warm aggregates; and for bench_read.py's baseline
app (one Redis GET; one MGET of the 50 keys) called the same way, so `cpu_ratio` (baseline CPU /
service CPU) is the issue's throughput ratio as a CPU-bound server would see it, much less
sensitive to a shared machine's load than bench_read.py's. Each request carries the traceparent
the gateway sends (`--traceparent gateway`, the default: sampled for READ_TRACE_PERCENT of reads,
the gateway's head sampling) or none (`none`: the service starts, and exports, a trace for every
request, as it would called directly). With `--profile` the named scenario
also runs under cProfile and the functions that cost most are printed. Each answer is checked
(status 200, the seeded count); the last line is JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import os
import pstats
import random
import statistics
import sys
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def scope(method: str, path: str, headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.4"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"bench"), *headers],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8080),
        "state": {},
    }


async def call(app: Any, sc: dict[str, Any], body: bytes = b"") -> tuple[int, bytes]:
    """One request through the ASGI app; (status, body)."""
    sent = False
    status = 0
    chunks: list[bytes] = []

    async def receive() -> dict[str, Any]:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.sleep(3600)  # a client that stays connected
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(sc, receive, send)
    return status, b"".join(chunks)


# Where the time goes, by layer: the first group whose marker is in a function's file (or name)
# takes its own time (tottime). Ordered: most specific first.
GROUPS = [
    ("read service (services/read)", ("/services/read/",)),
    ("RED metrics / body limit (services/common)", ("/services/common/",)),
    ("FastAPI dependency solving", ("fastapi/dependencies",)),
    ("FastAPI/Starlette routing, middleware, responses", ("fastapi/", "starlette/")),
    ("pydantic", ("pydantic",)),
    ("RESP parsing (redis/_parsers)", ("redis/_parsers",)),
    ("redis client (cluster, connection)", ("redis/",)),
    ("asyncio.wait_for / timeouts", ("tasks.py:436(wait_for)", "timeouts.py")),
    ("asyncio event loop, tasks, streams", ("asyncio/", "select.epoll", "selectors.py")),
    ("socket send/recv", ("_socket.socket",)),
    ("prometheus_client", ("prometheus_client",)),
    ("JWT / crypto", ("jwt/", "cryptography")),
    ("json", ("json/", "json.")),
]


def breakdown(stats: pstats.Stats) -> str:
    """Own time per layer, as a share of the profiled total."""
    totals: dict[str, float] = {}
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (file, line, fn), (_cc, _nc, tt, _ct, _callers) in raw.items():
        where = f"{file}:{line}({fn})"
        group = next((g for g, marks in GROUPS if any(m in where for m in marks)), "other")
        totals[group] = totals.get(group, 0.0) + tt
    whole = sum(totals.values()) or 1.0
    ranked = sorted(totals.items(), key=lambda x: -x[1])
    lines = [f"  {share / whole:6.1%}  {g}" for g, share in ranked]
    return "own time by layer:\n" + "\n".join(lines)


@contextlib.asynccontextmanager
async def lifespan(app: Any) -> AsyncIterator[None]:
    """An ASGI app's lifespan, driven as a server drives it."""
    inbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    outbox: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
    task = asyncio.create_task(app({"type": "lifespan"}, inbox.get, outbox.put))
    await inbox.put({"type": "lifespan.startup"})
    assert (await outbox.get())["type"] == "lifespan.startup.complete"
    try:
        yield
    finally:
        await inbox.put({"type": "lifespan.shutdown"})
        await outbox.get()
        await task


async def run(args: argparse.Namespace) -> dict[str, Any]:
    from redis.cluster import ClusterNode, RedisCluster

    from bench import bench_read
    from local import layout, transforms
    from services.contracts import bloom, keys, workloads
    from services.contracts.settings import Settings
    from services.read.heat import StaticHeat
    from services.read.main import create_app

    lay = layout.for_benchmark()
    env = bench_read.read_env(lay)
    if args.no_traces:
        env.pop(Settings.env_name(workloads.TRACES), None)
    settings = bench_read.read_settings(lay, env)
    os.environ.update({k: v for k, v in env.items() if k.startswith("LIKES_")})  # the baseline's
    rc = RedisCluster(
        startup_nodes=[ClusterNode(h, p) for h, p in settings.count_cache_startup],
        password=settings.redis_auth,
        decode_responses=True,
    )
    run_id = uuid.uuid4().hex[:8]
    post_ids = [f"cpu-{run_id}-{i}" for i in range(args.posts)]
    expected = {p: i for i, p in enumerate(post_ids)}
    pipe = rc.pipeline()
    now_ms = int(time.time() * 1000)
    for i, p in enumerate(post_ids):
        reactions = json.dumps({"like": i, "love": i // 3})
        mapping = {"count": i, "gen": 1, "reactions": reactions, "last_fresh": now_ms}
        pipe.hset(keys.count_key(p), mapping=mapping)
        pipe.expire(keys.count_key(p), 3600)
        pipe.set(keys.sub_key(p, 0), i, ex=3600)  # what the baseline GETs
    pipe.execute()
    user = f"cpu-user-{run_id}"
    rc.set(keys.bloom_key(user), bloom.build([f"not-a-cpu-post-{run_id}"]), ex=3600)
    auth = [(b"authorization", f"Bearer {transforms.sign_token(lay, user)}".encode())]

    app = create_app(settings, heat=StaticHeat())
    base = bench_read.baseline_app()
    results: dict[str, Any] = {}
    async with app.router.lifespan_context(app), lifespan(base):
        store = app.state.store
        deadline = time.monotonic() + 60
        while store.session is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)

        def traced(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
            """The headers plus the gateway's traceparent (the baseline ignores it)."""
            if args.traceparent == "none":
                return headers
            return [*headers, (b"traceparent", bench_read.gateway_traceparent().encode())]

        def get(target: Any, headers: list[tuple[bytes, bytes]]) -> Any:
            async def one() -> bool:
                p = random.choice(post_ids)
                sc = scope("GET", f"/v1/posts/{p}/likes", traced(headers))
                status, body = await call(target, sc)
                return status == 200 and json.loads(body)["count"] == expected[p]

            return one

        def batch(target: Any) -> Any:
            async def one() -> bool:
                ids = random.sample(post_ids, 50)
                raw = json.dumps({"post_ids": ids}).encode()
                length = b"%d" % len(raw)
                headers = [(b"content-type", b"application/json"), (b"content-length", length)]
                sc = scope("POST", "/v1/posts/likes:batch", traced(headers))
                status, body = await call(target, sc, raw)
                counts = [it["count"] for it in json.loads(body)["items"]] if status == 200 else []
                return counts == [expected[p] for p in ids]

            return one

        scenarios = {
            "baseline GET": get(base, []),
            "anonymous": get(app, []),
            "authenticated": get(app, auth),
            "baseline MGET of 50": batch(base),
            "batch": batch(app),
        }
        batches = ("batch", "baseline MGET of 50")
        for name, one in scenarios.items():  # warm-up: connections, caches
            for _ in range(min(200, args.requests)):
                assert await one(), f"{name}: a wrong answer during the warm-up"
        per_round: dict[str, list[tuple[float, float]]] = {name: [] for name in scenarios}
        exact = {name: True for name in scenarios}
        for r in range(args.rounds):  # interleaved: a load spike hits every scenario alike
            for name, one in scenarios.items():
                n = max(1, args.requests // 5) if name in batches else args.requests
                profiler = cProfile.Profile() if args.profile == name and r == 0 else None
                t0, w0 = time.process_time(), time.perf_counter()
                if profiler:
                    profiler.enable()
                for _ in range(n):
                    exact[name] &= await one()
                if profiler:
                    profiler.disable()
                cpu, wall = time.process_time() - t0, time.perf_counter() - w0
                per_round[name].append((cpu / n * 1e6, wall / n * 1e6))
                print(f"[{r + 1}/{args.rounds}] {name:20s} {cpu / n * 1e6:8.1f} µs CPU/request  "
                      f"{wall / n * 1e6:8.1f} µs wall  (n={n}, load {os.getloadavg()[0]:.1f})",
                      flush=True)  # fmt: skip
                if profiler:
                    out = io.StringIO()
                    stats = pstats.Stats(profiler, stream=out)
                    stats.sort_stats("tottime").print_stats(args.top)
                    stats.sort_stats("cumulative").print_stats(args.top)
                    print(out.getvalue())
                    print(breakdown(stats))
                    if args.profile_out:
                        stats.dump_stats(args.profile_out)
        for name, rounds in per_round.items():
            cpus = [c for c, _ in rounds]
            results[name] = {
                "cpu_us": round(statistics.median(cpus), 1),
                "wall_us": round(statistics.median(w for _, w in rounds), 1),
                "cpu_us_rounds": [round(c, 1) for c in cpus],
                "exact": exact[name],
            }
    for p in post_ids:
        rc.delete(keys.count_key(p), keys.sub_key(p, 0))
    rc.delete(keys.bloom_key(user))
    rc.close()
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, default=2000, help="per round (a fifth for batches)")
    ap.add_argument("--posts", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians reported")
    ap.add_argument(
        "--profile",
        choices=["anonymous", "authenticated", "batch", "baseline GET", "baseline MGET of 50"],
    )
    ap.add_argument(
        "--no-traces",
        action="store_true",
        help="the service without its OTLP exporter (the stack's render turns tracing on): "
        "run once with and once without to read what tracing costs a request",
    )
    ap.add_argument(
        "--traceparent",
        choices=["gateway", "none"],
        default="gateway",
        help="gateway: each request carries the traceparent the gateway sends, sampled for "
        "READ_TRACE_PERCENT of reads; none: no traceparent, so the service traces every request",
    )
    ap.add_argument("--top", type=int, default=30, help="functions shown by --profile")
    ap.add_argument("--profile-out", help="also write the profile (pstats) to this file")
    args = ap.parse_args()
    load = os.getloadavg()
    results = asyncio.run(run(args))
    exact = all(r["exact"] for r in results.values())

    def ratio(base: str, mine: str) -> float:
        """The median of the rounds' ratios (each round ran the two back to back)."""
        pairs = zip(results[base]["cpu_us_rounds"], results[mine]["cpu_us_rounds"], strict=True)
        return round(statistics.median(b / m for b, m in pairs), 3)

    cpu_ratio = {
        "anonymous": ratio("baseline GET", "anonymous"),
        "authenticated": ratio("baseline GET", "authenticated"),
        "batch": ratio("baseline MGET of 50", "batch"),
    }
    print(f"CPU ratio (baseline CPU / service CPU): {cpu_ratio}")
    print(json.dumps({"cpu_us_per_request": results, "cpu_ratio": cpu_ratio, "exact": exact,
                      "load_avg": [load, os.getloadavg()]}))  # fmt: skip


if __name__ == "__main__":
    main()
