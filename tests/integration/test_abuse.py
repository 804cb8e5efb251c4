"""The abuse scorer on the real stack, as the program deploys it: the stack's own scorer and its
model server (the pod's sidecar, a process of its own here, speaking gRPC). A generated bot storm
through the gateway is scored, the bots' likes are voided, the storming accounts are degraded, and
every count equals the post's non-void liked edges (invariant 6). The model server going away (its
process stopped) defers scoring; the likes of the outage are voided once it is back. The scorer
killed mid-batch loses no void and applies none twice."""

from __future__ import annotations

import concurrent.futures as cf
import time
import uuid

import httpx
import pytest
from cassandra.cluster import Session
from prometheus_client.parser import text_string_to_metric_families

from infra import alert_rules
from infra import observability as obs
from local import transforms
from services.client import LikesClient
from services.contracts import clients, convergence, degrade, events, routes, signals, workloads
from services.contracts import kafka as kafka_contract
from services.contracts import metrics as metric_names
from tests.conftest import Stack
from tests.integration.test_alerts import _delivered
from tests.integration.test_data_path import liked_edges
from tests.integration.test_flags import wait_for

pytestmark = pytest.mark.stack

BOTS, HUMANS, POSTS_PER_BOT = 8, 12, 6


SCORER, MODEL = workloads.ABUSE_SCORER.name, workloads.ABUSE_MODEL.name


def metric(stack: Stack, name: str, of: str = SCORER, **labels: str) -> float:
    """The metric `name` of the stack's scorer (or `of`, its model server), its samples with
    `labels` summed, scraped from its ops port."""
    text = httpx.get(f"{stack.ops_url(of)}{workloads.METRICS_PATH}", timeout=5).text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
               if s.name == name and labels.items() <= s.labels.items())  # fmt: skip


def model_ready(stack: Stack) -> bool:
    try:
        r = httpx.get(f"{stack.ops_url(MODEL)}{workloads.READY_PATH}", timeout=2)
    except httpx.HTTPError:
        return False
    return r.status_code == 200


def ends(stack: Stack) -> dict[int, int]:
    """likes.committed's end offset per partition, now."""
    return clients.end_offsets(stack.kafka_config(), events.COMMITTED)


def scored_through(stack: Stack, marks: dict[int, int]) -> bool:
    """The stack scorer's group committed past `marks`: it commits only after a batch's voids are
    written, so every like before them is scored and its void (if any) is in the edge-store."""
    return clients.committed_through(
        stack.kafka_config(), kafka_contract.ABUSE_GROUP, events.COMMITTED, marks
    )


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


def subnet(tag: str) -> str:
    """A /24 of the benchmarking range (198.18.0.0/15) of this run's own: the stack's scorer
    remembers an hour of every earlier run, and rings of many runs on one /24 would look like
    one carrier NAT (many users, many likes) rather than a ring."""
    n = int(tag, 16)
    return f"198.{18 + (n >> 8) % 2}.{n % 256}"


