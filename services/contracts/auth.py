"""Bearer JWTs, verified against the identity provider's JWKS (RS256/ES256) in every environment.

There is no shared signing key: locally the stack runs its own issuer (local/issuer.py) at the
address the stack's identity-provider URL maps to, and only it can sign tokens the services take.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

import jwt

from services.contracts import keys
from services.contracts.settings import Settings

ALGORITHMS = ["RS256", "ES256"]  # asymmetric only: an HS256 token is refused whatever its key
_USER_ID = re.compile(keys.USER_ID_PATTERN)


class AuthUnavailable(Exception):
    """The JWKS could not be fetched: not the caller's fault (answer 503, not 401)."""


class AuthError(Exception):
    """The bearer token is missing, malformed, forged or expired; `code` is machine-readable."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


@lru_cache(maxsize=4)
def _jwks_client(url: str) -> jwt.PyJWKClient:
    return jwt.PyJWKClient(url, cache_keys=True, lifespan=300)


def verify(settings: Settings, authorization: str | None) -> str:
    """The caller's user id from an `Authorization: Bearer <jwt>` header, or AuthError."""
    return verify_claims(settings, authorization)[0]


def verify_claims(settings: Settings, authorization: str | None) -> tuple[str, dict[str, Any]]:
    """`verify`, and the token's verified claims (the write path reads the account's age)."""
    if not authorization:
        raise AuthError("missing_token", "Authorization: Bearer <token> is required")
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise AuthError("malformed_token", "Authorization must be 'Bearer <token>'")
    try:
        key = _jwks_client(settings.jwks_url).get_signing_key_from_jwt(token.strip()).key
        claims = jwt.decode(
            token.strip(),
            key,
            algorithms=ALGORITHMS,
            audience=settings.jwt_audience,
            issuer=settings.jwt_issuer,
            options={"require": ["sub", "exp"]},
        )
    except jwt.PyJWKClientConnectionError as e:
        raise AuthUnavailable(f"the identity provider's keys are unreachable: {e}") from e
    except jwt.ExpiredSignatureError as e:
        raise AuthError("expired_token", "the token has expired") from e
    except jwt.PyJWTError as e:
        raise AuthError("invalid_token", f"the token is not valid: {e}") from e
    sub = claims.get("sub")
    if not isinstance(sub, str) or not sub:
        raise AuthError("invalid_token", "the token has no subject")
    if not _USER_ID.fullmatch(sub):
        # the subject becomes part of Redis keys and hash tags: refuse what could break them
        raise AuthError("invalid_subject", f"the token's subject must match {keys.USER_ID_PATTERN}")
    return sub, claims
