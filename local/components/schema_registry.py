"""The local schema registry (local.schema_registry, a stand-in for Confluent's) as one process
beside Kafka.

It keeps its state in Kafka's `_schemas` topic and creates that topic itself, logged in to Kafka
as the registry's user. Every HTTP call must log in (basic auth, the users file written here from
the stack's secrets, in the format production's registry reads); bootstrap() is the deploy step
production runs as a Job: it registers the repository's schemas with their compatibility
(services/schema/registry_schemas.py), since producers never register them.
"""

from __future__ import annotations

import os
import ssl
import sys
from pathlib import Path

from confluent_kafka.schema_registry import SchemaRegistryClient

from local import tls as local_tls
from local.components import kafka
from local.components.base import Component, ProbeFailed, Server
from local.layout import HOST, REPO_ROOT, Layout
from local.schema_registry import __main__ as registry_main
from services.contracts import kafka as kafka_contract
from services.contracts import registry, tls
from services.schema import registry_schemas

# how long the deploy step waits for one registry call: beyond the registry's own wait for its
# write to Kafka (local.schema_registry.store, 30 s), so a slow write gets its own answer
BOOTSTRAP_TIMEOUT_S = 40.0


def credentials(layout: Layout) -> registry.Credentials:
    """The services' registry login (the program's schema-registry-auth secret, as played here)."""
    from local import transforms

    return registry.Credentials(
        registry.SERVICE_USER, transforms.stack_secrets(layout)[transforms.REGISTRY_AUTH]
    )


def url(layout: Layout) -> str:
    scheme = "https" if layout.tls else "http"
    return f"{scheme}://{HOST}:{layout.ports.schema_registry}"


def ca_file(layout: Layout) -> str | None:
    return local_tls.client_ca(layout)


def verify(layout: Layout) -> ssl.SSLContext | bool:
    """httpx's `verify` for this registry: the local CA in the --tls profile."""
    ca = ca_file(layout)
    return tls.client_context(ca) if ca else True


def users_file(layout: Layout) -> Path:
    """The registry's password file (mode 0600), rewritten from the stack's secrets at start."""
    return layout.home / "secrets" / "schema-registry.passwords"


class SchemaRegistry(Component):
    name = "schema-registry"
    requires = ("kafka",)

    def __init__(self, layout: Layout) -> None:
        super().__init__(layout)
        self.port = layout.ports.schema_registry
        self.url = url(layout)

    def client(self, timeout: float = 2) -> SchemaRegistryClient:
        return SchemaRegistryClient(
            registry.client_config(
                self.url, credentials(self.layout), timeout, ca_file=ca_file(self.layout)
            )
        )

    def servers(self) -> list[Server]:
        argv = [
            sys.executable,
            "-m",
            "local.schema_registry",
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--bootstrap",
            kafka.bootstrap_servers(self.layout),
            # the layout's broker count, not whatever happens to be registered at start
            "--replication-factor",
            str(min(3, self.layout.kafka_brokers)),
            "--users-file",
            str(users_file(self.layout)),
        ]
        if self.layout.tls:  # HTTPS, and TLS to Kafka (the same CA)
            argv += ["--tls-dir", str(local_tls.server_dir(self.layout, tls.REGISTRY))]
        # the supervisor runs servers in the stack's home: import this checkout's services
        pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
        return [
            Server(
                name=self.name,
                argv=argv,
                address=self.url,
                probe=self.probe,
                env={"PYTHONPATH": pythonpath, **self._kafka_login_env()},
                # start = replay of `_schemas`, possibly after creating it
                start_timeout=90.0,
            )
        ]

    def _kafka_login_env(self) -> dict[str, str]:
        # the registry's Kafka login, in its env (never argv)
        creds = kafka.login(self.layout, kafka_contract.REGISTRY_USER)
        return {
            registry_main.KAFKA_USER_ENV: creds.user,
            registry_main.KAFKA_PASSWORD_ENV: creds.password,
        }

    def prepare(self) -> None:
        self.layout.ensure()
        if self.layout.tls:
            local_tls.ensure(self.layout)
        f = users_file(self.layout)
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_suffix(".tmp")
        tmp.unlink(missing_ok=True)
        tmp.touch(mode=0o600)
        tmp.write_text(registry.password_file([credentials(self.layout)]))
        tmp.replace(f)

    def probe(self) -> None:
        """Answers a logged-in call (an anonymous one gets 401 by design)."""
        import httpx

        creds = credentials(self.layout)
        try:
            r = httpx.get(
                f"{self.url}/subjects",
                auth=(creds.user, creds.password),
                timeout=2,
                verify=verify(self.layout),
            )
        except httpx.HTTPError as e:
            raise ProbeFailed(f"{self.url}/subjects: {e}") from e
        if r.status_code != 200:
            raise ProbeFailed(f"{self.url}/subjects: HTTP {r.status_code}")

    def bootstrap(self) -> None:
        # production's deploy step (the schema-registration Job): the repository's schemas under
        # their subjects, FORWARD (a new event schema stays readable by consumers on the old one)
        # a deploy step, not a user's request: the first registration is the registry's first
        # write to its Kafka topic (the producer's TLS and SCRAM handshakes, acks=all), and on a
        # loaded 2-core machine it outlasted the 2 s a service waits, four tries in a row (a CI
        # run's second test stack, started while the first ran its tests: ReadTimeout)
        client = self.client(timeout=BOOTSTRAP_TIMEOUT_S)
        try:
            registry_schemas.apply(client, registry_schemas.subjects())
        finally:
            client.close()
