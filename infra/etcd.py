"""etcd: the config store (hot-key set, CDN heat, kill switches). Five members spread over three
zones (2/2/1), so a zone loss leaves three: quorum holds. The PDB keeps three up (quorum) too.

Authentication is on: a Job runs the repository's applier (services/schema/etcd_auth.py, the one
the local stack runs) to create root and the services' user, whose role may touch only the
platform's prefix, and to enable auth. Both passwords come from Secrets, never argv.

TLS on both ports (contracts/tls.py): clients verify the member against the platform's CA (the
certificate names the client Service and every member's peer name), and members require each
other's certificate from that CA on the peer port. /health and /metrics stay plain HTTP on the
metrics port, for the kubelet and Prometheus.
"""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from infra import k8s as kx
from infra import observability
from infra import tls as tls_infra
from services.contracts import etcd as etcd_contract
from services.contracts import tls
from services.contracts.settings import Settings
from services.schema import etcd_auth

TLS_DIR = "/etc/etcd/tls"  # the member's certificate Secret (tls.ETCD)
CLIENT_PORT = 2379
PEER_PORT = 2380
METRICS_PORT = 2381


@dataclass(frozen=True)
class EtcdArgs:
    namespace: str
    members: int
    storage_gi: int
    version: str
    root_password: pulumi.Input[str]
    service_password: pulumi.Input[str]  # etcd_contract.SERVICE_USER's
    auth_image: str  # the services image: it holds the applier
    storage_class: str = "gp3"
    cert_depends_on: tuple[pulumi.Resource, ...] = ()  # the internal CA's issuer


def quorum(members: int) -> int:
    return members // 2 + 1


def initial_cluster(name: str, namespace: str, members: int) -> str:
    peer = f"{name}-peer.{namespace}.svc.cluster.local"
    return ",".join(f"{name}-{i}=https://{name}-{i}.{peer}:{PEER_PORT}" for i in range(members))


