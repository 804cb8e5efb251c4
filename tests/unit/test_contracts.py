"""Pure tests of the shared contracts: settings, auth, key names, the event schema.

Auth runs against a real JWKS: an RSA key made here, served by a stdlib HTTP server on loopback
(the services only take RS256/ES256 tokens verified through the identity provider's JWKS)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import io
import json
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import fastavro
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from pydantic import ValidationError
from redis.cluster import key_slot

from services.contracts import auth, events, keys
from services.contracts.settings import TOOLING_VARS, Settings, UnknownVariable

ISSUER, AUDIENCE = "https://idp.test/", "likes"


@pytest.fixture(autouse=True)
def no_likes_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings read the process env; a developer's LIKES_* must not leak into these tests."""
    import os

    for k in list(os.environ):
        if k.upper().startswith("LIKES_"):
            monkeypatch.delenv(k)


# -- Settings -----------------------------------------------------------------------------------
def endpoints(**overrides: object) -> dict[str, object]:
    """Every endpoint field set explicitly, as the program renders them outside env=local."""
    values: dict[str, object] = {
        "count_cache_nodes": "count-cache:6379",
        "idem_store_nodes": "idem-store:6379",
        "cassandra_hosts": "scylla",
        "kafka_bootstrap": "kafka:9092",
        "schema_registry_url": "http://registry:8081",
        "etcd_host": "etcd",
        "jwks_url": "https://idp.test/jwks.json",
        "jwt_issuer": ISSUER,
        "redis_password": "from-a-secret",
        "cassandra_user": "likes",
        "cassandra_password": "from-a-secret",
        "etcd_user": "likes",
        "etcd_password": "from-a-secret",
        "kafka_user": "likes",
        "kafka_password": "from-a-secret",
        "schema_registry_user": "likes",
        "schema_registry_password": "from-a-secret",
        "tls_ca_file": "/etc/likes/tls/ca.crt",
    }
    assert set(values) == set(Settings.ENDPOINTS)  # a new endpoint needs a value here
    values.update(overrides)
    return values


def test_an_empty_ca_file_is_plaintext_chosen_explicitly_outside_local() -> None:
    """The local quick profile renders it empty; unset is refused like any endpoint (below)."""
    s = Settings(**endpoints(env="staging", tls_ca_file=""))  # type: ignore[arg-type]
    assert s.tls_ca_file is None
    assert Settings(**endpoints(env="staging")).tls_ca_file == "/etc/likes/tls/ca.crt"  # type: ignore[arg-type]


def test_an_unknown_likes_variable_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LIKES_KAFKA_BOOTSTRAPS", "kafka:9092")  # a typo of LIKES_KAFKA_BOOTSTRAP
    with pytest.raises(UnknownVariable, match="LIKES_KAFKA_BOOTSTRAPS"):
        Settings()
    monkeypatch.delenv("LIKES_KAFKA_BOOTSTRAPS")
    monkeypatch.setenv("LIKES_KAFKA_BOOTSTRAP", "kafka:9092")
    assert Settings().kafka_bootstrap == "kafka:9092"  # the right name is read


def test_the_removed_shared_jwt_secret_is_an_unknown_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("LIKES_JWT_SECRET", "local-only-signing-key-not-for-production")
    with pytest.raises(UnknownVariable, match="LIKES_JWT_SECRET"):
        Settings()
    monkeypatch.delenv("LIKES_JWT_SECRET")
    with pytest.raises(ValidationError, match="jwt_secret"):  # extra="forbid": nor as an argument
        Settings(jwt_secret="x")  # type: ignore[call-arg]


def test_tooling_variables_are_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in sorted(TOOLING_VARS):
        monkeypatch.setenv(name, "1")
    assert Settings().env == "local"


