"""Apache Kafka in KRaft mode, run from its Maven Central jars on the machine's Java.

Every node is a combined broker+controller with a static voter set (`controller.quorum.voters`),
so each node's storage is formatted on its own with the shared cluster id and no controller
directory ids have to be exchanged. Three nodes hold production's durability settings
(RF 3, min ISR 2); the one-node quick profile drops all of them to 1.

Clients log in, as in production: the broker listener is SASL_PLAINTEXT with SCRAM-SHA-512 and
refuses a client without credentials or with wrong ones. The brokers replicate over that
listener too, as the `admin` user, whose credential is written into the metadata log when the
storage is formatted (`--add-scram`, from a 0600 argument file: no password in argv); bootstrap()
then creates the services' and the registry's users through the Admin API, as admin. The
controller listener stays PLAINTEXT on loopback (KRaft cannot check SCRAM there: the credentials
live in the log the controllers serve). No authorizer runs locally: any logged-in user may do
anything; production's ACLs (services/contracts/kafka.py) are Strimzi's to enforce.
"""

from __future__ import annotations

import base64
import functools
import json
import logging
import subprocess
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ClusterMetadata,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialAlteration,
    UserScramCredentialUpsertion,
)

from infra import exporters
from local import maven
from local import tls as local_tls
from local.components.base import Component, ProbeFailed, Server, wait_until
from local.layout import HOST, REPO_ROOT, Layout
from services.contracts import kafka as kafka_contract
from services.contracts import tls

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


def login(layout: Layout, user: str) -> kafka_contract.Credentials:
    """A Kafka user's login as the stack plays its Secret (the services', the registry's, or
    the local admin's)."""
    from local import transforms

    secret = {
        kafka_contract.SERVICE_USER: transforms.KAFKA_AUTH,
        kafka_contract.REGISTRY_USER: transforms.KAFKA_REGISTRY,
        kafka_contract.ADMIN_USER: transforms.KAFKA_ADMIN,
    }[user]
    return kafka_contract.Credentials(user, transforms.stack_secrets(layout)[secret])


def ca_file(layout: Layout) -> str | None:
    """The CA clients verify the brokers against (the --tls profile); None: plaintext."""
    return local_tls.client_ca(layout)


def client_config(layout: Layout, creds: kafka_contract.Credentials) -> dict[str, Any]:
    """A client's connection settings for this stack's brokers, as `creds`."""
    return kafka_contract.client_config(bootstrap_servers(layout), creds, ca_file(layout))


def admin_config(layout: Layout) -> dict[str, Any]:
    """Connection settings of the local super user: `likes local up` creates topics and users
    with it (Strimzi's operators do in production); tests use the services' login instead."""
    return client_config(layout, login(layout, kafka_contract.ADMIN_USER))


# SCRAM credentials the bootstrap keeps as the stack's secrets say (the admin's is formatted in)
USERS = (kafka_contract.SERVICE_USER, kafka_contract.REGISTRY_USER)
SCRAM_ITERATIONS = 8192  # Kafka's StorageTool default for --add-scram


