"""The abuse scorer's settings: the shared LIKES_* settings plus its own (LIKES_ABUSE_*)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from services.contracts import events, workloads
from services.contracts import kafka as kafka_contract
from services.contracts.settings import FeatureStoreSettings

MODEL_PORT = workloads.ABUSE_MODEL.port  # the model server's gRPC port (the pod's sidecar)

# Where the features' state lives (services/abuse/scorer.py): this process's memory, right for
# one replica only (likes.committed is keyed by post: each replica reads a share of every user's
# likes), or the feature-store, shared by every replica (services/abuse/shared_features.py).
FeatureStore = Literal["memory", "shared"]


def feature_store_for(max_replicas: int) -> FeatureStore:
    """The store a scorer that may run `max_replicas` replicas must use (the program renders
    it from the workload's scale, so the two cannot disagree)."""
    return "shared" if max_replicas > 1 else "memory"


class ScorerSettings(FeatureStoreSettings):
    abuse_group_id: str = kafka_contract.ABUSE_GROUP
    # topic names behind this prefix (a test or a benchmark runs on its own copies of the topics)
    abuse_topic_prefix: str = ""
    abuse_model_target: str = workloads.ABUSE_MODEL.target  # host:port of the model server
    abuse_model_timeout_s: float = Field(default=2.0, gt=0)  # one Score call's deadline
    abuse_batch: int = Field(default=500, gt=0)  # events per consume and per Score call
    abuse_retry_max_s: float = Field(default=5.0, gt=0)  # backoff cap while deferring
    # a batch's voids written at once (each a marker, a conditional batch and an acked publish:
    # one by one they capped the scorer at ~1,300 likes/s in bench/bench_abuse.py)
    abuse_void_concurrency: int = Field(default=32, gt=0)
    abuse_feature_store: FeatureStore = "memory"

    def topic(self, name: str) -> str:
        return f"{self.abuse_topic_prefix}{name}"

    @property
    def source_topic(self) -> str:
        return self.topic(events.COMMITTED)
