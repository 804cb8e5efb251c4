"""The abuse signals a like carries (services/contracts/signals.py) and the like event's evolution
that holds them."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path

import fastavro
import jwt
import pytest

from local import issuer
from local.schema_registry import compat
from services.contracts import events, signals


def test_signals_are_parsed_and_a_malformed_one_is_named() -> None:
    assert signals.parse(None, None, None) == signals.NO_SIGNALS
    assert signals.parse("", "", None) == signals.NO_SIGNALS  # empty headers: no signal
    s = signals.parse(" 2001:DB8::1 ", "dev-1", 1_700_000_000)
    assert s == signals.Signals("2001:db8::1", "dev-1", 1_700_000_000_000)
    for ip, device, created, named in (
        ("10.0.0.256", None, None, signals.CLIENT_IP_HEADER),
        ("1.2.3.4, 5.6.7.8", None, None, signals.CLIENT_IP_HEADER),  # a list is not an IP
        (None, "a b", None, signals.DEVICE_HEADER),
        (None, "x" * 129, None, signals.DEVICE_HEADER),
        (None, None, "2024-01-01", signals.ACCOUNT_CREATED_CLAIM),
        (None, None, True, signals.ACCOUNT_CREATED_CLAIM),
    ):
        with pytest.raises(signals.InvalidSignal) as e:
            signals.parse(ip, device, created)
        assert e.value.signal == named and named in str(e.value)


def _without_signals() -> dict[str, object]:
    schema = json.loads(events.LIKE_EVENT_SCHEMA)
    schema["fields"] = [f for f in schema["fields"] if f["name"] not in events.OPTIONAL_FIELDS]
    return schema


def test_the_signal_fields_are_a_forward_and_backward_compatible_evolution() -> None:
    new = compat.parse_schema(events.LIKE_EVENT_SCHEMA)
    old = compat.parse_schema(json.dumps(_without_signals()))
    assert compat.check(compat.Level.FULL_TRANSITIVE, new, [old]).ok
    # the bytes, both ways: a consumer on the old schema reads new events, ours reads old ones
    e = events.LikeEvent.new(
        intent_uuid="i", user_id="u", post_id="p", action="like", reaction="like", delta=1,
        region="eu", client_ip="192.0.2.1", device="d", account_created=1_700_000_000_000,
    )  # fmt: skip
    new_s = fastavro.parse_schema(json.loads(events.LIKE_EVENT_SCHEMA))
    old_s = fastavro.parse_schema(_without_signals())
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, new_s, e.to_dict())
    assert events.LikeEvent.from_dict(fastavro.schemaless_reader(io.BytesIO(buf.getvalue()),
                                                                 new_s, new_s)) == e  # fmt: skip
    read_old = events.LikeEvent.from_dict(
        fastavro.schemaless_reader(io.BytesIO(buf.getvalue()), new_s, old_s)
    )
    assert read_old.intent_uuid == "i" and read_old.client_ip is None
    old_bytes = io.BytesIO()
    d = e.to_dict()
    for k in events.OPTIONAL_FIELDS:
        del d[k]
    fastavro.schemaless_writer(old_bytes, old_s, d)
    read_new = events.LikeEvent.from_dict(
        fastavro.schemaless_reader(io.BytesIO(old_bytes.getvalue()), old_s, new_s)
    )
    assert (read_new.client_ip, read_new.device, read_new.account_created) == (None, None, None)


def test_the_local_issuer_states_the_accounts_age(tmp_path: Path) -> None:
    def claims(token: str) -> dict[str, object]:
        return dict(jwt.decode(token, options={"verify_signature": False}))

    fresh = int(time.time()) - 60
    got = claims(issuer.sign(tmp_path, "bot-1", 600, "iss", "aud", account_created=fresh))
    assert got[signals.ACCOUNT_CREATED_CLAIM] == fresh
    # by default an old account, the same for a user on every token
    a = claims(issuer.sign(tmp_path, "alice", 600, "iss", "aud"))[signals.ACCOUNT_CREATED_CLAIM]
    b = claims(issuer.sign(tmp_path, "alice", 60, "iss", "aud"))[signals.ACCOUNT_CREATED_CLAIM]
    assert a == b and isinstance(a, int) and a <= 1_735_689_600


def test_a_dead_letter_fix_of_a_signal_field_is_typed_as_the_field() -> None:
    # `likes dlq replay --set`: the optional fields are typed `int | None` etc.; a fix given as
    # text must serialize (an account_created left a string would fail the Avro writer)
    from cli.dlq import _fixed

    e = events.LikeEvent.new(intent_uuid="i", user_id="u", post_id="p", action="like",
                             reaction="like", delta=1, region="eu", device="d")  # fmt: skip
    fixed = _fixed(e, {"account_created": "1700000000000", "abuse_score": "0.5", "device": "null"})
    assert (fixed.account_created, fixed.abuse_score, fixed.device) == (
        1_700_000_000_000,
        0.5,
        None,
    )
    buf = io.BytesIO()
    fastavro.schemaless_writer(buf, fastavro.parse_schema(json.loads(events.LIKE_EVENT_SCHEMA)),
                               fixed.to_dict())  # fmt: skip
    assert buf.getvalue()
