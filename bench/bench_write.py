"""Write service throughput and p99 to 202, against a one-idem-store-GET+SET baseline.

    LIKES_HOME=... LIKES_PORT_OFFSET=... .venv/bin/python bench/bench_write.py \
        [--concurrency 16] [--duration 10]

Needs a running local stack (`likes local up`). Serves, each with uvicorn in its own process:
  1. the baseline: a bare ASGI app doing what any idempotent write must do at the least — one
     GET and one SET EX on the idem-store — and answering 202;
  2. the write service (`services.write.main:create_app`): idem GET, the conditional edge/outbox
     BATCH (one Paxos round), the Kafka publish with acks=all, the idem SET.
Every request is a distinct like (its own user, post and Idempotency-Key): no replays. The load
generator is bench_read's (a separate process, minimal keep-alive HTTP/1.1 client). Prints
accepted likes/s, p50, p99 and the ratios to the baseline. No assertions.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.bench_read import post_json, run_load, serve  # noqa: E402


def baseline_app() -> Any:
    """One idem-store GET and one SET EX per request, then 202."""
    import redis.asyncio as aredis

    from services.contracts.settings import Settings

    r = aredis.Redis.from_url(Settings().idem_store_url)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if scope["path"] == "/healthz":
            body = b'{"status":"ok"}'
            status = 200
        else:
            while (await receive()).get("more_body"):
                pass
            key = "bench:" + dict(scope["headers"]).get(b"idempotency-key", b"").decode()
            if await r.get(key) is None:
                await r.set(key, b'{"state":"liked"}', ex=600)
            body, status = b'{"state":"liked"}', 202
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())],
            }
        )  # fmt: skip
        await send({"type": "http.response.body", "body": body})

    return app


def like_requests(n: int, run: str) -> list[bytes]:
    from local import layout, transforms

    lay = layout.from_env()
    out = []
    for i in range(n):
        tok = transforms.sign_token(lay, f"bench-{run}-u{i}")
        req = post_json("/v1/likes", {"post_id": f"bench-{run}-p{i % 500}", "action": "like"})
        head, _, body = req.partition(b"\r\n\r\n")
        extra = f"\r\nAuthorization: Bearer {tok}\r\nIdempotency-Key: {uuid.uuid4()}"
        out.append(head + extra.encode() + b"\r\n\r\n" + body)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--requests", type=int, default=20000, help="distinct likes prepared")
    ap.add_argument("--port", type=int, default=18580, help="baseline port; the service's is +1")
    args = ap.parse_args()

    from local import layout, transforms

    lay = layout.from_env()
    # the write service's env exactly as the stack runs it (its rendered spec, transformed)
    proc = next(
        p for p in transforms.processes(lay, lay.stack, check=False) if p.workload.name == "write"
    )
    env = {**proc.env, "LIKES_LOG_LEVEL": "WARNING"}
    uvicorn = [sys.executable, "-m", "uvicorn", "--host", "127.0.0.1", "--no-access-log"]
    uvicorn += ["--log-level", "warning", "--factory"]
    base_port, write_port = args.port, args.port + 1
    run = uuid.uuid4().hex[:8]
    # the requests cycle if the service outruns them: size --requests above rate x duration
    base_reqs, write_reqs = (
        like_requests(args.requests, run),
        like_requests(args.requests, run + "w"),
    )
    procs = []
    results: list[tuple[str, dict[str, float]]] = []
    try:
        procs.append(serve([*uvicorn, "--port", str(base_port), "bench.bench_write:baseline_app"],
                           env, base_port))  # fmt: skip
        procs.append(
            serve([*uvicorn, "--port", str(write_port), "services.write.main:create_app"],
                  env, write_port)
        )  # fmt: skip
        for name, port, reqs in [
            ("baseline: idem GET + SET", base_port, base_reqs),
            ("write: POST /v1/likes", write_port, write_reqs),
        ]:
            r = run_load(port, reqs, args.concurrency, args.duration, args.warmup)
            results.append((name, r))
            print(f"{name:28s} {r['rps']:8.0f} req/s  p50 {r['p50_ms']:7.2f} ms  "
                  f"p99 {r['p99_ms']:7.2f} ms", flush=True)  # fmt: skip
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    (_, base), (_, w) = results
    print(f"\nconcurrency {args.concurrency}, {args.duration:.0f} s each, distinct likes")
    print(
        f"write service: {w['rps'] / base['rps']:5.2f}x the baseline's throughput, "
        f"p50 {w['p50_ms'] / base['p50_ms']:5.2f}x, p99 {w['p99_ms'] / base['p99_ms']:5.2f}x"
    )
    print(json.dumps({"baseline": base, "write": w}))


if __name__ == "__main__":
    main()
