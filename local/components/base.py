"""The contract every local-stack component fulfils, so the supervisor can start any of them."""

from __future__ import annotations

import abc
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from local.layout import Layout


class MissingBinary(Exception):
    """A server's binary is not installed (local/setup.sh installs it)."""


class ProbeFailed(Exception):
    """A server did not answer its readiness request (yet)."""


@dataclass(frozen=True)
class Server:
    """One OS process of the stack. `probe` makes a real request and raises ProbeFailed."""

    name: str
    argv: list[str]
    address: str
    probe: Callable[[], None]
    env: dict[str, str] = field(default_factory=dict)
    inherit_env: bool = True  # False: `env` is the whole environment (a rendered workload)
    cwd: Path | None = None
    start_timeout: float = 90.0
    stop_timeout: float = 20.0


class Component(abc.ABC):
    """A named group of servers with its own config, start-up order and bootstrap."""

    name: str = ""
    requires: tuple[str, ...] = ()
    plays: str | None = None  # the rendered workload this stands in for, when not `name`

    def __init__(self, layout: Layout) -> None:
        self.layout = layout

    @abc.abstractmethod
    def servers(self) -> list[Server]:
        """The processes of this component, in start order."""

    def prepare(self) -> None:  # noqa: B027 - optional hook
        """Write configs and format storage before a server starts. Must be idempotent."""

    def bootstrap(self) -> None:  # noqa: B027 - optional hook
        """Run once every server answers (cluster create, topics, schema). Must be idempotent."""

    def metrics_targets(self) -> list[str]:
        """host:port endpoints the scrape config lists for this component: a server's own
        metrics (the pods job), or a Redis the exporter scrapes for the `redis` job."""
        return []

    def scrape_targets(self) -> dict[str, list[str]]:
        """metrics_targets() by the rendered workload they play (its app.kubernetes.io/name):
        the component's own name unless `plays` says which workload it stands in for."""
        return {self.plays or self.name: self.metrics_targets()}


def tcp_probe(host: str, port: int, timeout: float = 1.0) -> None:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as e:
        raise ProbeFailed(f"{host}:{port} refused: {e}") from e


def http_probe(url: str, timeout: float = 2.0, expect: int = 200) -> None:
    try:
        r = httpx.get(url, timeout=timeout)
    except httpx.HTTPError as e:
        raise ProbeFailed(f"{url}: {e}") from e
    if r.status_code != expect:
        raise ProbeFailed(f"{url}: HTTP {r.status_code}")


def wait_until(check: Callable[[], None], timeout: float, interval: float = 0.25) -> None:
    """Retry `check` until it stops raising ProbeFailed; re-raise the last failure at timeout."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            check()
            return
        except ProbeFailed:
            if time.monotonic() >= deadline:
                raise
            time.sleep(interval)
