"""The local identity provider: a key made once and kept private, a JWKS that verifies the tokens
it signs and nothing signed with another key."""

from __future__ import annotations

import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest

from local import issuer

ISS, AUD = "https://auth.test.likes.example/", "likes"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[str]:
    """The issuer's real HTTP server on a free loopback port; yields its base URL."""
    server = issuer.make_server(tmp_path, "127.0.0.1", 0)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_the_key_is_made_once_and_only_its_owner_can_read_it(tmp_path: Path) -> None:
    first = issuer.load_key(tmp_path)
    path = issuer.key_path(tmp_path)
    assert path.parent == tmp_path / "secrets"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    again = issuer.load_key(tmp_path)
    assert issuer.kid(again.public_key()) == issuer.kid(first.public_key())
    assert list(path.parent.iterdir()) == [path]  # no temporary file left behind


def test_jwks_served_over_http_verifies_a_token_it_signed(tmp_path: Path, served: str) -> None:
    assert httpx.get(served + issuer.HEALTH_PATH).status_code == 200
    token = issuer.sign(tmp_path, "alice", 600, issuer=ISS, audience=AUD)
    (key,) = httpx.get(served + issuer.JWKS_PATH).json()["keys"]
    assert key["kty"] == "RSA" and key["alg"] == "RS256" and key["use"] == "sig"
    assert jwt.get_unverified_header(token)["kid"] == key["kid"]
    client = jwt.PyJWKClient(served + issuer.JWKS_PATH)
    signing_key = client.get_signing_key_from_jwt(token)
    claims = jwt.decode(token, signing_key.key, algorithms=["RS256"], audience=AUD, issuer=ISS)
    assert claims["sub"] == "alice"
    assert claims["exp"] - claims["iat"] == 600


def test_a_token_signed_with_another_key_is_refused(tmp_path: Path, served: str) -> None:
    other_home = tmp_path / "elsewhere"
    forged = issuer.sign(other_home, "mallory", 600, issuer=ISS, audience=AUD)
    jwks = jwt.PyJWKSet.from_dict(httpx.get(served + issuer.JWKS_PATH).json())
    (key,) = jwks.keys
    # the kid does not even name our key; with our key forced, the signature still fails
    assert jwt.get_unverified_header(forged)["kid"] != key.key_id
    with pytest.raises(jwt.InvalidSignatureError):
        jwt.decode(forged, key.key, algorithms=["RS256"], audience=AUD, issuer=ISS)


def test_an_expired_token_is_refused(tmp_path: Path) -> None:
    token = issuer.sign(tmp_path, "alice", -120, issuer=ISS, audience=AUD)
    public = issuer.load_key(tmp_path).public_key()
    with pytest.raises(jwt.ExpiredSignatureError):
        jwt.decode(token, public, algorithms=["RS256"], audience=AUD, issuer=ISS)


def test_the_service_side_verifier_accepts_it(tmp_path: Path, served: str) -> None:
    """services/contracts/auth.verify, pointed at this JWKS, reads the user id."""
    from services.contracts import auth
    from services.contracts.settings import Settings

    settings = Settings(jwks_url=served + issuer.JWKS_PATH, jwt_issuer=ISS, jwt_audience=AUD)
    token = issuer.sign(tmp_path, "bob", 600, issuer=ISS, audience=AUD)
    assert auth.verify(settings, f"Bearer {token}") == "bob"
    with pytest.raises(auth.AuthError):
        auth.verify(settings, f"Bearer {issuer.sign(tmp_path / 'x', 'bob', 600, ISS, AUD)}")


def test_a_signer_loads_the_key_once_for_many_tokens_that_the_jwks_verifies(
    tmp_path: Path, served: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # bench_write signed each token with issuer.sign, which loads and checks the key every time
    # (~0.1-0.6 s, far more than the RS256 signature): a benchmark signing per request measured
    # that. A Signer loads it once.
    loads = 0
    load_key = issuer.load_key

    def counting(home: Path) -> Any:
        nonlocal loads
        loads += 1
        return load_key(home)

    monkeypatch.setattr(issuer, "load_key", counting)
    sign = issuer.Signer(tmp_path, ISS, AUD)
    tokens = [sign(f"user-{i}") for i in range(20)]
    assert loads == 1
    client = jwt.PyJWKClient(served + issuer.JWKS_PATH)
    for i, token in enumerate(tokens):
        key = client.get_signing_key_from_jwt(token)
        claims = jwt.decode(token, key.key, algorithms=["RS256"], audience=AUD, issuer=ISS)
        assert claims["sub"] == f"user-{i}"
