"""Run the local schema registry.

`python -m local.schema_registry --port P --bootstrap HOST:PORT[,..] [--users-file FILE]`; logs go
to stdout. Its Kafka login comes from the environment (REGISTRY_KAFKA_USER and
REGISTRY_KAFKA_PASSWORD), its HTTP users from the password file (Jetty's PropertyFileLoginModule
format, as production's registry reads it): no secret on the command line.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

import uvicorn

from local.schema_registry.app import create_app
from local.schema_registry.store import KafkaSchemaStore
from services.contracts import kafka, registry, tls

KAFKA_USER_ENV = "REGISTRY_KAFKA_USER"
KAFKA_PASSWORD_ENV = "REGISTRY_KAFKA_PASSWORD"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m local.schema_registry", description=__doc__)
    parser.add_argument("--port", type=int, default=8081)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument(
        "--bootstrap", required=True, help="Kafka bootstrap servers, host:port[,..]"
    )
    parser.add_argument("--topic", default=kafka.REGISTRY_TOPIC)
    parser.add_argument(
        "--replication-factor",
        type=int,
        default=None,
        help="for the topic, if it has to be created (default: min(3, brokers in the cluster))",
    )
    parser.add_argument(
        "--users-file",
        type=Path,
        default=None,
        help="`user: password,role` per line; every call must log in as one of them "
        f"(role {registry.ROLE}); without it the registry answers anonymous calls",
    )
    parser.add_argument(
        "--tls-dir",
        type=Path,
        default=None,
        help="serve HTTPS with this folder's tls.crt and tls.key (cert-manager's names), and "
        "reach Kafka over TLS, verified against its ca.crt",
    )
    args = parser.parse_args(argv)

    logging.basicConfig(
        stream=sys.stdout,
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    user, password = os.environ.get(KAFKA_USER_ENV), os.environ.get(KAFKA_PASSWORD_ENV)
    login = kafka.Credentials(user, password) if user and password else None
    d: Path | None = args.tls_dir
    store = KafkaSchemaStore(
        args.bootstrap,
        args.topic,
        args.replication_factor,
        login=login,
        ca_file=str(d / tls.CA_KEY) if d else None,
    )
    users = registry.parse_password_file(args.users_file.read_text()) if args.users_file else None
    # log_config=None: uvicorn's loggers propagate to the stdout handler above
    uvicorn.run(
        create_app(store, users),
        host=args.host,
        port=args.port,
        log_config=None,
        ssl_certfile=str(d / tls.CERT_KEY) if d else None,
        ssl_keyfile=str(d / tls.KEY_KEY) if d else None,
    )


if __name__ == "__main__":
    main()
