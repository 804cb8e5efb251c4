"""The sampler's knobs (LIKES_SAMPLER_*), beside the shared Settings (etcd address)."""

from __future__ import annotations

from pydantic_settings import BaseSettings, SettingsConfigDict


class SamplerSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LIKES_SAMPLER_", extra="ignore")

    top_k: int = 100  # posts published (the operator's cap applies after)
    min_rate: float = 200.0  # est. reads/s to be published at all
    heat_rate: float = 1000.0  # est. reads/s for the "hot" CDN heat hint (5 s TTL)
    publish_interval_s: float = 0.25
    lease_ttl_s: int = 5  # a dead sampler's flags are gone this long after its last keep-alive
    bucket_s: float = 0.25
    buckets: int = 20
    half_life_s: float = 1.0
