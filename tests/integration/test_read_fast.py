"""The read service's plain ASGI front (services/read/fast.py) answers exactly as the FastAPI
routes do: the same status, headers (in order) and body, for every request in a table of
well-formed, malformed and odd ones, against the real count-cache, counter-store and edge-store.

Two apps on the same stores: one with the front, one without (`create_app(fast_path=False)`),
the same heat hints and a fixed clock (so a fall-through tier's `last_fresh` is the same in
both). Each case also checks who answered: the front for a well-formed read, the routes for
anything else (a front that never served would pass the equality trivially).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import jwt
import pytest
from cassandra.cluster import Session
from cryptography.hazmat.primitives.asymmetric import rsa
from fastapi.testclient import TestClient
from prometheus_client import REGISTRY
from redis.cluster import RedisCluster

from services.contracts import bloom, clients, keys
from services.read.heat import StaticHeat
from services.read.main import create_app
from tests.conftest import Stack

pytestmark = pytest.mark.stack

NOW = 1_767_000_000.0  # the apps' clock: a fall-through tier stamps last_fresh with it
RUN = uuid.uuid4().hex[:8]
HOT = f"fast-hot-{RUN}"


def pid(name: str) -> str:
    return f"fast-{name}-{RUN}"


def served() -> tuple[float, float]:
    def get(outcome: str) -> float:
        return REGISTRY.get_sample_value("likes_read_fast_path_total", {"outcome": outcome}) or 0

    return get("served"), get("passed")


@pytest.fixture(scope="module")
def rc(stack: Stack) -> Iterator[RedisCluster]:
    c = clients.count_cache(stack.settings(), timeout=5)  # the services' own client
    yield c
    c.close()


@pytest.fixture(scope="module")
def cql(stack: Stack) -> Iterator[Session]:
    cluster, session = clients.cassandra(stack.settings())
    yield session
    cluster.shutdown()


@pytest.fixture(scope="module")
def user() -> str:
    return f"fast-user-{RUN}"


@pytest.fixture(scope="module")
def seeded(rc: RedisCluster, cql: Session, user: str) -> dict[str, str]:
    """Posts in every tier, and a user who liked two of them (filter and edges)."""
    fresh = int(time.time() * 1000) - 777

    def aggregate(post: str, count: int, reactions: str) -> None:
        mapping = {"count": count, "gen": 3, "reactions": reactions, "last_fresh": fresh}
        rc.hset(keys.count_key(post), mapping=mapping)
        rc.expire(keys.count_key(post), 3600)

    aggregate(pid("agg"), 42, json.dumps({"like": 30, "love": 10, "wow": 1, "sad": 1}))
    aggregate(HOT, 9, json.dumps({"like": 9}))
    aggregate(pid("negative"), -2, json.dumps({"like": -2}))
    # reaction names a writer would refuse, to hold the two JSON encoders to the same bytes
    aggregate(pid("odd"), 5, json.dumps({"é\u00e9": 2, 'q"\\': 2, "\u0001\u007f\u2028": 1}))
    aggregate(pid("garbled"), 7, "{not json")
    aggregate(pid("liked"), 3, json.dumps({"like": 3}))
    rc.set(keys.sub_key(pid("subs"), 2), 4, ex=3600)
    rc.set(keys.sub_key(pid("subs"), 5), 6, ex=3600)
    cql.execute(
        "INSERT INTO counter_cells (post_id, region, shard, value, applied_window, reactions, "
        "updated_at) VALUES (%s, 'local', 0, 11, 1, %s, %s)",
        (pid("cells"), {"like": 8, "haha": 3}, datetime.now(UTC)),
    )
    for post in (pid("liked"), pid("cells")):
        cql.execute(
            "INSERT INTO edges (user_id, kind, ref, state, reaction, void, updated_at) "
            "VALUES (%s, 'edge', %s, 'liked', 'like', false, %s)",
            (user, post, datetime.now(UTC)),
        )
    rc.set(keys.bloom_key(user), bloom.build([pid("liked"), pid("cells")]), ex=3600)
    return {
        name: pid(name)
        for name in ("agg", "negative", "odd", "garbled", "liked", "subs", "cells", "none")
    }


def _client(stack: Stack, fast: bool) -> TestClient:
    app = create_app(
        stack.settings(),
        heat=StaticHeat({HOT: "hot"}),
        reader_options={"clock": lambda: NOW},
        fast_path=fast,
    )
    return TestClient(app, raise_server_exceptions=False)


@pytest.fixture(scope="module")
def pair(stack: Stack, seeded: dict[str, str]) -> Iterator[tuple[TestClient, TestClient]]:
    with _client(stack, True) as fast, _client(stack, False) as routes:
        for c in (fast, routes):  # the Cassandra session opens in the background
            deadline = time.monotonic() + 30
            while c.app.state.store.session is None:  # type: ignore[attr-defined]
                assert time.monotonic() < deadline, "no Cassandra session"
                time.sleep(0.1)
        yield fast, routes


Request = dict[str, Any]


def same(pair: tuple[TestClient, TestClient], req: Request, expect_fast: bool | None) -> Any:
    """Send `req` to both apps; assert identical answers and who answered (None: the front took
    the request and raised, so main.NeverFail answered); the fast app's answer."""
    fast, routes = pair
    before = served()
    a = fast.request(**req, follow_redirects=False)
    after = served()
    b = routes.request(**req, follow_redirects=False)
    assert (a.status_code, a.headers.raw, a.content) == (b.status_code, b.headers.raw, b.content)
    if expect_fast is None:
        assert after == before, f"the front answered or passed on {req}"
    elif expect_fast:
        assert after == (before[0] + 1, before[1]), f"the front did not answer {req}"
    else:
        assert after == (before[0], before[1] + 1), f"the front answered {req}"
    return a


