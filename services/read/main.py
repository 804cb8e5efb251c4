"""The read service's app: settings, stores and the heat source in the lifespan, the routes, and a
last-resort middleware that turns any exception or 5xx on /v1 into a degraded 200.

    python -m services.common.serve services.read.main --port 8080 --ops-port 9100
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.common import heap, http, observability, switches
from services.contracts import etcd, flags, workloads
from services.contracts import hotkeys as hotkey_flags
from services.contracts.settings import HotPoolSettings
from services.read import api, fast, hotkeys
from services.read.core import Reader
from services.read.heat import EtcdHeat, HeatSource, SwitchedHeat
from services.read.metrics import DEGRADED
from services.read.stores import CassandraStore, FilterRebuilder, RedisCountCache

log = logging.getLogger("read")
BREAKER_PROBE_S = 1.0  # under every breaker's cooldown: a closed dependency is seen within ~1 s


class NeverFail:
    """Pure ASGI (no per-request task like BaseHTTPMiddleware): if a /v1 route raises or starts a
    5xx before anything was sent, answer 200 with the degraded body instead (invariant 3)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        started = False
        swallow = False

        async def guarded(message: Message) -> None:
            nonlocal started, swallow
            if message["type"] == "http.response.start":
                if message["status"] >= 500:
                    swallow = True
                    return
                started = True
            elif swallow:
                return
            await send(message)

        try:
            await self.app(scope, receive, guarded)
        except Exception:
            if started:
                raise
            log.exception("unexpected failure; answering degraded")
            swallow = True
        if not swallow:
            return
        DEGRADED.labels("middleware").inc()
        app_state = getattr(scope.get("app"), "state", None)
        reader = getattr(app_state, "reader", None)
        post_ids = scope.get("state", {}).get("post_ids")
        body = json.dumps(api.degraded_body(reader, scope["path"], post_ids)).encode()
        headers: list[tuple[bytes, bytes]] = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            (b"cache-control", api.PRIVATE.encode()),
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})


async def _probe_breakers(reader: Reader, every_s: float = BREAKER_PROBE_S) -> None:
    """A breaker whose dependency no read reaches still closes once the dependency is back."""
    while True:
        await asyncio.sleep(every_s)
        try:
            await reader.probe_open_breakers()
        except Exception as e:  # the next turn tries again; reads never depend on this task
            log.warning("breaker trial failed", extra={"fields": {"error": repr(e)}})


def create_app(
    settings: HotPoolSettings | None = None,
    *,
    heat: HeatSource | None = None,
    reader_options: dict[str, Any] | None = None,
    fast_path: bool = True,
) -> FastAPI:
    """`heat` replaces the etcd heat source (tests, benchmarks); `reader_options` are passed to
    core.Reader (timeouts, breakers, clock); `fast_path=False` serves every request through the
    FastAPI routes (the equivalence tests compare the two)."""
    settings = settings or HotPoolSettings()
    observability.setup_logging(workloads.READ.name, settings.log_level)
    observability.setup_tracing(workloads.READ.name, settings.otlp_endpoint)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        cache = RedisCountCache(settings)
        store = CassandraStore(settings)
        etcd_login = etcd.credentials(settings)
        heat_source = heat or EtcdHeat(
            settings.etcd_host, settings.etcd_port, credentials=etcd_login,
            ca_file=settings.tls_ca_file,
        )  # fmt: skip
        await store.start()  # connects in the background: the service answers without Cassandra
        await cache.warm_up()
        kill = flags.from_settings(settings, gauge=switches.export)
        await kill.start()
        heat_source = SwitchedHeat(heat_source, kill)
        await heat_source.start()
        pools_view = hotkey_flags.PrefixView(
            settings.etcd_host, settings.etcd_port, hotkey_flags.HOTPOOL_PREFIX,
            hotkey_flags.decode_pools, credentials=etcd_login,
            ca_file=settings.tls_ca_file,
        )  # fmt: skip
        await pools_view.start()
        hot_cache = hotkeys.HotPoolCountCache(
            cache,
            pools_view,
            password=settings.redis_auth,
            pools=[f"{h}:{p}" for h, p in settings.hot_pool_addresses],
            switches=kill,
            fill_from=cache.aggregate_hash,
        )
        app.state.settings = settings
        app.state.cache, app.state.store, app.state.heat = cache, store, heat_source
        rebuilder = FilterRebuilder(cache, store)
        options = {"rebuild_filter": rebuilder.request, **(reader_options or {})}
        app.state.reader = reader = Reader(hot_cache, store, **options)
        trials = asyncio.create_task(_probe_breakers(reader), name="breaker-trials")
        heap.settle()
        try:
            yield
        finally:
            trials.cancel()
            await rebuilder.close()
            await pools_view.close()
            await hot_cache.close()
            await heat_source.close()
            await kill.close()
            await store.close()
            await cache.close()

    app = FastAPI(
        telemetry=observability.FASTAPI_TELEMETRY_OFF,
        title="likes read",
        version="1",
        lifespan=lifespan,
        description="Like counts and has_liked. Never 5xx: degraded answers carry `stale: true`.",
    )

    async def ready() -> dict[str, bool]:
        # deliberately not gated on the stores: with them down this service still answers (last
        # good / null, 200), and an unready fleet would turn that into gateway 5xx. Dependency
        # health is on /metrics (likes_read_breaker_open, likes_read_dependency_errors_total).
        return {"reader": hasattr(app.state, "reader")}

    if fast_path:  # innermost: inside NeverFail, so its answers are guarded like the routes'
        app.add_middleware(fast.FastReads, fastapi_app=app)
    app.add_middleware(NeverFail)  # before install(): inside the RED middleware, which sees 200
    app.add_middleware(http.BodyLimit, max_bytes=api.MAX_BODY_BYTES)  # the batch read's body
    http.install(app, workloads.READ.name, ready)
    app.include_router(api.router)
    return app
