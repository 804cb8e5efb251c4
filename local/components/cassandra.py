"""Apache Cassandra 5.0, one node, run from its Maven Central jars on the machine's Java 17.

prepare() resolves the classpath (Maven, cached), writes the yaml from local/cassandra/ and
`java @argfiles` holding the classpath and the class-data-sharing flags, so servers() stays cheap
for `status`. Logins are required (PasswordAuthenticator, as production's Scylla): bootstrap()
logs in as the admin role (creating it as the default superuser on a first start), applies
services/schema/cql/ with this node's data-centre name at replication factor 1, then the roles
(the services' one from the stack's secrets file; the default superuser is dropped).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import ssl
import string
import subprocess
from pathlib import Path

from cassandra.auth import PlainTextAuthProvider
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile, Session
from cassandra.policies import WhiteListRoundRobinPolicy

from infra import exporters, scylla
from local import maven
from local import tls as local_tls
from local.components.base import Component, ProbeFailed, Server, tcp_probe
from local.layout import HOST, REPO_ROOT, Layout
from services.contracts import tls
from services.schema import cql_apply, cql_roles

CONF_DIR = REPO_ROOT / "local" / "cassandra"
YAML_TEMPLATE = CONF_DIR / "cassandra.yaml"
LOGBACK_CONFIG = CONF_DIR / "logback.xml"
MAIN_CLASS = "org.apache.cassandra.service.CassandraDaemon"

# The Java 17 module flags of Cassandra 5.0's conf/jvm17-server.options: without them start-up
# aborts with "FATAL: Cassandra is unable to access required classes".
JAVA17_FLAGS = [
    "-Djdk.attach.allowAttachSelf=true",
    *(
        f"--add-exports={m}=ALL-UNNAMED"
        for m in (
            "java.base/jdk.internal.misc",
            "java.management.rmi/com.sun.jmx.remote.internal.rmi",
            "java.management/com.sun.jmx.remote.security",
            "java.rmi/sun.rmi.registry",
            "java.rmi/sun.rmi.server",
            "java.sql/java.sql",
            "java.base/java.lang.ref",
            "jdk.unsupported/sun.misc",
        )
    ),
    *(
        f"--add-opens=java.base/{p}=ALL-UNNAMED"
        for p in (
            "java.lang.module",
            "jdk.internal.loader",
            "jdk.internal.ref",
            "jdk.internal.reflect",
            "jdk.internal.math",
            "jdk.internal.module",
            "jdk.internal.util.jar",
            "sun.nio.ch",
            "java.io",
            "java.lang.reflect",
            "java.lang",
            "java.util",
            "java.nio",
        )
    ),
    "--add-opens=jdk.management/com.sun.management.internal=ALL-UNNAMED",
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dio.netty.allocator.useCacheForAllThreads=true",
    "-Dio.netty.allocator.maxOrder=11",
]

# An explicit heap: the launcher script would size it from RAM (~6 GB here). Cassandra mlockall()s
# its memory at start (it succeeds when run as root), pinning whatever is committed by then, so
# -Xms stays small (RSS ~0.65 GB instead of ~1.4 GB with -Xms1G) while the heap may grow to 1 GB.
# No AlwaysPreTouch (in Cassandra's options) for the same reason.
JVM_FLAGS = [
    "-Xms256M",
    "-Xmx1G",
    "-Xss256k",
    "-XX:+UseG1GC",
    "-XX:+ParallelRefProcEnabled",
    "-XX:MaxTenuringThreshold=1",
    "-XX:G1RSetUpdatingPauseTimePercent=5",
    "-XX:MaxGCPauseMillis=300",
    "-XX:+PerfDisableSharedMem",  # no /tmp/hsperfdata mmap, as in jvm-server.options
    "-XX:+ExitOnOutOfMemoryError",
    "-Djava.net.preferIPv4Stack=true",
    "-Dchronicle.analytics.disable=true",
    "-Dchronicle.announcer.disable=true",
]

# Start/stop speed-ups for a lone seed node. With no peers there is no gossip to wait for at start
# (5 s+) nor anyone to tell about a shutdown (2 s). Not -Dcassandra.unsafesystem (no flush of the
# schema tables after DDL): a game day's SIGKILL showed the commit log does NOT cover it. At
# restart the replay met the data of tables whose schema was not loaded yet, skipped all of it
# ("Skipped 23585 mutations from unknown (probably removed) CF") and the keyspace was gone.
FAST_FLAGS = [
    "-Dcassandra.skip_wait_for_gossip_to_settle=0",
    "-Dcassandra.shutdown_announce_in_ms=0",
    # the default superuser is created this long after start (10 s by default): the first
    # bootstrap logs in as it
    "-Dcassandra.superuser_setup_delay_ms=0",
]

PROBE_TIMEOUT = 2.0


def admin_password(layout: Layout) -> str:
    """The admin role's password (the program's scylla-admin secret, as the stack plays it)."""
    from local import transforms

    return transforms.stack_secrets(layout)[transforms.CASSANDRA_ADMIN]


def service_login(layout: Layout) -> tuple[str, str]:
    """The services' role and password (the program's scylla-auth secret, as the stack plays it)."""
    from local import transforms

    return cql_roles.SERVICE_ROLE, transforms.stack_secrets(layout)[transforms.CASSANDRA_AUTH]


def connect(
    host: str,
    port: int,
    timeout: float = 10.0,
    login: tuple[str, str] | None = None,
    ssl_context: ssl.SSLContext | None = None,
    connect_timeout: float = 5.0,
) -> tuple[Cluster, Session]:
    """A driver session pinned to one node, without the schema/token metadata fetches that make a
    first connect slow, logged in as `login` (user, password), over TLS with `ssl_context`,
    each connection given up to `connect_timeout` (at most `timeout`). The caller shuts it
    down."""
    profile = ExecutionProfile(
        load_balancing_policy=WhiteListRoundRobinPolicy([host]), request_timeout=timeout
    )
    cluster = Cluster(
        [host],
        port=port,
        protocol_version=5,
        execution_profiles={EXEC_PROFILE_DEFAULT: profile},
        connect_timeout=min(timeout, connect_timeout),
        control_connection_timeout=timeout,
        schema_metadata_enabled=False,
        token_metadata_enabled=False,
        auth_provider=PlainTextAuthProvider(*login) if login else None,
        ssl_context=ssl_context,
    )
    try:
        return cluster, cluster.connect()
    except BaseException:
        cluster.shutdown()
        raise


class Cassandra(Component):
    name = "cassandra"
    plays = scylla.SCYLLA_APP  # the program's Scylla: scraped as workload=scylla
    requires = ()

    # -- paths -----------------------------------------------------------------------------
    @property
    def data_dir(self) -> Path:
        return self.layout.data / "cassandra"

    @property
    def yaml_file(self) -> Path:
        return self.layout.conf / "cassandra.yaml"

    @property
    def _argfile(self) -> Path:
        """`java @file` argument file holding `-cp <classpath>`, written by prepare()."""
        return self.layout.conf / "cassandra.jvm-args"

    @property
    def _cds_argfile(self) -> Path:
        """`java @file` with this start's class-data-sharing flags, written by prepare()."""
        return self.layout.conf / "cassandra.cds-args"

    @property
    def cds_dir(self) -> Path:
        # Beside the Maven classpaths: shared by every stack of this checkout, survives a wipe.
        return self.layout.cache / "cds"

    @property
    def ssl_context(self) -> ssl.SSLContext | None:
        """A client's TLS to this node in the --tls profile (as clients.cassandra_tls builds)."""
        ca = local_tls.client_ca(self.layout)
        return tls.cassandra_context(ca) if ca else None

    @property
    def native_port(self) -> int:
        return self.layout.ports.cassandra_native

    @property
    def jmx_port(self) -> int:
        return self.layout.ports.cassandra_jmx

    def metrics_targets(self) -> list[str]:
        return [f"{HOST}:{self.layout.ports.cassandra_metrics}"]

    # -- servers ---------------------------------------------------------------------------
    def servers(self) -> list[Server]:
        # Cheap on purpose (status calls it): the classpath sits in the argfile, not resolved here.
        argv = [
            "java",
            *JVM_FLAGS,
            *JAVA17_FLAGS,
            *FAST_FLAGS,
            f"-Dcassandra.config={self.yaml_file.as_uri()}",
            "-Dcassandra-foreground=yes",  # otherwise the daemon closes stdout/stderr
            f"-Dlogback.configurationFile={LOGBACK_CONFIG}",
            f"-Dcassandra.logdir={self.layout.logs}",
            f"-Dcassandra.storagedir={self.data_dir}",
            f"-Dcassandra.triggers_dir={self.data_dir / 'triggers'}",
            # lz4/snappy/netty unpack their natives here: inside the stack, not strewn over /tmp
            f"-Djava.io.tmpdir={self.data_dir / 'tmp'}",
            f"-Dcassandra.jmx.local.port={self.jmx_port}",
            # RMI objects on the same port (as cassandra-env.sh does), not on a random one
            f"-Dcom.sun.management.jmxremote.rmi.port={self.jmx_port}",
            # Scylla's metrics port, served by the JMX exporter agent (infra/exporters.py)
            exporters.jmx_agent_flag(
                maven.jar_path(exporters.JMX_AGENT),
                HOST,
                self.layout.ports.cassandra_metrics,
                exporters.CASSANDRA_JMX_RULES,
            ),
            f"@{self._cds_argfile}",
            f"@{self._argfile}",
            MAIN_CLASS,
        ]
        return [
            Server(
                name="cassandra",
                argv=argv,
                address=f"{HOST}:{self.native_port}",
                probe=self._probe,
                start_timeout=180.0,
                # SIGTERM drains (flushes memtables) and a first run dumps its CDS archive
                stop_timeout=30.0,
            )
        ]

    def prepare(self) -> None:
        self.layout.ensure()
        for sub in ("data", "commitlog", "saved_caches", "hints", "cdc_raw", "triggers", "tmp"):
            (self.data_dir / sub).mkdir(parents=True, exist_ok=True)
        yaml_text = string.Template(YAML_TEMPLATE.read_text()).substitute(
            host=HOST,
            storage_port=self.layout.ports.cassandra_storage,
            native_port=self.native_port,
            data=self.data_dir,
            client_encryption=self._client_encryption(),
        )
        _write_if_changed(self.yaml_file, yaml_text)
        classpath = maven.resolve("cassandra")
        maven.jar(exporters.JMX_AGENT)
        _write_if_changed(self._argfile, f"-cp\n{classpath}\n")
        self._prepare_class_data_sharing(classpath)

    def _client_encryption(self) -> str:
        """The --tls profile: the native port serves only TLS, from the local CA's PEM keystore
        (Cassandra 5's PEMBasedSslContextFactory; production's Scylla: infra/scylla.py)."""
        if not self.layout.tls:
            return ""
        local_tls.ensure(self.layout)
        keystore = local_tls.server_dir(self.layout, tls.SCYLLA) / local_tls.KEYSTORE
        return (
            "client_encryption_options:\n"
            "  enabled: true\n"
            "  optional: false\n"
            "  require_client_auth: false\n"
            "  ssl_context_factory:\n"
            "    class_name: org.apache.cassandra.security.PEMBasedSslContextFactory\n"
            f"  keystore: {keystore}\n"
            "  accepted_protocols: [TLSv1.2, TLSv1.3]\n"
        )

    def _prepare_class_data_sharing(self, classpath: str) -> None:
        """AppCDS: a start that maps an archive of the classes Cassandra loads was 25-35 % faster
        on this 2-core box. Without an archive for this classpath + JVM yet, the server dumps one
        when it exits (a clean `down`); the next prepare() checks and promotes it."""
        ident = f"{classpath}\n{_java_release()}\n{JVM_FLAGS}"
        key = hashlib.sha256(ident.encode()).hexdigest()[:16]
        archive = self.cds_dir / f"cassandra-{key}.jsa"
        # Dumped under a per-stack name: two stacks exiting at once never write the same file.
        stack = hashlib.sha256(str(self.layout.home).encode()).hexdigest()[:8]
        pending = self.cds_dir / f"cassandra-{key}-{stack}.jsa.pending"
        self.cds_dir.mkdir(parents=True, exist_ok=True)
        if pending.exists():
            if not archive.exists() and self._archive_usable(pending):
                os.replace(pending, archive)
            else:
                pending.unlink(missing_ok=True)
        for old in self.cds_dir.glob("cassandra-*.jsa"):
            if old != archive:  # another classpath or JVM: never valid again
                old.unlink(missing_ok=True)
        if archive.exists():
            flag = f"-XX:SharedArchiveFile={archive}"
        else:
            # the JMX exporter agent is attached: the JVM refuses to dump with an agent unless
            # told that this one transforms no class (a fresh machine's first start failed)
            flag = (
                "-XX:+UnlockDiagnosticVMOptions\n-XX:+AllowArchivingWithJavaAgent\n"
                f"-XX:ArchiveClassesAtExit={pending}"
            )
        # cds=error: the dump warns once per class it skips (hundreds of old-bytecode lines)
        _write_if_changed(self._cds_argfile, f"{flag}\n-Xlog:cds*=error\n")

    def _archive_usable(self, archive: Path) -> bool:
        """A dump cut short (SIGKILL during exit) must not be promoted: with -Xshare:on the JVM
        refuses to start unless it can map and validate the archive against this classpath."""
        cmd = [
            "java",
            *JVM_FLAGS,
            *JAVA17_FLAGS,
            "-Xshare:on",
            f"-XX:SharedArchiveFile={archive}",
            "-Xlog:cds*=error",
            f"@{self._argfile}",
            "-version",
        ]
        try:
            proc = subprocess.run(cmd, capture_output=True, timeout=60)
        except subprocess.TimeoutExpired:
            return False
        return proc.returncode == 0

    def nodetool_argv(self, *args: str) -> list[str]:
        """`nodetool <args>` against this node over its loopback JMX port (needs prepare() to
        have written the classpath argfile), for runbooks and chaos experiments."""
        return [
            "java",
            "-Xmx128M",
            *JAVA17_FLAGS,
            f"-Dlogback.configurationFile={LOGBACK_CONFIG}",
            f"-Dcassandra.logdir={self.layout.logs}",
            f"@{self._argfile}",
            "org.apache.cassandra.tools.NodeTool",
            *("-h", HOST, "-p", str(self.jmx_port)),
            *args,
        ]

    def _login(self, timeout: float) -> tuple[Cluster, Session]:
        """A session as the admin role; before the first bootstrap made it, as the default
        superuser (the server creates that a moment after it opens its port)."""
        try:
            admin = (cql_roles.ADMIN_ROLE, self._admin)
            return connect(HOST, self.native_port, timeout, admin, self.ssl_context)
        except Exception as e:
            if not cql_roles.is_auth_failure(e):
                raise
            default = (cql_roles.DEFAULT_SUPERUSER, cql_roles.DEFAULT_SUPERUSER)
            return connect(HOST, self.native_port, timeout, default, self.ssl_context)

    @property
    def _admin(self) -> str:
        return admin_password(self.layout)

    def _probe(self) -> None:
        """Ready = the native port answers a real CQL query, logged in."""
        tcp_probe(HOST, self.native_port, timeout=PROBE_TIMEOUT)
        try:
            cluster, session = self._login(PROBE_TIMEOUT)
        except Exception as e:  # NoHostAvailable, OperationTimedOut, AuthenticationFailed...
            raise ProbeFailed(f"{HOST}:{self.native_port}: no CQL session: {e}") from e
        try:
            row = session.execute("SELECT release_version FROM system.local").one()
        except Exception as e:
            raise ProbeFailed(f"{HOST}:{self.native_port}: query failed: {e}") from e
        finally:
            cluster.shutdown()
        if row is None:
            raise ProbeFailed(f"{HOST}:{self.native_port}: system.local is empty")

    def bootstrap(self) -> None:
        def login(user: str, password: str) -> tuple[Cluster, Session]:
            # a node just started, on a loaded machine, may take over 5 s to finish a TLS
            # handshake and a bcrypt check: a restart in CI failed its roles step so
            return connect(HOST, self.native_port, 30.0, (user, password), self.ssl_context,
                           connect_timeout=30.0)  # fmt: skip

        cluster, session = cql_roles.admin_session(login, self._admin)
        try:
            # The data-centre name comes from the snitch (SimpleSnitch: datacenter1); reading it
            # keeps the keyspace valid if the snitch changes.
            row = session.execute("SELECT data_center FROM system.local").one()
            cql_apply.apply(session, {row.data_center: 1})
            cql_roles.apply(session, login, service_login(self.layout)[1])
        finally:
            cluster.shutdown()


def _java_release() -> str:
    """Identity of the `java` on PATH (its JDK's release file), part of the archive key."""
    java = shutil.which("java")
    if java is None:
        return ""
    home = Path(java).resolve().parent.parent
    try:
        return (home / "release").read_text()
    except OSError:
        return str(home)


def _write_if_changed(path: Path, text: str) -> None:
    if not path.exists() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