def get(post: str, headers: Any = None, **kw: Any) -> Request:
    return {"method": "GET", "url": f"/v1/posts/{post}/likes", "headers": headers, **kw}


def batch(body: Any, headers: Any = None, raw: bytes | None = None) -> Request:
    content = raw if raw is not None else json.dumps(body).encode()
    h = [("content-type", "application/json")] if headers is None else headers
    return {"method": "POST", "url": "/v1/posts/likes:batch", "headers": h, "content": content}


def bearer(stack: Stack, user: str, ttl_s: int = 3600) -> list[tuple[str, str]]:
    return [("authorization", f"Bearer {stack.token(user, ttl_s)}")]


# -- well-formed: the front answers ----------------------------------------------------------


def test_anonymous_gets_in_every_tier(
    pair: tuple[TestClient, TestClient], seeded: dict[str, str]
) -> None:
    tiers = {}
    for name, post in [*seeded.items(), ("hot", HOT)]:
        r = same(pair, get(post), expect_fast=True)
        assert r.status_code == 200
        tiers[name] = r.headers["x-read-tier"]
    assert tiers["agg"] == "aggregate" and tiers["subs"] == "subcounters"
    assert tiers["cells"] == tiers["none"] == "counter_store"
    r = same(pair, get(HOT), expect_fast=True)
    assert r.headers["cache-control"] == "public, max-age=5"
    assert r.json()["count"] == 9 and "has_liked" not in r.json()


def test_authenticated_gets_with_has_liked(
    stack: Stack, pair: tuple[TestClient, TestClient], seeded: dict[str, str], user: str
) -> None:
    headers = bearer(stack, user)
    liked = {}
    for name, post in seeded.items():
        r = same(pair, get(post, headers), expect_fast=True)
        liked[name] = r.json()["has_liked"]
        assert r.headers["cache-control"] == "private, no-store"
    assert liked["liked"] is True and liked["cells"] is True and liked["agg"] is False
    # the scheme is case-insensitive, and the token is verified once then remembered: the
    # second answer (from the front's cache of verified tokens) is still the same
    token = headers[0][1].split(" ", 1)[1]
    for _ in range(2):
        same(pair, get(seeded["liked"], [("authorization", f"bearer {token}")]), True)