def _metadata(conf: dict[str, Any], timeout: float) -> ClusterMetadata:
    bootstrap = conf["bootstrap.servers"]
    admin = AdminClient(
        {
            **conf,
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

    def _format_args(self, node: int) -> Path:
        """The storage format's main class and arguments (a password among them), read by java
        from this 0600 file and deleted after."""
        return self.layout.conf / f"kafka-format-{node}.args"

    def _props_file(self, node: int) -> Path:
        return self.layout.conf / f"kafka-{node}.properties"

    def _log_dir(self, node: int) -> Path:
        return self.layout.data / f"kafka-{node}"

    def _broker_port(self, node: int) -> int:
        return self.layout.ports.kafka_brokers[node - 1]

    def _controller_port(self, node: int) -> int:
        return self.layout.ports.kafka_controllers[node - 1]

    def _metrics_port(self, node: int) -> int:
        return self.layout.ports.kafka_metrics[node - 1]

    @property
    def _agent(self) -> Path:
        """The JMX exporter agent's jar (setup.sh fetches it; `servers()` must stay cheap)."""
        return maven.jar_path(exporters.JMX_AGENT)

    def metrics_targets(self) -> list[str]:
        return [f"{HOST}:{self._metrics_port(n)}" for n in self.node_ids]

    # -- servers ---------------------------------------------------------------------------
    def servers(self) -> list[Server]:
        # Cheap on purpose (status calls it): the classpath sits in the argfile, not resolved here.
        return [self._server(n) for n in self.node_ids]

    def _server(self, node: int) -> Server:
        name = f"kafka-{node}"
        argv = [
            "java",
            *JVM_FLAGS,
            # the program's metricsConfig: the JMX exporter agent with the same rule file
            exporters.jmx_agent_flag(
                self._agent, HOST, self._metrics_port(node), exporters.KAFKA_JMX_RULES
            ),
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
        md = _metadata(self._admin_conf(addr), timeout=2.0)
        if node not in md.brokers:
            raise ProbeFailed(f"{addr}: broker {node} not yet in metadata {sorted(md.brokers)}")
        if md.controller_id < 0:
            raise ProbeFailed(f"{addr}: no controller known")

    def _admin_conf(self, bootstrap: str | None = None) -> dict[str, Any]:
        conf = admin_config(self.layout)
        if bootstrap is not None:
            conf["bootstrap.servers"] = bootstrap
        return conf

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
                f"CLIENT://{HOST}:{self._broker_port(node)},"
                f"CONTROLLER://{HOST}:{self._controller_port(node)}"
            ),
            # the --faults profile announces the broker's proxy: clients and replica fetchers
            # then reach it through Toxiproxy (local/components/toxiproxy.py)
            "advertised.listeners": (
                f"CLIENT://{HOST}:{self.layout.announced(self._broker_port(node))}"
            ),
            # clients and replication log in (SCRAM); the controllers' quorum is loopback-only
            "listener.security.protocol.map": (
                f"CLIENT:{kafka_contract.protocol(self.layout.tls)},CONTROLLER:PLAINTEXT"
            ),
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "CLIENT",
            "sasl.enabled.mechanisms": kafka_contract.SASL_MECHANISM,
            "sasl.mechanism.inter.broker.protocol": kafka_contract.SASL_MECHANISM,
            f"listener.name.client.{kafka_contract.SASL_MECHANISM.lower()}.sasl.jaas.config": (
                kafka_contract.jaas_config(login(self.layout, kafka_contract.ADMIN_USER))
            ),
            **self._tls_properties(),
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
        lines = [
            f"# written by local/components/kafka.py for {self.layout.home}; edits are lost",
            "# holds the admin's password (inter-broker login): mode 0600, like a mounted Secret",
        ]
        lines += [f"{k}={v}" for k, v in props.items()]
        return "\n".join(lines) + "\n"

    def _tls_properties(self) -> dict[str, str]:
        """The --tls profile: the client listener (and so replication) serves the local CA's
        certificate from a PEM keystore, and brokers verify each other against the CA."""
        if not self.layout.tls:
            return {}
        d = local_tls.server_dir(self.layout, tls.KAFKA)
        return {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(d / local_tls.KEYSTORE),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(d / tls.CA_KEY),
            "ssl.enabled.protocols": "TLSv1.3,TLSv1.2",
        }

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
            if not saved.get("scram"):
                # formatted before the brokers logged in: their admin credential is not in the
                # metadata log, so no broker could replicate
                raise RuntimeError(
                    f"Kafka data under {self.layout.data} was formatted without SCRAM logins: "
                    "run `likes local down --wipe` first"
                )
            return str(saved["cluster_id"])
        cid = _new_cluster_id()
        f.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.with_suffix(".tmp")
        tmp.write_text(json.dumps({"cluster_id": cid, "nodes": self.count, "scram": True}))
        tmp.replace(f)
        return cid

    @staticmethod
    def _write_if_changed(path: Path, text: str, mode: int = 0o644) -> None:
        if not path.exists() or path.read_text() != text:
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.unlink(missing_ok=True)
            tmp.touch(mode=mode)
            tmp.write_text(text)
            tmp.replace(path)

    def prepare(self) -> None:
        self.layout.ensure()
        if self.layout.tls:
            local_tls.ensure(self.layout)
        classpath = maven.resolve("kafka")
        maven.jar(exporters.JMX_AGENT)  # the metrics agent every broker loads
        # java's @argfile syntax: quoted so that a classpath entry may hold spaces
        self._write_if_changed(self._argfile, f'-cp "{classpath}"\n')
        cid = self._cluster_id()
        for n in self.node_ids:
            self._write_if_changed(self._props_file(n), self._properties(n), mode=0o600)
        # Format only nodes never formatted: a restarted node keeps its log and metadata. The
        # format JVMs run side by side (a few seconds each on a small machine).
        todo = [n for n in self.node_ids if not (self._log_dir(n) / "meta.properties").exists()]
        if not todo:
            return
        admin = login(self.layout, kafka_contract.ADMIN_USER)
        # the admin's credential goes into the metadata log at format time (the brokers need it
        # to replicate before anything could create it); java reads the main class and its
        # arguments from this file, so the password is never in a command line
        procs = []
        try:
            for n in todo:
                node_args = self._format_args(n)
                node_args.unlink(missing_ok=True)
                node_args.touch(mode=0o600)
                node_args.write_text(
                    f"kafka.tools.StorageTool format --ignore-formatted -t {cid} "
                    f'-c "{self._props_file(n)}" --add-scram '
                    f"{kafka_contract.SASL_MECHANISM}=[name={admin.user},"
                    f"password={admin.password}]\n"
                )
                cmd = [
                    "java",
                    "-Xmx256m",
                    f"-Dlog4j2.configurationFile={LOG4J_CONFIG}",
                    f"@{self._argfile}",
                    f"@{node_args}",
                ]
                procs.append(
                    (n, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
                )
            for n, p in procs:
                out, _ = p.communicate()
                if p.returncode != 0:
                    tail = "\n".join(out.decode(errors="replace").splitlines()[-20:])
                    raise RuntimeError(f"formatting kafka-{n} storage failed:\n{tail}")
        finally:
            for _n, p in procs:
                if p.poll() is None:
                    p.kill()
            for n in todo:
                self._format_args(n).unlink(missing_ok=True)

    # -- bootstrap -------------------------------------------------------------------------
    def bootstrap(self) -> None:
        """Wait until every broker is in the cluster's metadata, so that a produce with acks=all
        to a topic of replication factor 3 succeeds as soon as `up` returns."""
        want = set(self.node_ids)
        admin_conf = self._admin_conf()

        def all_brokers() -> None:
            md = _metadata(admin_conf, timeout=2.0)
            if not want <= set(md.brokers) or md.controller_id < 0:
                raise ProbeFailed(f"brokers {sorted(md.brokers)} of {sorted(want)} registered")

        wait_until(all_brokers, timeout=60.0, interval=0.5)
        ensure_users(self.layout)
        # the event spine's topics as the program declares them (local/transforms.py scales
        # their partitions down)
        from local import transforms
        from services.contracts import topics

        topics.ensure(
            admin_conf, self.count, transforms.topic_specs(self.layout, self.layout.stack)
        )


def _logs_in(layout: Layout, creds: kafka_contract.Credentials) -> bool:
    conf = client_config(layout, creds)
    try:
        _metadata(conf, timeout=3.0)
        return True
    except ProbeFailed:
        return False


def ensure_users(layout: Layout) -> list[str]:
    """Give each of USERS the SCRAM credential of its stack secret, as admin; a user whose
    password already logs in is left alone (a rewrite would change nothing but the salt).
    Returns the users written ([] on a rerun)."""
    conf: dict[str, Any] = {**admin_config(layout), "logger": _quiet}
    admin = AdminClient(conf)
    mechanism = ScramMechanism[kafka_contract.SASL_MECHANISM.replace("-", "_")]
    # a user with no credential at all (a fresh stack) is written without a login attempt,
    # which would only time out
    known = set()
    described = admin.describe_user_scram_credentials(list(USERS))
    assert isinstance(described, dict)  # one future per named user
    for user, fut in described.items():
        try:
            if any(i.mechanism == mechanism for i in fut.result(timeout=30).scram_credential_infos):
                known.add(user)
        except KafkaException as e:
            if e.args[0].code() != KafkaError.RESOURCE_NOT_FOUND:
                raise
    todo = [login(layout, u) for u in USERS]
    todo = [c for c in todo if c.user not in known or not _logs_in(layout, c)]
    if not todo:
        return []
    upserts: list[UserScramCredentialAlteration] = [
        UserScramCredentialUpsertion(
            c.user, ScramCredentialInfo(mechanism, SCRAM_ITERATIONS), c.password.encode()
        )
        for c in todo
    ]
    for fut in admin.alter_user_scram_credentials(upserts).values():
        fut.result(timeout=30)
    # a credential reaches every broker through the metadata log: wait until each logs in
    for c in todo:
        wait_until(functools.partial(_require_login, layout, c), timeout=30.0, interval=0.5)
    return [c.user for c in todo]


def _require_login(layout: Layout, creds: kafka_contract.Credentials) -> None:
    if not _logs_in(layout, creds):
        raise ProbeFailed(f"kafka: {creds.user} does not log in yet")
