"""The sampler's app: the gateway's mirrored copies of reads (on the read routes themselves),
GET /v1/top, and the publish loop.

python -m services.common.serve services.hotkey_sampler.main --port 8080 --ops-port 9100
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

from services.common import heap, http, observability, switches
from services.contracts import etcd, flags, routes
from services.contracts import metrics as metric_names
from services.contracts.workloads import HOTKEY_SAMPLER as WORKLOAD
from services.hotkey_sampler.publisher import EtcdPublisher
from services.hotkey_sampler.settings import SamplerSettings
from services.hotkey_sampler.window import DecayingTopK, with_hysteresis

log = logging.getLogger("hotkey_sampler")

SAMPLES = Counter(metric_names.SAMPLER_SAMPLES, "Sampled reads received")
PUBLISH_ERRORS = Counter("likes_sampler_publish_errors_total", "Failed publishes to etcd")
PUBLISHED = Gauge(metric_names.SAMPLER_PUBLISHED_POSTS, "Posts currently flagged hot in etcd")


class MirroredBatch(BaseModel):
    # the batch read's body as the client sent it; the sampler only counts the ids
    post_ids: list[str] = Field(max_length=1000)


class Hot(BaseModel):
    post_id: str
    rate: float


async def publish_loop(
    window: DecayingTopK,
    publisher: EtcdPublisher,
    cfg: SamplerSettings,
    kill: flags.Switches | None = None,
) -> None:
    """Publishes the window's top every interval. With `sampler-off` (or `panic`) engaged it
    publishes an empty top: what it had published is withdrawn at the next turn, and the window
    keeps sampling, so switching it back on publishes a current top at once."""
    failing = False
    while True:
        try:
            exit_rate = cfg.sampler_min_rate * cfg.sampler_exit_ratio
            top = with_hysteresis(
                window.top(2 * cfg.sampler_top_k, exit_rate),
                publisher.published.rates,
                cfg.sampler_top_k,
                cfg.sampler_min_rate,
                exit_rate,
            )
            if kill is not None and kill.engaged(flags.Switch.SAMPLER_OFF):
                top = []
            await publisher.publish(top, cfg.sampler_heat_rate)
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
        await asyncio.sleep(cfg.sampler_publish_interval_s)


def create_app(cfg: SamplerSettings | None = None) -> FastAPI:
    cfg = cfg or SamplerSettings()
    observability.setup_logging(WORKLOAD.name, cfg.log_level)
    observability.setup_tracing(WORKLOAD.name, cfg.otlp_endpoint)
    weight = max(1, round(100 / cfg.sampler_mirror_percent))  # reads one mirrored copy stands for

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        window = DecayingTopK(
            bucket_s=cfg.sampler_bucket_s,
            buckets=cfg.sampler_buckets,
            half_life_s=cfg.sampler_half_life_s,
        )
        publisher = EtcdPublisher(
            cfg.etcd_host,
            cfg.etcd_port,
            lease_ttl_s=cfg.sampler_lease_ttl_s,
            credentials=etcd.credentials(cfg),
            ca_file=cfg.tls_ca_file,
        )
        kill = flags.from_settings(cfg, gauge=switches.export)
        await kill.start()
        app.state.window, app.state.publisher = window, publisher
        task = asyncio.create_task(publish_loop(window, publisher, cfg, kill), name="publish")
        heap.settle()
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await publisher.close()  # a clean stop revokes the lease: flags go at once
            await kill.close()

    app = FastAPI(
        title="likes hot-key sampler",
        version="1",
        lifespan=lifespan,
        telemetry=observability.FASTAPI_TELEMETRY_OFF,
    )

    def sample(request: Request, post_ids: list[str]) -> dict[str, int]:
        window: DecayingTopK = request.app.state.window
        window.update_many(post_ids, weight=weight)
        SAMPLES.inc(len(post_ids))
        return {"accepted": len(post_ids)}

    # Envoy mirrors reads here as they are (fire and forget; the answer is thrown away)
    @app.get(routes.READ_TEMPLATE, status_code=202)
    async def mirrored_read(request: Request, post_id: str) -> dict[str, int]:
        return sample(request, [post_id])

    @app.post(routes.BATCH_READ_PATH, status_code=202)
    async def mirrored_batch(
        request: Request, body: Annotated[MirroredBatch, Body()]
    ) -> dict[str, int]:
        return sample(request, body.post_ids)

    @app.get("/v1/top", response_model=list[Hot])
    async def top(request: Request, k: Annotated[int, Query(ge=1, le=1000)] = 20) -> list[Hot]:
        window: DecayingTopK = request.app.state.window
        return [Hot(post_id=p, rate=round(r, 1)) for p, r in window.top(k)]

    async def ready() -> dict[str, bool]:
        return {"window": hasattr(app.state, "window")}

    http.install(app, WORKLOAD.name, ready)
    return app
