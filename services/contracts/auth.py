"""Bearer JWTs: a local HS256 signing key for the local stack, JWKS verification in production."""

from __future__ import annotations

import time
from functools import lru_cache

import jwt

from services.contracts.settings import Settings


class AuthError(Exception):
    """The bearer token is missing, malformed, forged or expired; `code` is machine-readable."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def issue_token(settings: Settings, user_id: str, ttl_s: int = 3600) -> str:
    """A token valid on the local stack (HS256 with the local key); never used in production."""
    now = int(time.time())
    claims = {
        "sub": user_id,
        "iss": settings.jwt_issuer,
        "aud": settings.jwt_audience,
        "iat": now,
        "exp": now + ttl_s,
    }
    return jwt.encode(claims, settings.jwt_secret.get_secret_value(), algorithm="HS256")


@lru_cache(maxsize=4)
def _jwks_client(url: str) -> jwt.PyJWKClient:
    return jwt.PyJWKClient(url, cache_keys=True, lifespan=300)


def verify(settings: Settings, authorization: str | None) -> str:
    """The caller's user id from an `Authorization: Bearer <jwt>` header, or AuthError."""
    if not authorization:
        raise AuthError("missing_token", "Authorization: Bearer <token> is required")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthError("malformed_token", "Authorization must be 'Bearer <token>'")
    try:
        if settings.jwks_url:
            key = _jwks_client(settings.jwks_url).get_signing_key_from_jwt(token).key
            algorithms = ["RS256", "ES256"]
        else:
            key, algorithms = settings.jwt_secret.get_secret_value(), ["HS256"]
        claims = jwt.decode(
            token.strip(),
            key,
            algorithms=algorithms,
            audience=settings.jwt_audience,
            issuer=settings.jwt_issuer,
            options={"require": ["sub", "exp"]},
        )
    except jwt.ExpiredSignatureError as e:
        raise AuthError("expired_token", "the token has expired") from e
    except jwt.PyJWTError as e:
        raise AuthError("invalid_token", f"the token is not valid: {e}") from e
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub:
        raise AuthError("invalid_token", "the token has no subject")
    return sub
