"""The aggregator's settings: the shared LIKES_* settings plus its own knobs (LIKES_AGG_*)."""

from __future__ import annotations

from typing import Literal

from pydantic import SecretStr, model_validator

from services.aggregator import purge
from services.contracts import convergence, events
from services.contracts import kafka as kafka_contract
from services.contracts.settings import HotPoolSettings


class AggregatorSettings(HotPoolSettings):
    agg_group_id: str = kafka_contract.AGGREGATOR_GROUP
    # topic names are events.EVENT_TOPICS / DEAD_LETTER behind this prefix (a bench or a test can
    # run on its own copies of the topics)
    agg_topic_prefix: str = ""
    agg_window_ms: int = int(convergence.AGG_WINDOW_S * 1000)
    agg_window_max_events: int = 200_000  # flush early: bounds a catch-up window's memory
    agg_window_max_stretch_ms: int = 10_000  # back-pressure: a slow flush lengthens windows
    # Dedup bound, per partition: intents no older than `agg_dedup_horizon_s` (by message time),
    # at most `agg_dedup_capacity` of them. Duplicate publications (the writer's late ack and the
    # relay's republish, contracts/convergence.py) arrive within HOLD_S; the horizon is twice
    # that. The capacity is sized from the partition's peak rate, so the count bound never cuts
    # the horizon short (review D4: 100 k intents were ~16 s of a hot partition, less than the
    # relay's republish horizon). A duplicate later than the horizon counts twice: the
    # reconciler (`likes recount`) repairs it, and likes_aggregator_dedup_horizon_seconds shows
    # the horizon each partition really holds.
    agg_dedup_horizon_s: float = 2 * convergence.HOLD_S
    agg_dedup_peak_rate: int = 6000  # events/s of the hottest partition (a split viral post)
    agg_dedup_capacity: int = 0  # 0: peak_rate x horizon
    agg_cell_cache_size: int = 500_000
    agg_poison_attempts: int = 3
    agg_store_concurrency: int = 64
    agg_cache_ttl_s: int = 7 * 86400  # aggregate + sub-counters expire when a post goes cold
    agg_auto_offset_reset: Literal["earliest", "latest"] = "earliest"
    # peer regions whose events MirrorMaker 2 mirrors here (comma-separated): consumed to refresh
    # the aggregates and has_liked filters of their posts, never counted (their own aggregator
    # counts them into their cells, which reach this region through the counter-store's DCs)
    agg_peer_regions: str = ""
    agg_remote_recheck_s: float = 30.0  # re-read a post once more after a peer's event
    # copy every aggregate written into all hot pools for hotkeys.ALWAYS_REPLICATE_TTL_S, before
    # any sampler flags the post (the seed's flash-spike mitigation; best effort, never blocks)
    agg_always_replicate: bool = True
    # a test hook: exit the process abruptly at this point of the first non-empty flush
    agg_test_crash: Literal["", "after-cells", "after-cache"] = ""

    cdn_purger: Literal["recording", "cloudflare", "none"] = "recording"
    cloudflare_zone_id: str = ""
    cloudflare_api_token: SecretStr = SecretStr("")
    cloudflare_api_url: str = purge.CLOUDFLARE_API  # the local stack points it at its sink

    @model_validator(mode="after")
    def _local_only_knobs(self) -> AggregatorSettings:
        if self.env != "local":
            if self.agg_test_crash:
                raise ValueError("LIKES_AGG_TEST_CRASH is a test hook; refused outside env=local")
            # a deployed aggregator purges the real CDN, or counts stay stale for a TTL (the
            # local stack keeps `cloudflare` and points its API URL at a local sink)
            if self.cdn_purger != "cloudflare":
                raise ValueError(
                    f"env={self.env} purges through Cloudflare: LIKES_CDN_PURGER=cloudflare"
                )
        if self.cdn_purger == "cloudflare" and not (
            self.cloudflare_zone_id and self.cloudflare_api_token.get_secret_value()
        ):
            raise ValueError("cloudflare purger needs LIKES_CLOUDFLARE_ZONE_ID and _API_TOKEN")
        return self

    @property
    def dedup_capacity(self) -> int:
        return self.agg_dedup_capacity or int(self.agg_dedup_peak_rate * self.agg_dedup_horizon_s)

    def topic(self, name: str) -> str:
        return self.agg_topic_prefix + name

    @property
    def source_topics(self) -> list[str]:
        return [self.topic(t) for t in events.EVENT_TOPICS]

    @property
    def mirrored_topics(self) -> list[str]:
        peers = [p.strip() for p in self.agg_peer_regions.split(",") if p.strip()]
        return [self.topic(events.mirrored(p, t)) for p in peers for t in events.EVENT_TOPICS]

    @property
    def dead_letter_topic(self) -> str:
        return self.topic(events.DEAD_LETTER)
