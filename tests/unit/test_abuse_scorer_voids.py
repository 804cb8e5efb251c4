"""How the scorer writes a batch's voids (services/abuse/scorer.Scorer._score_and_void): users'
at once, each user's in order, and a failure of one holds the batch only after every other void
was waited for and the storm watch saw each one that is done. The voids themselves, on the real
edge-store, are tests/integration/test_voids.py's and test_abuse.py's, the storm watch's count
tests/integration/test_abuse_storms.py's; here the writer and the watch only record their
calls."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Sequence
from typing import Any

import pytest

from services.abuse import features
from services.abuse.model_server import Verdicts
from services.abuse.scorer import Held, Scorer
from services.abuse.settings import ScorerSettings
from services.abuse.voids import Result
from services.contracts import degrade, events
from services.write.core import Unavailable

THRESHOLD = 0.5


class FixedModel:
    """Scores each row by its first feature (the test puts the probability there)."""

    def verdicts(self, rows: Sequence[Sequence[float]]) -> Verdicts:
        return Verdicts([float(r[0]) for r in rows], "v-test", THRESHOLD)


class PerLike:
    """void_many as the real voider answers it: each like's result in order, or the Unavailable
    that stopped it (the batching itself is tests/integration/test_voids.py's)."""

    def void(self, e: events.LikeEvent, version: str, score: float) -> Result:
        raise NotImplementedError

    def void_many(
        self, likes: Sequence[tuple[events.LikeEvent, float]], version: str
    ) -> list[Result | Unavailable]:
        out: list[Result | Unavailable] = []
        for e, score in likes:
            try:
                out.append(self.void(e, version, score))
            except Unavailable as exc:
                out.append(exc)
        return out


class Storms:
    """Records the voids the scorer counts for storms."""

    def __init__(self) -> None:
        self.voids: list[tuple[str, str, float]] = []

    def voided_many(self, voids: Sequence[tuple[str, str, float]]) -> list[bool]:
        self.voids += voids
        return [False] * len(voids)


def like(user: str) -> events.LikeEvent:
    return events.LikeEvent.new(
        intent_uuid=str(uuid.uuid4()), user_id=user, post_id=f"p-{uuid.uuid4().hex[:6]}",
        action="like", reaction="like", delta=1, region="local",
    )  # fmt: skip


def batch(scores: list[tuple[str, float]]) -> Held:
    width = len(features.FEATURE_NAMES)
    return Held([(like(u), [p] + [0.0] * (width - 1)) for u, p in scores], {("t", 0): 1})


def scorer(voider: Any, storms: Storms | None = None) -> Scorer:
    return Scorer(
        ScorerSettings(abuse_void_concurrency=8), consumer=None, deserialize=lambda *_: None,  # type: ignore[arg-type]
        features=None, model=FixedModel(), voider=voider, storms=storms,  # type: ignore[arg-type]
    )  # fmt: skip


def test_a_batchs_voids_are_written_at_once() -> None:
    """Eight flagged likes: each void waits for the other seven to start (a barrier), so the
    batch finishes only if they run together; one by one, the first would wait in vain."""
    flagged = 8
    barrier = threading.Barrier(flagged, timeout=20)
    voided: list[str] = []

    class Voider(PerLike):
        def void(self, e: events.LikeEvent, version: str, score: float) -> Result:
            barrier.wait()
            voided.append(e.intent_uuid)
            return Result(True, "voided")

    held = batch([(f"bot-{i}", 0.9) for i in range(flagged)] + [("human", 0.1)] * 3)
    scorer(Voider())._score_and_void(held)
    assert sorted(voided) == sorted(e.intent_uuid for e, row in held.likes if row[0] > THRESHOLD)


def test_one_users_voids_are_written_in_one_call_in_order() -> None:
    """A void is a lightweight transaction on the user's partition: a bot's burst voided all at
    once would contend in Paxos. Two bots, five likes each: the bots run at once (the barrier
    of their calls), each bot's voids in ONE call, in its likes' order (the voider batches
    them: one Paxos round for several)."""
    barrier = threading.Barrier(2, timeout=20)
    calls: dict[str, list[list[str]]] = {}
    lock = threading.Lock()

    class Voider:
        def void_many(
            self, likes: Sequence[tuple[events.LikeEvent, float]], version: str
        ) -> list[Result]:
            (user,) = {e.user_id for e, _ in likes}
            with lock:
                calls.setdefault(user, []).append([e.intent_uuid for e, _ in likes])
            barrier.wait()
            return [Result(True, "voided") for _ in likes]

    held = batch([(f"bot-{i % 2}", 0.9) for i in range(10)])
    scorer(Voider())._score_and_void(held)
    for user in ("bot-0", "bot-1"):
        assert calls[user] == [[e.intent_uuid for e, _ in held.likes if e.user_id == user]]


def test_one_failed_void_holds_the_batch_after_the_others_reach_the_storm_watch() -> None:
    storms = Storms()
    n = degrade.STORM_VOIDS

    class Voider(PerLike):
        def void(self, e: events.LikeEvent, version: str, score: float) -> Result:
            if e.user_id == "unlucky":
                raise Unavailable("edge-store", "timed out")
            return Result(True, "voided")

    held = batch([("unlucky", 0.9)] + [("bot", 0.9)] * n)
    with pytest.raises(Unavailable):
        scorer(Voider(), storms)._score_and_void(held)
    # all n of the bot's voids were counted before the batch was held
    assert [u for u, _, _ in storms.voids] == ["bot"] * n


def test_a_replayed_void_reaches_the_storm_watch_and_a_void_not_done_does_not() -> None:
    """A batch held (or handed over by a rebalance) after its voids applied finds them replayed:
    the storm watch may have missed them (it failed, or the process died), and it counts each
    like once, so they go to it again. A like voided by another model's void, taken back or
    superseded was not voided by this void: it is not counted."""
    storms = Storms()
    answers = {"bot": "voided", "again": "replayed", "other": "already-void", "gone": "not-liked"}

    class Voider(PerLike):
        def void(self, e: events.LikeEvent, version: str, score: float) -> Result:
            reason = answers[e.user_id]
            return Result(reason == "voided", reason)

    held = batch([(u, 0.9) for u in answers])
    scorer(Voider(), storms)._score_and_void(held)
    ids = {e.user_id: (e.user_id, e.intent_uuid, e.occurred_at / 1000) for e, _ in held.likes}
    assert storms.voids == [ids["bot"], ids["again"]]


def test_a_storm_watch_that_cannot_reach_the_idem_store_holds_the_batch_as_the_idem_stores() -> (
    None
):
    """The storm watch lives in the idem-store: its failure holds the batch (the retry counts
    the same voids again, harmlessly) and is the idem-store's, in the dependency metric and in
    readiness, not the edge-store's the voids were written to."""
    import redis

    from services.abuse import metrics
    from services.abuse import scorer as scorer_mod

    class Down(Storms):
        def voided_many(self, voids: Sequence[tuple[str, str, float]]) -> list[bool]:
            raise redis.exceptions.ConnectionError("idem-store unreachable (test)")

    class Voider(PerLike):
        def void(self, e: events.LikeEvent, version: str, score: float) -> Result:
            return Result(True, "voided")

    class Consumer:  # the Kafka consumer's pause/resume, which a held batch calls
        def pause(self, partitions: Any) -> None:
            self.paused = True

    def failures(dep: str) -> float:
        return metrics.DEPENDENCY_FAILURES.labels(dep)._value.get()

    sc = scorer(Voider(), Down())
    sc.consumer = Consumer()  # type: ignore[assignment]
    before = {d: failures(d) for d in scorer_mod.DEPENDENCIES}
    held = batch([("bot", 0.9)])
    sc._finish(held)
    assert sc.held is held and sc.consumer.paused  # type: ignore[attr-defined]
    grew = {d for d in scorer_mod.DEPENDENCIES if failures(d) > before[d]}
    assert grew == {scorer_mod.IDEM_STORE}
    assert sc.loop.waiting_for == scorer_mod.IDEM_STORE
