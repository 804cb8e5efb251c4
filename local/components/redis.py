"""The count-cache, the AOF idem-store and the feature-store, each a Redis Cluster of 3 primaries
+ 3 replicas as the program declares them (the idem-store was one shard here until the program's
3 shards were run locally too: issue 9 item 3).

Both from Debian's redis-server. The cluster uses a short node timeout so a killed primary fails
over to its replica within a few seconds on a laptop (production keeps Redis's defaults).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import redis

from infra import exporters
from infra import redis as redis_infra
from local.components.base import Component, ProbeFailed, Server, http_probe, wait_until
from local.layout import HOST, Layout
from services.contracts import keys

CLUSTER_NODE_TIMEOUT_MS = 2000


def redis_server_bin() -> str:
    return shutil.which("redis-server") or "/usr/bin/redis-server"


def password(layout: Layout) -> str:
    """The stack's Redis password (the program's redis-auth secret, played by the stack's secret
    file): every local Redis requires it, so every client of ours runs its AUTH code here."""
    from local import transforms

    return transforms.stack_secrets(layout)[transforms.REDIS_AUTH]


def auth_lines(layout: Layout) -> list[str]:
    """Config lines (a file, never argv): clients and replicas authenticate."""
    pw = password(layout)
    return [f"requirepass {pw}", f"masterauth {pw}"]


def client(layout: Layout, port: int, **kw: Any) -> redis.Redis:
    return redis.Redis(host=HOST, port=port, password=password(layout), **kw)


def ping_probe(layout: Layout, port: int, password_: str | None = None) -> None:
    """PING with the stack's Redis password (or `password_`, a Redis of another Secret)."""
    pw = password(layout) if password_ is None else password_
    try:
        with redis.Redis(
            host=HOST, port=port, password=pw, socket_timeout=1, socket_connect_timeout=1
        ) as r:
            r.ping()
    except redis.RedisError as e:
        raise ProbeFailed(f"redis {HOST}:{port}: {e}") from e


