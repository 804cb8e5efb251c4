"""The abuse scorer's throughput against the raw consume rate of the same topic, and like -> void
visible in the count, on an idle stack and under steady traffic (issue 13).

    LIKES_HOME=... LIKES_PORT_OFFSET=... .venv/bin/python bench/bench_abuse.py [--users 2000]
        [--rings 4] [--steady-s 150 --steady-rate 10 --ring-every 10] [--feature-store memory]

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
batch read API is polled every 0.25 s from the first like on. A post's latency runs from its last
accepted like to the first read that shows its final count (the non-void liked edges, read from
the edge-store at the end) and keeps showing it to the end of the polling (a read that matches
and is undone later is no settlement); the JSON line gains their p50, p99 and max.

Then (`--steady-s`, 0 to skip) the same latency under load: the game days' traffic
(chaos/traffic.py: a like per new user, each on an address of its own, retried with its key, and
reads) flows through the gateway at `--steady-rate` likes/s for `--steady-s` seconds, and a ring
starts every `--ring-every` s of it (none in its last 30 s, so that its void shows while the
background flows), each bot sending each like once (a degraded account's 429 is final). After the
background stops and the stack's scorer has committed every like, every post's count (the
background's and the rings') must equal its non-void liked edges and still equal them a
convergence hold later (services/contracts/convergence.py), no accepted like may be missing, and
the truth must not have moved meanwhile: `steady_exact`. The JSON line gains the background rate
achieved, the rings, the p50/p99/max (`steady_void_visible_*`) and `steady_exact`.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import replace
from datetime import UTC, datetime

import httpx
from cassandra.concurrent import execute_concurrent_with_args
from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from confluent_kafka.serialization import MessageField, SerializationContext
from prometheus_client import REGISTRY

from chaos import traffic
from local import issuer, layout, transforms
from services.abuse import generator, model
from services.abuse.main import build
from services.abuse.settings import ScorerSettings
from services.common import heap
from services.contracts import (
    clients,
    convergence,
    events,
    keys,
    routes,
    signals,
    topics,
    workloads,
)
from services.schema import registry_schemas


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def scorer_settings(lay: layout.Layout, prefix: str = "", target: str = "") -> ScorerSettings:
    """The env the stack gives its scorer (every store's address and login); with a `prefix`, on
    the run's own topics and group, with a `target`, on a model server of its own."""
    env = transforms.workload_env(lay, workloads.ABUSE_SCORER.name)
    values = {k.removeprefix("LIKES_").lower(): v for k, v in env.items()}
    if prefix:
        values |= {"abuse_topic_prefix": prefix, "abuse_group_id": f"{prefix}abuse"}
    if target:
        values["abuse_model_target"] = target
    return ScorerSettings.model_validate({**values, "log_level": "WARNING"})


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


RING_BOTS, RING_POSTS = 8, 10  # a ring: this many fresh accounts, each liking its posts
POLL_S = 0.25  # how often the rings' posts are read
HUMAN_POSTS = 8  # the background's posts (chaos/traffic.py's default)
WRITE_BUDGET_S = 2.0  # a background writer's time per like: writers = rate x this (at least 4)
# no ring starts in the background's last LOADED_TAIL_S: its void shows within them (a few
# seconds, in the storm's figures); one that shows later is counted all the same, and
# steady_settled_after_bg says how many did
LOADED_TAIL_S = 30.0
Like = tuple[str, str, str, dict[str, str]]  # (user, post, token, headers): Traffic.likes_as's


def ring_likes(
    sign: issuer.Signer, tag: str, r: int, net: str, now: int
) -> tuple[list[str], list[Like]]:
    """Ring `r` of a run: RING_BOTS accounts an hour old on the /24 `net`, sharing two device
    fingerprints, each liking the RING_POSTS posts of the ring's own; its posts and its likes."""
    post_ids = [f"bench-void-{tag}-{r}-{i}" for i in range(RING_POSTS)]
    likes: list[Like] = []
    for b in range(RING_BOTS):
        user = f"bench-bot-{tag}-{r}-{b}"
        tok = sign(user, 600, account_created=now - 3600)
        headers = {signals.CLIENT_IP_HEADER: f"{net}.{10 + b}",
                   signals.DEVICE_HEADER: f"ring-{tag}-{r}-{b % 2}"}  # fmt: skip
        likes += [(user, post, tok, headers) for post in post_ids]
    return post_ids, likes


def ring_nets(rnd: random.Random) -> list[str]:
    """The /24s of 198.18.0.0/15 (the benchmarking range), each run's rings on distinct ones."""
    return [f"198.{18 + n // 256}.{n % 256}" for n in rnd.sample(range(512), 512)]


def batch_counts(
    http: httpx.Client, gw: str, post_ids: list[str], rnd: random.Random
) -> dict[str, int | None]:
    """The counts the batch read API shows for `post_ids` now (a post whose page failed: absent)."""
    counts: dict[str, int | None] = {}
    for i in range(0, len(post_ids), 50):
        try:
            resp = http.post(
                f"{gw}{routes.BATCH_READ_PATH}", json={"post_ids": post_ids[i : i + 50]},
                headers={signals.CLIENT_IP_HEADER: f"10.9.{rnd.randrange(256)}.7"},
            )  # fmt: skip
        except httpx.TransportError:
            continue
        if resp.status_code == 200:
            counts.update({v["post_id"]: v["count"] for v in resp.json()["items"]})
    return counts


class Poller(threading.Thread):
    """Reads the counts of `posts` (a ring's added before its first like) through the batch
    read API every POLL_S from start to stop, noting when each read's answers were in."""

    def __init__(self, gw: str, tag: str) -> None:
        super().__init__(name="bench-poll", daemon=True)
        self.gw, self.rnd = gw, random.Random(f"{tag}-poll")
        self.posts: list[str] = []  # appended to only: each read takes a copy
        self.seen: list[tuple[float, dict[str, int | None]]] = []
        self._done = threading.Event()

    def run(self) -> None:
        with httpx.Client(timeout=10) as http:
            while not self._done.wait(POLL_S):
                if posts := list(self.posts):
                    counts = batch_counts(http, self.gw, posts, self.rnd)
                    self.seen.append((time.time(), counts))

    def stop(self) -> list[tuple[float, dict[str, int | None]]]:
        self._done.set()
        self.join(30)
        return self.seen


def edges(lay: layout.Layout, pairs: Iterable[tuple[str, str]]) -> dict[tuple[str, str], str]:
    """Each (user, post) edge's state in the edge-store: "liked", "void" (liked, voided),
    another state, or "missing"."""
    pairs = list(dict.fromkeys(pairs))
    s = scorer_settings(lay)
    cluster, session = clients.cassandra(s, request_timeout=20.0)
    try:
        q = session.prepare(
            "SELECT state, void FROM edges WHERE user_id = ? AND kind = 'edge' AND ref = ?"
        )
        rows = execute_concurrent_with_args(session, q, pairs, concurrency=64,
                                            raise_on_first_error=True)  # fmt: skip
    finally:
        cluster.shutdown()
    out = {}
    for pair, (_ok, result) in zip(pairs, rows, strict=True):
        row = result.one()
        out[pair] = ("missing" if row is None else "void" if row.state == "liked" and row.void
                     else str(row.state))  # fmt: skip
    return out


def truth(states: dict[tuple[str, str], str], post_ids: Iterable[str]) -> dict[str, int]:
    """Each post's final count: its non-void liked edges."""
    out = dict.fromkeys(post_ids, 0)
    for (_user, post), state in states.items():
        if post in out:
            out[post] += state == "liked"
    return out


def settled_at(
    seen: list[tuple[float, dict[str, int | None]]], post: str, final: int, since: float
) -> float | None:
    """When the reads after `since` (the post's last like) first showed its final count and kept
    showing it (None: the last read did not): a read that shows it and is undone later is no
    settlement."""
    at = None
    for t, counts in seen:
        if t >= since:
            at = (at or t) if counts.get(post) == final else None
    return at


def percentiles(lat: list[float], prefix: str) -> dict[str, float]:
    lat = sorted(lat)
    if not lat:
        return {}
    return {
        f"{prefix}_p50_s": round(lat[len(lat) // 2], 2),
        f"{prefix}_p99_s": round(lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2),
        f"{prefix}_max_s": round(lat[-1], 2),
    }


def storm_latency(lay: layout.Layout, rings: int) -> dict[str, float]:
    """Like -> void visible in the count, through the gateway and the stack's own scorer."""
    gw = f"http://{layout.HOST}:{lay.ports.gateway}"
    sign = transforms.signer(lay)
    tag = uuid.uuid4().hex[:8]
    now = int(time.time())
    rnd = random.Random(tag)
    nets = ring_nets(rnd)
    pairs: list[tuple[str, str]] = []
    last_like: dict[str, float] = {}
    poller = Poller(gw, tag)
    poller.start()  # from the first like: a post can settle while the next rings are sent
    with httpx.Client(timeout=10) as http:
        for r in range(rings):
            posts, likes = ring_likes(sign, tag, r, nets[r], now)
            poller.posts.extend(posts)
            for user, post, tok, extra in likes:
                pairs.append((user, post))
                resp = http.post(
                    f"{gw}{routes.WRITE_PATH}", json={"post_id": post, "action": "like"},
                    headers={"Authorization": f"Bearer {tok}",
                             "Idempotency-Key": str(uuid.uuid4()), **extra},
                )  # fmt: skip
                if resp.status_code == 202:
                    last_like[post] = time.time()
    time.sleep(90)
    seen = poller.stop()
    post_ids = poller.posts
    final = truth(edges(lay, pairs), post_ids)
    lat = []
    for post in last_like:
        at = settled_at(seen, post, final[post], last_like[post])
        if at is not None:
            lat.append(at - last_like[post])
    if not lat:
        return {"void_visible_posts": 0}
    return {
        "void_visible_posts": len(lat), "void_visible_of": len(last_like),
        **percentiles(lat, "void_visible"),
        "voided_share": round(1 - sum(final.values()) / max(1, len(pairs)), 3),
    }  # fmt: skip


def scorer_caught_up(lay: layout.Layout, timeout_s: float) -> bool:
    """The stack's scorer has committed every like on likes.committed now: each void it will
    make of them is written (it commits after a batch's voids)."""
    s = scorer_settings(lay)
    return clients.caught_up(clients.kafka_config(s), s.abuse_group_id, s.source_topic, timeout_s)


def steady_latency(
    lay: layout.Layout, rate: float, seconds: float, ring_every: float
) -> dict[str, float | int | bool]:
    """Like -> void visible in the count while human likes and reads flow at a steady rate."""
    gw = f"http://{layout.HOST}:{lay.ports.gateway}"
    sign = transforms.signer(lay)
    bg = traffic.Traffic(
        gateway_url=gw, token=lambda user: sign(user),
        users=max(1, int(rate * seconds * 2)), posts=HUMAN_POSTS,
        writers=max(4, math.ceil(rate * WRITE_BUDGET_S)), readers=2, write_rate=rate,
    )  # fmt: skip
    tag, now = bg.run, int(time.time())
    rnd = random.Random(tag)
    nets = ring_nets(rnd)
    ring_pairs: list[tuple[str, str]] = []
    poller = Poller(gw, tag)

    def ring(r: int, likes: list[Like]) -> None:
        sent = time.time()
        accepted = bg.likes_as(likes, workers=RING_BOTS, retry_throttled=False)
        n = sum(1 for u, _p in list(bg.ledger) if u.startswith(f"gd-{tag}-u"))
        print(f"  {time.time() - t0:5.0f} s  ring {r}: {accepted}/{len(likes)} likes accepted in "
              f"{time.time() - sent:.1f} s; background {n / (time.time() - t0):.1f} likes/s "
              f"({n} accepted)", flush=True)  # fmt: skip

    bg.start()
    poller.start()
    t0 = time.time()
    last_ring = t0 + max(0.0, seconds - LOADED_TAIL_S)
    rings: list[threading.Thread] = []
    while (due := t0 + (len(rings) + 0.5) * ring_every) <= last_ring:
        time.sleep(max(0.0, due - time.time()))
        posts, likes = ring_likes(sign, tag, len(rings), nets[len(rings) % len(nets)], now)
        poller.posts.extend(posts)
        ring_pairs.extend((u, p) for u, p, _t, _h in likes)
        # each ring in a thread of its own: the pace is the schedule's, however slow the writes
        rings.append(threading.Thread(target=ring, args=(len(rings), likes), daemon=True))
        rings[-1].start()
    time.sleep(max(0.0, t0 + seconds - time.time()))
    for t in rings:
        t.join()
    r = len(rings)
    bg.stop()
    stopped = time.time()
    span = stopped - t0
    summary = bg.summary()
    humans = [pair for pair in list(bg.ledger) if pair[0].startswith(f"gd-{tag}-u")]
    print(f"  background stopped after {span:.0f} s: {len(humans)} human likes accepted "
          f"({len(humans) / span:.1f}/s of {rate:g}), {r} rings; write answers (background and "
          f"rings) {summary['writes']}, background reads {summary['reads']}; waiting for the "
          "scorer", flush=True)  # fmt: skip
    if len(humans) < 0.9 * rate * span:
        print(f"  the background fell short of {rate:g} likes/s: the stack on this machine does "
              "not sustain it now (see --steady-rate)", flush=True)  # fmt: skip
    caught_up = scorer_caught_up(lay, 180)
    states = edges(lay, bg.attempted)
    all_posts = bg.post_ids + poller.posts
    final = truth(states, all_posts)
    lost = sum(1 for pair in bg.ledger if states.get(pair, "missing") not in ("liked", "void"))

    def read_all() -> dict[str, int | None]:
        with httpx.Client(timeout=10) as http:
            return batch_counts(http, gw, all_posts, rnd)

    conv = convergence.wait_converged(read_all, final, timeout_s=120)
    seen = poller.stop()
    again = truth(edges(lay, bg.attempted), all_posts)  # no void landed after the truth was read
    exact = caught_up and conv.converged and again == final and lost == 0
    print(f"  counts: {conv}; scorer caught up: {caught_up}; lost likes: {lost}", flush=True)
    last_like: dict[str, float] = {}
    for pair in ring_pairs:
        if pair in bg.accepted_at:
            last_like[pair[1]] = max(last_like.get(pair[1], 0.0), bg.accepted_at[pair])
    lat, after_bg = [], 0
    for post, liked in last_like.items():
        at = settled_at(seen, post, final[post], liked)
        if at is not None:
            lat.append(at - liked)
            after_bg += at > stopped
    return {
        "steady_rate_target": rate, "steady_rate_per_s": round(len(humans) / span, 1),
        "steady_s": round(span), "steady_rings": r, "steady_posts": len(lat),
        "steady_posts_of": len(last_like), "steady_settled_after_bg": after_bg,
        **percentiles(lat, "steady_void_visible"),
        # as the storm's voided_share: of the rings' likes, those not counted (voided or refused)
        "steady_voided_share": round(
            1 - sum(1 for p in ring_pairs if states.get(p) == "liked") / max(1, len(ring_pairs)),
            3),
        "steady_ring_refused": sum(1 for p in ring_pairs if p not in bg.ledger),
        "steady_human_voided": sum(1 for p in humans if states.get(p) == "void"),
        "steady_unclean_writes": summary["unclean_writes"], "steady_read_5xx": summary["read_5xx"],
        "steady_lost": lost, "steady_exact": exact,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--users", type=int, default=2000, help="accounts in the generated traffic")
    # one: the scorer is one consumer per region anyway (its features are its own state), and
    # one partition's order is the order the exactness check replays
    ap.add_argument("--partitions", type=int, default=1)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--rings", type=int, default=4, help="rings for like -> void (0: skip)")
    ap.add_argument(
        "--steady-s",
        type=float,
        default=150.0,
        help="seconds of steady human traffic for like -> void under load (0: skip)",
    )
    ap.add_argument(
        "--steady-rate",
        type=float,
        default=10.0,
        help="human likes a second through the gateway during --steady-s (10: what this 2-core "
        "machine sustained, shared, with the rings beside them)",
    )
    ap.add_argument("--ring-every", type=float, default=10.0,
                    help="seconds between two rings during --steady-s")  # fmt: skip
    ap.add_argument(
        "--feature-store", choices=("rendered", "memory", "shared"), default="rendered",
        help="where the benchmarked scorer keeps its features: what the program renders for "
        "the stack (shared when the scorer may run several replicas), or either one",
    )  # fmt: skip
    args = ap.parse_args()
    if args.steady_s > 0 and min(args.steady_rate, args.ring_every) <= 0:
        ap.error("--steady-rate and --ring-every must be positive")

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
    if args.feature_store != "rendered":
        s = s.model_copy(update={"abuse_feature_store": args.feature_store})
    print(f"features kept in: {s.abuse_feature_store}")
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
    visible = storm_latency(lay, args.rings) if args.rings else {}
    if visible.get("void_visible_posts"):
        print(f"like -> void in the count: p50 {visible['void_visible_p50_s']} s, p99 "
              f"{visible['void_visible_p99_s']} s over {visible['void_visible_posts']} posts "
              f"({visible['voided_share']:.0%} of the rings' likes voided)")  # fmt: skip
    steady: dict[str, float | int | bool] = {}
    if args.steady_s > 0:
        print(f"like -> void under steady traffic: {args.steady_rate:g} human likes/s for "
              f"{args.steady_s:g} s, a ring every {args.ring_every:g} s", flush=True)  # fmt: skip
        steady = steady_latency(lay, args.steady_rate, args.steady_s, args.ring_every)
        if steady.get("steady_posts"):
            print(f"like -> void in the count at {steady['steady_rate_per_s']} human likes/s: "
                  f"p50 {steady['steady_void_visible_p50_s']} s, p99 "
                  f"{steady['steady_void_visible_p99_s']} s, max "
                  f"{steady['steady_void_visible_max_s']} s over {steady['steady_posts']} posts "
                  f"of {steady['steady_rings']} rings; every count exact: "
                  f"{steady['steady_exact']}")  # fmt: skip
    print(f"raw consume+deserialize : {raw_rate:10.0f} likes/s  ({raw_s:.1f}s)")
    print(f"scorer (end to end)     : {scorer_rate:10.0f} likes/s  ({scorer_s:.1f}s)")
    print(f"scorer / raw            : {scorer_rate / raw_rate:10.3f}")
    print(f"voids                   : {check['voided']} of {n} likes ({attempts:.0f} attempted); "
          f"exactly the likes the model flags: {check['exact']}")  # fmt: skip
    print(json.dumps({
        "bench": "abuse", "likes": n, "raw_per_s": round(raw_rate), "scorer_per_s":
        round(scorer_rate), "ratio": round(scorer_rate / raw_rate, 3), "model": current.version,
        "feature_store": s.abuse_feature_store,
        **check, **visible, **steady,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
