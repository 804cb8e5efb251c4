"""Local stand-in for the identity provider: serves the JWKS the gateway and the services verify
bearer tokens against, and signs RS256 tokens for `likes local token`.

The RSA key is made on first use under `<stack home>/secrets/` (mode 0600) and kept across restarts,
so tokens stay valid while the stack lives; `down --wipe` forgets it. Production's identity provider
is external (the stack's `gateway.jwksUri`); nothing here is deployed.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import hashlib
import json
import os
import time
import uuid
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from jwt.algorithms import RSAAlgorithm

from services.contracts import signals

__all__ = [
    "HEALTH_PATH",
    "JWKS_PATH",
    "Signer",
    "jwks",
    "key_path",
    "kid",
    "load_key",
    "make_server",
    "serve",
    "sign",
]

JWKS_PATH = "/.well-known/jwks.json"  # where identity providers publish it (RFC 8414 style)
HEALTH_PATH = "/healthz"
ALGORITHM = "RS256"
_OLD_ACCOUNTS = 1_735_689_600  # 2025-01-01: the default accounts are older (see Signer)


def key_path(home: Path) -> Path:
    return home / "secrets" / "identity-provider.pem"


def load_key(home: Path) -> rsa.RSAPrivateKey:
    """The stack's signing key, created on first call. Two first callers (the issuer starting and
    `likes local token`) race safely: the key is written aside and linked into place once."""
    path = key_path(home)
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.parent.chmod(0o700)
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        try:
            with contextlib.suppress(FileExistsError):  # the other caller won: use its key
                os.link(tmp, path)
        finally:
            tmp.unlink()
    loaded = serialization.load_pem_private_key(path.read_bytes(), password=None)
    if not isinstance(loaded, rsa.RSAPrivateKey):
        raise ValueError(f"{path} is not an RSA private key")
    return loaded


def kid(public_key: rsa.RSAPublicKey) -> str:
    """RFC 7638 thumbprint: the id changes with the key, so a verifier never caches a stale one."""
    jwk = RSAAlgorithm.to_jwk(public_key, as_dict=True)
    canonical = json.dumps({k: jwk[k] for k in ("e", "kty", "n")}, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()


def jwks(home: Path) -> dict[str, Any]:
    public = load_key(home).public_key()
    jwk = RSAAlgorithm.to_jwk(public, as_dict=True)
    return {"keys": [{**jwk, "kid": kid(public), "use": "sig", "alg": ALGORITHM}]}


class Signer:
    """Signs tokens for many users with one key load: loading the key parses and checks it
    (~0.1 s), much more than an RS256 signature (~1 ms); a benchmark that signed per request
    measured mostly that."""

    def __init__(self, home: Path, issuer: str, audience: str) -> None:
        self.key = load_key(home)
        self.headers = {"kid": kid(self.key.public_key())}
        self.issuer, self.audience = issuer, audience

    def __call__(self, user_id: str, ttl_s: int = 3600, account_created: int | None = None) -> str:
        """An RS256 token for `user_id` that this stack's JWKS verifies. `account_created`
        (epoch seconds; the identity provider's claim the abuse scorer reads) defaults to a
        fixed time per user within the 5 years before 2025: a fresh account must be asked for."""
        if not user_id:
            raise ValueError("user_id must not be empty")
        now = int(time.time())
        if account_created is None:
            account_created = _OLD_ACCOUNTS - 86400 * (zlib.crc32(user_id.encode()) % 1800)
        claims = {"sub": user_id, "iss": self.issuer, "aud": self.audience, "iat": now,
                  "exp": now + ttl_s,
                  signals.ACCOUNT_CREATED_CLAIM: account_created}  # fmt: skip
        return jwt.encode(claims, self.key, algorithm=ALGORITHM, headers=self.headers)


def sign(
    home: Path, user_id: str, ttl_s: int, issuer: str, audience: str,
    account_created: int | None = None,
) -> str:  # fmt: skip
    """An RS256 token for `user_id` that this stack's JWKS verifies (see Signer)."""
    return Signer(home, issuer, audience)(user_id, ttl_s, account_created)


def make_server(home: Path, host: str, port: int) -> ThreadingHTTPServer:
    """The JWKS and health endpoints, bound (port 0: any free port); call serve_forever()."""
    body = json.dumps(jwks(home)).encode()  # the key never changes while the server runs

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == JWKS_PATH:
                self._answer(200, body, "application/json")
            elif self.path == HEALTH_PATH:
                self._answer(200, b"ok\n", "text/plain")
            else:
                self._answer(404, b"not found\n", "text/plain")

        def _answer(self, status: int, payload: bytes, content_type: str) -> None:
            self.send_response(status)
            self.send_header("content-type", content_type)
            self.send_header("content-length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *_: object) -> None:
            pass

    return ThreadingHTTPServer((host, port), Handler)


def serve(home: Path, host: str, port: int) -> None:
    with make_server(home, host, port) as server:
        server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--home", type=Path, required=True, help="the stack's home folder")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    serve(args.home, args.host, args.port)


if __name__ == "__main__":
    main()