def test_batches_of_1_and_50(
    stack: Stack, pair: tuple[TestClient, TestClient], seeded: dict[str, str], user: str
) -> None:
    posts = list(seeded.values())
    page = [posts[i % len(posts)] for i in range(50)]  # repeats: read once, answered in order
    for body in ({"post_ids": [seeded["agg"]]}, {"post_ids": page}):
        r = same(pair, batch(body), expect_fast=True)
        assert len(r.json()["items"]) == len(body["post_ids"])
        r = same(pair, batch(body, [("content-type", "application/json"), *bearer(stack, user)]),
                 expect_fast=True)  # fmt: skip
        assert all("has_liked" in it for it in r.json()["items"])


def test_headers_the_routes_ignore_do_not_matter(
    pair: tuple[TestClient, TestClient], seeded: dict[str, str]
) -> None:
    # the routes support no conditional requests, no encodings: these change nothing
    odd = [
        ("if-none-match", '"abc"'),
        ("if-modified-since", "Wed, 21 Oct 2015 07:28:00 GMT"),
        ("accept", "text/html"),
        ("accept-encoding", "gzip, br"),
        ("x-forwarded-for", "10.0.0.1"),
        ("cf-connecting-ip", "10.0.0.2"),
        ("cookie", "a=b"),
    ]
    same(pair, get(seeded["agg"], odd), expect_fast=True)
    same(pair, get(seeded["agg"], params={"cache-buster": "1"}), expect_fast=True)
    same(pair, batch({"post_ids": [seeded["agg"]]}, [("content-type", "application/json"), *odd]),
         expect_fast=True)  # fmt: skip


def test_a_failing_reader_degrades_the_same(
    stack: Stack, pair: tuple[TestClient, TestClient], seeded: dict[str, str], user: str
) -> None:
    async def broken(*_a: Any, **_k: Any) -> Any:
        raise RuntimeError("a bug")

    saved = []
    for c in pair:
        reader = c.app.state.reader  # type: ignore[attr-defined]
        saved.append((reader, reader.__dict__.copy()))
        reader.counts = broken
        reader.has_liked = broken
    try:
        r = same(pair, get(seeded["agg"]), expect_fast=True)
        assert r.status_code == 200 and r.json()["stale"] is True  # the last good value
        same(pair, get(seeded["agg"], bearer(stack, user)), expect_fast=True)
        same(pair, batch({"post_ids": [seeded["agg"], seeded["none"]]}), expect_fast=True)
        for reader, _ in saved:
            reader.degraded = lambda *_a: 1 / 0  # the degraded answer breaks too: NeverFail
        r = same(pair, get(seeded["agg"]), expect_fast=None)
        assert r.status_code == 200 and r.json()["count"] is None
    finally:
        for reader, attrs in saved:
            reader.__dict__.clear()
            reader.__dict__.update(attrs)


# -- anything else: the routes answer ---------------------------------------------------------


def test_malformed_ids_and_bodies_are_the_routes_422(
    pair: tuple[TestClient, TestClient], seeded: dict[str, str]
) -> None:
    for bad in ("a:b", "has{brace}", "x" * 129, "new%0Aline", "sp%20ace", "dot%2Fslash"):
        r = same(pair, get(bad), expect_fast=False)
        assert r.status_code in (404, 422), bad
    ok = seeded["agg"]
    bodies: list[Any] = [
        {"post_ids": [ok] * 51},
        {"post_ids": []},
        {"post_ids": [ok, "has{brace}"]},
        {"post_ids": [ok, "new\nline"]},
        {"post_ids": [ok, 7]},
        {"post_ids": ok},
        {"ids": [ok]},
        {"post_ids": [ok], "extra": 1},
        [ok],
        None,
    ]
    for body in bodies:
        r = same(pair, batch(body), expect_fast=False)
        assert r.status_code == 422, body
    # (nested 10 000 deep: a RecursionError in json.loads, under the 16 KiB body limit)
    for raw in (b"{not json", b"", b"[" * 10_000, '{"post_ids": ["\u00e9"]}'.encode()):
        r = same(pair, batch(None, raw=raw), expect_fast=False)
        assert r.status_code in (400, 413, 422), raw[:20]


