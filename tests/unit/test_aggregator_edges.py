"""The aggregator's edges that need no server: CDN purge batching, DLQ headers, settings."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from services.aggregator import dlq
from services.aggregator.purge import CloudflarePurger, surrogate_key
from services.aggregator.settings import AggregatorSettings
from services.contracts import events


class FakeCloudflare:
    """Stands in for the `cloudflare` SDK client (not a store): records purge calls."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.cache = self

    def purge(self, **kw: Any) -> None:
        self.calls.append(kw)


def test_cloudflare_purge_batches_at_most_100_tags_per_call() -> None:
    sdk = FakeCloudflare()
    tags = [surrogate_key(f"p{i}") for i in range(250)]
    CloudflarePurger("zone-1", client=sdk).purge([*tags, tags[0]])
    assert [len(c["tags"]) for c in sdk.calls] == [100, 100, 50]
    assert {c["zone_id"] for c in sdk.calls} == {"zone-1"}
    assert sorted(t for c in sdk.calls for t in c["tags"]) == sorted(tags)


def test_cloudflare_sdk_is_not_imported_until_used() -> None:
    CloudflarePurger("zone-1", "token")  # constructing it needs no SDK


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


def test_settings_refuse_test_hooks_and_recording_purger_outside_local() -> None:
    with pytest.raises(ValidationError):
        AggregatorSettings(env="prod", jwt_secret=SecretStr("s"), agg_test_crash="after-cells")
    with pytest.raises(ValidationError):
        AggregatorSettings(env="prod", jwt_secret=SecretStr("s"), cdn_purger="recording")
    with pytest.raises(ValidationError):
        AggregatorSettings(cdn_purger="cloudflare")  # no zone/token
    s = AggregatorSettings(agg_topic_prefix="b1.")
    assert s.source_topics == ["b1.likes.committed", "b1.likes.voided", "b1.likes.unvoided"]
    assert s.dead_letter_topic == "b1.likes.dead-letter"
