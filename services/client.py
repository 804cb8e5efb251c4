"""A small client for the like API. Retries a write with the SAME Idempotency-Key, so a retry
can never count twice; used by the tests, the demo and the load tools."""

from __future__ import annotations

import ssl
import uuid
import zlib
from dataclasses import dataclass
from typing import Any

import httpx
import jwt
from tenacity import (
    Retrying,
    retry_if_exception_type,
    stop_after_attempt,
    wait_exponential_jitter,
)

from services.contracts import routes


class RetryableStatus(Exception):
    def __init__(self, response: httpx.Response) -> None:
        super().__init__(f"HTTP {response.status_code}: {response.text[:200]}")
        self.response = response


def client_ip(token: str | None) -> str:
    """An address in 10.0.0.0/8 of the token's user (its unverified `sub`), the same for every
    request of that user; random without a token."""
    try:
        sub = str(jwt.decode(token or "", options={"verify_signature": False})["sub"])
    except (jwt.InvalidTokenError, KeyError):
        sub = uuid.uuid4().hex
    n = zlib.crc32(sub.encode())
    return f"10.{n >> 24}.{(n >> 16) & 255}.{1 + (n & 255) % 254}"


@dataclass
class LikesClient:
    write_url: str
    read_url: str
    token: str | None = None
    timeout: float = 5.0
    attempts: int = 5
    # through the gateway: each user claims an address of its own in the CDN's header, as many
    # clients behind the CDN would (the per-IP rate limit keys on it). Stable per user (its
    # token's `sub`): a user hopping /24s like after like is what the abuse scorer voids.
    vary_client_ip: bool = False
    # a service's API directly (not through the gateway) in the --tls profile: an SSLContext
    # with the gateway's client certificate (services require one)
    verify: ssl.SSLContext | bool = True

    def _headers(self, token: str | None) -> dict[str, str]:
        tok = token or self.token
        headers = {"Authorization": f"Bearer {tok}"} if tok else {}
        if self.vary_client_ip:
            headers[routes.CLIENT_IP_HEADER] = client_ip(tok)
        return headers

    def like(
        self,
        post_id: str,
        action: str = "like",
        *,
        reaction: str = "like",
        idempotency_key: str | None = None,
        token: str | None = None,
    ) -> httpx.Response:
        """POST /v1/likes; 5xx, 429 and transport errors are retried with the same key."""
        key = idempotency_key or str(uuid.uuid4())
        body = {"post_id": post_id, "action": action, "reaction": reaction}
        headers = {**self._headers(token), "Idempotency-Key": key}
        for attempt in Retrying(
            stop=stop_after_attempt(self.attempts),
            wait=wait_exponential_jitter(initial=0.1, max=2.0),
            retry=retry_if_exception_type((httpx.TransportError, RetryableStatus)),
            reraise=True,
        ):
            with attempt:
                r = httpx.post(
                    f"{self.write_url}{routes.WRITE_PATH}",
                    json=body,
                    headers=headers,
                    timeout=self.timeout,
                    verify=self.verify,
                )
                if r.status_code >= 500 or r.status_code == 429:
                    raise RetryableStatus(r)
        return r

    def count(self, post_id: str, token: str | None = None) -> dict[str, Any]:
        r = httpx.get(
            f"{self.read_url}{routes.read_path(post_id)}",
            headers=self._headers(token),
            timeout=self.timeout,
            verify=self.verify,
        )
        r.raise_for_status()
        data: dict[str, Any] = r.json()
        return data
