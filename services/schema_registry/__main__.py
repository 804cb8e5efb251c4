"""Run the local schema registry.

`python -m services.schema_registry --port P --bootstrap HOST:PORT[,..]`; logs go to stdout.
"""

from __future__ import annotations

import argparse
import logging
import sys

import uvicorn

from services.schema_registry.app import create_app
from services.schema_registry.store import KafkaSchemaStore


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m services.schema_registry", description=__doc__)
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--bootstrap", required=True, help="Kafka bootstrap servers, host:port[,..]"
    )
    parser.add_argument("--topic", default="_schemas")
    parser.add_argument(
        "--replication-factor",
        type=int,
        default=None,
        help="for the topic, if it has to be created (default: min(3, brokers in the cluster))",
    )
    args = parser.parse_args(argv)

    logging.basicConfig(
        stream=sys.stdout,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    store = KafkaSchemaStore(args.bootstrap, args.topic, args.replication_factor)
    # log_config=None: uvicorn's loggers propagate to the stdout handler above
    uvicorn.run(create_app(store), host=args.host, port=args.port, log_config=None)


if __name__ == "__main__":
    main()