def test_content_types_the_front_does_not_take(
    pair: tuple[TestClient, TestClient], seeded: dict[str, str]
) -> None:
    body = {"post_ids": [seeded["agg"]]}
    for headers in (
        [],  # no content-type: FastAPI's strict content type refuses it
        [("content-type", "text/plain")],
        [("content-type", "application/json; charset=utf-8")],  # fine, but the routes' call
        [("content-type", "application/json"), ("content-type", "application/json")],
    ):
        same(pair, batch(body, headers), expect_fast=False)


def test_refused_tokens_are_the_routes_401(
    stack: Stack, pair: tuple[TestClient, TestClient], seeded: dict[str, str], user: str
) -> None:
    settings = stack.settings()
    other_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    claims = {"sub": user, "iss": settings.jwt_issuer, "aud": settings.jwt_audience,
              "exp": int(time.time()) + 600}  # fmt: skip
    forged = jwt.encode(claims, other_key, algorithm="RS256", headers={"kid": "rogue"})
    refused = [
        "",
        "Bearer",
        "Bearer not-a-jwt",
        "Basic dTpw",
        f"Bearer {forged}",
        f"Bearer {stack.token(user, ttl_s=-5)}",  # expired
        f"Bearer {stack.token('has{brace}')}",  # a subject that cannot become a key
    ]
    for value in refused:
        r = same(pair, get(seeded["agg"], [("authorization", value)]), expect_fast=False)
        assert r.status_code == 401, value
        headers = [("content-type", "application/json"), ("authorization", value)]
        r = same(pair, batch({"post_ids": [seeded["agg"]]}, headers), expect_fast=False)
        assert r.status_code == 401
    # two Authorization headers: which one counts is the routes' call
    twice = [*bearer(stack, user), ("authorization", "Bearer not-a-jwt")]
    same(pair, get(seeded["agg"], twice), expect_fast=False)


def test_a_remembered_token_still_expires(
    stack: Stack, pair: tuple[TestClient, TestClient], seeded: dict[str, str], user: str
) -> None:
    headers = bearer(stack, user, ttl_s=2)
    r = same(pair, get(seeded["agg"], headers), expect_fast=True)  # verified, remembered
    assert r.status_code == 200
    time.sleep(3)
    r = same(pair, get(seeded["agg"], headers), expect_fast=False)
    assert r.status_code == 401 and r.json()["error"]["code"] == "expired_token"


def test_other_methods_and_paths_are_the_routes(
    pair: tuple[TestClient, TestClient], seeded: dict[str, str]
) -> None:
    ok = seeded["agg"]
    for method in ("HEAD", "PUT", "DELETE", "OPTIONS", "PATCH"):
        same(pair, {"method": method, "url": f"/v1/posts/{ok}/likes"}, expect_fast=False)
        same(pair, {"method": method, "url": "/v1/posts/likes:batch"}, expect_fast=False)
    same(pair, {"method": "POST", "url": f"/v1/posts/{ok}/likes", "json": {}}, False)
    same(pair, {"method": "GET", "url": "/v1/posts/likes:batch"}, expect_fast=False)
    for path in (f"/v1/posts/{ok}/likes/", "/v1/posts//likes", "/v1/posts/likes", "/v1/nope"):
        same(pair, {"method": "GET", "url": path}, expect_fast=False)


def test_the_red_metrics_label_the_front_answers_with_the_route(
    pair: tuple[TestClient, TestClient], seeded: dict[str, str]
) -> None:
    labels = {"service": "read", "route": "/v1/posts/{post_id}/likes", "status": "200"}

    def count() -> float:
        return REGISTRY.get_sample_value("likes_http_requests_total", labels) or 0.0

    before = count()
    same(pair, get(seeded["agg"]), expect_fast=True)
    assert count() == before + 2  # one from each app: the front's answer has the route label
