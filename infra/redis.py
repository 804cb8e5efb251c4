"""Redis: the count-cache cluster, the hot pools the operator replicates hot counts into, the
AOF-persisted idem-store cluster, and the feature-store cluster (the abuse scorer's shared
feature state: a cache of its own, no AOF, evicting when full, so that state can neither fill the
idem-store nor fail the writes' dedup). On-cluster rather than ElastiCache: see infra/README.md.

The password reaches redis-server as a config file (`include`d by redis.conf) from the `redis-auth`
Secret, never as argv: `--requirepass $(REDIS_PASSWORD)` shows in `ps` and in the pod spec's
expanded command.

Hot pools are four *addressable* servers, one pod each: a hot post's copy is written to a named
pool and read back from that same server. (They were 3-pod StatefulSets of independent servers
behind one DNS name, so a copy landed on one pod and most reads asked another and missed: review
C10.) Read capacity for a hot key is 4 pools, one Redis each, behind the CDN; a pool that dies is a
miss that falls back to the count-cache until its StatefulSet restarts it and the next copy lands.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from infra import exporters, observability
from infra import k8s as kx
from services.contracts import keys

PORT = 6379
BUS_PORT = 16379
REDIS_UID = 999  # the official image's redis user
AUTH_SECRET = "redis-auth"
AUTH_CONF_KEY = "auth.conf"  # the Secret's key holding `requirepass`/`masterauth` lines
AUTH_CONF_DIR = "/etc/redis-auth"
ROLE_LABEL = "likes.io/redis-role"  # on every Redis pod: one of COMPONENTS
COMPONENTS = ("count-cache", "idem-store", "feature-store", "hot-pool")
CLUSTERS = ("count-cache", "idem-store", "feature-store")  # the COMPONENTS that are clusters


def hot_pool(i: int) -> str:
    """The i-th hot pool's StatefulSet (and app.kubernetes.io/name), from 0."""
    return f"hot-pool-{i}"


@dataclass(frozen=True)
class RedisArgs:
    namespace: str
    version: str
    password: pulumi.Input[str]
    count_cache_shards: int
    replicas_per_shard: int
    count_cache_memory_gi: int
    hot_pools: int
    idem_store_shards: int
    idem_store_memory_gi: int
    idem_store_storage_gi: int
    feature_store_shards: int
    feature_store_memory_gi: int
    storage_class: str = "gp3"


# A shard that lost its primary and replica stops only its own slots: the rest of the cluster
# keeps answering (Redis's default would refuse every key). The local stack runs these lines too.
CLUSTER_AVAILABILITY = ("cluster-require-full-coverage no",)
# Every ack'd idempotency key survives a restart; at most ~1 s lost on a node crash.
AOF = ("appendonly yes", "appendfsync everysec")


def redis_conf(*, cluster: bool, memory_gi: int, policy: str, aof: bool) -> str:
    """redis.conf for one role. maxmemory leaves 20% headroom for fork/COW and buffers."""
    lines = [
        f"port {PORT}",
        "bind 0.0.0.0",
        "protected-mode yes",
        "dir /data",
        f"maxmemory {int(memory_gi * 0.8 * 1024)}mb",
        f"maxmemory-policy {policy}",
        "tcp-keepalive 60",
        # requirepass/masterauth, from the redis-auth Secret (never argv)
        f"include {AUTH_CONF_DIR}/{AUTH_CONF_KEY}",
    ]
    if cluster:
        lines += [
            "cluster-enabled yes",
            "cluster-config-file /data/nodes.conf",
            "cluster-node-timeout 5000",
            # Announce stable DNS names: pod IPs change on every restart.
            "cluster-preferred-endpoint-type hostname",
            *CLUSTER_AVAILABILITY,
        ]
    if aof:
        lines += [*AOF, 'save ""', "aof-use-rdb-preamble yes"]
    else:
        lines += ["appendonly no", 'save ""']
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class _Role:
    name: str
    component: str
    replicas: int
    memory_gi: int
    conf: str
    cluster: bool
    storage_gi: int
    max_unavailable: int


