"""The read service's last-resort middleware: an exception or a 5xx in a /v1 route becomes a
degraded 200; other routes are left alone."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.testclient import TestClient

from services.read.core import CountView, LastGood, Reader
from services.read.main import NeverFail


def app_with(reader: Reader | None) -> FastAPI:
    app = FastAPI()
    app.add_middleware(NeverFail)
    app.state.reader = reader

    @app.get("/v1/posts/{post_id}/likes")
    async def boom(post_id: str) -> dict[str, str]:
        raise RuntimeError("unexpected")

    @app.post("/v1/posts/likes:batch")
    async def five_hundred() -> JSONResponse:
        return JSONResponse({"oops": True}, status_code=503)

    @app.get("/readyz")
    async def readyz() -> JSONResponse:
        return JSONResponse({"ready": False}, status_code=503)

    return app


def test_an_exception_is_a_stale_200_with_the_last_good_value() -> None:
    lg = LastGood()
    lg.put([CountView("p1", 7, {"like": 7}, 123, False, "aggregate")])
    reader = Reader(cache=None, store=None, last_good=lg)  # type: ignore[arg-type]
    c = TestClient(app_with(reader), raise_server_exceptions=False)
    r = c.get("/v1/posts/p1/likes")
    assert r.status_code == 200
    assert r.json() == {
        "post_id": "p1",
        "count": 7,
        "top_reactions": [{"reaction": "like", "count": 7}],
        "last_fresh": 123,
        "stale": True,
    }
    r = c.get("/v1/posts/p2/likes")
    assert r.status_code == 200 and r.json()["count"] is None and r.json()["stale"] is True


def test_a_5xx_response_is_replaced_even_without_a_reader() -> None:
    c = TestClient(app_with(None), raise_server_exceptions=False)
    r = c.post("/v1/posts/likes:batch", json={"post_ids": ["a"]})
    assert r.status_code == 200 and r.json() == {"items": []}
    assert r.headers["cache-control"] == "private, no-store"


def test_non_v1_routes_keep_their_status() -> None:
    c = TestClient(app_with(None), raise_server_exceptions=False)
    assert c.get("/readyz").status_code == 503
