"""POST /v1/likes."""

from __future__ import annotations

import re
import uuid
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from services.common.http import ApiError
from services.contracts import auth, degrade, flags, keys, routes, signals
from services.write import core

router = APIRouter(prefix=routes.API_PREFIX, tags=["likes"])

POST_ID = keys.POST_ID_PATTERN
MAX_BODY_BYTES = 4096


class LikeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    post_id: str = Field(pattern=POST_ID)
    action: Literal["like", "unlike"]
    reaction: str = Field(default="like", pattern=keys.REACTION_PATTERN)
    user_id: str | None = Field(default=None, description="optional; must be the caller")


class LikeAccepted(BaseModel):
    intent_uuid: str
    state: Literal["liked", "unliked"]
    changed: bool


def _retry_503(dependency: str) -> ApiError:
    return ApiError(
        503,
        f"{dependency.replace('-', '_')}_unavailable",
        f"{dependency} is unavailable; nothing was written, retry with the same Idempotency-Key",
        headers={"Retry-After": "1"},
    )


@router.post(
    routes.relative(routes.WRITE_PATH),
    status_code=202,
    response_model=LikeAccepted,
    responses={400: {}, 401: {}, 403: {}, 409: {}, 413: {}, 422: {}, 429: {}, 503: {}},
)
async def post_like(
    request: Request,
    body: LikeRequest,
    authorization: Annotated[str | None, Header()] = None,
    idempotency_key: Annotated[str | None, Header()] = None,
    client_ip: Annotated[
        str | None, Header(alias=signals.CLIENT_IP_HEADER, description="set by the CDN")
    ] = None,
    device: Annotated[
        str | None, Header(alias=signals.DEVICE_HEADER, pattern=signals.DEVICE_PATTERN)
    ] = None,
) -> JSONResponse:
    """Like or unlike a post as the caller. A replay of the same Idempotency-Key returns the
    first answer and changes nothing."""
    settings = request.app.state.settings
    if request.app.state.switches.engaged(flags.Switch.WRITES_READONLY):
        raise ApiError(
            503,
            "writes_readonly",
            "writes are switched off for now (kill switch writes-readonly); nothing was "
            "written, retry later with the same Idempotency-Key",
            headers={"Retry-After": str(flags.RETRY_AFTER_S)},
        )
    try:
        user_id, claims = auth.verify_claims(settings, authorization)
    except auth.AuthError as e:
        raise ApiError(401, e.code, str(e), headers={"WWW-Authenticate": "Bearer"}) from e
    except auth.AuthUnavailable as e:
        raise ApiError(503, "identity_provider_unavailable", str(e), {"Retry-After": "1"}) from e
    if body.user_id is not None and body.user_id != user_id:
        raise ApiError(403, "forbidden_user", "you can only like as yourself")
    intent_uuid = _parse_key(idempotency_key)
    try:
        sig = signals.parse(client_ip, device, claims.get(signals.ACCOUNT_CREATED_CLAIM))
    except signals.InvalidSignal as e:
        raise ApiError(400, "invalid_signal", str(e)) from e
    intent = core.Intent(user_id, body.post_id, body.action, body.reaction, intent_uuid, sig)
    writer: core.LikeWriter = request.app.state.writer
    try:
        out = await run_in_threadpool(writer.write, intent)
    except core.Unavailable as e:
        raise _retry_503(e.dependency) from e
    except core.Refused as e:
        raise ApiError(
            422,
            "refused_by_edge_store",
            "the edge-store refused this request (an identifier longer than it can store?); "
            "nothing was written, and retrying it will not help",
        ) from e
    except core.Degraded as e:
        raise ApiError(
            429,
            "degraded_account",
            f"this account may like once every {degrade.GATE_S} s for now (abuse protection); "
            "nothing was written",
            headers={"Retry-After": str(e.retry_after_s)},
        ) from e
    except core.KeyReused as e:
        raise ApiError(
            409,
            "idempotency_key_reused",
            "this Idempotency-Key was already used for a different request",
        ) from e
    headers = {"Idempotent-Replayed": "true"} if out.replayed else {}
    return JSONResponse(out.body(), status_code=202, headers=headers)


_UUID = re.compile(r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")


def _parse_key(raw: str | None) -> str:
    if raw is None or not raw.strip():
        raise ApiError(400, "missing_idempotency_key", "the Idempotency-Key header is required")
    if not _UUID.match(raw.strip()):
        raise ApiError(400, "malformed_idempotency_key", "Idempotency-Key must be a UUID")
    return str(uuid.UUID(raw.strip()))
