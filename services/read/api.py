"""GET /v1/posts/{post_id}/likes and POST /v1/posts/likes:batch — answers that never 5xx."""

from __future__ import annotations

import asyncio
from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Header, Path, Request, Response
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr

from services.common.http import ApiError, error_body
from services.contracts import auth, keys, routes
from services.contracts.settings import Settings
from services.read.core import CountView, Reader
from services.read.heat import HOT_TTL_S, HeatSource
from services.read.metrics import DEGRADED

router = APIRouter(prefix=routes.API_PREFIX, tags=["likes"])
MAX_BODY_BYTES = 16384  # a batch of 50 ids of at most 128 characters, with room for JSON

POST_ID = keys.POST_ID_PATTERN
MAX_BATCH = 50
PRIVATE = "private, no-store"


class Reaction(BaseModel):
    reaction: str
    count: int


class LikesView(BaseModel):
    post_id: str
    count: int | None = Field(description="null only when no tier answered and no recent value")
    top_reactions: list[Reaction] = Field(description="up to 3, most frequent first")
    has_liked: bool | None = Field(
        default=None,
        description="present only for an authenticated caller; null when the edge-store could "
        "not confirm a Bloom-filter 'maybe'",
    )
    last_fresh: int | None = Field(description="epoch ms at which the count was known fresh")
    stale: bool = Field(description="true when served from the last good value (or null)")
    _tier: str = PrivateAttr(default="none")  # which tier answered: the X-Read-Tier header

    @classmethod
    def of(cls, v: CountView) -> LikesView:
        body = cls(
            post_id=v.post_id,
            # a PN-counter can dip below zero for a moment (a void before its like): never show it
            count=None if v.count is None else max(0, v.count),
            top_reactions=[Reaction(reaction=r, count=c) for r, c in v.top_reactions()],
            last_fresh=v.last_fresh_ms,
            stale=v.stale,
        )
        body._tier = v.tier
        return body


class BatchRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    post_ids: list[Annotated[str, Field(pattern=POST_ID)]] = Field(
        min_length=1, max_length=MAX_BATCH, description=f"1 to {MAX_BATCH} post ids (a feed page)"
    )


class BatchView(BaseModel):
    items: list[LikesView] = Field(description="one per requested id, in request order")


ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"description": "the bearer token is malformed, forged or expired"},
    422: {"description": "invalid post id(s), or more than 50"},
}


async def caller(
    request: Request, authorization: Annotated[str | None, Header()] = None
) -> str | None:
    """The authenticated user, None for an anonymous caller; a bad token is a 401, not anonymous
    (a silently-anonymous answer would be cached publicly and hide the client's bug)."""
    if authorization is None:
        return None
    settings: Settings = request.app.state.settings
    try:
        return auth.verify(settings, authorization)
    except auth.AuthError as e:
        raise ApiError(401, e.code, str(e), headers={"WWW-Authenticate": "Bearer"}) from e
    except auth.AuthUnavailable:
        # never 5xx: without the IdP's keys, answer the anonymous view (no has_liked); the
        # answer stays uncacheable at the edge (Vary: Authorization)
        return None


Caller = Annotated[str | None, Depends(caller)]


def _reader(request: Request) -> Reader:
    reader: Reader = request.app.state.reader
    return reader


async def _views(request: Request, user_id: str | None, post_ids: list[str]) -> list[LikesView]:
    """Counts (and has_liked) for post_ids; any unexpected failure degrades, never raises."""
    request.state.post_ids = post_ids  # for the last-resort middleware in main.py
    reader = _reader(request)
    try:
        if user_id is None:
            views = await reader.counts(post_ids)
            liked: list[bool | None] | None = None
        else:
            views, liked = await _gather(reader, user_id, post_ids)
    except Exception:
        DEGRADED.labels(request.url.path.rsplit("/", 1)[-1]).inc()
        views, liked = reader.degraded(post_ids), None
        if user_id is not None:
            liked = [None] * len(post_ids)
    out = [LikesView.of(v) for v in views]
    if liked is not None:
        for body, has in zip(out, liked, strict=True):
            body.has_liked = has  # assignment marks the field set: it is serialized
    return out


async def _gather(
    reader: Reader, user_id: str, post_ids: list[str]
) -> tuple[list[CountView], list[bool | None]]:
    counts, liked = await asyncio.gather(
        reader.counts(post_ids), reader.has_liked(user_id, post_ids)
    )
    return counts, liked


@router.get(
    routes.relative(routes.READ_TEMPLATE),
    response_model=LikesView,
    response_model_exclude_unset=True,
    responses=ERRORS,
    summary="A post's like count, top reactions and (authenticated) whether the caller liked it",
)
async def get_likes(
    request: Request,
    response: Response,
    post_id: Annotated[str, Path(pattern=POST_ID)],
    user_id: Caller,
) -> LikesView:
    """Never 5xx: when the stores are down the answer is the last good count (at most 1 minute
    old) with `stale: true`, or `count: null`.

    Anonymous answers are cacheable by the CDN for the post's heat TTL (5 s hot … 30 s cold) and
    carry `Surrogate-Key`/`Cache-Tag: post-<id>` for purges; authenticated ones are private."""
    (body,) = await _views(request, user_id, [post_id])
    response.headers["X-Read-Tier"] = body._tier  # for on-call and tests; not part of the body
    if user_id is None:
        heat: HeatSource = request.app.state.heat
        # a stale or null answer should not stick at the edge for long
        ttl = HOT_TTL_S if body.stale else heat.ttl(post_id)
        response.headers["Cache-Control"] = f"public, max-age={ttl}"
        response.headers["Surrogate-Key"] = f"post-{post_id}"
        response.headers["Cache-Tag"] = f"post-{post_id}"
        response.headers["Vary"] = "Authorization"
    else:
        response.headers["Cache-Control"] = PRIVATE
    return body


@router.post(
    routes.relative(routes.BATCH_READ_PATH),
    response_model=BatchView,
    response_model_exclude_unset=True,
    responses=ERRORS,
    summary="Counts (and has_liked) for a feed page of up to 50 posts in one round trip",
)
async def batch_likes(
    request: Request,
    response: Response,
    body: Annotated[BatchRequest, Body()],
    user_id: Caller,
) -> BatchView:
    """The same answer as the single read for each id, in request order; the count-cache reads
    are pipelined and has_liked needs at most one edge-store query (the user's partition).
    Private: a page mixes posts of different heat and may be personalised."""
    response.headers["Cache-Control"] = PRIVATE
    return BatchView(items=await _views(request, user_id, body.post_ids))


def degraded_body(
    reader: Reader | None, path: str, post_ids: list[str] | None
) -> dict[str, object]:
    """The last-resort answer of main.py's middleware, built without FastAPI."""
    if post_ids is None:
        parts = path.strip("/").split("/")  # v1/posts/<id>/likes
        post_ids = [parts[2]] if len(parts) == 4 and parts[3] == "likes" else []
    views: list[CountView] = []
    if reader is not None:
        try:
            views = reader.degraded(post_ids)
        except Exception:
            views = []
    if len(views) != len(post_ids):
        views = [CountView(p, None, {}, None, True, "none") for p in post_ids]
    items = [LikesView.of(v).model_dump(exclude_unset=True) for v in views]
    if path.endswith("likes:batch"):
        return {"items": items}
    return items[0] if items else error_body("unavailable", "no answer") | {"stale": True}
