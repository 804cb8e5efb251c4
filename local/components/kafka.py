"""Apache Kafka in KRaft mode, run from its Maven Central jars on the machine's Java.

Every node is a combined broker+controller with a static voter set (`controller.quorum.voters`),
so each node's storage is formatted on its own with the shared cluster id and no controller
directory ids have to be exchanged. Three nodes hold production's durability settings
(RF 3, min ISR 2); the one-node quick profile drops all of them to 1.
"""

from __future__ import annotations

import base64
import json
import logging
import subprocess
import uuid
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata

from local import maven
from local.components.base import Component, ProbeFailed, Server, wait_until
from local.layout import HOST, REPO_ROOT, Layout

CONF_DIR = REPO_ROOT / "local" / "kafka"
LOG4J_CONFIG = CONF_DIR / "log4j2.yaml"

# Heap kept small: the 2-core machine runs three of these beside Cassandra. The rest are the flags
# of Kafka's bin/kafka-run-class.sh (KAFKA_JVM_PERFORMANCE_OPTS and KAFKA_OPTS' defaults).
JVM_FLAGS = [
    "-Xms256m",
    "-Xmx512m",
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-XX:MaxInlineLevel=15",
    "-Djava.awt.headless=true",
]

# librdkafka logs every refused connection while a broker is still starting; the probe's own
# ProbeFailed message is what the supervisor reports, so its logger stays quiet.
_quiet = logging.getLogger("local.kafka.probe")
_quiet.addHandler(logging.NullHandler())
_quiet.propagate = False


def bootstrap_servers(layout: Layout) -> str:
    """Comma-separated host:port of every broker of this layout, for clients' bootstrap.servers."""
    return ",".join(f"{HOST}:{p}" for p in layout.ports.kafka_brokers[: layout.kafka_brokers])


def _new_cluster_id() -> str:
    # Kafka's Uuid.randomUuid(): 16 random bytes, URL-safe base64 without padding, never starting
    # with '-' (a CLI would read that as an option).
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def _metadata(bootstrap: str, timeout: float) -> ClusterMetadata:
    admin = AdminClient(
        {
            "bootstrap.servers": bootstrap,
            "broker.address.family": "v4",
            "socket.connection.setup.timeout.ms": int(timeout * 1000),
            "log.connection.close": False,
        },
        logger=_quiet,
    )
    try:
        return admin.list_topics(timeout=timeout)
    except KafkaException as e:
        raise ProbeFailed(f"{bootstrap}: no metadata: {e}") from e


