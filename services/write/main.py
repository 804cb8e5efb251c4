"""The write service's app: settings, clients in the lifespan, routers."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from services.common import clock, heap, http, observability, switches
from services.contracts import clients, convergence, flags, workloads
from services.contracts.settings import Settings
from services.write import api, core, splits


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    observability.setup_logging(workloads.WRITE.name, settings.log_level)
    observability.setup_tracing(workloads.WRITE.name, settings.otlp_endpoint)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        cluster, session = clients.cassandra(settings, first_connect_s=clients.FIRST_CONNECT_S)
        registry = clients.schema_registry(settings, retries=clients.FAIL_FAST_REGISTRY_RETRIES)
        serializer = clients.like_serializer(registry)
        publisher = core.Publisher(
            clients.producer(
                settings,
                **{"message.timeout.ms": round(1000 * convergence.WRITER_PUBLISH_TIMEOUT_S)},
            )
        )
        split_view = splits.split_view(settings)
        await split_view.start()  # polls in the background; no etcd → nothing split
        kill = flags.from_settings(settings, gauge=switches.export)
        await kill.start()
        app.state.settings, app.state.switches = settings, kill
        app.state.writer = core.LikeWriter(
            session=session,
            idem=clients.idem_store(settings),
            publisher=publisher,
            serialize=serializer,
            region=settings.region,
            count_cache=clients.count_cache(settings),
            shard_for=splits.SplitRouter(split_view, kill).shard_for,
        )

        def flush_schemas() -> None:  # the schema id is looked up again on the next write
            registry.clear_caches()
            app.state.writer.serialize = clients.like_serializer(registry)

        kill.on_change(switches.flush_on_set(flush_schemas))
        app.state.clock = clock.EdgeStoreClock(session)
        heap.settle()
        yield
        await kill.close()
        await split_view.close()
        publisher.close()
        cluster.shutdown()

    app = FastAPI(
        title="likes write",
        version="1",
        lifespan=lifespan,
        telemetry=observability.FASTAPI_TELEMETRY_OFF,
    )

    # bounded even when chunked: a body is read into memory before it is validated
    app.add_middleware(http.BodyLimit, max_bytes=api.MAX_BODY_BYTES)

    async def ready() -> dict[str, bool]:
        writer: core.LikeWriter = app.state.writer
        checks = {}
        try:
            checks["idem-store"] = bool(writer.idem.ping())
        except Exception:
            checks["idem-store"] = False
        # all_hosts() lists down hosts too: ready only while the driver holds a live one
        checks["edge-store"] = any(h.is_up for h in writer.session.cluster.metadata.all_hosts())
        # a clock too far off puts outbox markers where the relay no longer looks (D11)
        checks["clock"] = app.state.clock.ok()
        return checks

    http.install(app, workloads.WRITE.name, ready)
    app.include_router(api.router)
    return app
