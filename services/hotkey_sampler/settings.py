"""The sampler's settings: the shared LIKES_* settings (etcd) plus its own LIKES_SAMPLER_* knobs."""

from __future__ import annotations

from pydantic import Field

from services.contracts.settings import Settings


class SamplerSettings(Settings):
    # the gateway mirrors this percentage of reads here: each sample stands for 100/percent reads
    # (the program renders it from the same stack value it gives Envoy)
    sampler_mirror_percent: float = Field(default=1.0, gt=0, le=100)
    sampler_top_k: int = 100  # posts published (the operator's cap applies after)
    sampler_min_rate: float = 200.0  # est. reads/s to be published at all
    # once published, a post stays until its rate falls below min_rate x this (hysteresis)
    sampler_exit_ratio: float = Field(default=0.5, gt=0, le=1)
    sampler_heat_rate: float = 1000.0  # est. reads/s for the "hot" CDN heat hint (5 s TTL)
    sampler_publish_interval_s: float = 0.25
    sampler_lease_ttl_s: int = 5  # a dead sampler's flags are gone this long after its last beat
    sampler_bucket_s: float = 0.25
    sampler_buckets: int = 20
    sampler_half_life_s: float = 1.0