class _Cluster(Component):
    """A Redis Cluster of `len(ports)` nodes, one replica per primary, formed at first start."""

    def ports(self) -> list[int]:
        raise NotImplementedError

    def conf_lines(self, port: int) -> list[str]:
        """The role's own lines (persistence, memory); bind, cluster and auth are common."""
        raise NotImplementedError

    def servers(self) -> list[Server]:
        return [
            Server(
                name=f"{self.name}-{i + 1}",
                argv=[redis_server_bin(), str(self.layout.conf / f"{self.name}-{port}.conf")],
                address=f"{HOST}:{port}",
                probe=lambda port=port: ping_probe(self.layout, port),  # type: ignore[misc]
                start_timeout=30,
                stop_timeout=10,
            )
            for i, port in enumerate(self.ports())
        ]

    def prepare(self) -> None:
        self.layout.ensure()
        for port in self.ports():
            d = self.layout.data / f"{self.name}-{port}"
            d.mkdir(parents=True, exist_ok=True)
            conf = self.layout.conf / f"{self.name}-{port}.conf"
            conf.touch(mode=0o600)  # it holds the password
            conf.chmod(0o600)
            conf.write_text(
                "\n".join(
                    [
                        f"bind {HOST}",
                        f"port {port}",
                        "protected-mode no",
                        "daemonize no",
                        f"dir {d}",
                        "cluster-enabled yes",
                        "cluster-config-file nodes.conf",
                        f"cluster-node-timeout {CLUSTER_NODE_TIMEOUT_MS}",
                        *redis_infra.CLUSTER_AVAILABILITY,
                        *self.announce_lines(port),
                        *self.conf_lines(port),
                        *auth_lines(self.layout),
                        "",
                    ]
                )
            )

    def announce_lines(self, port: int) -> list[str]:
        """The --faults profile: clients (and replicas) are sent to the node's proxy by
        CLUSTER SLOTS, MOVED and CLUSTER NODES; the bus stays direct (the port's own + 10000,
        said explicitly: it would otherwise follow the announced port)."""
        announced = self.layout.announced(port)
        if announced == port:
            return []
        return [f"cluster-announce-port {announced}", f"cluster-announce-bus-port {port + 10000}"]

    def bootstrap(self) -> None:
        ports = self.ports()
        if not self._formed(ports[0]):
            cmd = ["redis-cli", "--cluster", "create"]
            cmd += [f"{HOST}:{p}" for p in ports]
            cmd += ["--cluster-replicas", "1", "--cluster-yes"]
            # redis-cli reads the password from REDISCLI_AUTH: never on a command line
            env = {**os.environ, "REDISCLI_AUTH": password(self.layout)}
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
            if proc.returncode != 0:
                raise ProbeFailed(f"redis-cli --cluster create failed:\n{proc.stdout}{proc.stderr}")
        wait_until(lambda: self._settled(ports), timeout=60, interval=0.5)

    def _settled(self, ports: list[int]) -> None:
        self._repoint_replicas(ports)
        self._check_ok(ports)

    def _repoint_replicas(self, ports: list[int]) -> None:
        """Point a replica whose link is down at the port its primary announces now.

        Redis 7.0 learns a peer's new announced port from gossip (CLUSTER NODES shows it) but
        leaves a replica's established replication target where it was. A profile switch
        changes every announced port (--faults announces the proxies', the plain profile the
        nodes' own), so a replica that came back before its primary kept dialing a proxy that
        no longer existed: its primary had no replica and `up` gave up after 60 s (switching
        back after the kafka-cross-az-partition game day). CLUSTER REPLICATE to the same
        primary makes the replica dial the address the node table holds."""
        for p in ports:
            with client(self.layout, p, socket_timeout=2, decode_responses=True) as r:
                role = r.info("replication")
                if role["role"] != "slave" or role.get("master_link_status") == "up":
                    continue
                primary = replication_target(str(r.execute_command("CLUSTER", "NODES")))
                if primary is not None and primary[1] != int(role.get("master_port", 0)):
                    r.execute_command("CLUSTER", "REPLICATE", primary[0])

    def _info(self, port: int) -> dict[str, str]:
        with client(self.layout, port, socket_timeout=2, decode_responses=True) as r:
            raw = r.execute_command("CLUSTER", "INFO")
        if isinstance(raw, dict):
            return {str(k): str(v) for k, v in raw.items()}
        return dict(line.split(":", 1) for line in str(raw).splitlines() if ":" in line)

    def _formed(self, port: int) -> bool:
        info = self._info(port)
        return int(info.get("cluster_known_nodes", "1")) > 1

    def _check_ok(self, ports: list[int]) -> None:
        for p in ports:
            info = self._info(p)
            if info.get("cluster_state") != "ok" or info.get("cluster_slots_assigned") != "16384":
                raise ProbeFailed(
                    f"{self.name} node {p}: cluster_state={info.get('cluster_state')}"
                )
        # every primary has a replica in sync: a restarted ex-primary first comes back as an
        # empty master and turns replica seconds later; until then a second failure would lose
        # its slots, so `up` is not done before this holds
        for p in ports:
            with client(self.layout, p, socket_timeout=2, decode_responses=True) as r:
                role = r.info("replication")
            if role["role"] == "master" and int(role.get("connected_slaves", 0)) < 1:
                raise ProbeFailed(f"{self.name} node {p}: primary without a replica")
            if role["role"] == "slave" and role.get("master_link_status") != "up":
                raise ProbeFailed(f"{self.name} node {p}: replica not in sync")

    def startup_nodes(self) -> list[tuple[str, int]]:
        return [(HOST, p) for p in self.ports()]

    def metrics_targets(self) -> list[str]:
        # each node, scraped through the exporter (the rendered pods carry its annotations)
        return [f"{HOST}:{p}" for p in self.ports()]


class Exporter(Component):
    """One redis_exporter (Debian's prometheus-redis-exporter) in multi-target mode, as the
    program deploys it (infra/exporters.py): Prometheus's `redis` job names the Redis to scrape
    in each request. It logs in with the stack's password, from its environment."""

    name = exporters.REDIS_EXPORTER

    @property
    def address(self) -> str:
        return f"{HOST}:{self.layout.ports.redis_exporter}"

    def servers(self) -> list[Server]:
        binary = shutil.which("prometheus-redis-exporter") or "/usr/bin/prometheus-redis-exporter"
        argv = [binary, f"--web.listen-address={self.address}", *exporters.REDIS_EXPORTER_FLAGS]
        return [
            Server(
                name=self.name,
                argv=argv,
                address=self.address,
                probe=lambda: http_probe(f"http://{self.address}/health"),
                env={"REDIS_PASSWORD": password(self.layout)},
                start_timeout=30,
                stop_timeout=5,
            )
        ]


class CountCache(_Cluster):
    name = "count-cache"

    def ports(self) -> list[int]:
        return self.layout.ports.count_cache

    def conf_lines(self, port: int) -> list[str]:
        return [
            # a cache: RDB snapshots only keep node restarts warm; no AOF
            "appendonly no",
            "save 60 1000",
            "maxmemory 256mb",
            # as the program: counts and has_liked filters may be evicted (a lost
            # filter is a miss, rebuilt from the edge-store; contracts/bloom.py)
            f"maxmemory-policy {keys.EVICTION_POLICY['count-cache']}",
        ]


