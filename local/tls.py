"""The local `--tls` profile's CA: made at the first start, kept across `up`s (`down --wipe` drops
it with the rest of the stack's home).

It plays cert-manager's part in the program (infra/tls.py): one CA, and per server a folder with
cert-manager's three files (`ca.crt`, `tls.crt`, `tls.key`, contracts/tls.py), so a server's
flags name the same files locally as in a pod. Every local server listens on 127.0.0.1: each
certificate names that address (and `localhost`), and clients verify it as in production.
"""

from __future__ import annotations

import datetime
import fcntl
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from local.layout import HOST, Layout
from services.contracts import tls, workloads

CA_DIR = "ca"
KEYSTORE = "keystore.pem"  # tls.key + tls.crt in one file: Kafka's and Cassandra's PEM keystore
CA_DAYS = 3650
CERT_DAYS = 825


def root(layout: Layout) -> Path:
    return layout.home / "tls"


def ca_file(layout: Layout) -> Path:
    """What Settings.tls_ca_file names locally (the program mounts it at tls.CA_FILE)."""
    return root(layout) / CA_DIR / tls.CA_KEY


def client_ca(layout: Layout) -> str | None:
    """The CA a client of this stack verifies its servers with: the --tls profile's, or None
    (plaintext)."""
    return str(ca_file(layout)) if layout.tls else None


def server_dir(layout: Layout, server: tls.ServerCert) -> Path:
    return root(layout) / server.server


def workload_dir(layout: Layout, workload: str) -> Path:
    """An HTTP service's (or the gateway's) certificate folder: what the program mounts at
    tls.MOUNT_DIR (gateway -> service mTLS)."""
    return root(layout) / workload


def _certs() -> list[tuple[str, tuple[str, ...]]]:
    """(folder, extra DNS names) of every certificate the stack issues: the stores', and each
    HTTP service's under the in-cluster names the gateway's render dials and checks."""
    out: list[tuple[str, tuple[str, ...]]] = [(s.server, ()) for s in tls.SERVERS]
    for w in workloads.SERVICES:
        if w.kind == "http":
            out.append((w.name, tuple(tls.service_names(w.name, workloads.NAMESPACE))))
    out.append((tls.GATEWAY, ()))  # a client certificate: its names are not checked
    return out


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    # PKCS#8, unencrypted: the encoding Kafka's and Cassandra's PEM keystores read
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _write(path: Path, data: bytes, mode: int = 0o644) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.touch(mode=mode)
    tmp.write_bytes(data)
    tmp.replace(path)


def _ca(layout: Layout) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    d = root(layout) / CA_DIR
    try:
        cert = x509.load_pem_x509_certificate((d / tls.CA_KEY).read_bytes())
        key = serialization.load_pem_private_key((d / tls.KEY_KEY).read_bytes(), None)
        assert isinstance(key, ec.EllipticCurvePrivateKey)
        return cert, key
    except FileNotFoundError:
        pass
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(f"likes local CA ({layout.home.name})"))
        .issuer_name(_name(f"likes local CA ({layout.home.name})"))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    _write(d / tls.KEY_KEY, _pem_key(key), 0o600)
    _write(d / tls.CA_KEY, cert.public_bytes(serialization.Encoding.PEM))
    return cert, key


def _issue(
    ca: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    cn: str,
    dns_names: tuple[str, ...] = (),
) -> tuple[bytes, bytes]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=CERT_DAYS))
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    *(x509.DNSName(n) for n in dns_names),
                    x509.IPAddress(ipaddress.ip_address(HOST)),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM), _pem_key(key)


def ensure(layout: Layout) -> list[str]:
    """The CA and a certificate for every server of tls.SERVERS, each HTTP service and the
    gateway; returns the folders whose
    certificate was made now ([] on a rerun: a server keeps its files across `up`s). Several
    components prepare at once (threads of one `up`, or two `up`s): one at a time makes them."""
    lock = root(layout) / ".lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        return _ensure(layout)


def _ensure(layout: Layout) -> list[str]:
    ca, ca_key = _ca(layout)
    ca_pem = ca.public_bytes(serialization.Encoding.PEM)
    made = []
    for name, dns_names in _certs():
        d = root(layout) / name
        if (d / KEYSTORE).exists() and (d / tls.CA_KEY).read_bytes() == ca_pem:
            continue
        cert, key = _issue(ca, ca_key, f"{name}.local", dns_names)
        _write(d / tls.CA_KEY, ca_pem)
        _write(d / tls.CERT_KEY, cert)
        _write(d / tls.KEY_KEY, key, 0o600)
        _write(d / KEYSTORE, key + cert, 0o600)
        made.append(name)
    return made
