"""The canary's settings: the shared LIKES_* settings plus LIKES_CANARY_* and the gateway."""

from __future__ import annotations

from pydantic import Field, SecretStr

from services.contracts import convergence
from services.contracts.settings import Settings


class CanarySettings(Settings):
    # where users reach the API (the public hostname in the program: the CDN, WAF and gateway
    # are on the canary's path as on a user's)
    gateway_url: str = "http://127.0.0.1:8000"
    # the canary user's bearer token (a Secret rotated out of band; a refused token shows as
    # result="error" checks and the CanaryFailing alert)
    canary_token: SecretStr | None = None
    canary_posts: int = Field(default=3, ge=1, le=100)  # posts it takes turns on
    # how long after its like or unlike the count must equal the truth: the convergence hold
    canary_hold_s: float = Field(default=convergence.HOLD_S, gt=0)
    canary_read_interval_s: float = Field(default=2.0, gt=0)  # reads during the hold
    canary_timeout_s: float = Field(default=5.0, gt=0)  # each call's bound

    ENDPOINTS = (*Settings.ENDPOINTS, "gateway_url", "canary_token")
