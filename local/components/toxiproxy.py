"""Toxiproxy, the --faults profile's network: one proxy in front of every node a client reaches
after bootstrap, so a game day's latency, timeout or cut lands where clients really connect.

Kafka, a Redis Cluster and the Cassandra driver all bootstrap from one address and then connect
to the addresses the servers announce (advertised.listeners, CLUSTER SLOTS, system.local): a
proxy in front of the bootstrap address alone would carry nothing. So each node has its own
proxy (Layout.proxies, named as the server it fronts) and, in this profile, announces it
(Layout.announced): Redis with cluster-announce-port, Kafka with advertised.listeners, and the
one Cassandra node as the services' contact point. What flows through a node's proxy is what
production's network carries to that node: client requests, and Redis replication and Kafka's
replica fetches (their inter-broker listener is the client one); the cluster buses, KRaft's
quorum and the exporters' scrapes bypass it, as a node's sidecar would.

The proxies are created from a config file when the server starts (its `-config`), so a
restarted Toxiproxy comes back with every proxy and no toxics. Benchmarks run without the
profile: a proxy costs a hop per request.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from local.components.base import Component, MissingBinary, ProbeFailed, Server
from local.layout import HOST, Layout

VERSION = "v2.5.0"  # local/setup.sh installs this version (go install), into BINARY's folder
MODULE = "github.com/Shopify/toxiproxy/v2"
CONFIG = "toxiproxy.json"


def binary(layout: Layout) -> str:
    return str(layout.cache / "toxiproxy" / "server")


def api_url(layout: Layout) -> str:
    return f"http://{HOST}:{layout.ports.toxiproxy}"


def proxy_specs(layout: Layout) -> list[dict[str, Any]]:
    """Toxiproxy's -config: every proxy of the profile, enabled."""
    return [
        {"name": name, "listen": f"{HOST}:{listen}", "upstream": f"{HOST}:{upstream}",
         "enabled": True}
        for name, (listen, upstream) in layout.proxies().items()
    ]  # fmt: skip


def reset(layout: Layout, timeout: float = 5.0) -> None:
    """Every proxy enabled and every toxic removed (Toxiproxy's POST /reset)."""
    httpx.post(f"{api_url(layout)}/reset", timeout=timeout).raise_for_status()


def toxics(layout: Layout, timeout: float = 5.0) -> dict[str, list[dict[str, Any]]]:
    """Proxy name -> its toxics now (an empty list: clean)."""
    r = httpx.get(f"{api_url(layout)}/proxies", timeout=timeout)
    r.raise_for_status()
    return {name: list(p.get("toxics") or []) for name, p in r.json().items()}


class Toxiproxy(Component):
    name = "toxiproxy"

    @property
    def _config(self) -> str:
        return str(self.layout.conf / CONFIG)

    def prepare(self) -> None:
        self.layout.ensure()
        if not Path(binary(self.layout)).exists():
            raise MissingBinary(
                f"toxiproxy {VERSION} is not installed at {binary(self.layout)}: run local/setup.sh"
            )
        (self.layout.conf / CONFIG).write_text(json.dumps(proxy_specs(self.layout), indent=2))

    def servers(self) -> list[Server]:
        argv = [
            binary(self.layout), "-host", HOST, "-port", str(self.layout.ports.toxiproxy),
            "-config", self._config,
        ]  # fmt: skip
        return [
            Server(
                name=self.name,
                argv=argv,
                address=f"{HOST}:{self.layout.ports.toxiproxy}",
                probe=self._probe,
                start_timeout=20,
                stop_timeout=5,
            )
        ]

    def _probe(self) -> None:
        """Ready = the API answers and lists every proxy of the profile (a proxy a game day
        disabled still counts: the fault is the experiment's, not a broken start)."""
        try:
            r = httpx.get(f"{api_url(self.layout)}/proxies", timeout=2)
        except httpx.HTTPError as e:
            raise ProbeFailed(f"toxiproxy: {e}") from e
        if r.status_code != 200:
            raise ProbeFailed(f"toxiproxy: HTTP {r.status_code}")
        have = r.json()
        missing = sorted(set(self.layout.proxies()) - set(have))
        if missing:
            raise ProbeFailed(f"toxiproxy: proxies missing: {missing}")