def storm(
    stack: Stack, tag: str, posts: list[str], n_bots: int, wave: str, net: str | None = None
) -> list[tuple[str, str]]:
    """A ring of fresh accounts on one /24 (this run's, or `net`) sharing two devices, each liking
    every post within a second or two; returns the (user, post) pairs that were accepted (202)."""
    now = int(time.time())
    net = net or subnet(tag)
    jobs = [
        (f"bot-{wave}-{i}-{tag}", post, f"{net}.{10 + i}", f"ring-{tag}-{i % 2}", now - 3600)
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
        ip = f"100.{64 + i}.{int(tag[:2], 16)}.{7 + i}"  # a network of its own, each
        created = int(time.time()) - 400 * 86400
        assert like_as(stack, user, post, ip, f"phone-{tag}-{i}", created) == 202
        out.append((user, post))
        time.sleep(0.2)
    return out


def test_a_bot_storm_is_voided_and_counts_equal_the_non_void_edges(
    stack: Stack, cql: Session
) -> None:
    tag = uuid.uuid4().hex[:8]
    posts = [f"abuse-{tag}-{i}" for i in range(POSTS_PER_BOT)]
    degraded_before = metric(stack, metric_names.ABUSE_DEGRADED)
    began = time.time()
    pairs = humans(stack, tag, posts) + storm(stack, tag, posts, BOTS, "a")
    marks_a = ends(stack)

    def voided() -> int:
        return sum(1 for u, p in pairs if u.startswith("bot-") and void_of(cql, u, p))

    # most of the ring's likes voided; no human's
    wait_for(lambda: voided() >= BOTS * POSTS_PER_BOT * 0.8, "the storm voided", 90)
    wait_for(lambda: scored_through(stack, marks_a), "wave a scored", 60)
    assert not any(void_of(cql, u, p) for u, p in pairs if u.startswith("human-"))
    # the ring's accounts storming were degraded: the write path lets them like once a minute
    idem = clients.idem_store(stack.settings(), timeout=2.0)
    assert sum(degrade.is_degraded(idem, f"bot-a-{i}-{tag}") for i in range(BOTS)) >= BOTS // 2
    degraded = metric(stack, metric_names.ABUSE_DEGRADED) - degraded_before
    assert degraded >= BOTS // 2
    # the storm pages the abuse team: AbuseStorm reaches their receiver (the local rules are the
    # program's, time-scaled; the sink plays the receiver's integrations)
    wait_for(
        lambda: _delivered(stack, obs.ABUSE_RECEIVER, alert_rules.ABUSE_STORM, "firing", began),
        "AbuseStorm delivered to the abuse team", 90,
    )  # fmt: skip

    # the model server's process goes away: scoring is deferred (nothing skipped, nothing
    # committed), the outage's bot likes are counted meanwhile, then voided once it is back
    try:
        stack.cli("local", "stop", MODEL)
        wave_b = storm(stack, tag, posts, BOTS, "b")
        marks = ends(stack)
        wait_for(lambda: metric(stack, metric_names.ABUSE_DEFERRED) == 1, "scoring deferred", 30)
        r = httpx.get(f"{stack.ops_url(SCORER)}{workloads.READY_PATH}", timeout=5)
        assert r.status_code == 503, r.text  # not ready: its model is away
        time.sleep(3)  # the outage lasts: still deferred, still nothing of wave b voided
        assert metric(stack, metric_names.ABUSE_DEFERRED) == 1
        assert not any(void_of(cql, u, p) for u, p in wave_b)
        assert not scored_through(stack, marks)
    finally:
        stack.up()  # the model server back (whatever failed above)
    assert model_ready(stack)
    wait_for(lambda: metric(stack, metric_names.ABUSE_DEFERRED) == 0, "scoring resumed", 60)
    wait_for(
        lambda: sum(void_of(cql, u, p) for u, p in wave_b) >= len(wave_b) * 0.8,
        "the outage's storm voided", 90,
    )  # fmt: skip
    # the scorer killed (SIGKILL) while it voids a third ring's likes: it restarts from its last
    # committed offset (committed only after a batch's voids), so no void is lost, and a void it
    # attempts again finds its own (replayed): none counts twice (the counts below are exact)
    voids_before = metric(stack, metric_names.ABUSE_VOIDS)
    try:
        wave_c = storm(stack, tag, posts, BOTS, "c", net=subnet(tag[::-1]))
        marks = ends(stack)
        wait_for(lambda: metric(stack, metric_names.ABUSE_VOIDS) > voids_before,
                 "the scorer voiding wave c", 60)  # fmt: skip
        stack.cli("local", "stop", "--kill", SCORER)
    finally:
        stack.up()
    wait_for(
        lambda: sum(void_of(cql, u, p) for u, p in wave_c) >= len(wave_c) * 0.8,
        "the killed scorer's storm voided", 90,
    )  # fmt: skip
    # every like of the test scored (its void, if any, written), then every count equals its
    # post's non-void liked edges, and stays so
    wait_for(lambda: scored_through(stack, marks), "every like of the test scored", 60)
    truth = liked_edges(cql, pairs + wave_b + wave_c)
    assert sum(truth.values()) <= HUMANS + 0.2 * 3 * BOTS * POSTS_PER_BOT  # the voids are out
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


def test_a_scorer_whose_waiting_batch_is_revoked_is_ready_again(stack: Stack) -> None:
    """While the model server is away the scorer holds its batch and says so on /readyz. A
    rebalance hands the batch to the next owner: nothing waits on the model here any more, so
    an idle scorer must not stay unready (it did, until a batch of its own was scored: the game
    days found the stack's scorer unready long after the model was back)."""
    from services.abuse.main import build
    from services.abuse.settings import ScorerSettings

    env = stack.workload_env("read")  # the shared settings; the scorer's own are defaulted
    values = {k.removeprefix("LIKES_").lower(): v for k, v in env.items()}
    values = {k: v for k, v in values.items() if k in ScorerSettings.model_fields}
    # the feature-store's seeds: the scorer's alone (the read service is not told them)
    own = transforms.workload_env(stack.layout, workloads.ABUSE_SCORER.name)
    values["feature_store_nodes"] = own["LIKES_FEATURE_STORE_NODES"]
    s = ScorerSettings.model_validate({
        **values, "abuse_group_id": f"test-revoke-{uuid.uuid4().hex[:8]}",
        "abuse_model_target": "127.0.0.1:1", "abuse_model_timeout_s": 0.5,  # nothing listens
        "abuse_batch": 20,
    })  # fmt: skip
    built = build(s)
    scorer = built.scorer
    try:
        scorer.consumer.subscribe(
            [s.source_topic], on_assign=scorer._on_assign, on_revoke=scorer._on_revoke
        )
        deadline = time.monotonic() + 60
        while scorer.held is None:  # a new group reads the topic from its start: likes to score
            assert time.monotonic() < deadline, "the scorer never held a batch for the model"
            scorer.step()
        assert scorer.ready()["model"] is False
        scorer.consumer.unsubscribe()  # the rebalance a new member or a lost session brings
        for _ in range(20):
            scorer.step()
            if not scorer.assigned:
                break
        assert scorer.assigned == [] and scorer.held is None
        assert scorer.ready()["model"] is True
    finally:
        scorer.consumer.close()
        built.close()


def test_a_published_version_that_does_not_load_files_a_ticket_and_the_previous_serves_on(
    stack: Stack,
) -> None:
    """A broken publish made current with `likes abuse use` (a model file truncated on its way
    to the models volume): the model server serves the version it had, says so on its metric,
    AbuseModelErrors (reason load-failed) files a ticket (labelled team=abuse), `likes runbook
    diagnose` finds it; `use` of the version serving again resolves it."""
    import shutil

    from services.abuse import features, model
    from services.abuse.model_server import ModelClient
    from tests.integration.test_alerts import _diagnosis_sees_trouble

    models = stack.layout.abuse_models
    serving = model.current_version(models)
    assert serving is not None
    bad = f"{serving}-broken-{uuid.uuid4().hex[:6]}"
    shutil.copytree(models / serving, models / bad)
    (models / bad / model.MODEL_FILE).write_bytes(b"\x80\x04truncated")

    def failing() -> float:
        return metric(stack, metric_names.ABUSE_MODEL_LOAD_FAILING, MODEL, version=bad)

    began = time.time()
    try:
        stack.cli("abuse", "use", bad, "--yes")
        wait_for(lambda: failing() == 1, "the model server reporting the version it cannot load",
                 30)  # fmt: skip
        target = f"{stack.host}:{stack.layout.ports.abuse_model}"
        with ModelClient(target, timeout=5) as client:
            row = [0.0] * len(features.FEATURE_NAMES)
            assert client.verdicts([row]).version == serving  # the previous serves on
        assert model_ready(stack)
        wait_for(
            lambda: _delivered(
                stack, obs.TICKET_RECEIVER, alert_rules.ABUSE_MODEL_ERRORS, "firing", began
            ),
            "AbuseModelErrors delivered as a ticket", 90,
        )  # fmt: skip
        _diagnosis_sees_trouble(stack, alert_rules.ABUSE_MODEL_ERRORS)
    finally:
        stack.cli("abuse", "use", serving, "--yes")  # the rollback
    wait_for(lambda: failing() == 0, "the load failure cleared", 30)
    wait_for(
        lambda: _delivered(
            stack, obs.TICKET_RECEIVER, alert_rules.ABUSE_MODEL_ERRORS, "resolved", began
        ),
        "AbuseModelErrors resolved", 90,
    )  # fmt: skip
    shutil.rmtree(models / bad)
