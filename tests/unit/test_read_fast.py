"""The read front's pieces that need no server: the verified-token memory and the aggregate's
HMGET parsing. (The front itself is compared with the FastAPI routes on the real stores in
tests/integration/test_read_fast.py.)"""

from __future__ import annotations

import base64
import json

from services.read.core import Aggregate
from services.read.fast import VerifiedTokens
from services.read.stores import AGGREGATE_FIELDS, parse_aggregate


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def header(claims: object) -> bytes:
    """`Bearer <jwt>` with these claims (the signature is not looked at: only verified tokens
    are ever put)."""

    def seg(obj: object) -> bytes:
        return base64.urlsafe_b64encode(json.dumps(obj).encode()).rstrip(b"=")

    return b"Bearer " + seg({"alg": "RS256"}) + b"." + seg(claims) + b".sig"


def test_a_verified_token_is_remembered_until_its_exp_and_not_a_second_longer() -> None:
    clock = Clock(1000.0)
    tokens = VerifiedTokens(clock=clock)
    h = header({"sub": "u1", "exp": 1010})
    assert tokens.get(h) is None
    tokens.put(h, "u1")
    assert tokens.get(h) == "u1"
    clock.t = 1009.999
    assert tokens.get(h) == "u1"
    clock.t = 1010.0  # PyJWT refuses a token at exp (no leeway): so does the memory
    assert tokens.get(h) is None
    clock.t = 1000.0
    assert tokens.get(h) is None  # forgotten, not just hidden


def test_a_token_without_a_readable_exp_is_not_remembered() -> None:
    tokens = VerifiedTokens(clock=Clock(0.0))
    for h in (
        header({"sub": "u1"}),
        header({"sub": "u1", "exp": "soon"}),
        header({"sub": "u1", "exp": True}),
        header(["not", "an", "object"]),
        b"Bearer not-a-jwt",
        b"Bearer a.%%%.c",
    ):
        tokens.put(h, "u1")
        assert tokens.get(h) is None, h


def test_the_memory_is_bounded_oldest_first() -> None:
    tokens = VerifiedTokens(capacity=2, clock=Clock(0.0))
    a, b, c = (header({"sub": s, "exp": 100}) for s in "abc")
    tokens.put(a, "a")
    tokens.put(b, "b")
    tokens.put(c, "c")
    assert (tokens.get(a), tokens.get(b), tokens.get(c)) == (None, "b", "c")


def test_hmget_fields_parse_as_the_aggregate() -> None:
    assert AGGREGATE_FIELDS == ("count", "reactions", "last_fresh")
    raw = [b"42", b'{"like": 40, "wow": 2}', b"123"]
    assert parse_aggregate(raw) == Aggregate(42, {"like": 40, "wow": 2}, 123)
    assert parse_aggregate([None, None, None]) is None  # no such hash: a miss
    assert parse_aggregate([b"x", b"{}", b"1"]) is None  # no usable count: a miss
    # a broken breakdown keeps the count; bytes that are not UTF-8 too
    assert parse_aggregate([b"7", b"{not json", None]) == Aggregate(7, {}, None)
    assert parse_aggregate([b"7", b"\xff\xfe{", b"5"]) == Aggregate(7, {}, 5)
