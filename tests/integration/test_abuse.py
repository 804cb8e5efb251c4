"""The abuse scorer on the real stack: a generated bot storm through the gateway is scored by the
model server (a real process, speaking gRPC), the bots' likes are voided, a storming account is
degraded, and every count equals the post's non-void liked edges (invariant 6). The model server
going away defers scoring; the likes of the outage are voided once it is back."""

from __future__ import annotations

import concurrent.futures as cf
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cassandra.cluster import Session
from confluent_kafka import Consumer, TopicPartition

from services.abuse import main as abuse_main
from services.abuse import metrics as abuse_metrics
from services.abuse import model as abuse_model
from services.abuse.settings import ScorerSettings
from services.client import LikesClient
from services.contracts import clients, convergence, degrade, events, routes, signals
from tests.conftest import Stack
from tests.integration.test_data_path import liked_edges
from tests.integration.test_flags import wait_for

pytestmark = pytest.mark.stack

BOTS, HUMANS, POSTS_PER_BOT = 8, 12, 6


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("abuse-models")
    # the generator's traffic, the default parameters: what `likes abuse train` does
    abuse_model.save(abuse_model.train(), d)
    return d


class ModelServer:
    """`python -m services.abuse.model_server` as its own process: down means a process gone."""

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = model_dir
        self.port, self.ops_port = free_port(), free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services.abuse.model_server", "--host", "127.0.0.1",
             "--port", str(self.port), "--ops-port", str(self.ops_port),
             "--model-dir", str(self.model_dir)],
            env={**os.environ}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        wait_for(self.ready, "the model server ready", 60)

    def ready(self) -> bool:
        try:
            r = httpx.get(f"http://127.0.0.1:{self.ops_port}/readyz", timeout=1)
            return r.status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(20)
            self.proc = None


@pytest.fixture(scope="module")
def model_server(model_dir: Path) -> Iterator[ModelServer]:
    server = ModelServer(model_dir)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def scorer(stack: Stack, model_server: ModelServer) -> Iterator[abuse_main.Built]:
    """The scorer in-process, in a group of its own, reading likes.committed from its end when it
    joins (the stack's earlier traffic is not this test's to score)."""
    env = stack.workload_env("write")
    settings = ScorerSettings.model_validate({
        **{k.removeprefix("LIKES_").lower(): v for k, v in env.items()},
        "abuse_group_id": f"likes-abuse-test-{uuid.uuid4().hex[:8]}",
        "abuse_model_target": f"127.0.0.1:{model_server.port}",
        "abuse_model_timeout_s": 1.0,
        "abuse_retry_max_s": 1.0,
    })  # fmt: skip
    start_at_the_end(stack, settings.abuse_group_id)
    built = abuse_main.build(settings)
    stop = threading.Event()
    t = threading.Thread(target=built.scorer.run, args=(stop,), daemon=True)
    t.start()
    wait_for(lambda: built.scorer.assigned, "the scorer assigned", 60)
    yield built
    stop.set()
    t.join(30)
    built.close()


def start_at_the_end(stack: Stack, group: str) -> None:
    """Commit the group's offsets at the topic's end now: it scores only what comes after."""
    c = Consumer({**stack.kafka_config(), "group.id": group, "enable.auto.commit": False})
    try:
        md = c.list_topics(events.COMMITTED, timeout=10).topics[events.COMMITTED]
        ends = []
        for p in md.partitions:
            _low, high = c.get_watermark_offsets(TopicPartition(events.COMMITTED, p), timeout=10)
            ends.append(TopicPartition(events.COMMITTED, p, high))
        c.commit(offsets=ends, asynchronous=False)
    finally:
        c.close()


def like_as(stack: Stack, user: str, post: str, ip: str, device: str, created: int) -> int:
    r = httpx.post(
        f"{stack.gateway_url}{routes.WRITE_PATH}",
        json={"post_id": post, "action": "like"},
        headers={
            "Authorization": f"Bearer {stack.token(user, account_created=created)}",
            "Idempotency-Key": str(uuid.uuid4()),
            signals.CLIENT_IP_HEADER: ip,
            signals.DEVICE_HEADER: device,
        },
        timeout=10,
    )
    return r.status_code


