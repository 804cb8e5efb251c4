"""The local schema registry (services.schema_registry) as one process beside Kafka.

It keeps its state in Kafka's `_schemas` topic and creates that topic itself, so the component has
no storage of its own and nothing to bootstrap.
"""

from __future__ import annotations

import os
import sys

import httpx

from local.components import kafka
from local.components.base import Component, Server, http_probe
from local.layout import HOST, REPO_ROOT, Layout


class SchemaRegistry(Component):
    name = "schema-registry"
    requires = ("kafka",)

    def __init__(self, layout: Layout) -> None:
        super().__init__(layout)
        self.port = layout.ports.schema_registry
        self.url = f"http://{HOST}:{self.port}"

    def servers(self) -> list[Server]:
        argv = [
            sys.executable,
            "-m",
            "services.schema_registry",
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--bootstrap",
            kafka.bootstrap_servers(self.layout),
            # the layout's broker count, not whatever happens to be registered at start
            "--replication-factor",
            str(min(3, self.layout.kafka_brokers)),
        ]
        # the supervisor runs servers in the stack's home: import this checkout's services
        pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
        return [
            Server(
                name="schema-registry",
                argv=argv,
                address=self.url,
                probe=lambda: http_probe(f"{self.url}/subjects"),
                env={"PYTHONPATH": pythonpath},
                # start = replay of `_schemas`, possibly after creating it
                start_timeout=90.0,
            )
        ]

    def bootstrap(self) -> None:
        # production's registry runs with FORWARD as its default level (infra/schema_registry.py):
        # a new event schema must stay readable by consumers still on the old one
        r = httpx.put(
            f"{self.url}/config",
            json={"compatibility": "FORWARD"},
            headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
            timeout=10,
        )
        r.raise_for_status()
