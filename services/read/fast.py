"""A plain ASGI front for the read service's two hot routes.

A well-formed GET of one post's count, or POST of a feed page, is answered here without FastAPI's
routing, dependency solving and pydantic serialization (together about a third of a read's CPU in
the profile). Anything else (a bad id or body, a refused token, another method or path, a
duplicated header) goes on untouched to the FastAPI routes in api.py, so every error answer and
the OpenAPI contract stay defined once, there. Mounted inside main.NeverFail: an exception here is
still a degraded 200, and the RED middleware sees the same route label as for a routed request.

What it answers is byte for byte what api.py answers (status, headers, body): the equivalence
tests in tests/integration/test_read_fast.py hold the two side by side.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from typing import Any

import orjson
from fastapi import FastAPI
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.contracts import auth, keys, routes
from services.contracts.settings import Settings
from services.read import api
from services.read.core import CountView, Reader
from services.read.heat import HOT_TTL_S, HeatSource
from services.read.metrics import DEGRADED, FAST_PATH

_API = routes.API_PREFIX + "/"
_POST_ID = re.compile(keys.POST_ID_PATTERN)
_PREFIX, _SUFFIX = routes.READ_TEMPLATE.split("{post_id}")
_JSON = b"application/json"
_PRIVATE = api.PRIVATE.encode()
# what FastAPI's JSONResponse renders (json.dumps, ensure_ascii=False, compact separators), for
# the str / int / bool / None / list / dict bodies here, at a tenth of the stdlib encoder's cost
_DUMPS = orjson.dumps
_SERVED = FAST_PATH.labels("served")
_PASSED = FAST_PATH.labels("passed")
_DEGRADED_GET = DEGRADED.labels(_SUFFIX.rsplit("/", 1)[-1])  # what api._views labels them
_DEGRADED_BATCH = DEGRADED.labels(routes.BATCH_READ_PATH.rsplit("/", 1)[-1])


class VerifiedTokens:
    """Bearer headers already verified, with their subject, until the token's `exp`.

    A feed client sends the same token with every read; PyJWT re-verifying it (two decodes of
    the token, per-byte base64 checks, the RSA signature) was the largest single cost of an
    authenticated read. A hit is the same answer a verification would give: the signature and
    claims cannot change, `exp` is honoured to the second as PyJWT does (no leeway), and the
    signing keys are already pinned for the process's life by PyJWKClient(cache_keys=True).
    Only successes are kept; bounded, oldest entry dropped first."""

    def __init__(self, capacity: int = 4096, clock: Any = time.time) -> None:
        self.capacity, self.clock = capacity, clock
        self._subjects: dict[bytes, tuple[str, float]] = {}

    def get(self, header: bytes) -> str | None:
        hit = self._subjects.get(header)
        if hit is None:
            return None
        if self.clock() >= hit[1]:  # expired: verification would refuse it now
            del self._subjects[header]
            return None
        return hit[0]

    def put(self, header: bytes, user_id: str) -> None:
        exp = _expiry(header)
        if exp is None:
            return
        if len(self._subjects) >= self.capacity:
            del self._subjects[next(iter(self._subjects))]
        self._subjects[header] = (user_id, exp)


def _expiry(header: bytes) -> float | None:
    """The `exp` of an already verified `Bearer <jwt>`, None if it cannot be read."""
    try:
        payload = header.split(b".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + b"=" * (-len(payload) % 4)))
        exp = claims["exp"]
    except (IndexError, KeyError, TypeError, ValueError):
        return None
    if isinstance(exp, bool) or not isinstance(exp, int | float):
        return None
    return float(exp)


class _PassOn(Exception):
    """Not a request this front answers: the FastAPI routes will."""


def _item(v: CountView, liked: list[bool | None] | None, i: int) -> dict[str, Any]:
    """api.LikesView.of(v) as `response_model_exclude_unset` serializes it: field order kept,
    has_liked present only for an authenticated caller."""
    out: dict[str, Any] = {
        "post_id": v.post_id,
        # a PN-counter can dip below zero for a moment (a void before its like): never show it
        "count": None if v.count is None else max(0, v.count),
        "top_reactions": [{"reaction": r, "count": c} for r, c in v.top_reactions()],
    }
    if liked is not None:
        out["has_liked"] = liked[i]
    out["last_fresh"] = v.last_fresh_ms
    out["stale"] = v.stale
    return out


class FastReads:
    """The ASGI middleware; `fastapi_app` holds the reader, settings and heat source (its
    lifespan puts them on app.state) and the routes whose labels the metrics use."""

    def __init__(self, app: ASGIApp, fastapi_app: FastAPI, tokens: VerifiedTokens | None = None):
        self.app = app
        self.fastapi_app = fastapi_app
        self.tokens = tokens or VerifiedTokens()
        self._routes: dict[tuple[str, str], Any] = {}

    def _route(self, method: str, path: str) -> Any:
        """The APIRoute the router would put in the scope (api.router's own: FastAPI wraps an
        included router, then selects the original route): RED metrics label by its path."""
        route = self._routes.get((method, path))
        if route is None:
            for r in api.router.routes:
                if getattr(r, "path", None) == path and method in getattr(r, "methods", ()):
                    route = self._routes[(method, path)] = r
                    break
        return route

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith(_API):
            await self.app(scope, receive, send)  # ops routes (/healthz, /metrics, ...)
            return
        method, path = scope["method"], scope["path"]
        if not scope.get("root_path"):
            if method == "GET" and path.startswith(_PREFIX) and path.endswith(_SUFFIX):
                post_id = path[len(_PREFIX) : -len(_SUFFIX)]
                if _POST_ID.fullmatch(post_id):
                    try:
                        await self._get(scope, send, post_id)
                        return
                    except _PassOn:
                        pass
            elif method == "POST" and path == routes.BATCH_READ_PATH:
                await self._batch(scope, receive, send)
                return
        _PASSED.inc()
        await self.app(scope, receive, send)

    # -- the two routes ---------------------------------------------------------------------
    async def _get(self, scope: Scope, send: Send, post_id: str) -> None:
        authorization, _ = self._headers(scope)
        reader, user_id = self._caller(authorization)
        views, liked = await self._views(scope, reader, user_id, [post_id], _DEGRADED_GET)
        v = views[0]
        body = _DUMPS(_item(v, liked, 0))
        headers = [
            (b"content-length", b"%d" % len(body)),
            (b"content-type", _JSON),
            (b"x-read-tier", v.tier.encode()),
        ]
        if user_id is None:
            heat: HeatSource = self.fastapi_app.state.heat
            # a stale or null answer should not stick at the edge for long
            ttl = HOT_TTL_S if v.stale else heat.ttl(post_id)
            tag = f"post-{post_id}".encode()
            headers += [
                (b"cache-control", b"public, max-age=%d" % ttl),
                (b"surrogate-key", tag),
                (b"cache-tag", tag),
                (b"vary", b"Authorization"),
            ]
        else:
            headers.append((b"cache-control", _PRIVATE))
        await self._answer(scope, send, routes.READ_TEMPLATE, "GET", headers, body)

    async def _batch(self, scope: Scope, receive: Receive, send: Send) -> None:
        messages: list[Message] = []
        failure: Exception | None = None
        chunks: list[bytes] = []
        while True:
            try:
                message = await receive()
            except Exception as e:  # e.g. BodyLimit cutting off a chunked body: replayed below
                failure = e
                break
            messages.append(message)
            if message["type"] != "http.request":
                break
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        try:
            if failure is not None or messages[-1]["type"] != "http.request":
                raise _PassOn
            authorization, content_type = self._headers(scope)
            if content_type != _JSON:
                raise _PassOn
            post_ids = self._batch_ids(b"".join(chunks))
            reader, user_id = self._caller(authorization)
        except _PassOn:
            await self.app(scope, self._replay(messages, failure, receive), send)
            return
        views, liked = await self._views(scope, reader, user_id, post_ids, _DEGRADED_BATCH)
        items = [_item(v, liked, i) for i, v in enumerate(views)]
        body = _DUMPS({"items": items})
        headers = [
            (b"content-length", b"%d" % len(body)),
            (b"content-type", _JSON),
            (b"cache-control", _PRIVATE),
        ]
        await self._answer(scope, send, routes.BATCH_READ_PATH, "POST", headers, body)

    # -- pieces ---------------------------------------------------------------------------------
    @staticmethod
    def _headers(scope: Scope) -> tuple[bytes | None, bytes | None]:
        """Authorization and Content-Type, the only headers the routes read; either one sent
        twice is left to the routes."""
        authorization = content_type = None
        for name, value in scope["headers"]:
            if name == b"authorization":
                if authorization is not None:
                    raise _PassOn
                authorization = value
            elif name == b"content-type":
                if content_type is not None:
                    raise _PassOn
                content_type = value
        return authorization, content_type

    @staticmethod
    def _batch_ids(raw: bytes) -> list[str]:
        """api.BatchRequest's rules: exactly {"post_ids": [1..50 valid ids]}."""
        try:
            doc = orjson.loads(raw)
        except Exception:  # orjson.JSONDecodeError, also for a too deeply nested body
            raise _PassOn from None
        if type(doc) is not dict or len(doc) != 1:
            raise _PassOn
        ids = doc.get("post_ids")
        if type(ids) is not list or not 1 <= len(ids) <= api.MAX_BATCH:
            raise _PassOn
        for p in ids:
            if type(p) is not str or not _POST_ID.fullmatch(p):
                raise _PassOn
        return ids

    def _caller(self, authorization: bytes | None) -> tuple[Reader, str | None]:
        """The reader and api.caller's answer; a refused token is left to the routes (401)."""
        state = self.fastapi_app.state
        reader: Reader | None = getattr(state, "reader", None)
        if reader is None:  # not started yet
            raise _PassOn
        if authorization is None:
            return reader, None
        user_id = self.tokens.get(authorization)
        if user_id is not None:
            return reader, user_id
        settings: Settings = state.settings
        try:
            user_id = auth.verify(settings, authorization.decode("latin-1"))
        except auth.AuthError:
            raise _PassOn from None
        except auth.AuthUnavailable:
            return reader, None  # as api.caller: the anonymous view, never a 5xx
        self.tokens.put(authorization, user_id)
        return reader, user_id

    async def _views(
        self, scope: Scope, reader: Reader, user_id: str | None, post_ids: list[str], degraded: Any
    ) -> tuple[list[CountView], list[bool | None] | None]:
        """api._views without the pydantic models: any unexpected failure degrades."""
        scope.setdefault("state", {})["post_ids"] = post_ids  # for main.NeverFail
        liked: list[bool | None] | None = None
        try:
            if user_id is None:
                views = await reader.counts(post_ids)
            else:
                views, liked = await asyncio.gather(
                    reader.counts(post_ids), reader.has_liked(user_id, post_ids)
                )
        except Exception:
            degraded.inc()
            views = reader.degraded(post_ids)
            liked = None if user_id is None else [None] * len(post_ids)
        return views, liked

    async def _answer(
        self, scope: Scope, send: Send, path: str, method: str,
        headers: list[tuple[bytes, bytes]], body: bytes,
    ) -> None:  # fmt: skip
        scope["route"] = self._route(method, path)
        _SERVED.inc()
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    @staticmethod
    def _replay(messages: list[Message], failure: Exception | None, receive: Receive) -> Receive:
        """The request as the routes would have read it: the messages already taken, then the
        failure that stopped the reading, then the live channel."""
        _PASSED.inc()
        pending = list(messages)

        async def replay() -> Message:
            if pending:
                return pending.pop(0)
            if failure is not None:
                raise failure
            return await receive()

        return replay
