"""`python -m services.abuse --port P`: the abuse scorer (its model server is a sidecar:
`python -m services.abuse.model_server`)."""

from __future__ import annotations

import argparse
import signal
import threading

from services.abuse.main import build
from services.abuse.settings import ScorerSettings
from services.common import heap, observability, worker_http
from services.contracts import workloads

NAME = workloads.ABUSE_SCORER.name  # its logs' and spans' service name


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m services.abuse", description=__doc__)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True, help="/healthz, /readyz, /metrics")
    args = ap.parse_args(argv)

    settings = ScorerSettings()
    log = observability.setup_logging(NAME, settings.log_level)
    observability.setup_tracing(NAME, settings.otlp_endpoint)
    built = build(settings)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = worker_http.serve(args.host, args.port, built.scorer.ready, built.scorer.loop.alive)
    heap.settle()
    log.info("abuse scorer serving ops", extra={"fields": {"port": args.port}})
    try:
        built.scorer.run(stop)
    finally:
        server.shutdown()
        built.close()


if __name__ == "__main__":
    main()
