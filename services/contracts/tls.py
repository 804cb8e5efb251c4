"""TLS between our workloads and the platform's servers (etcd, Kafka, Scylla, the schema registry),
defined once for the program (infra/tls.py issues the certificates) and for the clients.

One private CA signs every internal server's certificate: cert-manager's `ClusterIssuer`
ISSUER in production (infra/tls.py), a CA generated at the first start of the local `--tls`
profile (local/tls.py). Every certificate Secret has cert-manager's shape (`ca.crt`, `tls.crt`,
`tls.key`), and a pod mounts its own at MOUNT_DIR, so a workload finds the CA that verifies every
server at CA_FILE (Settings.tls_ca_file; None: plaintext, the local quick profile).

What is verified, per store:
- etcd (gRPC), Kafka (librdkafka) and the registry (HTTPS): the chain AND the name (the address
  the client dialled must be in the certificate), as their clients do by default.
- Scylla/Cassandra: the chain only. The driver learns the other nodes from `system.peers` by IP,
  and a node's IP is not known when its certificate is issued; a certificate from the platform's
  private CA is what identifies a node of ours (no other party holds that CA's key).
Light on purpose: no client library (the `likes` CLI and the program import it).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

ISSUER = "likes-internal"  # cert-manager ClusterIssuer (kind CA)
CA_SECRET = "likes-internal-ca"  # the CA's own Secret (cert-manager namespace)
CA_KEY = "ca.crt"  # cert-manager's keys in every issued Secret
CERT_KEY = "tls.crt"
KEY_KEY = "tls.key"
MOUNT_DIR = "/etc/likes/tls"  # where a workload's certificate Secret is mounted
CA_FILE = f"{MOUNT_DIR}/{CA_KEY}"
MIN_VERSION = ssl.TLSVersion.TLSv1_2


@dataclass(frozen=True)
class ServerCert:
    """One server's certificate: its Secret and the names clients dial it by (the program fills
    in the namespace and cluster names; locally every server is 127.0.0.1)."""

    server: str
    secret: str


ETCD = ServerCert("etcd", "etcd-tls")
KAFKA = ServerCert("kafka", "kafka-listener-tls")
SCYLLA = ServerCert("scylla", "scylla-client-tls")
REGISTRY = ServerCert("schema-registry", "schema-registry-tls")
SERVERS: tuple[ServerCert, ...] = (ETCD, KAFKA, SCYLLA, REGISTRY)


def service_names(service: str, namespace: str) -> list[str]:
    """The names a Service is dialled by in-cluster (short forms first): what its certificate
    carries, in the program and in the local --tls profile (so a client's name check, such as the
    gateway's, is the same in both)."""
    return [f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


GATEWAY = "envoy"  # the gateway (its Deployment): its internal certificate is its client identity
# to our HTTP services (Secret envoy-tls; gateway-tls is the public, ACME-issued one)


def workload_secret(workload: str) -> str:
    """The Secret a workload (or the gateway) mounts at MOUNT_DIR: the CA every client verifies
    against, and its own certificate (an HTTP service's server side of the gateway's mTLS; the
    gateway's client side)."""
    return f"{workload}-tls"


def mtls_server_context(cert_dir: str) -> ssl.SSLContext:
    """An HTTP service's API side of gateway -> service mTLS: it presents its own certificate
    and requires a client certificate that chains to the platform's CA. Which holder of such a
    certificate may connect is the NetworkPolicies' part (only the gateway reaches the API port,
    infra/netpol.py); the chain proves the peer is ours, not a pod that got onto the network."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = MIN_VERSION
    load_mtls_files(ctx, cert_dir)
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx


def load_mtls_files(ctx: ssl.SSLContext, cert_dir: str) -> None:
    """(Re)load a certificate folder's pair and CA into `ctx`: new handshakes use them, so a
    renewed certificate (cert-manager rewrites the mounted Secret) needs no restart."""
    d = cert_dir.rstrip("/")
    ctx.load_cert_chain(f"{d}/{CERT_KEY}", f"{d}/{KEY_KEY}")
    ctx.load_verify_locations(cafile=f"{d}/{CA_KEY}")


def mtls_client_context(cert_dir: str) -> ssl.SSLContext:
    """A client of an HTTP service's API (the gateway's part; tools and tests that call a
    service directly): verifies the server's chain and name, presents the folder's pair."""
    d = cert_dir.rstrip("/")
    ctx = client_context(f"{d}/{CA_KEY}")
    ctx.load_cert_chain(f"{d}/{CERT_KEY}", f"{d}/{KEY_KEY}")
    return ctx


def cassandra_context(ca_file: str) -> ssl.SSLContext:
    """The edge-store's client context: the chain is verified, the name is not (see above)."""
    return client_context(ca_file, check_hostname=False)


def client_context(ca_file: str, check_hostname: bool = True) -> ssl.SSLContext:
    """A client context that trusts only the platform's CA (not the system store: a public
    certificate for one of our names must not pass)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = MIN_VERSION
    ctx.load_verify_locations(cafile=ca_file)
    ctx.check_hostname = check_hostname
    ctx.verify_mode = ssl.CERT_REQUIRED
    return ctx
