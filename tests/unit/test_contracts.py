"""Pure tests of the shared contracts: settings, auth, key names, the event schema."""

from __future__ import annotations

import json
import time

import fastavro
import jwt
import pytest
from pydantic import ValidationError
from redis.cluster import key_slot

from services.contracts import auth, events, keys
from services.contracts.settings import LOCAL_JWT_SECRET, Settings


def test_default_secret_is_refused_outside_local(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LIKES_JWT_SECRET", raising=False)
    with pytest.raises(ValidationError, match="LIKES_JWT_SECRET"):
        Settings(env="prod")
    assert Settings(env="prod", jwt_secret="s3cret-from-a-vault").env == "prod"
    assert Settings(env="staging", jwks_url="https://idp.example/jwks").jwks_url
    assert Settings(env="local").jwt_secret.get_secret_value() == LOCAL_JWT_SECRET


def test_token_round_trip_and_rejections() -> None:
    s = Settings()
    token = auth.issue_token(s, "alice")
    assert auth.verify(s, f"Bearer {token}") == "alice"
    for header, code in [
        (None, "missing_token"),
        ("Basic abc", "malformed_token"),
        ("Bearer ", "malformed_token"),
        ("Bearer not-a-jwt", "invalid_token"),
    ]:
        with pytest.raises(auth.AuthError) as e:
            auth.verify(s, header)
        assert e.value.code == code
    forged = jwt.encode(
        {"sub": "alice", "iss": s.jwt_issuer, "aud": s.jwt_audience, "exp": time.time() + 60},
        "another-key",
        algorithm="HS256",
    )
    with pytest.raises(auth.AuthError) as e:
        auth.verify(s, f"Bearer {forged}")
    assert e.value.code == "invalid_token"
    expired = auth.issue_token(s, "alice", ttl_s=-10)
    with pytest.raises(auth.AuthError) as e:
        auth.verify(s, f"Bearer {expired}")
    assert e.value.code == "expired_token"


def test_keys_of_one_post_share_a_cluster_slot() -> None:
    post = "p-42"
    slots = {key_slot(k.encode()) for k in [keys.count_key(post), *keys.sub_keys(post)]}
    assert len(slots) == 1
    assert key_slot(keys.bloom_key("u1").encode()) == key_slot(
        keys.bloom_scratch_key("u1").encode()
    )
    assert keys.idem_key("u", "p", "i") == "idem:u:p:i"
    assert keys.kafka_key("p", 0) == "p" and keys.kafka_key("p", 3) == "p:3"


def test_event_schema_round_trips_an_event() -> None:
    schema = fastavro.parse_schema(json.loads(events.LIKE_EVENT_SCHEMA))
    ev = events.LikeEvent.new(
        intent_uuid="7d9f3f8e-2f8e-4a55-9a53-3a3a7b0b3c11", user_id="u", post_id="p",
        action="like", reaction="like", delta=1, region="local",
    )  # fmt: skip
    import io

    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, schema, ev.to_dict())
    buf.seek(0)
    back = events.LikeEvent.from_dict(fastavro.schemaless_reader(buf, schema, schema))
    assert back == ev