class IdemStore(_Cluster):
    """The idempotency keys: 3 shards with AOF, as the program declares (infra/redis.py), so the
    write service's cluster client meets MOVED redirections and a failover here too."""

    name = "idem-store"

    def ports(self) -> list[int]:
        return self.layout.ports.idem_store

    def conf_lines(self, port: int) -> list[str]:
        return [
            # idempotency keys must survive a restart: a lost key means a double count
            *redis_infra.AOF,
            f"maxmemory-policy {keys.EVICTION_POLICY['idem-store']}",
        ]


class FeatureStore(_Cluster):
    """The abuse scorer's shared feature state (services/abuse/shared_features.py): a cache, so
    no AOF, evicting when full, as the program declares it (infra/redis.py)."""

    name = "feature-store"

    def ports(self) -> list[int]:
        return self.layout.ports.feature_store

    def conf_lines(self, port: int) -> list[str]:
        return [
            "appendonly no",
            'save ""',  # every key expires within the hour: a restart starts it empty
            "maxmemory 256mb",
            # a lost feature weakens a score, never a count: evict, never refuse
            f"maxmemory-policy {keys.EVICTION_POLICY['feature-store']}",
        ]


def replication_target(nodes: str) -> tuple[str, int] | None:
    """From a replica's CLUSTER NODES: its primary's node id and the port the table holds for
    it (None: the node is no replica, or its primary is not in the table)."""
    rows = [line.split() for line in nodes.splitlines() if line.strip()]
    me = next((r for r in rows if "myself" in r[2].split(",")), None)
    if me is None or me[3] == "-":
        return None
    primary = next((r for r in rows if r[0] == me[3]), None)
    if primary is None:
        return None
    port = primary[1].split("@", 1)[0].rsplit(":", 1)[1]
    return primary[0], int(port)


class ScratchCluster:
    """A one-node Redis Cluster owning every slot, with `maxmemory_mb` and the eviction policy of
    `role` (keys.EVICTION_POLICY; the count-cache's by default): a small count-cache (or
    feature-store) for the memory tests and benchmarks (issue 10, hole 2), apart from the
    stack's (which it would fill). Requires `password`; stop with close()."""

    def __init__(
        self, home: Path, password: str, maxmemory_mb: int, role: str = "count-cache"
    ) -> None:
        home.mkdir(parents=True, exist_ok=True)
        self.home, self.password = home, password
        # a port picked free can be taken before the server binds it (another process's
        # ephemeral port): start again on a new one rather than fail
        for attempt in range(5):
            with socket.socket() as s:
                s.bind((HOST, 0))
                self.port = int(s.getsockname()[1])
            conf = home / f"redis-{attempt}.conf"
            conf.touch(mode=0o600)  # it holds the password
            conf.write_text(
                "\n".join(
                    [
                        f"bind {HOST}", f"port {self.port}", f"dir {home}", 'save ""',
                        "appendonly no", "cluster-enabled yes",
                        f"cluster-config-file nodes-{attempt}.conf",
                        f"maxmemory {maxmemory_mb}mb",
                        f"maxmemory-policy {keys.EVICTION_POLICY[role]}",
                        f"requirepass {password}", "",
                    ]
                )
            )  # fmt: skip
            self._log = (home / f"redis-{attempt}.log").open("wb")
            self.proc = subprocess.Popen(
                [redis_server_bin(), str(conf)], stdout=self._log, stderr=subprocess.STDOUT
            )
            self.r = redis.Redis(
                host=HOST, port=self.port, password=password, decode_responses=True
            )
            if self._started():
                break
            self.proc.kill()
            self._log.close()
        else:
            raise RuntimeError(f"the scratch {role} did not start: see {home}")
        self.r.execute_command("CLUSTER", "ADDSLOTSRANGE", "0", "16383")
        wait_until(self._cluster_ok, 20, interval=0.2)

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def _started(self) -> bool:
        """Answering within 30 s; False if it exited (its port taken) or never answered."""
        deadline = time.monotonic() + 30
        while self.proc.poll() is None:
            try:
                return bool(self.r.ping())
            except redis.ConnectionError:
                if time.monotonic() > deadline:
                    return False
                time.sleep(0.2)
        return False

    def _cluster_ok(self) -> None:
        if "cluster_state:ok" not in self.r.execute_command("CLUSTER", "INFO"):
            raise ProbeFailed(f"redis {self.address}: cluster state not ok yet")

    def oom_errors(self) -> int:
        stats = self.r.info("errorstats")
        return int(stats.get("errorstat_OOM", {}).get("count", 0))

    def evicted_keys(self) -> int:
        return int(self.r.info("stats")["evicted_keys"])

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)
        self._log.close()
