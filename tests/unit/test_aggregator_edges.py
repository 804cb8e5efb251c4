"""The aggregator's edges that need no server: CDN purge batching, DLQ headers, settings."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from prometheus_client import REGISTRY
from pydantic import SecretStr, ValidationError

from services.aggregator import dlq, purge
from services.aggregator import main as aggregator_main
from services.aggregator.purge import BackgroundPurger, CloudflarePurger, PurgeFailed, surrogate_key
from services.aggregator.settings import AggregatorSettings
from services.contracts import events
from services.contracts import metrics as names


class CloudflareApi:
    """A real HTTP server on loopback answering Cloudflare's purge call (the CDN is not ours):
    records each request, answers with `answers` in turn (then success)."""

    def __init__(self, answers: list[tuple[int, dict[str, Any]]] | None = None) -> None:
        self.calls: list[dict[str, Any]] = []
        self.answers = list(answers or [])
        self.gate: threading.Event | None = None  # when set: each call waits for it to open
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if api.gate is not None:
                    api.gate.wait(30)
                api.calls.append({"path": self.path, "auth": self.headers["Authorization"], **body})
                status, answer = api.answers.pop(0) if api.answers else (200, {"success": True})
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/client/v4"

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def cf() -> Iterator[CloudflareApi]:
    api = CloudflareApi()
    yield api
    api.close()


def test_cloudflare_purge_batches_at_most_100_tags_per_call(cf: CloudflareApi) -> None:
    tags = [surrogate_key(f"p{i}") for i in range(250)]
    CloudflarePurger("zone-1", "tok", cf.url).purge([*tags, tags[0]])
    assert [len(c["tags"]) for c in cf.calls] == [100, 100, 50]
    assert {c["path"] for c in cf.calls} == {"/client/v4/zones/zone-1/purge_cache"}
    assert {c["auth"] for c in cf.calls} == {"Bearer tok"}
    assert sorted(t for c in cf.calls for t in c["tags"]) == sorted(tags)


def test_a_refused_purge_raises(cf: CloudflareApi) -> None:
    cf.answers = [(403, {"success": False, "errors": [{"code": 10000}]})]
    with pytest.raises(PurgeFailed, match="403"):
        CloudflarePurger("zone-1", "tok", cf.url).purge(["post-a"])
    cf.answers = [(200, {"success": False})]  # Cloudflare's "200 but failed" shape
    with pytest.raises(PurgeFailed):
        CloudflarePurger("zone-1", "tok", cf.url).purge(["post-a"])


def test_an_unreachable_cdn_raises() -> None:
    with pytest.raises(PurgeFailed):
        CloudflarePurger("zone-1", "tok", "http://127.0.0.1:9/client/v4").purge(["post-a"])


def _count(name: str) -> float:
    return REGISTRY.get_sample_value(name) or 0.0


UNAVAILABLE = (503, {"success": False, "errors": [{"code": 503}]})
RATE_LIMITED = (429, {"success": False, "errors": [{"code": 971}]})


def test_a_transient_failure_is_retried_then_succeeds(cf: CloudflareApi) -> None:
    retries, purged = _count(names.CDN_PURGE_RETRIES), _count(names.CDN_PURGED)
    cf.answers = [UNAVAILABLE, RATE_LIMITED]  # then success
    CloudflarePurger("zone-1", "tok", cf.url).purge(["post-a", "post-b"])
    assert [c["tags"] for c in cf.calls] == [["post-a", "post-b"]] * 3
    assert _count(names.CDN_PURGE_RETRIES) - retries == 2
    assert _count(names.CDN_PURGED) - purged == 2


def test_retries_are_bounded_and_a_refusal_is_not_retried(cf: CloudflareApi) -> None:
    cf.answers = [UNAVAILABLE] * (purge.ATTEMPTS + 5)
    with pytest.raises(PurgeFailed, match="503"):
        CloudflarePurger("zone-1", "tok", cf.url).purge(["post-a"])
    assert len(cf.calls) == purge.ATTEMPTS
    cf.calls.clear()
    cf.answers = [(403, {"success": False})]
    with pytest.raises(PurgeFailed, match="403"):
        CloudflarePurger("zone-1", "tok", cf.url).purge(["post-a"])
    assert len(cf.calls) == 1, "a bad token does not get better by retrying"


def test_the_background_purger_never_makes_the_caller_wait(cf: CloudflareApi) -> None:
    cf.gate = threading.Event()  # the CDN answers nothing until the gate opens
    purged = _count(names.CDN_PURGED)
    bg = BackgroundPurger(CloudflarePurger("zone-1", "tok", cf.url))
    try:
        bg.purge(["post-a"])
        bg.purge(["post-b", "post-a"])
        # both calls returned while the CDN still holds the first request
        assert cf.calls == [] and not bg.wait_idle(0)
        cf.gate.set()
        assert bg.wait_idle(30)
        assert sorted(t for c in cf.calls for t in c["tags"]) == ["post-a", "post-b"]
        assert _count(names.CDN_PURGED) - purged == 2
    finally:
        cf.gate.set()
        bg.close()


def test_a_purge_given_up_on_is_counted_not_raised(cf: CloudflareApi) -> None:
    failures = _count(names.CDN_PURGE_FAILURES)
    cf.answers = [UNAVAILABLE] * purge.ATTEMPTS  # then success, for the next purge
    bg = BackgroundPurger(CloudflarePurger("zone-1", "tok", cf.url))
    try:
        bg.purge(["post-a"])
        assert bg.wait_idle(30)
        assert _count(names.CDN_PURGE_FAILURES) - failures == 1
        assert len(cf.calls) == purge.ATTEMPTS
        bg.purge(["post-b"])  # the purger keeps working after a failure
        assert bg.wait_idle(30)
        assert cf.calls[-1]["tags"] == ["post-b"]
    finally:
        bg.close()


def test_keys_past_the_pending_bound_are_dropped_and_counted(cf: CloudflareApi) -> None:
    dropped = _count(names.CDN_PURGE_DROPPED)
    bg = BackgroundPurger(CloudflarePurger("zone-1", "tok", cf.url), max_pending=3)
    try:
        bg.purge(["k1", "k2", "k3", "k4", "k5"])  # nothing pending yet: room for 3
        assert _count(names.CDN_PURGE_DROPPED) - dropped == 2
        assert bg.wait_idle(30)
        assert sorted(t for c in cf.calls for t in c["tags"]) == ["k1", "k2", "k3"]
    finally:
        bg.close()


def test_production_purges_through_the_background_purger() -> None:
    s = AggregatorSettings(**CLOUDFLARE)
    p = aggregator_main.make_purger(s, rc=None)
    assert isinstance(p, BackgroundPurger) and isinstance(p.inner, CloudflarePurger)
    p.close()


def test_surrogate_key_per_post() -> None:
    assert surrogate_key("abc") == "post-abc"


def test_dlq_headers_carry_source_error_attempts_and_ids() -> None:
    e = events.LikeEvent.new(
        intent_uuid="i-1", user_id="u", post_id="p", action="like", reaction="like",
        delta=1, region="eu", shard=0,
    )  # fmt: skip
    hs = dict(dlq.headers("likes.committed", 3, 42, "boom", 3, e, [("trace", b"x")]))
    assert hs["trace"] == b"x"
    assert hs["dlq.source.topic"] == b"likes.committed"
    assert hs["dlq.source.partition"] == b"3"
    assert hs["dlq.source.offset"] == b"42"
    assert hs["dlq.error"] == b"boom"
    assert hs["dlq.attempts"] == b"3"
    assert hs["dlq.event_id"] == e.event_id.encode()
    assert hs["dlq.intent_uuid"] == b"i-1"
    assert "dlq.event_id" not in dict(dlq.headers("t", 0, 0, "undecodable", 3, None))


PROD_ENDPOINTS: dict[str, Any] = {
    "count_cache_nodes": "count-cache:6379",
    "hot_pools": "hot-pool-0-0.hot-pool-0:6379",
    "idem_store_nodes": "idem-store:6379",
    "cassandra_hosts": "scylla",
    "kafka_bootstrap": "kafka:9092",
    "schema_registry_url": "http://registry:8081",
    "etcd_host": "etcd",
    "jwks_url": "https://idp.test/jwks.json",
    "jwt_issuer": "https://idp.test/",
    "redis_password": "pw",
    "cassandra_user": "likes",
    "cassandra_password": "pw",
    "etcd_user": "likes",
    "etcd_password": "pw",
    "kafka_user": "likes",
    "kafka_password": "pw",
    "schema_registry_user": "likes",
    "schema_registry_password": "pw",
    "tls_ca_file": "/etc/likes/tls/ca.crt",
}
CLOUDFLARE: dict[str, Any] = {
    "cdn_purger": "cloudflare",
    "cloudflare_zone_id": "zone",
    "cloudflare_api_token": SecretStr("token"),
}


def test_settings_refuse_test_hooks_and_recording_purger_outside_local(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for k in [k for k in os.environ if k.startswith("LIKES_")]:
        monkeypatch.delenv(k)
    assert set(PROD_ENDPOINTS) == set(AggregatorSettings.ENDPOINTS)
    prod = {"env": "prod", **PROD_ENDPOINTS}
    # a complete prod configuration is accepted: each refusal below is the knob's own
    assert AggregatorSettings(**prod, **CLOUDFLARE).cdn_purger == "cloudflare"
    with pytest.raises(ValidationError, match="LIKES_AGG_TEST_CRASH"):
        AggregatorSettings(**prod, **CLOUDFLARE, agg_test_crash="after-cells")
    with pytest.raises(ValidationError, match="LIKES_CDN_PURGER=cloudflare"):
        AggregatorSettings(**prod, cdn_purger="recording")
    with pytest.raises(ValidationError, match="LIKES_CDN_PURGER=cloudflare"):
        AggregatorSettings(**{**prod, "env": "staging"}, cdn_purger="none")
    with pytest.raises(ValidationError, match="LIKES_CLOUDFLARE_ZONE_ID"):
        AggregatorSettings(cdn_purger="cloudflare")  # no zone/token
    s = AggregatorSettings(agg_topic_prefix="b1.")
    assert s.source_topics == ["b1.likes.committed", "b1.likes.voided", "b1.likes.unvoided"]
    assert s.dead_letter_topic == "b1.likes.dead-letter"


def test_a_read_overlapping_the_cells_write_is_patched_to_what_the_write_wrote() -> None:
    """The aggregates' read runs while the window's cells are written (worker._flush_window):
    each written cell must show the written state, unless the read saw one further along the
    log; every other cell, and every post the window did not write, stays as read."""
    from services.aggregator.core import CellKey, CellRow, CellState
    from services.aggregator.worker import _patched

    read = {
        "a": [CellRow("us", 0, 5, 10, {"like": 5}), CellRow("eu", 0, 7, 3, {"like": 7})],
        "b": [CellRow("us", 0, 9, 50, {"like": 9})],  # a later owner wrote past this window
        "c": [CellRow("us", 0, 1, 1, {})],
    }
    plans = {
        "a": [(CellKey("a", "us", 0), CellState(5, 10, {}), CellState(8, 20, {"like": 8}))],
        "b": [(CellKey("b", "us", 0), CellState(4, 30, {}), CellState(6, 40, {"like": 6}))],
        "d": [(CellKey("d", "us", 1), CellState.empty(), CellState(2, 0, {"like": 2}))],
    }
    got = _patched(read, plans, ["a", "b", "c", "d"])
    assert sorted((r.region, r.value, r.applied) for r in got["a"]) == [("eu", 7, 3), ("us", 8, 20)]
    assert [(r.value, r.applied) for r in got["b"]] == [(9, 50)]
    assert [(r.value, r.applied) for r in got["c"]] == [(1, 1)]
    assert [(r.shard, r.value, r.applied, dict(r.reactions)) for r in got["d"]] == [
        (1, 2, 0, {"like": 2})
    ]
