"""The abuse scorer's throughput against the raw consume rate of the same topic (issue 13).

    LIKES_HOME=... LIKES_PORT_OFFSET=... .venv/bin/python bench/bench_abuse.py [--users 2000]

Needs a running local stack (`likes local up`) with a model (its first start trains one). Writes
the generator's human and bot traffic (services/abuse/generator.py: bursts, rings on one /24,
shared devices, fresh accounts; ~15 % of the likes a bot's) as like events to a private copy of
likes.committed (`bench-<id>.likes.committed`) and the liked edges they stand for to the
edge-store, then, in the same run, times
  1. a bare consumer reading and deserializing every message (the baseline), and
  2. the scorer (features, one gRPC Score call per batch to a model server of its own, a
     separate process as the sidecar is, a conditional void and its event for each like above
     the threshold, the storm watch, the offset commit) from the first offset until its
     committed offsets reach the end of the topic,
and checks that every like the model flags is void in the edge-store and no other is. Ends with
one JSON line: both rates, their `ratio`, the voids and `exact`. No assertions.

Then (`--rings`, 0 to skip) like -> void visible in the count, on the stack as it runs: rings of
fresh accounts (each on its own /24, sharing two devices) like posts of their own through the
gateway; the stack's scorer and model server void them, the aggregator folds the voids, and the
batch read API is polled every 0.25 s. A post's latency runs from its last accepted like to the
first read that shows its final count (the non-void liked edges) and keeps showing it; the JSON
line gains their p50, p99 and max.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import replace
from datetime import UTC, datetime

import httpx
from cassandra.concurrent import execute_concurrent_with_args
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.serialization import MessageField, SerializationContext
from prometheus_client import REGISTRY

from local import layout, transforms
from services.abuse import generator, model
from services.abuse.main import build
from services.abuse.settings import ScorerSettings
from services.common import heap
from services.contracts import clients, events, keys, routes, signals, topics, workloads
from services.schema import registry_schemas


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scorer_settings(lay: layout.Layout, prefix: str, target: str) -> ScorerSettings:
    """The env the stack gives its scorer (every store's address and login), on the run's own
    topic, group and model server."""
    env = transforms.workload_env(lay, workloads.ABUSE_SCORER.name)
    values = {k.removeprefix("LIKES_").lower(): v for k, v in env.items()}
    return ScorerSettings.model_validate({
        **values, "abuse_topic_prefix": prefix, "abuse_group_id": f"{prefix}abuse",
        "abuse_model_target": target, "log_level": "WARNING",
    })  # fmt: skip


def produce(s: ScorerSettings, users: int, seed: int) -> list[events.LikeEvent]:
    """The generator's traffic as like events on the run's topic, their edges liked."""
    likes = generator.generate(generator.Traffic(users=users, seed=seed))
    tag = uuid.uuid4().hex[:8]
    out = []
    seen: set[tuple[str, str]] = set()
    for o in likes:
        if (o.user_id, o.post_id) in seen:
            continue  # one like per edge: a second would supersede the first (not a void's test)
        seen.add((o.user_id, o.post_id))
        e = events.LikeEvent.new(
            intent_uuid=str(uuid.uuid4()), user_id=f"{o.user_id}-{tag}", post_id=o.post_id,
            action="like", reaction="like", delta=1, region=s.region, client_ip=o.client_ip,
            device=o.device,
            account_created=None if o.account_created is None else int(o.account_created * 1000),
        )  # fmt: skip
        out.append(replace(e, occurred_at=int(o.ts * 1000)))
    cluster, session = clients.cassandra(s, request_timeout=20.0)
    try:
        stmt = session.prepare(
            "UPDATE edges SET state = 'liked', reaction = 'like', void = false, updated_at = ?, "
            "intent_uuid = ? WHERE user_id = ? AND kind = 'edge' AND ref = ?"
        )
        now = datetime.now(UTC)
        rows = [(now, uuid.UUID(e.intent_uuid), e.user_id, e.post_id) for e in out]
        execute_concurrent_with_args(session, stmt, rows, concurrency=64, raise_on_first_error=True)
    finally:
        cluster.shutdown()
    ser = clients.like_serializer(clients.schema_registry(s))
    topic = s.source_topic
    ctx = SerializationContext(topic, MessageField.VALUE)
    prod = clients.producer(s, **{"linger.ms": 20})
    for e in out:
        while True:
            try:
                prod.produce(topic, key=keys.kafka_key(e.post_id, 0).encode(), value=ser(e, ctx))
                break
            except BufferError:
                prod.poll(0.05)
        prod.poll(0)
    prod.flush(60)
    return out


def raw_consume(s: ScorerSettings, n: int) -> float:
    """Baseline: read and deserialize every message, nothing else."""
    topic = s.source_topic
    des = clients.like_deserializer(clients.schema_registry(s))
    c = Consumer({**clients.kafka_config(s), "group.id": f"{s.abuse_group_id}-raw",
                  "enable.auto.commit": False})  # fmt: skip
    parts = c.list_topics(topic, timeout=10).topics[topic].partitions
    c.assign([TopicPartition(topic, p, 0) for p in parts])
    ctx = SerializationContext(topic, MessageField.VALUE)
    seen, t0 = 0, time.perf_counter()
    while seen < n:
        for m in c.consume(1000, 1.0):
            if m.error() is None:
                des(m.value(), ctx)
                seen += 1
    dt = time.perf_counter() - t0
    c.close()
    return dt


def run_scorer(s: ScorerSettings) -> float:
    topic = s.source_topic
    built = build(s)
    watch = Consumer({**clients.kafka_config(s), "group.id": s.abuse_group_id})
    parts = watch.list_topics(topic, timeout=10).topics[topic].partitions
    ends = {p: watch.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
    stop = threading.Event()
    t = threading.Thread(target=built.scorer.run, args=(stop,), daemon=True)
    started = time.perf_counter()
    t.start()
    while not built.scorer.assigned and time.perf_counter() - started < 60:
        time.sleep(0.005)  # the group join is a one-off per restart, not throughput
    t0 = time.perf_counter()
    while True:
        time.sleep(0.05)
        try:
            got = watch.committed([TopicPartition(topic, p) for p in parts], timeout=10)
        except KafkaException:
            continue
        if all(tp.offset >= ends[tp.partition] for tp in got):
            break
    dt = time.perf_counter() - t0
    stop.set()
    t.join(60)
    watch.close()
    built.close()
    return dt


def voids_match(s: ScorerSettings, likes: list[events.LikeEvent], threshold: float) -> dict:
    """Every like the model scores above its threshold is void, and no other: the features and
    the model replayed here, in the topic's order (one partition: the order the scorer read)."""
    from services.abuse import features as features_mod

    m = model.load(layout.from_env().abuse_models)
    f = features_mod.Features()
    order = likes
    flagged = {
        (e.user_id, e.post_id)
        for e, p in zip(order, m.probabilities([f.observe(e) for e in order]), strict=True)
        if p >= threshold
    }
    cluster, session = clients.cassandra(s, request_timeout=20.0)
    try:
        q = session.prepare(
            "SELECT void FROM edges WHERE user_id = ? AND kind = 'edge' AND ref = ?"
        )
        rows = execute_concurrent_with_args(
            session, q, [(e.user_id, e.post_id) for e in likes], concurrency=64
        )
        void = {(e.user_id, e.post_id) for e, (_ok, r) in zip(likes, rows, strict=True)
                if r.one() and r.one().void}  # fmt: skip
    finally:
        cluster.shutdown()
    return {"voided": len(void), "flagged_by_replay": len(flagged),
            "exact": void == flagged}  # fmt: skip


def storm_latency(lay: layout.Layout, rings: int, bots: int, posts: int) -> dict[str, float]:
    """Like -> void visible in the count, through the gateway and the stack's own scorer."""
    gw = f"http://{layout.HOST}:{lay.ports.gateway}"
    tag = uuid.uuid4().hex[:8]
    now = int(time.time())
    rnd = random.Random(tag)
    post_ids = [f"bench-void-{tag}-{r}-{i}" for r in range(rings) for i in range(posts)]
    last_like: dict[str, float] = {}
    with httpx.Client(timeout=10) as http:
        for r in range(rings):
            net = f"198.18.{rnd.randrange(256)}"
            for b in range(bots):
                user = f"bench-bot-{tag}-{r}-{b}"
                tok = transforms.sign_token(lay, user, 600, account_created=now - 3600)
                for post in post_ids[r * posts : (r + 1) * posts]:
                    resp = http.post(
                        f"{gw}{routes.WRITE_PATH}", json={"post_id": post, "action": "like"},
                        headers={"Authorization": f"Bearer {tok}",
                                 "Idempotency-Key": str(uuid.uuid4()),
                                 signals.CLIENT_IP_HEADER: f"{net}.{10 + b}",
                                 signals.DEVICE_HEADER: f"ring-{tag}-{r}-{b % 2}"},
                    )  # fmt: skip
                    if resp.status_code == 202:
                        last_like[post] = time.time()
        seen: list[tuple[float, dict[str, int]]] = []
        deadline = time.time() + 90
        while time.time() < deadline:
            counts: dict[str, int] = {}
            for i in range(0, len(post_ids), 50):
                resp = http.post(
                    f"{gw}{routes.BATCH_READ_PATH}", json={"post_ids": post_ids[i : i + 50]},
                    headers={signals.CLIENT_IP_HEADER: f"10.9.{rnd.randrange(256)}.7"},
                )  # fmt: skip
                if resp.status_code == 200:
                    counts.update({v["post_id"]: v["count"] for v in resp.json()["items"]})
            seen.append((time.time(), counts))
            time.sleep(0.25)
    s = scorer_settings(lay, "", workloads.ABUSE_MODEL.target)
    cluster, session = clients.cassandra(s, request_timeout=20.0)
    try:
        q = session.prepare(
            "SELECT state, void FROM edges WHERE user_id = ? AND kind = 'edge' AND ref = ?"
        )
        truth = dict.fromkeys(post_ids, 0)
        for r in range(rings):
            for b in range(bots):
                for post in post_ids[r * posts : (r + 1) * posts]:
                    row = session.execute(q, (f"bench-bot-{tag}-{r}-{b}", post)).one()
                    truth[post] += bool(row and row.state == "liked" and not row.void)
    finally:
        cluster.shutdown()
    lat = []
    for post in post_ids:
        if post not in last_like:
            continue
        at = None  # the first read from which every later one shows the final count
        for t, counts in seen:
            settled = counts.get(post) == truth[post]
            at = (at or t) if settled else None
        if at is not None:
            lat.append(max(0.0, at - last_like[post]))
    lat.sort()
    if not lat:
        return {"void_visible_posts": 0}
    return {
        "void_visible_posts": len(lat), "void_visible_of": len(last_like),
        "void_visible_p50_s": round(lat[len(lat) // 2], 2),
        "void_visible_p99_s": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2),
        "void_visible_max_s": round(lat[-1], 2),
        "voided_share": round(1 - sum(truth.values()) / max(1, rings * bots * posts), 3),
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--users", type=int, default=2000, help="accounts in the generated traffic")
    # one: the scorer is one consumer per region anyway (its features are its own state), and
    # one partition's order is the order the exactness check replays
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--rings", type=int, default=4, help="rings for like -> void (0: skip)")
    args = ap.parse_args()

    lay = layout.for_benchmark()
    models = lay.abuse_models
    if model.current_version(models) is None:
        sys.exit(f"no current model in {models}: start the stack (`likes local up`) first")
    current = model.load(models)
    port, ops = free_port(), free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", workloads.ABUSE_MODEL.module, "--host", layout.HOST,
         "--port", str(port), "--ops-port", str(ops), "--model-dir", str(models)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    prefix = f"bench-{uuid.uuid4().hex[:8]}."
    s = scorer_settings(lay, prefix, f"{layout.HOST}:{port}")
    specs = [topics.TopicSpec(prefix + t, args.partitions, {}) for t in events.EVENT_TOPICS]
    topics.ensure(clients.kafka_config(s), lay.kafka_brokers, specs)
    registry = clients.schema_registry(s)
    by_schema = {"like_event": tuple(prefix + t for t in events.EVENT_TOPICS)}
    registry_schemas.apply(registry, registry_schemas.subjects(topics_by_schema=by_schema))
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://{layout.HOST}:{ops}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        t0 = time.perf_counter()
        likes = produce(s, args.users, args.seed)
        print(f"produced {len(likes)} likes of {args.users} accounts (edges and events) in "
              f"{time.perf_counter() - t0:.1f} s")  # fmt: skip
        heap.settle()
        raw_s = raw_consume(s, len(likes))
        voids_before = sum(
            REGISTRY.get_sample_value("likes_abuse_voids_total", {"result": r}) or 0.0
            for r in ("voided", "replayed", "not-liked", "superseded", "already-void")
        )
        scorer_s = run_scorer(s)
        attempts = (
            sum(
                REGISTRY.get_sample_value("likes_abuse_voids_total", {"result": r}) or 0.0
                for r in ("voided", "replayed", "not-liked", "superseded", "already-void")
            )
            - voids_before
        )
        check = voids_match(s, likes, current.threshold)
    finally:
        server.terminate()
        server.wait(20)
        AdminClient(clients.kafka_config(s)).delete_topics([x.name for x in specs])
    n = len(likes)
    raw_rate, scorer_rate = n / raw_s, n / scorer_s
    visible = storm_latency(lay, args.rings, 8, 10) if args.rings else {}
    if visible.get("void_visible_posts"):
        print(f"like -> void in the count: p50 {visible['void_visible_p50_s']} s, p99 "
              f"{visible['void_visible_p99_s']} s over {visible['void_visible_posts']} posts "
              f"({visible['voided_share']:.0%} of the rings' likes voided)")  # fmt: skip
    print(f"raw consume+deserialize : {raw_rate:10.0f} likes/s  ({raw_s:.1f}s)")
    print(f"scorer (end to end)     : {scorer_rate:10.0f} likes/s  ({scorer_s:.1f}s)")
    print(f"scorer / raw            : {scorer_rate / raw_rate:10.3f}")
    print(f"voids                   : {check['voided']} of {n} likes ({attempts:.0f} attempted); "
          f"exactly the likes the model flags: {check['exact']}")  # fmt: skip
    print(json.dumps({
        "bench": "abuse", "likes": n, "raw_per_s": round(raw_rate), "scorer_per_s":
        round(scorer_rate), "ratio": round(scorer_rate / raw_rate, 3), "model": current.version,
        **check, **visible,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
