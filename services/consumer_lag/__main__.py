"""`python -m services.consumer_lag --port P`: read every watched group's lag from Kafka each
LIKES_LAG_INTERVAL_S and export it on /metrics, until SIGTERM."""

from __future__ import annotations

import argparse
import logging
import signal
import threading
import time

from confluent_kafka.admin import AdminClient

from services.common import heap, observability, worker_http
from services.consumer_lag.core import Key, LagRead, LagReader, consumer_factory
from services.consumer_lag.metrics import LAG_MESSAGES, LAG_READ_SPAN, LAG_SECONDS, READS, UNREAD
from services.consumer_lag.settings import LagSettings
from services.contracts import clients, workloads

REBUILD_AFTER = 3  # consecutive failed reads before the Kafka clients are recreated


def export(read: LagRead, groups: list[str]) -> None:
    """The read's lags; an unread partition's series are removed (no reading is better than an
    old one that looks current) and counted in UNREAD, which ConsumerLagUnknown watches."""
    for lag in read.lags:
        labels = (lag.group, lag.topic, str(lag.partition))
        LAG_SECONDS.labels(*labels).set(lag.seconds)
        LAG_MESSAGES.labels(*labels).set(lag.messages)
    unread = dict.fromkeys(groups, 0)
    for u in read.unread:
        labels = (u.group, u.topic, str(u.partition))
        LAG_SECONDS.remove(*labels)
        LAG_MESSAGES.remove(*labels)
        unread[u.group] = unread.get(u.group, 0) + 1
    for group, n in unread.items():
        UNREAD.labels(group).set(n)


def main() -> None:
    ap = argparse.ArgumentParser(description="Export consumer lag in seconds, read from Kafka.")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True, help="port of /healthz, /readyz, /metrics")
    args = ap.parse_args()

    settings = LagSettings()
    log = observability.setup_logging(workloads.CONSUMER_LAG.name, settings.log_level)
    observability.setup_tracing(workloads.CONSUMER_LAG.name, settings.otlp_endpoint)
    conf = clients.kafka_config(settings, logger=logging.getLogger("kafka.admin"))

    def new_reader(partitions: list[Key] | None = None) -> LagReader:
        return LagReader(
            AdminClient(conf), consumer_factory(conf), settings.groups, settings.topics,
            settings.lag_timeout_s, topics_of=settings.topics_of, partitions=partitions,
        )  # fmt: skip

    reader = new_reader()
    failures = 0
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    last_ok = [0.0]

    def ready() -> dict[str, bool]:
        # stale after three intervals: Prometheus would be exporting an old reading
        fresh = time.monotonic() - last_ok[0] < 3 * settings.lag_interval_s + settings.lag_timeout_s
        return {"kafka": last_ok[0] > 0 and fresh}

    loop = worker_http.LoopHealth(())
    server = worker_http.serve(args.host, args.port, ready, loop.alive)
    heap.settle()
    log.info("consumer-lag exporter started", extra={"fields": {"groups": settings.groups}})
    while not stop.is_set():
        loop.turned()
        start = time.time_ns()
        try:
            read = reader.read()
            export(read, settings.groups)
            worst = max((lag.seconds for lag in read.lags), default=0.0)
            observability.record_span(
                LAG_READ_SPAN, start,
                {"likes.lag.max_seconds": worst, "likes.lag.unread": len(read.unread)},
            )  # fmt: skip
            READS.labels("partial" if read.unread else "ok").inc()
            if read.unread:
                log.warning("lag read partial", extra={"fields": {
                    "unread": len(read.unread), "first": repr(read.unread[0])}})  # fmt: skip
            if read.lags or not read.unread:
                last_ok[0] = time.monotonic()
            failures = failures + 1 if read.unread else 0
        except Exception as e:  # LagError, KafkaException: Kafka did not answer
            # no reading is better than an old one that looks current: the series vanish and
            # the ConsumerLagUnknown alert (absent series) says the lag is not known
            LAG_SECONDS.clear()
            LAG_MESSAGES.clear()
            UNREAD.clear()
            READS.labels("error").inc()
            observability.record_span(LAG_READ_SPAN, start, {}, e)
            log.warning("lag read failed", extra={"fields": {"error": repr(e)}})
            failures += 1
        if failures >= REBUILD_AFTER:
            # after a whole-cluster restart librdkafka's clients kept failing the offsets calls
            # for minutes (the test of Kafka down and back): new clients look the leaders and
            # the coordinator up afresh
            reader.close()
            reader = new_reader(reader.known_partitions)
            failures = 0
            log.info("kafka clients recreated")
        stop.wait(settings.lag_interval_s)
    server.shutdown()
    reader.close()


if __name__ == "__main__":
    main()
