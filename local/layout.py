"""Where the local stack keeps its files and which loopback ports it listens on.

One place for both, so that a second stack (the test session's) can live beside a developer's
by setting LIKES_HOME and LIKES_PORT_OFFSET.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
HOST = "127.0.0.1"


@dataclass(frozen=True)
class Ports:
    """Loopback ports; every one is shifted by the same offset."""

    offset: int = 0

    def _p(self, port: int) -> int:
        return port + self.offset

    @property
    def count_cache(self) -> list[int]:
        return [self._p(7001 + i) for i in range(6)]

    @property
    def idem_store(self) -> int:
        return self._p(6390)

    @property
    def etcd_client(self) -> int:
        return self._p(2379)

    @property
    def etcd_peer(self) -> int:
        return self._p(2380)

    @property
    def kafka_brokers(self) -> list[int]:
        return [self._p(29092 + i) for i in range(3)]

    @property
    def kafka_controllers(self) -> list[int]:
        return [self._p(29192 + i) for i in range(3)]

    @property
    def cassandra_native(self) -> int:
        return self._p(9042)

    @property
    def cassandra_storage(self) -> int:
        return self._p(7000)

    @property
    def schema_registry(self) -> int:
        return self._p(8081)

    @property
    def write(self) -> int:
        return self._p(8100)

    @property
    def read(self) -> int:
        return self._p(8200)

    @property
    def relay(self) -> int:
        return self._p(8300)  # metrics/health only

    @property
    def aggregator(self) -> int:
        return self._p(8400)  # metrics/health only

    @property
    def hotkey_sampler(self) -> int:
        return self._p(8500)

    @property
    def hotkey_operator(self) -> int:
        return self._p(8600)  # the local reconcile loop's health/metrics

    @property
    def hot_pools(self) -> list[int]:
        return [self._p(7101 + i) for i in range(4)]

    @property
    def prometheus(self) -> int:
        return self._p(9090)

    @property
    def alertmanager(self) -> int:
        return self._p(9093)

    @property
    def webhook_sink(self) -> int:
        return self._p(9095)  # where the local Alertmanager's receivers post


@dataclass(frozen=True)
class Layout:
    """Folders of one local stack: `home` holds data, configs, logs and the pid state."""

    home: Path
    ports: Ports
    kafka_brokers: int = 3

    @property
    def data(self) -> Path:
        return self.home / "data"

    @property
    def conf(self) -> Path:
        return self.home / "conf"

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    @property
    def state_file(self) -> Path:
        return self.home / "state.json"

    @property
    def cache(self) -> Path:
        """Shared across stacks: Maven classpaths survive `down --wipe`."""
        return REPO_ROOT / ".cache"

    def log_file(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def ensure(self) -> None:
        for d in (self.data, self.conf, self.logs):
            d.mkdir(parents=True, exist_ok=True)


PROFILE = "profile.json"


def from_env(kafka_brokers: int | None = None) -> Layout:
    """The stack named by LIKES_HOME / LIKES_PORT_OFFSET; the broker count an existing stack was
    created with wins over the default, so `status` and `down` see the same servers as `up`."""
    home = Path(os.environ.get("LIKES_HOME", REPO_ROOT / ".stack")).resolve()
    offset = int(os.environ.get("LIKES_PORT_OFFSET", "0"))
    if kafka_brokers is None:
        try:
            kafka_brokers = int(json.loads((home / PROFILE).read_text())["kafka_brokers"])
        except (FileNotFoundError, KeyError, ValueError):
            kafka_brokers = int(os.environ.get("LIKES_KAFKA_BROKERS", "3"))
    return Layout(home=home, ports=Ports(offset), kafka_brokers=kafka_brokers)


def recorded_brokers(home: Path) -> int | None:
    try:
        return int(json.loads((home / PROFILE).read_text())["kafka_brokers"])
    except (FileNotFoundError, KeyError, ValueError):
        return None


def record_profile(layout: Layout) -> None:
    layout.home.mkdir(parents=True, exist_ok=True)
    (layout.home / PROFILE).write_text(json.dumps({"kafka_brokers": layout.kafka_brokers}))
