"""The shared HTTP plumbing: RED metrics labelled by route template, errors as JSON."""

from __future__ import annotations

from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY

from services.common import http


def sample(name: str, labels: dict[str, str]) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_red_metrics_use_the_route_template_and_the_real_status() -> None:
    app = FastAPI()

    @app.get("/v1/posts/{post_id}/likes")
    async def likes(post_id: str) -> dict[str, str]:
        if post_id == "boom":
            raise http.ApiError(409, "conflict", "no")
        return {"post_id": post_id}

    http.install(app, "unit-test")
    route = "/v1/posts/{post_id}/likes"
    ok = {"service": "unit-test", "route": route, "status": "200"}
    before = sample("likes_http_requests_total", ok)
    before_409 = sample("likes_http_requests_total", {**ok, "status": "409"})
    before_unmatched = sample(
        "likes_http_requests_total", {**ok, "route": "unmatched", "status": "404"}
    )
    with TestClient(app) as c:
        assert c.get("/v1/posts/a/likes").status_code == 200
        assert c.get("/v1/posts/b/likes").status_code == 200
        r = c.get("/v1/posts/boom/likes")
        assert r.status_code == 409 and r.json()["error"]["code"] == "conflict"
        assert c.get("/nowhere").status_code == 404
    assert sample("likes_http_requests_total", ok) == before + 2
    assert sample("likes_http_requests_total", {**ok, "status": "409"}) == before_409 + 1
    assert (
        sample("likes_http_requests_total", {**ok, "route": "unmatched", "status": "404"})
        == before_unmatched + 1
    )
    count = sample(
        "likes_http_request_duration_seconds_count", {"service": "unit-test", "route": route}
    )
    assert count >= 3