class Kafka(Component):
    name = "kafka"
    requires = ()

    def __init__(self, layout: Layout) -> None:
        super().__init__(layout)
        self.count = layout.kafka_brokers
        self.node_ids = list(range(1, self.count + 1))

    # -- paths -----------------------------------------------------------------------------
    @property
    def _root(self) -> Path:
        return self.layout.data / "kafka"

    @property
    def _cluster_file(self) -> Path:
        """Cluster id and node count, fixed at the first format of this stack's data."""
        return self._root / "cluster.json"

    @property
    def _argfile(self) -> Path:
        """`java @file` argument file holding `-cp <classpath>`, written by prepare()."""
        return self.layout.conf / "kafka.jvm-args"

    def _props_file(self, node: int) -> Path:
        return self.layout.conf / f"kafka-{node}.properties"

    def _log_dir(self, node: int) -> Path:
        return self.layout.data / f"kafka-{node}"

    def _broker_port(self, node: int) -> int:
        return self.layout.ports.kafka_brokers[node - 1]

    def _controller_port(self, node: int) -> int:
        return self.layout.ports.kafka_controllers[node - 1]

    # -- servers ---------------------------------------------------------------------------
    def servers(self) -> list[Server]:
        # Cheap on purpose (status calls it): the classpath sits in the argfile, not resolved here.
        return [self._server(n) for n in self.node_ids]

    def _server(self, node: int) -> Server:
        name = f"kafka-{node}"
        argv = [
            "java",
            *JVM_FLAGS,
            f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
            f"-Dkafka.logs.dir={self.layout.logs}",
            f"@{self._argfile}",
            "kafka.Kafka",
            str(self._props_file(node)),
        ]
        return Server(
            name=name,
            argv=argv,
            address=f"{HOST}:{self._broker_port(node)}",
            probe=lambda: self._probe(node),
            start_timeout=120.0,
            # a combined node's controlled shutdown waits on the quorum; give it time before KILL
            stop_timeout=30.0,
        )

    def _probe(self, node: int) -> None:
        """Ready = this broker answers Metadata, lists itself as an unfenced broker, and the
        cluster reports an active controller."""
        addr = f"{HOST}:{self._broker_port(node)}"
        md = _metadata(addr, timeout=2.0)
        if node not in md.brokers:
            raise ProbeFailed(f"{addr}: broker {node} not yet in metadata {sorted(md.brokers)}")
        if md.controller_id < 0:
            raise ProbeFailed(f"{addr}: no controller known")

    # -- prepare ---------------------------------------------------------------------------
    def _properties(self, node: int) -> str:
        rf = 3 if self.count >= 3 else self.count
        min_isr = 2 if self.count >= 3 else 1
        voters = ",".join(f"{n}@{HOST}:{self._controller_port(n)}" for n in self.node_ids)
        props = {
            "process.roles": "broker,controller",
            "node.id": node,
            "controller.quorum.voters": voters,
            "listeners": (
                f"PLAINTEXT://{HOST}:{self._broker_port(node)},"
                f"CONTROLLER://{HOST}:{self._controller_port(node)}"
            ),
            "advertised.listeners": f"PLAINTEXT://{HOST}:{self._broker_port(node)}",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": self._log_dir(node),
            # production's durability: a write with acks=all survives one node lost
            "default.replication.factor": rf,
            "min.insync.replicas": min_isr,
            "offsets.topic.replication.factor": rf,
            "transaction.state.log.replication.factor": rf,
            "transaction.state.log.min.isr": min_isr,
            "share.coordinator.state.topic.replication.factor": rf,
            "share.coordinator.state.topic.min.isr": min_isr,
            # topics are created by our bootstrap code with explicit settings, never by a typo
            "auto.create.topics.enable": "false",
            # local footprint: few partitions/threads, small segments, no rebalance delay
            "num.partitions": 3,
            "offsets.topic.num.partitions": 10,
            "transaction.state.log.num.partitions": 10,
            "share.coordinator.state.topic.num.partitions": 5,
            "num.network.threads": 2,
            "num.io.threads": 4,
            "background.threads": 4,
            "num.recovery.threads.per.data.dir": 1,
            "log.segment.bytes": 16 * 1024 * 1024,
            "log.retention.hours": 24,
            "group.initial.rebalance.delay.ms": 0,
            # a killed broker is fenced in ~4 s instead of 9 s: failure drills finish sooner
            "broker.session.timeout.ms": 4000,
            "broker.heartbeat.interval.ms": 1000,
        }
        lines = [f"# written by local/components/kafka.py for {self.layout.home}; edits are lost"]
        lines += [f"{k}={v}" for k, v in props.items()]
        return "\n".join(lines) + "\n"

    def _cluster_id(self) -> str:
        """The stack's cluster id, made once; refuses data formatted for another node count,
        whose static voter set could never form a quorum with this one."""
        f = self._cluster_file
        if f.exists():
            saved = json.loads(f.read_text())
            if saved["nodes"] != self.count:
                raise RuntimeError(
                    f"Kafka data under {self.layout.data} was formatted for {saved['nodes']} "
                    f"node(s), this stack wants {self.count}: run `likes local down --wipe` first"
                )
            return str(saved["cluster_id"])
        cid = _new_cluster_id()
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_suffix(".tmp")
        tmp.write_text(json.dumps({"cluster_id": cid, "nodes": self.count}))
        tmp.replace(f)
        return cid

    @staticmethod
    def _write_if_changed(path: Path, text: str) -> None:
        if not path.exists() or path.read_text() != text:
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text(text)
            tmp.replace(path)

    def prepare(self) -> None:
        self.layout.ensure()
        classpath = maven.resolve("kafka")
        # java's @argfile syntax: quoted so that a classpath entry may hold spaces
        self._write_if_changed(self._argfile, f'-cp "{classpath}"\n')
        cid = self._cluster_id()
        for n in self.node_ids:
            self._write_if_changed(self._props_file(n), self._properties(n))
        # Format only nodes never formatted: a restarted node keeps its log and metadata. The
        # format JVMs run side by side (a few seconds each on a small machine).
        todo = [n for n in self.node_ids if not (self._log_dir(n) / "meta.properties").exists()]
        procs = []
        for n in todo:
            cmd = [
                "java",
                "-Xmx256m",
                f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
                f"@{self._argfile}",
                "kafka.tools.StorageTool",
                "format",
                "--ignore-formatted",
                "-t",
                cid,
                "-c",
                str(self._props_file(n)),
            ]
            procs.append(
                (n, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
            )
        for n, p in procs:
            out, _ = p.communicate()
            if p.returncode != 0:
                tail = "\n".join(out.decode(errors="replace").splitlines()[-20:])
                raise RuntimeError(f"formatting kafka-{n} storage failed:\n{tail}")

    # -- bootstrap -------------------------------------------------------------------------
    def bootstrap(self) -> None:
        """Wait until every broker is in the cluster's metadata, so that a produce with acks=all
        to a topic of replication factor 3 succeeds as soon as `up` returns."""
        want = set(self.node_ids)
        servers = bootstrap_servers(self.layout)

        def all_brokers() -> None:
            md = _metadata(servers, timeout=2.0)
            if not want <= set(md.brokers) or md.controller_id < 0:
                raise ProbeFailed(f"brokers {sorted(md.brokers)} of {sorted(want)} registered")

        wait_until(all_brokers, timeout=60.0, interval=0.5)
        # the event spine's topics as the program declares them (local/transforms.py scales
        # their partitions down)
        from local import transforms
        from services.contracts import topics

        topics.ensure(servers, self.count, transforms.topic_specs(self.layout, self.layout.stack))