def test_every_variable_the_test_harness_reads_is_a_tooling_variable() -> None:
    """The harness's own LIKES_* (tests/conftest.py, local/check.sh) are in every process's env
    during a test run: a name missing from TOOLING_VARS fails every Settings of the run."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    text = "".join((root / f).read_text() for f in ("tests/conftest.py", "local/check.sh"))
    named = set(re.findall(r"\bLIKES_[A-Z_]+[A-Z]\b", text))
    assert {"LIKES_TEST_STACKS", "LIKES_TEST_WORKERS", "LIKES_KEEP_STACK"} <= named, named
    assert named - TOOLING_VARS - Settings.env_names() == set()


def test_render_env_names_come_from_the_fields_and_refuse_unknown_ones() -> None:
    assert Settings.render_env({"kafka_bootstrap": "k:9092", "env": "prod"}) == {
        "LIKES_KAFKA_BOOTSTRAP": "k:9092",
        "LIKES_ENV": "prod",
    }
    assert Settings.env_name("idem_store_nodes") == "LIKES_IDEM_STORE_NODES"
    assert "LIKES_REDIS_PASSWORD" in Settings.env_names()
    for gone in ("jwt_secret", "idem_store_url"):
        with pytest.raises(UnknownVariable, match=gone):
            Settings.render_env({gone: "x"})


def test_outside_local_an_unset_endpoint_is_refused_naming_its_variable() -> None:
    assert Settings(env="staging", **endpoints()).env == "staging"  # type: ignore[arg-type]
    for field in Settings.ENDPOINTS:
        values = endpoints()
        del values[field]
        with pytest.raises(ValidationError, match=Settings.env_name(field)):
            Settings(env="staging", **values)  # type: ignore[arg-type]
    assert Settings(env="local").kafka_bootstrap  # local keeps its loopback defaults


def test_outside_local_endpoints_from_the_env_count_as_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for field, value in endpoints().items():
        monkeypatch.setenv(Settings.env_name(field), str(value))
    monkeypatch.setenv("LIKES_ENV", "prod")
    s = Settings()
    assert (s.env, s.redis_auth, s.idem_store_startup) == (
        "prod",
        "from-a-secret",
        [("idem-store", 6379)],
    )
    monkeypatch.delenv("LIKES_ETCD_HOST")
    with pytest.raises(ValidationError, match="LIKES_ETCD_HOST"):
        Settings()


def test_a_login_is_a_user_and_its_password_or_neither() -> None:
    """Half a login (the user rendered, the Secret's key missing) must not pass as "no auth"."""
    for user, password in Settings.LOGINS:
        assert Settings(**{user: "likes", password: "pw"}).model_dump()[user] == "likes"
        assert Settings().model_dump()[user] is None  # local: a bare server, no login
        for half in ({user: "likes"}, {password: "pw"}):
            with pytest.raises(ValidationError, match=Settings.env_name(password)):
                Settings(**half)  # type: ignore[arg-type]


# -- auth: RS256 against a real JWKS ------------------------------------------------------------
def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


@dataclass
class Issuer:
    key: rsa.RSAPrivateKey
    kid: str
    jwks_url: str

    def settings(self) -> Settings:
        return Settings(jwks_url=self.jwks_url, jwt_issuer=ISSUER, jwt_audience=AUDIENCE)

    def claims(self, sub: str = "alice", ttl_s: float = 60, **extra: Any) -> dict[str, Any]:
        return {
            "sub": sub,
            "iss": ISSUER,
            "aud": AUDIENCE,
            "exp": int(time.time() + ttl_s),
            **extra,
        }

    def sign(self, claims: dict[str, Any], key: rsa.RSAPrivateKey | None = None) -> str:
        return jwt.encode(claims, key or self.key, algorithm="RS256", headers={"kid": self.kid})


def dead_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def issuer() -> Iterator[Issuer]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    kid = uuid.uuid4().hex
    jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(key.public_key()))
    body = json.dumps({"keys": [{**jwk, "kid": kid, "use": "sig", "alg": "RS256"}]}).encode()

    class Jwks(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status = 200 if self.path == "/.well-known/jwks.json" else 404
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Jwks)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    port = server.server_address[1]
    try:
        yield Issuer(key, kid, f"http://127.0.0.1:{port}/.well-known/jwks.json")
    finally:
        server.shutdown()
        server.server_close()


def code_of(s: Settings, token: str) -> str:
    with pytest.raises(auth.AuthError) as e:
        auth.verify(s, f"Bearer {token}")
    return e.value.code


def test_a_valid_rs256_token_gives_its_subject(issuer: Issuer) -> None:
    assert (
        auth.verify(issuer.settings(), f"Bearer {issuer.sign(issuer.claims('alice'))}") == "alice"
    )