class Etcd(pulumi.ComponentResource):
    client_endpoint: str
    client_host: str
    client_port: int
    service: k8s.core.v1.Service

    def __init__(
        self, name: str, args: EtcdArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("likes:infra:Etcd", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        ns = args.namespace
        lbls = kx.labels(name, "config-store", "datastore")
        match = kx.selector(name)
        kx.headless_service(
            f"{name}-peer",
            ns,
            lbls,
            match,
            {"client": CLIENT_PORT, "peer": PEER_PORT},
            child,
            publish_not_ready=True,  # members must resolve each other before they are ready
        )
        client = kx.headless_service(
            name, ns, lbls, match, {"client": CLIENT_PORT}, child, headless=False
        )
        kx.service_account(name, ns, lbls, child)
        peer_host = f"$(POD_NAME).{name}-peer.{ns}.svc.cluster.local"
        cert = tls_infra.certificate(
            f"{name}-tls",
            tls.ETCD.secret,
            ns,
            [
                *tls_infra.service_names(name, ns),
                f"*.{name}-peer.{ns}.svc",
                f"*.{name}-peer.{ns}.svc.cluster.local",
            ],
            pulumi.ResourceOptions(parent=self, depends_on=list(args.cert_depends_on)),
            usages=tls_infra.SERVER_AND_CLIENT,  # a member is its peers' client too
        )
        command = [
            "etcd",
            "--name=$(POD_NAME)",
            "--data-dir=/var/lib/etcd/data",
            f"--listen-peer-urls=https://0.0.0.0:{PEER_PORT}",
            f"--listen-client-urls=https://0.0.0.0:{CLIENT_PORT}",
            f"--listen-metrics-urls=http://0.0.0.0:{METRICS_PORT}",
            f"--advertise-client-urls=https://{peer_host}:{CLIENT_PORT}",
            f"--initial-advertise-peer-urls=https://{peer_host}:{PEER_PORT}",
            *server_tls_flags(TLS_DIR),
            f"--initial-cluster={initial_cluster(name, ns, args.members)}",
            "--initial-cluster-state=new",
            f"--initial-cluster-token={name}-{ns}",
            "--auto-compaction-retention=1h",
            "--quota-backend-bytes=2147483648",
        ]
        container = kx.core.ContainerArgs(
            name="etcd",
            image=f"quay.io/coreos/etcd:{args.version}",
            command=command,
            env=[
                kx.core.EnvVarArgs(
                    name="POD_NAME",
                    value_from=kx.core.EnvVarSourceArgs(
                        field_ref=kx.core.ObjectFieldSelectorArgs(field_path="metadata.name")
                    ),
                )
            ],
            ports=[
                kx.core.ContainerPortArgs(name="client", container_port=CLIENT_PORT),
                kx.core.ContainerPortArgs(name="peer", container_port=PEER_PORT),
                kx.core.ContainerPortArgs(name="metrics", container_port=METRICS_PORT),
            ],
            resources=kx.resources("500m", "2Gi", cpu_limit="2"),
            # Serializable health answers from the local member: a lost quorum must not make
            # the kubelet restart every member (that would only make recovery slower).
            liveness_probe=kx.http_probe("/health?serializable=true", METRICS_PORT, delay=10),
            readiness_probe=kx.http_probe("/health", METRICS_PORT),
            security_context=kx.security(),
            volume_mounts=[kx.mount("data", "/var/lib/etcd"), kx.mount("tls", TLS_DIR, True)],
        )
        sts = k8s.apps.v1.StatefulSet(
            name,
            metadata=kx.meta(name, ns, lbls),
            spec=k8s.apps.v1.StatefulSetSpecArgs(
                replicas=args.members,
                service_name=f"{name}-peer",
                # All members start together: with OrderedReady, member 0 waits for a quorum
                # that can only form once the others exist.
                pod_management_policy="Parallel",
                selector=kx.meta_v1.LabelSelectorArgs(match_labels=match),
                template=kx.core.PodTemplateSpecArgs(
                    metadata=kx.meta_v1.ObjectMetaArgs(
                        labels=lbls, annotations=observability.scrape_annotations(METRICS_PORT)
                    ),
                    spec=kx.core.PodSpecArgs(
                        service_account_name=name,
                        automount_service_account_token=False,
                        security_context=kx.pod_security(),
                        node_selector=kx.node_selector("system"),
                        topology_spread_constraints=kx.zone_spread(match),
                        containers=[container],
                        volumes=[tls_infra.cert_volume("tls", tls.ETCD.secret)],
                    ),
                ),
                volume_claim_templates=[
                    kx.pvc_template("data", args.storage_gi, args.storage_class)
                ],
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[cert]),
        )
        kx.pdb(
            name,
            ns,
            match,
            lbls,
            pulumi.ResourceOptions(parent=self, depends_on=[sts]),
            min_available=quorum(args.members),
        )
        # Names are fixed at declaration, so endpoints are plain strings other components embed.
        self.client_host = f"{name}.{ns}.svc.cluster.local"
        self.client_port = CLIENT_PORT
        self.client_endpoint = f"https://{self.client_host}:{CLIENT_PORT}"
        self.service = client
        self._auth_job(name, args, sts)
        self.register_outputs({"client_endpoint": self.client_endpoint})

    def _auth_job(self, name: str, args: EtcdArgs, sts: pulumi.Resource) -> None:
        """Enable auth once the members answer; a rerun finds it as wanted and changes nothing."""
        ns = args.namespace
        key = etcd_contract.PASSWORD_KEY
        secrets = []
        for secret, password in (
            (etcd_contract.ROOT_SECRET, args.root_password),
            (etcd_contract.AUTH_SECRET, args.service_password),
        ):
            secrets.append(
                k8s.core.v1.Secret(
                    secret,
                    metadata=kx.meta(secret, ns, kx.labels(name, secret, "datastore")),
                    type="Opaque",
                    string_data={key: password},
                    opts=pulumi.ResourceOptions(parent=self),
                )
            )
        env = kx.env(
            Settings.render_env(
                {
                    "etcd_host": self.client_host,
                    "etcd_port": CLIENT_PORT,
                    "etcd_user": etcd_contract.SERVICE_USER,
                    "etcd_password": kx.SecretRef(etcd_contract.AUTH_SECRET, key),
                    "tls_ca_file": tls.CA_FILE,
                }
            )
        )
        env.append(kx.secret_env(etcd_auth.ROOT_PASSWORD_ENV, etcd_contract.ROOT_SECRET, key))
        env.append(kx.core.EnvVarArgs(name="PYTHONDONTWRITEBYTECODE", value="1"))
        lbls = kx.labels(f"{name}-auth", "etcd-auth", "job")
        k8s.batch.v1.Job(
            f"{name}-auth",
            metadata=kx.meta(f"{name}-auth", ns, lbls),
            # retried until the members have formed a cluster
            spec=kx.setup_job_spec(
                lbls,
                kx.core.ContainerArgs(
                    name="auth",
                    image=args.auth_image,
                    command=["python", "-m", etcd_auth.__name__],
                    env=env,
                    resources=kx.resources("100m", "128Mi"),
                    security_context=kx.security(),
                    volume_mounts=[kx.mount("tls", tls.MOUNT_DIR, True)],
                ),
                volumes=[tls_infra.ca_volume("tls", tls.ETCD.secret)],
                # a rotated password re-runs the Job, which sets it in etcd (a changed root
                # password fails it loudly: etcd still knows the old one)
                credentials={
                    etcd_contract.ROOT_SECRET: args.root_password,
                    etcd_contract.AUTH_SECRET: args.service_password,
                },
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[sts, *secrets]),
        )


def server_tls_flags(cert_dir: str) -> list[str]:
    """etcd's TLS flags for a member whose certificate files (cert-manager's names) are in
    `cert_dir`; the local --tls profile runs the same flags (local/components/etcd.py). Clients
    need no certificate (they log in); peers do."""
    return [
        f"--cert-file={cert_dir}/{tls.CERT_KEY}",
        f"--key-file={cert_dir}/{tls.KEY_KEY}",
        # no --trusted-ca-file: etcd then requires a client certificate on the client port
        # (clients log in with a password instead)
        f"--peer-cert-file={cert_dir}/{tls.CERT_KEY}",
        f"--peer-key-file={cert_dir}/{tls.KEY_KEY}",
        f"--peer-trusted-ca-file={cert_dir}/{tls.CA_KEY}",
        "--peer-client-cert-auth=true",
    ]
