"""Voids and unvoids on the real stack (services/abuse/voids.py): likes written through the gateway,
voided and unvoided against the edge-store and Kafka, counted by the stack's aggregator. The
counts must converge to the non-void liked edges (invariant 6), whatever the order of events."""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Iterator

import pytest
from cassandra.cluster import Session
from confluent_kafka import Producer
from confluent_kafka.serialization import MessageField, SerializationContext

from services.abuse import voids
from services.client import LikesClient, RetryableStatus
from services.contracts import clients, degrade, events, keys, workloads
from services.write.core import Publisher
from tests.conftest import Stack
from tests.integration.test_data_path import converge, liked_edges
from tests.integration.test_flags import wait_for

pytestmark = pytest.mark.stack

MODEL = "v-test"


@pytest.fixture(scope="module")
def api(stack: Stack) -> LikesClient:
    return LikesClient(stack.gateway_url, stack.gateway_url, attempts=8, vary_client_ip=True)


@pytest.fixture(scope="module")
def voider(stack: Stack, cql: Session) -> Iterator[voids.Voider]:
    settings = stack.settings()
    publisher = Publisher(clients.producer(settings))
    yield voids.Voider(
        session=cql, publisher=publisher, region=settings.region,
        serialize=clients.like_serializer(clients.schema_registry(settings)),
    )  # fmt: skip
    publisher.close()


def like(stack: Stack, api: LikesClient, user: str, post: str, action: str = "like") -> str:
    """A like (or unlike) through the gateway; its intent."""
    key = str(uuid.uuid4())
    r = api.like(post, action, idempotency_key=key, token=stack.token(user))
    assert r.status_code == 202, r.text
    return key


def like_event(user: str, post: str, intent: str, region: str) -> events.LikeEvent:
    """The like as the scorer reads it off likes.committed (what a void needs of it)."""
    return events.LikeEvent.new(intent_uuid=intent, user_id=user, post_id=post, action="like",
                                reaction="like", delta=1, region=region)  # fmt: skip


def liked_twice(
    stack: Stack, api: LikesClient, prefix: str, tag: str, kinds: tuple[str, ...]
) -> tuple[dict[str, str], dict[str, str], dict[str, str], str]:
    """A post per kind, liked by its own user (post, user and intent by kind) and by one
    bystander, both counted. The bystander's like makes a count one too low read 0, not a
    -1 the read path clamps to 0."""
    post = {k: f"{prefix}-{k}-{tag}" for k in kinds}
    user = {k: f"u-{k}-{tag}" for k in kinds}
    intent = {k: like(stack, api, user[k], post[k]) for k in kinds}
    bystander = f"u-bystander-{tag}"
    for p in post.values():
        like(stack, api, bystander, p)
    wait_for(lambda: all(api.count(p)["count"] == 2 for p in post.values()), "likes counted", 60)
    return post, user, intent, bystander


def edge(cql: Session, user: str, post: str) -> tuple[str, bool, uuid.UUID | None]:
    row = cql.execute(
        "SELECT state, void, void_id FROM edges WHERE user_id = %s AND kind = 'edge' AND ref = %s",
        (user, post),
    ).one()
    return (row.state, bool(row.void), row.void_id)


def test_voids_and_unvoids_keep_counts_equal_to_the_non_void_edges(
    stack: Stack, api: LikesClient, cql: Session, voider: voids.Voider
) -> None:
    tag = uuid.uuid4().hex[:8]
    region = stack.settings().region
    kinds = ("voided", "unliked", "unvoided", "relike", "relayed", "control")
    post, user, intent, bystander = liked_twice(stack, api, "void", tag, kinds)

    # voided: the edge's current intent, once; a retry finds its own void, another model's void
    # finds the edge void already
    ev = like_event(user["voided"], post["voided"], intent["voided"], region)
    first = voider.void(ev, MODEL, 0.97)
    assert (first.applied, first.reason, first.published) == (True, "voided", True)
    assert first.event is not None and first.event.subject_intent_uuid == intent["voided"]
    assert edge(cql, user["voided"], post["voided"]) == (
        "liked",
        True,
        uuid.UUID(voids.void_intent(intent["voided"], MODEL)),
    )
    assert voider.void(ev, MODEL, 0.97).reason == "replayed"
    assert voider.void(ev, "v-other", 0.99).reason == "already-void"

    # unliked while void: the unlike subtracts nothing, and the void can no longer be taken back
    ev = like_event(user["unliked"], post["unliked"], intent["unliked"], region)
    unliked_void = voider.void(ev, MODEL, 0.9)
    assert unliked_void.applied and unliked_void.event is not None
    like(stack, api, user["unliked"], post["unliked"], "unlike")
    assert voider.unvoid(unliked_void.event).reason == "not-liked"

    # unvoided: back in the count; a second unvoid changes nothing
    ev = like_event(user["unvoided"], post["unvoided"], intent["unvoided"], region)
    v = voider.void(ev, MODEL, 0.9)
    assert v.applied and v.event is not None
    wait_for(lambda: api.count(post["unvoided"])["count"] == 1, "the void counted", 60)
    back = voider.unvoid(v.event)
    assert (back.applied, back.reason) == (True, "unvoided")
    assert voider.unvoid(v.event).reason == "not-void"

    # liked again since (unlike, like: a new intent): the old intent's void does not apply
    like(stack, api, user["relike"], post["relike"], "unlike")
    like(stack, api, user["relike"], post["relike"])
    ev = like_event(user["relike"], post["relike"], intent["relike"], region)
    assert voider.void(ev, MODEL, 0.9).reason == "superseded"

    # a void whose process dies before it publishes (here: a producer that never reaches a
    # broker): the void's edge write and its outbox row are one batch, so the relay publishes it
    dead = Publisher(Producer({"bootstrap.servers": "127.0.0.1:1", "message.timeout.ms": 500}))
    ser = clients.like_serializer(clients.schema_registry(stack.settings()))
    v = voids.Voider(session=cql, publisher=dead, region=region, publish_wait_s=0.5, serialize=ser)
    try:
        ev = like_event(user["relayed"], post["relayed"], intent["relayed"], region)
        result = v.void(ev, MODEL, 0.99)
    finally:
        dead.close(timeout=1)
    assert (result.applied, result.published) == (True, False)

    want = {"voided": 1, "unliked": 1, "unvoided": 2, "relike": 2, "relayed": 1, "control": 2}
    truth = liked_edges(cql, [(u, post[k]) for k in post for u in (user[k], bystander)])
    assert {k: truth[post[k]] for k in post} == want  # the edge-store agrees with the plan
    early = void_before_its_like(stack, api)
    burst = a_burst_voided_in_batches(stack, api, cql, voider)
    # one convergence hold for all of them (each is ~30 s of the suite's critical path)
    converge(api, {**{post[k]: n for k, n in want.items()}, early: 1, **burst})