def test_a_subject_that_could_break_a_redis_key_is_refused(issuer: Issuer) -> None:
    # the review's case: `}` in sub broke the bloom:{user} hash tag and every Lua call CROSSSLOT
    for sub in ("mallory}x", "{evil}", "a" * 129, "two words", "nul\x00"):
        assert code_of(issuer.settings(), issuer.sign(issuer.claims(sub))) == "invalid_subject"
    for sub in ("auth0|64f1c2", "alice@example.com", "user-42", str(uuid.uuid4())):
        assert auth.verify(issuer.settings(), f"Bearer {issuer.sign(issuer.claims(sub))}") == sub


def test_malformed_headers_are_refused_before_any_key_lookup(issuer: Issuer) -> None:
    s = issuer.settings()
    for header, code in [
        (None, "missing_token"),
        ("Basic abc", "malformed_token"),
        ("Bearer ", "malformed_token"),
        ("Bearer not-a-jwt", "invalid_token"),
    ]:
        with pytest.raises(auth.AuthError) as e:
            auth.verify(s, header)
        assert e.value.code == code


def test_an_expired_token_is_expired(issuer: Issuer) -> None:
    assert code_of(issuer.settings(), issuer.sign(issuer.claims(ttl_s=-30))) == "expired_token"


def test_a_token_signed_by_another_key_is_invalid(issuer: Issuer) -> None:
    other = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    s = issuer.settings()
    assert code_of(s, issuer.sign(issuer.claims(), key=other)) == "invalid_token"  # same kid
    unknown_kid = jwt.encode(issuer.claims(), other, algorithm="RS256", headers={"kid": "nope"})
    assert code_of(s, unknown_kid) == "invalid_token"


def test_wrong_audience_or_issuer_is_invalid(issuer: Issuer) -> None:
    s = issuer.settings()
    assert code_of(s, issuer.sign(issuer.claims(aud="someone-else"))) == "invalid_token"
    assert code_of(s, issuer.sign(issuer.claims(iss="https://evil.test/"))) == "invalid_token"


def test_an_hs256_token_is_refused_whatever_its_key(issuer: Issuer) -> None:
    s = issuer.settings()
    claims = issuer.claims()
    plain = jwt.encode(claims, "local-only-signing-key-not-for-production", algorithm="HS256",
                       headers={"kid": issuer.kid})  # fmt: skip
    assert code_of(s, plain) == "invalid_token"
    # algorithm confusion: HMAC keyed with the JWKS's public key, which anyone can fetch
    public_pem = issuer.key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    head = _b64(json.dumps({"alg": "HS256", "typ": "JWT", "kid": issuer.kid}).encode())
    payload = _b64(json.dumps(claims).encode())
    mac = hmac.new(public_pem, f"{head}.{payload}".encode(), hashlib.sha256).digest()
    assert code_of(s, f"{head}.{payload}.{_b64(mac)}") == "invalid_token"


def test_an_unreachable_jwks_is_auth_unavailable_not_a_bad_token(issuer: Issuer) -> None:
    s = Settings(
        jwks_url=f"http://127.0.0.1:{dead_port()}/.well-known/jwks.json",
        jwt_issuer=ISSUER,
        jwt_audience=AUDIENCE,
    )
    with pytest.raises(auth.AuthUnavailable):
        auth.verify(s, f"Bearer {issuer.sign(issuer.claims())}")


# -- keys and events ----------------------------------------------------------------------------
def test_keys_of_one_post_share_a_cluster_slot() -> None:
    post = "p-42"
    slots = {key_slot(k.encode()) for k in [keys.count_key(post), *keys.sub_keys(post)]}
    assert len(slots) == 1
    assert key_slot(keys.bloom_key("u1").encode()) == key_slot(
        keys.bloom_scratch_key("u1").encode()
    )
    assert keys.idem_key("u", "p", "i") == "idem:u:p:i"
    assert keys.kafka_key("p", 0) == "p" and keys.kafka_key("p", 3) == "p:3"


def test_event_schema_round_trips_an_event() -> None:
    schema = fastavro.parse_schema(json.loads(events.LIKE_EVENT_SCHEMA))
    ev = events.LikeEvent.new(
        intent_uuid="7d9f3f8e-2f8e-4a55-9a53-3a3a7b0b3c11", user_id="u", post_id="p",
        action="like", reaction="like", delta=1, region="local",
    )  # fmt: skip
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, ev.to_dict())
    buf.seek(0)
    raw = fastavro.schemaless_reader(buf, schema, schema)
    assert isinstance(raw, dict)
    back = events.LikeEvent.from_dict(raw)
    assert back == ev
