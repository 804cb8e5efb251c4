"""Scylla through the Scylla Operator: one data centre per region with a rack per zone, and a
migration Job that applies the repository's CQL (services/schema/cql) with NetworkTopologyStrategy
RF 3 in this region's data centre (and the peers' it is told to replicate to).

Logins are required (PasswordAuthenticator, CassandraAuthorizer): the Job creates an admin role
and the services' role, which may read and write the platform's keyspace only, and drops the
default superuser (services/schema/cql_roles.py, the applier the local stack runs too). The
passwords come from Secrets; the scylla.yaml ConfigMap holds none.

The client port serves only TLS (client_encryption_options), with a certificate from the
platform's CA (infra/tls.py) mounted into every member; clients verify the chain (contracts/tls.py
says why not the name).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pulumi
import pulumi_kubernetes as k8s

from infra import exporters, observability
from infra import k8s as kx
from infra import tls as tls_infra
from services.contracts import tls
from services.contracts.settings import Settings
from services.schema import cql_apply, cql_roles, migrate

CQL_DIR = cql_apply.CQL_DIR
CQL_MOUNT = "/schema/cql"
CQL_PORT = 9042  # the native protocol port clients connect to
SCYLLA_APP = "scylla"  # the app.kubernetes.io/name the Scylla Operator gives member pods
CONFIG_MAP = "scylla-config"  # the racks' scyllaConfig: scylla.yaml overrides
TLS_DIR = "/etc/scylla/tls"  # each member's certificate Secret (tls.SCYLLA)
# Merged over the image's scylla.yaml by the operator. Nothing secret in it (the key is a file).
SCYLLA_YAML = (
    "authenticator: PasswordAuthenticator\n"
    "authorizer: CassandraAuthorizer\n"
    "client_encryption_options:\n"
    "  enabled: true\n"
    f"  certificate: {TLS_DIR}/{tls.CERT_KEY}\n"
    f"  keyfile: {TLS_DIR}/{tls.KEY_KEY}\n"
    f"  truststore: {TLS_DIR}/{tls.CA_KEY}\n"
    "  require_client_auth: false\n"
)


@dataclass(frozen=True)
class ScyllaArgs:
    namespace: str
    datacenter: str
    zones: tuple[str, ...]
    version: str
    members_per_rack: int
    storage_gi: int
    cpu: str
    memory_gi: int
    replication_factor: int
    peer_datacenters: Sequence[str]
    external_seeds: Sequence[str]
    migration_image: str
    admin_password: pulumi.Input[str]  # cql_roles.ADMIN_ROLE's
    service_password: pulumi.Input[str]  # cql_roles.SERVICE_ROLE's
    cluster_name: str = "likes"
    storage_class: str = "gp3"
    cql_dir: Path = CQL_DIR
    depends_on: Sequence[pulumi.Resource] = ()
    cert_depends_on: Sequence[pulumi.Resource] = ()  # the internal CA's issuer


def replication(args: ScyllaArgs) -> dict[str, int]:
    """RF per data centre: this region's and every peer region's (each is one DC)."""
    dcs = [args.datacenter, *args.peer_datacenters]
    return {dc: args.replication_factor for dc in dcs}


def cql_files(directory: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(directory.glob("*.cql"))}


class Scylla(pulumi.ComponentResource):
    contact_points: str
    datacenter: str

    def __init__(
        self, name: str, args: ScyllaArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("likes:infra:Scylla", name, None, opts)
        ns, cluster = args.namespace, args.cluster_name
        memory = f"{args.memory_gi}Gi"
        racks = [
            {
                "name": zone,
                "members": args.members_per_rack,
                "storage": {
                    "capacity": f"{args.storage_gi}Gi",
                    "storageClassName": args.storage_class,
                },
                "scyllaConfig": CONFIG_MAP,  # logins and TLS required
                "volumes": [{"name": "tls", "secret": {"secretName": tls.SCYLLA.secret}}],
                "volumeMounts": [{"name": "tls", "mountPath": TLS_DIR, "readOnly": True}],
                # Scylla wants guaranteed QoS (requests == limits) to pin its shards to cores.
                "resources": {
                    "requests": {"cpu": args.cpu, "memory": memory},
                    "limits": {"cpu": args.cpu, "memory": memory},
                },
                "placement": {
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": kx.ZONE_KEY, "operator": "In", "values": [zone]}
                                    ]
                                }
                            ]
                        }
                    },
                    "tolerations": [
                        {
                            "key": kx.WORKLOAD_LABEL,
                            "operator": "Equal",
                            "value": "scylla",
                            "effect": "NoSchedule",
                        }
                    ],
                },
            }
            for zone in args.zones
        ]
        spec: dict[str, object] = {
            # the Scylla Operator labels and annotates its pods this way itself (scylla-operator
            # pkg/controller/scylladbdatacenter/resource.go); said here so the render shows the
            # scrape the pods job makes of Scylla's native metrics
            "podMetadata": {
                "labels": {observability.NAME_LABEL: SCYLLA_APP},
                "annotations": observability.scrape_annotations(exporters.SCYLLA_METRICS_PORT),
            },
            "version": args.version,
            "repository": "docker.io/scylladb/scylla",
            "automaticOrphanedNodeCleanup": True,
            "datacenter": {"name": args.datacenter, "racks": racks},
        }
        if args.external_seeds:
            # Joins the peer regions' data centres into one cluster (multi-DC).
            spec["externalSeeds"] = list(args.external_seeds)
        scylla_config = k8s.core.v1.ConfigMap(
            f"{name}-config",
            metadata=kx.meta(CONFIG_MAP, ns, kx.labels(cluster, "scylla-config", "datastore")),
            data={"scylla.yaml": SCYLLA_YAML},
            opts=pulumi.ResourceOptions(parent=self),
        )
        secrets = [
            k8s.core.v1.Secret(
                f"{name}-{secret}",
                metadata=kx.meta(secret, ns, kx.labels(cluster, secret, "datastore")),
                type="Opaque",
                string_data={cql_roles.PASSWORD_KEY: password},
                opts=pulumi.ResourceOptions(parent=self),
            )
            for secret, password in (
                (cql_roles.ADMIN_SECRET, args.admin_password),
                (cql_roles.AUTH_SECRET, args.service_password),
            )
        ]
        client_service = f"{cluster}-client"
        cert = tls_infra.certificate(
            f"{name}-tls",
            tls.SCYLLA.secret,
            ns,
            [*tls_infra.service_names(client_service, ns), f"*.{ns}.svc"],
            pulumi.ResourceOptions(parent=self, depends_on=list(args.cert_depends_on)),
        )
        scylla = k8s.apiextensions.CustomResource(
            f"{name}-cluster",
            api_version="scylla.scylladb.com/v1",
            kind="ScyllaCluster",
            metadata=kx.meta(cluster, ns, {kx.TIER_LABEL: "datastore"}),
            spec=spec,
            opts=pulumi.ResourceOptions(
                parent=self, depends_on=[*args.depends_on, scylla_config, cert]
            ),
        )
        lbls = kx.labels("schema-migration", "schema-migration", "job")
        files = cql_files(args.cql_dir)
        if not files:
            raise ValueError(f"no CQL files in {args.cql_dir}")
        cql = k8s.core.v1.ConfigMap(
            f"{name}-cql",
            metadata=kx.meta("scylla-cql", ns, lbls),
            data=files,
            opts=pulumi.ResourceOptions(parent=self),
        )
        self.contact_points = f"{client_service}.{ns}.svc.cluster.local"
        self.datacenter = args.datacenter
        rf = replication(args)
        # The Job's name carries a hash of the CQL: a schema change runs a new Job (Jobs are
        # immutable), an unchanged schema keeps the finished one.
        digest = _digest(files, rf)
        k8s.batch.v1.Job(
            f"{name}-migrate",
            metadata=kx.meta(f"scylla-migrate-{digest}", ns, lbls),
            spec=kx.setup_job_spec(
                lbls,
                kx.core.ContainerArgs(
                    name="migrate",
                    image=args.migration_image,
                    command=["python", "-m", migrate.__name__],
                    env=kx.env(
                        {
                            migrate.CONTACT_POINTS_ENV: self.contact_points,
                            migrate.LOCAL_DC_ENV: args.datacenter,
                            migrate.REPLICATION_ENV: json.dumps(rf, sort_keys=True),
                            migrate.CQL_DIR_ENV: CQL_MOUNT,
                            migrate.ADMIN_PASSWORD_ENV: kx.SecretRef(
                                cql_roles.ADMIN_SECRET, cql_roles.PASSWORD_KEY
                            ),
                            migrate.SERVICE_PASSWORD_ENV: kx.SecretRef(
                                cql_roles.AUTH_SECRET, cql_roles.PASSWORD_KEY
                            ),
                            Settings.env_name("tls_ca_file"): tls.CA_FILE,
                            "PYTHONDONTWRITEBYTECODE": "1",
                        }
                    ),
                    resources=kx.resources("250m", "256Mi"),
                    security_context=kx.security(),
                    volume_mounts=[
                        kx.mount("cql", CQL_MOUNT, read_only=True),
                        kx.mount("tls", tls.MOUNT_DIR, read_only=True),
                    ],
                ),
                volumes=[
                    kx.config_volume("cql", "scylla-cql"),
                    tls_infra.ca_volume("tls", tls.SCYLLA.secret),
                ],
                # a rotated service password re-runs the Job, which ALTERs the role to it
                credentials={
                    cql_roles.ADMIN_SECRET: args.admin_password,
                    cql_roles.AUTH_SECRET: args.service_password,
                },
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[scylla, cql, *secrets]),
        )
        self.register_outputs(
            {
                "contact_points": self.contact_points,
                "datacenter": self.datacenter,
                "replication": rf,
            }
        )


def _digest(files: dict[str, str], rf: dict[str, int]) -> str:
    import hashlib

    h = hashlib.sha256(json.dumps([files, rf], sort_keys=True).encode())
    return h.hexdigest()[:10]