def a_burst_voided_in_batches(
    stack: Stack, api: LikesClient, cql: Session, voider: voids.Voider
) -> dict[str, int]:
    """A bot's burst: one user likes VOID_BATCH + 2 posts (each liked by a user of its own too),
    and takes the last like back before the scorer gets to it. `void_many` writes the first
    VOID_BATCH voids as one conditional batch (one write timestamp for all their edges); the
    second chunk's batch fails on the unliked edge, so each of its voids answers for itself.
    The stack's own scorer is paused meanwhile (SIGSTOP): it would void the burst with its
    model first. Returns the posts and the non-void liked edges their counts must reach (the
    scorer judges the backlog once resumed)."""
    tag = uuid.uuid4().hex[:8]
    region = stack.settings().region
    bot = f"u-burst-{tag}"
    posts = [f"burst-{i}-{tag}" for i in range(voids.VOID_BATCH + 2)]
    others = [(f"u-burst-by-{i}-{tag}", p) for i, p in enumerate(posts)]  # one like each: human
    scorer = stack.pid(workloads.ABUSE_SCORER.name)
    os.kill(scorer, signal.SIGSTOP)
    try:
        intents = [like(stack, api, bot, p) for p in posts]
        for user, p in others:
            like(stack, api, user, p)
        like(stack, api, bot, posts[-1], "unlike")
        burst = [(like_event(bot, p, i, region), 0.99) for p, i in zip(posts, intents, strict=True)]
        results = voider.void_many(burst, MODEL)
        again = voider.void_many(burst, MODEL)  # a replay (a scorer crashed before its commit)
    finally:
        os.kill(scorer, signal.SIGCONT)
    reasons = [r.reason for r in results if isinstance(r, voids.Result)]
    assert reasons == ["voided"] * (len(posts) - 1) + ["not-liked"], results
    assert all(r.published for r in results[:-1] if isinstance(r, voids.Result)), results
    stamps = {
        row.ref: row.stamp
        for row in cql.execute(
            "SELECT ref, writetime(void_id) AS stamp FROM edges "
            "WHERE user_id = %s AND kind = 'edge'",
            (bot,),
        )
    }
    assert len({stamps[p] for p in posts[: voids.VOID_BATCH]}) == 1, stamps  # one batch
    assert stamps[posts[voids.VOID_BATCH]] != stamps[posts[0]], stamps  # the fallback, alone
    # nothing is voided twice: the replay finds its own voids
    assert [r.reason for r in again if isinstance(r, voids.Result)] == ["replayed"] * (
        len(posts) - 1
    ) + ["not-liked"], again
    truth = liked_edges(cql, [(bot, p) for p in posts] + others)
    assert all(truth[p] <= 1 for p in posts), truth  # the bot's likes are void or taken back
    return {p: truth[p] for p in posts}


