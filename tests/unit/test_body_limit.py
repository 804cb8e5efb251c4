"""Request bodies are bounded even when the client does not say their length (chunked): the
write service trusted Content-Length alone, so a chunked body of any size went through (D12)."""

from __future__ import annotations

from collections.abc import Iterator

from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from services.common import http

LIMIT = 1024


def app() -> FastAPI:
    a = FastAPI()

    @a.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"read": len(await request.body())}

    a.add_middleware(http.BodyLimit, max_bytes=LIMIT)
    return a


def chunks(total: int, size: int = 256) -> Iterator[bytes]:
    for _ in range(total // size):
        yield b"x" * size


def test_a_chunked_body_over_the_limit_is_413_and_never_reaches_the_route() -> None:
    with TestClient(app()) as c:
        r = c.post("/echo", content=chunks(LIMIT * 8))
        assert r.status_code == 413
        assert r.json()["error"]["code"] == "body_too_large"
        # a chunked body within the limit is read whole
        r = c.post("/echo", content=chunks(LIMIT))
        assert r.status_code == 200 and r.json() == {"read": LIMIT}


def test_a_declared_length_over_the_limit_is_refused_before_reading() -> None:
    with TestClient(app()) as c:
        r = c.post("/echo", content=b"x" * (LIMIT + 1))
        assert r.status_code == 413
        assert c.post("/echo", content=b"x" * LIMIT).json() == {"read": LIMIT}
