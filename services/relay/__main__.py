"""`python -m services.relay --port P`: drain the outbox shards this replica holds a lease on,
every LIKES_RELAY_INTERVAL_S while it finds rows (convergence.RELAY_IDLE_INTERVAL_S when it finds
none), until SIGTERM (then give the leases back)."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from services.common import clock, heap, observability, worker_http
from services.contracts import clients, convergence, workloads
from services.contracts.clients import CASSANDRA_ERRORS
from services.relay.core import LOOP_TIMESTAMP, OutboxRelay
from services.relay.leases import ShardLeases
from services.relay.settings import RelaySettings
from services.write.core import OUTBOX_SHARDS, Publisher


def main() -> None:
    ap = argparse.ArgumentParser(description="Publish outbox rows the write path could not.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True, help="port of /healthz, /readyz, /metrics")
    args = ap.parse_args()

    settings = RelaySettings()
    log = observability.setup_logging(workloads.OUTBOX_RELAY.name, settings.log_level)
    observability.setup_tracing(workloads.OUTBOX_RELAY.name, settings.otlp_endpoint)
    cluster, session = clients.cassandra(settings, first_connect_s=clients.FIRST_CONNECT_S)
    publisher = Publisher(
        clients.producer(
            settings, **{"message.timeout.ms": round(1000 * convergence.RELAY_PUBLISH_TIMEOUT_S)}
        )
    )
    replica = settings.new_replica_id()
    leases = ShardLeases(session, replica, OUTBOX_SHARDS)
    relay = OutboxRelay(
        session,
        publisher,
        leases=leases,
        dead_letter_attempts=settings.relay_dead_letter_attempts,
        dead_letter_after_s=settings.relay_dead_letter_after_s,
        idem=lambda: clients.idem_store(settings),  # notes of events in Kafka whose rows stayed
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    last_ok = threading.Event()

    edge_clock = clock.EdgeStoreClock(session)

    def ready() -> dict[str, bool]:
        # a clock ahead of the writers' would pass buckets they still write into (D11)
        return {"edge-store": last_ok.is_set(), "clock": edge_clock.ok()}

    loop = worker_http.LoopHealth(())  # /healthz: a pass that hangs gets the pod restarted
    server = worker_http.serve(args.host, args.port, ready, loop.alive)
    heap.settle()
    log.info("relay started", extra={"fields": {"replica": replica}})
    idle_s = max(settings.relay_interval_s, convergence.RELAY_IDLE_INTERVAL_S)
    while not stop.is_set():
        loop.turned()
        LOOP_TIMESTAMP.set_to_current_time()
        wait_s = settings.relay_interval_s
        try:
            res = relay.run_once()
            last_ok.set()
            if not res.pending:
                wait_s = idle_s
            if res.published or res.dead_lettered:
                log.info(
                    "relayed",
                    extra={"fields": {"published": res.published,
                                      "dead_lettered": res.dead_lettered}},
                )  # fmt: skip
        except CASSANDRA_ERRORS as e:
            last_ok.clear()
            log.warning("edge-store unavailable", extra={"fields": {"error": str(e)}})
        except Exception:
            logging.getLogger("relay").exception("relay pass failed")
        stop.wait(wait_s)
    leases.release()  # the others take these shards at their next renewal, not after the TTL
    server.shutdown()
    publisher.close()
    cluster.shutdown()


if __name__ == "__main__":
    main()