def _cluster_role(name: str, nodes: int, memory_gi: int, *, aof: bool, storage_gi: int) -> _Role:
    """A Redis Cluster role (one of CLUSTERS): `nodes` pods, primaries and their replicas, with
    the role's eviction policy (keys.EVICTION_POLICY)."""
    conf = redis_conf(cluster=True, memory_gi=memory_gi, policy=keys.EVICTION_POLICY[name], aof=aof)
    return _Role(
        name, name, nodes, memory_gi, conf, cluster=True, storage_gi=storage_gi, max_unavailable=1
    )


class Redis(pulumi.ComponentResource):
    exporter: str  # the multi-target redis_exporter, host:port
    count_cache_seeds: str
    idem_store_seeds: str
    feature_store_seeds: str
    hot_pool_endpoints: list[str]

    def __init__(
        self, name: str, args: RedisArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("likes:infra:Redis", name, None, opts)
        self._ns = args.namespace
        self._args = args
        secret = k8s.core.v1.Secret(
            f"{name}-auth",
            metadata=kx.meta(AUTH_SECRET, args.namespace, kx.labels("redis", "auth", "datastore")),
            type="Opaque",
            string_data={
                "password": args.password,
                AUTH_CONF_KEY: pulumi.Output.concat(
                    "requirepass ", args.password, "\nmasterauth ", args.password, "\n"
                ),
            },
            opts=pulumi.ResourceOptions(parent=self),
        )
        roles = [
            _cluster_role(
                "count-cache",
                args.count_cache_shards * (1 + args.replicas_per_shard),
                args.count_cache_memory_gi,
                aof=False,
                storage_gi=1,  # nodes.conf only: a node must keep its cluster identity
            ),
            _cluster_role(
                "idem-store",
                args.idem_store_shards * 2,
                args.idem_store_memory_gi,
                aof=True,
                storage_gi=args.idem_store_storage_gi,
            ),
            # a cache of the scorer's features: a lost key weakens a score, never a count, so
            # no AOF, and it evicts when full (keys.EVICTION_POLICY) rather than refuse
            _cluster_role(
                "feature-store",
                args.feature_store_shards * 2,
                args.feature_store_memory_gi,
                aof=False,
                storage_gi=1,  # nodes.conf only
            ),
        ]
        roles += [
            _Role(
                hot_pool(i),
                "hot-pool",
                1,  # one addressable server per pool (see the module docstring)
                max(1, args.count_cache_memory_gi // 4),
                redis_conf(
                    cluster=False,
                    memory_gi=max(1, args.count_cache_memory_gi // 4),
                    policy=keys.EVICTION_POLICY["hot-pool"],
                    aof=False,
                ),
                cluster=False,
                storage_gi=0,
                max_unavailable=1,
            )
            for i in range(args.hot_pools)
        ]
        for role in roles:
            self._role(role, secret)
        self.exporter = self._exporter(secret)
        suffix = f"{args.namespace}.svc.cluster.local:{PORT}"
        self.count_cache_seeds = f"count-cache.{suffix}"
        self.idem_store_seeds = f"idem-store.{suffix}"
        self.feature_store_seeds = f"feature-store.{suffix}"
        # the pool's one pod by its stable name: writes and reads reach the same server
        self.hot_pool_endpoints = [
            f"{hot_pool(i)}-0.{hot_pool(i)}.{suffix}" for i in range(args.hot_pools)
        ]
        self.register_outputs(
            {
                "exporter": self.exporter,
                "count_cache_seeds": self.count_cache_seeds,
                "idem_store_seeds": self.idem_store_seeds,
                "feature_store_seeds": self.feature_store_seeds,
                "hot_pool_endpoints": self.hot_pool_endpoints,
            }
        )

    def _role(self, role: _Role, secret: k8s.core.v1.Secret) -> None:
        ns = self._ns
        child = pulumi.ResourceOptions(parent=self)
        lbls = {
            **kx.labels(role.name, role.component, "datastore"),
            ROLE_LABEL: role.component,
        }
        match = kx.selector(role.name)
        config_map = k8s.core.v1.ConfigMap(
            f"{role.name}-conf",
            metadata=kx.meta(f"{role.name}-conf", ns, lbls),
            data={"redis.conf": role.conf},
            opts=child,
        )
        ports = {"redis": PORT, "bus": BUS_PORT} if role.cluster else {"redis": PORT}
        kx.headless_service(role.name, ns, lbls, match, ports, child, publish_not_ready=True)
        kx.service_account(role.name, ns, lbls, child)
        host = f"$(POD_NAME).{role.name}.{ns}.svc.cluster.local"
        command = ["redis-server", "/etc/redis/redis.conf"]
        if role.cluster:
            command += ["--cluster-announce-hostname", host]
        ping = ["sh", "-c", "redis-cli -p 6379 ping | grep -q PONG"]
        env = [
            kx.core.EnvVarArgs(
                name="POD_NAME",
                value_from=kx.core.EnvVarSourceArgs(
                    field_ref=kx.core.ObjectFieldSelectorArgs(field_path="metadata.name")
                ),
            ),
            # redis-cli reads REDISCLI_AUTH, so probes never put the password on a command line.
            kx.secret_env("REDISCLI_AUTH", AUTH_SECRET, "password"),
        ]
        memory = f"{role.memory_gi}Gi"
        container = kx.core.ContainerArgs(
            name="redis",
            image=f"redis:{self._args.version}",
            command=command,
            env=env,
            ports=[kx.core.ContainerPortArgs(name=n, container_port=p) for n, p in ports.items()],
            resources=kx.resources("1", memory, cpu_limit="2"),
            liveness_probe=kx.exec_probe(ping, delay=10),
            readiness_probe=kx.exec_probe(ping),
            security_context=kx.security(uid=REDIS_UID),
            volume_mounts=[
                kx.mount("conf", "/etc/redis", read_only=True),
                kx.mount("auth", AUTH_CONF_DIR, read_only=True),
                kx.mount("data", "/data"),
            ],
        )
        volumes = [
            kx.config_volume("conf", f"{role.name}-conf"),
            kx.secret_volume("auth", AUTH_SECRET, {AUTH_CONF_KEY: AUTH_CONF_KEY}),
        ]
        if role.storage_gi == 0:
            volumes.append(kx.empty_dir("data", "1Gi"))
        sts = k8s.apps.v1.StatefulSet(
            role.name,
            metadata=kx.meta(role.name, ns, lbls),
            spec=k8s.apps.v1.StatefulSetSpecArgs(
                replicas=role.replicas,
                service_name=role.name,
                pod_management_policy="Parallel",
                selector=kx.meta_v1.LabelSelectorArgs(match_labels=match),
                template=kx.core.PodTemplateSpecArgs(
                    metadata=kx.meta_v1.ObjectMetaArgs(
                        labels=lbls,
                        annotations={
                            # Roll pods when the config changes (a ConfigMap edit alone does not).
                            "likes.io/config-sha": _sha(role.conf),
                            # scraped through the multi-target exporter (infra/exporters.py)
                            **exporters.redis_annotations(PORT),
                        },
                    ),
                    spec=kx.core.PodSpecArgs(
                        service_account_name=role.name,
                        automount_service_account_token=False,
                        security_context=kx.pod_security(uid=REDIS_UID),
                        node_selector=kx.node_selector("redis"),
                        tolerations=kx.tolerations("redis"),
                        topology_spread_constraints=kx.zone_spread(match),
                        containers=[container],
                        volumes=volumes,
                    ),
                ),
                volume_claim_templates=[
                    kx.pvc_template("data", role.storage_gi, self._args.storage_class)
                ]
                if role.storage_gi
                else None,
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[secret, config_map]),
        )
        kx.pdb(
            role.name,
            ns,
            match,
            lbls,
            pulumi.ResourceOptions(parent=self, depends_on=[sts]),
            max_unavailable=role.max_unavailable,
        )
        if role.cluster:
            self._cluster_job(role, lbls, sts)

    def _exporter(self, secret: k8s.core.v1.Secret) -> str:
        """One redis_exporter in multi-target mode for every Redis here (infra/exporters.py);
        its host:port, for Prometheus's `redis` job. It logs in with the shared password, from
        the Secret (env REDIS_PASSWORD, never argv)."""
        ns, name, port = self._ns, exporters.REDIS_EXPORTER, exporters.REDIS_EXPORTER_PORT
        lbls = kx.labels(name, "metrics", "datastore")
        match = kx.selector(name)
        child = pulumi.ResourceOptions(parent=self)
        kx.service_account(name, ns, lbls, child)
        kx.headless_service(name, ns, lbls, match, {"metrics": port}, child, headless=False)
        container = kx.core.ContainerArgs(
            name=name,
            image=exporters.REDIS_EXPORTER_IMAGE,
            args=[f"--web.listen-address=:{port}", *exporters.REDIS_EXPORTER_FLAGS],
            env=[kx.secret_env("REDIS_PASSWORD", AUTH_SECRET, "password")],
            ports=[kx.core.ContainerPortArgs(name="metrics", container_port=port)],
            resources=kx.resources("50m", "64Mi", cpu_limit="500m"),
            liveness_probe=kx.http_probe("/health", port),
            readiness_probe=kx.http_probe("/health", port),
            security_context=kx.security(),
        )
        k8s.apps.v1.Deployment(
            name,
            metadata=kx.meta(name, ns, lbls),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=1,
                selector=kx.meta_v1.LabelSelectorArgs(match_labels=match),
                strategy=kx.rolling_update(),
                template=kx.core.PodTemplateSpecArgs(
                    metadata=kx.meta_v1.ObjectMetaArgs(labels=lbls),
                    spec=kx.core.PodSpecArgs(
                        service_account_name=name,
                        automount_service_account_token=False,
                        security_context=kx.pod_security(),
                        containers=[container],
                    ),
                ),
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[secret]),
        )
        return observability.in_cluster(name, ns, port)

    def _cluster_job(self, role: _Role, lbls: dict[str, str], sts: pulumi.Resource) -> None:
        """Form the Redis Cluster once; a rerun sees `cluster_state:ok` and does nothing."""
        ns = self._ns
        hosts = " ".join(
            f"{role.name}-{i}.{role.name}.{ns}.svc.cluster.local:{PORT}"
            for i in range(role.replicas)
        )
        first = f"{role.name}-0.{role.name}.{ns}.svc.cluster.local"
        script = (
            f"until redis-cli -h {first} ping | grep -q PONG; do sleep 2; done; "
            f"if redis-cli -h {first} cluster info | grep -q cluster_state:ok; then exit 0; fi; "
            f"redis-cli --cluster create {hosts} --cluster-replicas 1 --cluster-yes"
        )
        k8s.batch.v1.Job(
            f"{role.name}-create",
            metadata=kx.meta(f"{role.name}-create", ns, {**lbls, "likes.io/tier": "job"}),
            spec=k8s.batch.v1.JobSpecArgs(
                backoff_limit=10,
                ttl_seconds_after_finished=3600,
                template=kx.core.PodTemplateSpecArgs(
                    metadata=kx.meta_v1.ObjectMetaArgs(
                        labels={"app.kubernetes.io/name": f"{role.name}-create"}
                    ),
                    spec=kx.core.PodSpecArgs(
                        restart_policy="OnFailure",
                        automount_service_account_token=False,
                        security_context=kx.pod_security(uid=REDIS_UID),
                        containers=[
                            kx.core.ContainerArgs(
                                name="create",
                                image=f"redis:{self._args.version}",
                                command=["sh", "-c", script],
                                env=[kx.secret_env("REDISCLI_AUTH", AUTH_SECRET, "password")],
                                resources=kx.resources("100m", "128Mi"),
                                security_context=kx.security(uid=REDIS_UID),
                            )
                        ],
                    ),
                ),
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[sts]),
        )


def _sha(text: str) -> str:
    import hashlib

    return hashlib.sha256(text.encode()).hexdigest()[:16]
