"""`python -m services.aggregator --port P`: the counter aggregator worker."""

from __future__ import annotations

import argparse
import signal
import threading

from services.aggregator.main import build
from services.aggregator.settings import AggregatorSettings
from services.common import heap, observability, switches, worker_http
from services.contracts import clients, flags, workloads


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m services.aggregator", description=__doc__)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True, help="/healthz, /readyz, /metrics")
    args = ap.parse_args(argv)

    settings = AggregatorSettings()
    log = observability.setup_logging(workloads.AGGREGATOR.name, settings.log_level)
    observability.setup_tracing(workloads.AGGREGATOR.name, settings.otlp_endpoint)
    agg, cluster = build(settings)
    kill = switches.in_thread(flags.from_settings(settings, gauge=switches.export))
    if isinstance(agg.deserialize, clients.LikeDeserializer):
        kill.on_change(switches.flush_on_set(agg.deserialize.flush))
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = worker_http.serve(args.host, args.port, agg.ready, agg.loop.alive)
    heap.settle()
    log.info("aggregator serving ops", extra={"fields": {"port": args.port}})
    try:
        agg.run(stop)
    finally:
        server.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main()
