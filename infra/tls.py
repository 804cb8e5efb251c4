"""The platform's private CA and the certificates it issues (contracts/tls.py names them).

cert-manager's CA bootstrap: a self-signed ClusterIssuer signs one CA certificate (its Secret in
cert-manager's own namespace, the issuer's "cluster resource namespace"), and the ClusterIssuer
`tls.ISSUER` issues from that CA. Every internal server (etcd, Kafka's client listener, Scylla's
client port, the schema registry) and every workload gets a Certificate from it; cert-manager
renews them (a server re-reads its files or is restarted by its operator), and each Secret
carries `ca.crt`, the one file a client verifies servers against.
"""

from __future__ import annotations

from collections.abc import Sequence

import pulumi
import pulumi_kubernetes as k8s

from infra import k8s as kx
from services.contracts import tls

API = "cert-manager.io/v1"
SELF_SIGNED = "likes-selfsigned"
CA_DURATION = "87600h"  # 10 years: rotating the CA is a planned event, not a renewal
CERT_DURATION = "2160h"  # 90 days, renewed 30 days before expiry
CERT_RENEW_BEFORE = "720h"
SERVER_AUTH = ("server auth",)
# etcd peers; workloads: an HTTP service serves the gateway's mTLS, the gateway is its client
SERVER_AND_CLIENT = ("server auth", "client auth")


class InternalCa(pulumi.ComponentResource):
    """The ClusterIssuer every internal certificate comes from."""

    def __init__(
        self, name: str, cert_manager_namespace: str, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("likes:infra:InternalCa", name, None, opts)
        lbls = kx.labels("internal-ca", "tls", "platform")
        selfsigned = k8s.apiextensions.CustomResource(
            f"{name}-selfsigned",
            api_version=API,
            kind="ClusterIssuer",
            metadata=kx.meta(SELF_SIGNED, None, lbls),
            spec={"selfSigned": {}},
            opts=pulumi.ResourceOptions(parent=self),
        )
        ca = k8s.apiextensions.CustomResource(
            f"{name}-ca",
            api_version=API,
            kind="Certificate",
            metadata=kx.meta(tls.CA_SECRET, cert_manager_namespace, lbls),
            spec={
                "isCA": True,
                "commonName": "likes internal CA",
                "secretName": tls.CA_SECRET,
                "duration": CA_DURATION,
                "privateKey": {"algorithm": "ECDSA", "size": 256},
                "issuerRef": {
                    "name": SELF_SIGNED,
                    "kind": "ClusterIssuer",
                    "group": "cert-manager.io",
                },
            },
            opts=pulumi.ResourceOptions(parent=self, depends_on=[selfsigned]),
        )
        self.issuer = k8s.apiextensions.CustomResource(
            f"{name}-issuer",
            api_version=API,
            kind="ClusterIssuer",
            metadata=kx.meta(tls.ISSUER, None, lbls),
            spec={"ca": {"secretName": tls.CA_SECRET}},
            opts=pulumi.ResourceOptions(parent=self, depends_on=[ca]),
        )
        self.register_outputs({"issuer": tls.ISSUER})


def certificate(
    resource: str,
    secret: str,
    namespace: str,
    dns_names: Sequence[str],
    opts: pulumi.ResourceOptions,
    usages: Sequence[str] = SERVER_AUTH,
    keystore_password: tuple[str, str] | None = None,
) -> k8s.apiextensions.CustomResource:
    """A certificate from the internal CA into Secret `secret` (ca.crt, tls.crt, tls.key).
    PKCS#8 keys: Kafka and Cassandra read PEM keys only in that encoding. `keystore_password`
    (Secret, key): cert-manager also writes `keystore.p12` for a server that reads no PEM."""
    spec: dict[str, object] = {
        "secretName": secret,
        "commonName": dns_names[0],
        "dnsNames": list(dns_names),
        "usages": list(usages),
        "duration": CERT_DURATION,
        "renewBefore": CERT_RENEW_BEFORE,
        "privateKey": {
            "algorithm": "ECDSA",
            "size": 256,
            "encoding": "PKCS8",
            "rotationPolicy": "Always",
        },
        "issuerRef": {"name": tls.ISSUER, "kind": "ClusterIssuer", "group": "cert-manager.io"},
    }
    if keystore_password is not None:
        ref = {"name": keystore_password[0], "key": keystore_password[1]}
        spec["keystores"] = {"pkcs12": {"create": True, "passwordSecretRef": ref}}
    return k8s.apiextensions.CustomResource(
        resource,
        api_version=API,
        kind="Certificate",
        metadata=kx.meta(secret, namespace, kx.labels(secret, "tls", "platform")),
        spec=spec,
        opts=opts,
    )


def workload_certificate(
    workload: str, namespace: str, parent: pulumi.Resource, depends_on: Sequence[pulumi.Resource]
) -> tuple[str, k8s.apiextensions.CustomResource]:
    """A workload's own certificate (its Service's names; server and client use), and the Secret
    its pod mounts at tls.MOUNT_DIR: the CA there is what Settings.tls_ca_file names."""
    secret = tls.workload_secret(workload)
    cert = certificate(
        f"{workload}-tls",
        secret,
        namespace,
        service_names(workload, namespace),
        pulumi.ResourceOptions(parent=parent, depends_on=list(depends_on)),
        usages=SERVER_AND_CLIENT,
    )
    return secret, cert


service_names = tls.service_names  # defined once: the local stack issues the same names


def ca_volume(volume: str, secret: str) -> kx.core.VolumeArgs:
    """Only the CA of a certificate Secret, as MOUNT_DIR/ca.crt: a client that needs nothing
    else (a Job) gets no key."""
    return kx.secret_volume(volume, secret, {tls.CA_KEY: tls.CA_KEY})


def cert_volume(volume: str, secret: str) -> kx.core.VolumeArgs:
    """A certificate Secret's three files (ca.crt, tls.crt, tls.key), 0440."""
    keys = (tls.CA_KEY, tls.CERT_KEY, tls.KEY_KEY)
    return kx.secret_volume(volume, secret, {k: k for k in keys})
