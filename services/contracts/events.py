"""The like event: its Avro schema, topics, and the (de)serializers bound to the registry."""

from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

AVRO_DIR = Path(__file__).resolve().parent / "avro"
LIKE_EVENT_SCHEMA = (AVRO_DIR / "like_event.avsc").read_text()

COMMITTED = "likes.committed"
VOIDED = "likes.voided"
UNVOIDED = "likes.unvoided"
DEAD_LETTER = "likes.dead-letter"
EVENT_TOPICS = (COMMITTED, VOIDED, UNVOIDED)


def mirrored(peer_region: str, topic: str) -> str:
    """A peer region's topic as MirrorMaker 2 names it here (DefaultReplicationPolicy, the
    source cluster's alias = the peer's region: infra/kafka.py `_mirror`)."""
    return f"{peer_region}.{topic}"


Action = Literal["like", "unlike", "void", "unvoid"]
SIGNAL_FIELDS = ("client_ip", "device", "account_created")  # optional: services/contracts/signals
VOID_FIELDS = ("subject_event_id", "subject_intent_uuid", "model_version", "abuse_score")
OPTIONAL_FIELDS = (*SIGNAL_FIELDS, *VOID_FIELDS)  # null by default, absent from older schemas


@dataclass(frozen=True)
class LikeEvent:
    event_id: str
    intent_uuid: str
    user_id: str
    post_id: str
    action: Action
    reaction: str
    delta: int
    region: str
    shard: int
    occurred_at: int  # epoch milliseconds
    # abuse signals (services/contracts/signals.py): optional, null in events written before them
    client_ip: str | None = None
    device: str | None = None
    account_created: int | None = None  # epoch milliseconds
    # void and unvoid events (services/abuse/voids.py): the like they act on, and the model
    subject_event_id: str | None = None
    subject_intent_uuid: str | None = None
    model_version: str | None = None
    abuse_score: float | None = None

    @classmethod
    def new(
        cls,
        *,
        intent_uuid: str,
        user_id: str,
        post_id: str,
        action: Action,
        reaction: str,
        delta: int,
        region: str,
        shard: int = 0,
        client_ip: str | None = None,
        device: str | None = None,
        account_created: int | None = None,
    ) -> LikeEvent:
        return cls(
            event_id=str(uuid.uuid4()),
            intent_uuid=intent_uuid,
            user_id=user_id,
            post_id=post_id,
            action=action,
            reaction=reaction,
            delta=delta,
            region=region,
            shard=shard,
            occurred_at=int(time.time() * 1000),
            client_ip=client_ip,
            device=device,
            account_created=account_created,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LikeEvent:
        at = d["occurred_at"]
        if not isinstance(at, int):  # fastavro turns timestamp-millis into a datetime
            at = int(at.timestamp() * 1000)
        created = d.get("account_created")
        if created is not None and not isinstance(created, int):
            created = int(created.timestamp() * 1000)
        fields: dict[str, Any] = {
            k: d[k] if k not in OPTIONAL_FIELDS else d.get(k) for k in cls.__dataclass_fields__
        }  # older schemas lack some
        return cls(**{**fields, "occurred_at": at, "account_created": created})  # fmt: skip


def subject(topic: str) -> str:
    """Confluent's default TopicNameStrategy."""
    return f"{topic}-value"