def storm(
    stack: Stack, tag: str, posts: list[str], n_bots: int, wave: str
) -> list[tuple[str, str]]:
    """A ring of fresh accounts on one /24 sharing two devices, each liking every post within a
    second or two; returns the (user, post) pairs that were accepted (202)."""
    now = int(time.time())
    jobs = [
        (f"bot-{wave}-{i}-{tag}", post, f"203.0.113.{10 + i}", f"ring-{tag}-{i % 2}", now - 3600)
        for i in range(n_bots) for post in posts
    ]  # fmt: skip
    with cf.ThreadPoolExecutor(8) as pool:
        codes = list(pool.map(lambda j: like_as(stack, *j), jobs))
    return [(u, p) for (u, p, *_), c in zip(jobs, codes, strict=True) if c == 202]


def humans(stack: Stack, tag: str, posts: list[str]) -> list[tuple[str, str]]:
    """Old accounts on their own devices and networks, one like each."""
    out = []
    for i in range(HUMANS):
        user, post = f"human-{i}-{tag}", posts[i % len(posts)]
        ip = f"198.{51 + i}.{100 + i}.{7 + i}"
        created = int(time.time()) - 400 * 86400
        assert like_as(stack, user, post, ip, f"phone-{tag}-{i}", created) == 202
        out.append((user, post))
        time.sleep(0.2)
    return out


def test_a_bot_storm_is_voided_and_counts_equal_the_non_void_edges(
    stack: Stack, cql: Session, scorer: abuse_main.Built, model_server: ModelServer
) -> None:
    tag = uuid.uuid4().hex[:8]
    posts = [f"abuse-{tag}-{i}" for i in range(POSTS_PER_BOT)]
    scored_before = sample(abuse_metrics.SCORED)
    pairs = humans(stack, tag, posts) + storm(stack, tag, posts, BOTS, "a")

    def scored(pairs: list[tuple[str, str]]) -> bool:
        """Every like of `pairs` scored (and voided or not): no void of them is still to come."""
        s = scorer.scorer
        return s.held is None and sample(abuse_metrics.SCORED) - scored_before >= len(pairs)

    def voided() -> int:
        return sum(1 for u, p in pairs if u.startswith("bot-") and void_of(cql, u, p))

    # most of the ring's likes voided; no human's
    wait_for(lambda: voided() >= BOTS * POSTS_PER_BOT * 0.8, "the storm voided", 90)
    assert not any(void_of(cql, u, p) for u, p in pairs if u.startswith("human-"))
    # the ring's accounts storming were degraded: the write path lets them like once a minute
    idem = clients.idem_store(stack.settings(), timeout=2.0)
    assert sum(degrade.is_degraded(idem, f"bot-a-{i}-{tag}") for i in range(BOTS)) >= BOTS // 2
    assert sample(abuse_metrics.DEGRADED) >= BOTS // 2

    # the model server goes away: scoring is deferred (nothing skipped, nothing committed), the
    # outage's bot likes are counted meanwhile, then voided once it is back
    model_server.stop()
    wave_b = storm(stack, tag, posts, BOTS, "b")
    wait_for(lambda: scorer.scorer.held is not None, "scoring deferred", 30)
    assert not scorer.scorer.ready()["model"]
    time.sleep(3)  # the outage lasts: still deferred, still nothing voided of wave b
    assert scorer.scorer.held is not None
    assert not any(void_of(cql, u, p) for u, p in wave_b)
    model_server.start()
    wait_for(lambda: scorer.scorer.held is None, "scoring resumed", 60)
    wait_for(
        lambda: sum(void_of(cql, u, p) for u, p in wave_b) >= len(wave_b) * 0.8,
        "the outage's storm voided", 90,
    )  # fmt: skip
    # every count equals its post's non-void liked edges, and stays so
    wait_for(lambda: scored(pairs + wave_b), "every like of the test scored", 60)
    truth = liked_edges(cql, pairs + wave_b)
    assert sum(truth.values()) <= HUMANS + 0.2 * 2 * BOTS * POSTS_PER_BOT  # the voids are out
    result = convergence.wait_converged(
        lambda: {p: stack_api(stack).count(p)["count"] for p in posts},
        {p: truth[p] for p in posts}, timeout_s=60,
    )  # fmt: skip
    assert result.converged, f"{result}; truth {dict(truth)}"


def void_of(cql: Session, user: str, post: str) -> bool:
    row = cql.execute(
        "SELECT void FROM edges WHERE user_id = %s AND kind = 'edge' AND ref = %s", (user, post)
    ).one()
    return bool(row and row.void)


def stack_api(stack: Stack) -> LikesClient:
    return LikesClient(stack.gateway_url, stack.gateway_url, attempts=8)


def sample(metric: object) -> float:
    return float(metric._value.get())  # type: ignore[attr-defined]
