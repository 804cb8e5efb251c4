"""`python -m services.relay --port P`: drain the outbox every half second until SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from services.common import observability, worker_http
from services.contracts import clients, convergence, workloads
from services.contracts.clients import CASSANDRA_ERRORS
from services.contracts.settings import Settings
from services.relay.core import OutboxRelay
from services.write.core import Publisher


def main() -> None:
    ap = argparse.ArgumentParser(description="Publish outbox rows the write path could not.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True, help="port of /healthz, /readyz, /metrics")
    ap.add_argument("--interval", type=float, default=0.5, help="seconds between passes")
    args = ap.parse_args()

    settings = Settings()
    log = observability.setup_logging(workloads.OUTBOX_RELAY.name, settings.log_level)
    observability.setup_tracing(workloads.OUTBOX_RELAY.name, settings.otlp_endpoint)
    cluster, session = clients.cassandra(settings, first_connect_s=clients.FIRST_CONNECT_S)
    publisher = Publisher(
        clients.producer(
            settings, **{"message.timeout.ms": round(1000 * convergence.RELAY_PUBLISH_TIMEOUT_S)}
        )
    )
    relay = OutboxRelay(session, publisher)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    last_ok = threading.Event()

    def ready() -> dict[str, bool]:
        return {"edge-store": last_ok.is_set()}

    loop = worker_http.LoopHealth(())  # /healthz: a pass that hangs gets the pod restarted
    server = worker_http.serve(args.host, args.port, ready, loop.alive)
    log.info("relay started")
    while not stop.is_set():
        loop.turned()
        try:
            res = relay.run_once()
            last_ok.set()
            if res.published:
                log.info("relayed", extra={"fields": {"published": res.published}})
        except CASSANDRA_ERRORS as e:
            last_ok.clear()
            log.warning("edge-store unavailable", extra={"fields": {"error": str(e)}})
        except Exception:
            logging.getLogger("relay").exception("relay pass failed")
        stop.wait(args.interval)
    server.shutdown()
    publisher.close()
    cluster.shutdown()


if __name__ == "__main__":
    main()