def void_before_its_like(stack: Stack, api: LikesClient) -> str:
    """The aggregator reads likes.voided and likes.committed at their own pace: a void may be
    folded first. Its -1 waits in the voided topic's cell; the sum is exact once both are in.
    Returns the post, whose count must converge to 1."""
    tag = uuid.uuid4().hex[:8]
    region = stack.settings().region
    post = f"void-early-{tag}"
    ser = clients.like_serializer(clients.schema_registry(stack.settings()))
    like_ev = like_event(f"u-{tag}", post, str(uuid.uuid4()), region)
    void_ev = events.LikeEvent.new(
        intent_uuid=voids.void_intent(like_ev.intent_uuid, MODEL), user_id=like_ev.user_id,
        post_id=post, action="void", reaction="like", delta=-1, region=region,
    )  # fmt: skip
    p = Producer(stack.kafka_config())

    def send(topic: str, e: events.LikeEvent) -> None:
        value = ser(e, SerializationContext(topic, MessageField.VALUE))
        p.produce(topic, key=keys.kafka_key(post, 0), value=value)
        assert p.flush(30) == 0

    other = like_event(f"u-other-{tag}", post, str(uuid.uuid4()), region)
    send(events.COMMITTED, other)  # another user's like: 1
    wait_for(lambda: api.count(post)["count"] == 1, "the other like counted", 60)
    send(events.VOIDED, void_ev)  # the void of a like not yet in: its -1 is held, 1 - 1 = 0
    wait_for(lambda: api.count(post)["count"] == 0, "the early void folded", 60)
    send(events.COMMITTED, like_ev)  # the like lands: exact, and it stays so
    return post


def test_a_bad_models_voids_are_undone_and_counts_return_exactly(
    stack: Stack, api: LikesClient, cql: Session, voider: voids.Voider
) -> None:
    # `likes abuse unvoid --model-version V`: the seed's cleanup after a bad model deploy
    tag = uuid.uuid4().hex[:8]
    region = stack.settings().region
    bad, good = f"bad-{tag}", f"good-{tag}"
    post, user, intent, _ = liked_twice(stack, api, "unvoid", tag, ("restored", "unliked", "good"))
    for k, model in (("restored", bad), ("unliked", bad), ("good", good)):
        assert voider.void(like_event(user[k], post[k], intent[k], region), model, 0.95).applied
    like(stack, api, user["unliked"], post["unliked"], "unlike")  # while void: no second -1
    wait_for(lambda: all(api.count(p)["count"] == 1 for p in post.values()), "voids counted", 60)

    def unvoid() -> dict[str, object]:
        proc = stack.cli("abuse", "unvoid", "--model-version", bad, "--since", "10m", "--yes",
                         "--json")  # fmt: skip
        out: dict[str, object] = json.loads(proc.stdout)
        return out

    first = unvoid()
    assert (first["voids"], first["results"]) == (2, {"unvoided": 1, "not-liked": 1}), first
    again = unvoid()  # changes nothing: the edge it unvoided is no longer void
    assert again["results"] == {"not-void": 1, "not-liked": 1}, again
    # restored: its like counts again; unliked: the user took it back, so only the bystander's;
    # the other model's void stands
    converge(api, {post["restored"]: 2, post["unliked"]: 1, post["good"]: 1})
    trail = json.loads(stack.cli("audit", "--since", "10m", "--json").stdout)
    runs = [r for r in trail if r["command"] == "abuse unvoid"
            and r["args"]["model_version"] == bad]  # fmt: skip
    details = [r["detail"] for r in sorted(runs, key=lambda r: r["at"])]
    assert details == [first["results"], again["results"]], runs


def test_a_degraded_account_likes_once_a_minute_and_unlikes_freely(
    stack: Stack, cql: Session
) -> None:
    # the seed's storm answer: the scorer degrades the account (services/contracts/degrade.py)
    # and the write path admits one like per GATE_S from it, before writing anything
    one_try = LikesClient(stack.gateway_url, stack.gateway_url, attempts=1, vary_client_ip=True)
    tag = uuid.uuid4().hex[:8]
    u = f"u-storm-{tag}"
    idem = clients.idem_store(stack.settings(), timeout=2.0)
    assert degrade.degrade(idem, u) and not degrade.degrade(idem, u)  # once
    tok = stack.token(u)
    first = one_try.like(f"storm-a-{tag}", token=tok)
    assert first.status_code == 202, first.text
    with pytest.raises(RetryableStatus) as refused:  # the client does not retry it (attempts=1)
        one_try.like(f"storm-b-{tag}", token=tok)
    second = refused.value.response
    assert second.status_code == 429, second.text
    assert second.json()["error"]["code"] == "degraded_account"
    assert 0 < int(second.headers["Retry-After"]) <= degrade.GATE_S
    assert edge(cql, u, f"storm-a-{tag}")[0] == "liked"
    assert (
        cql.execute(
            "SELECT state FROM edges WHERE user_id = %s AND kind = 'edge' AND ref = %s",
            (u, f"storm-b-{tag}"),
        ).one()
        is None
    )  # the refused like wrote nothing
    assert one_try.like(f"storm-a-{tag}", "unlike", token=tok).status_code == 202
    # on-call lifts it (the AbuseStorm runbook's step), audited; the next like goes through
    out = stack.cli("abuse", "restore", u, "never-degraded", "--yes", "--json").stdout
    lifted = json.loads(out)
    assert lifted == {"restored": [u], "not_degraded": ["never-degraded"]}
    assert not degrade.is_degraded(idem, u)
    assert one_try.like(f"storm-b-{tag}", token=tok).status_code == 202
