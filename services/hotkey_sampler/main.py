"""The sampler's app: POST /v1/samples (the mirror's batches), GET /v1/top, and the publish loop.

uvicorn services.hotkey_sampler.main:create_app --factory
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Body, FastAPI, Query, Request
from prometheus_client import Counter, Gauge
from pydantic import BaseModel, Field

from services.common import http, observability
from services.contracts.settings import Settings
from services.hotkey_sampler.publisher import EtcdPublisher
from services.hotkey_sampler.settings import SamplerSettings
from services.hotkey_sampler.window import DecayingTopK

log = logging.getLogger("hotkey_sampler")

SAMPLES = Counter("likes_sampler_samples_total", "Sampled reads received")
PUBLISH_ERRORS = Counter("likes_sampler_publish_errors_total", "Failed publishes to etcd")
PUBLISHED = Gauge("likes_sampler_published_posts", "Posts currently flagged hot in etcd")


class Samples(BaseModel):
    post_ids: list[str] = Field(max_length=10_000)
    fraction: float = Field(0.01, gt=0, le=1, description="the mirror's sampling fraction")


class Hot(BaseModel):
    post_id: str
    rate: float


async def publish_loop(
    window: DecayingTopK, publisher: EtcdPublisher, cfg: SamplerSettings
) -> None:
    failing = False
    while True:
        try:
            await publisher.publish(window.top(cfg.top_k, cfg.min_rate), cfg.heat_rate)
            PUBLISHED.set(len(publisher.published.rates))
            if failing:
                log.info("etcd reachable again; flags republished")
            failing = False
        except asyncio.CancelledError:
            raise
        except Exception as e:
            PUBLISH_ERRORS.inc()
            if not failing:
                log.warning("publish failed", extra={"fields": {"error": repr(e)}})
            failing = True
            await publisher.reset()
        await asyncio.sleep(cfg.publish_interval_s)


def create_app(settings: Settings | None = None, cfg: SamplerSettings | None = None) -> FastAPI:
    settings = settings or Settings()
    cfg = cfg or SamplerSettings()
    observability.setup_logging("hotkey-sampler", settings.log_level)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        window = DecayingTopK(
            bucket_s=cfg.bucket_s, buckets=cfg.buckets, half_life_s=cfg.half_life_s
        )
        publisher = EtcdPublisher(
            settings.etcd_host, settings.etcd_port, lease_ttl_s=cfg.lease_ttl_s
        )
        app.state.window, app.state.publisher = window, publisher
        task = asyncio.create_task(publish_loop(window, publisher, cfg), name="publish")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await publisher.close()  # a clean stop revokes the lease: flags go at once

    app = FastAPI(title="likes hot-key sampler", version="1", lifespan=lifespan)

    @app.post("/v1/samples", status_code=202)
    async def samples(request: Request, body: Annotated[Samples, Body()]) -> dict[str, int]:
        window: DecayingTopK = request.app.state.window
        window.update_many(body.post_ids, weight=max(1, round(1 / body.fraction)))
        SAMPLES.inc(len(body.post_ids))
        return {"accepted": len(body.post_ids)}

    @app.get("/v1/top", response_model=list[Hot])
    async def top(request: Request, k: Annotated[int, Query(ge=1, le=1000)] = 20) -> list[Hot]:
        window: DecayingTopK = request.app.state.window
        return [Hot(post_id=p, rate=round(r, 1)) for p, r in window.top(k)]

    async def ready() -> dict[str, bool]:
        return {"window": hasattr(app.state, "window")}

    http.install(app, "hotkey-sampler", ready)
    return app
