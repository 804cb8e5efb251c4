"""The read API's response shaping, without servers."""

from __future__ import annotations

from services.read.api import LikesView
from services.read.core import CountView


def test_the_body_shows_the_top_three_reactions_and_never_a_negative_count() -> None:
    v = CountView(
        "p", -2, {"like": 5, "wow": 9, "sad": 0, "love": 5, "haha": 1}, 7, False, "aggregate"
    )
    body = LikesView.of(v).model_dump(exclude_unset=True)
    assert body == {
        "post_id": "p",
        "count": 0,
        "top_reactions": [
            {"reaction": "wow", "count": 9},
            {"reaction": "like", "count": 5},
            {"reaction": "love", "count": 5},
        ],
        "last_fresh": 7,
        "stale": False,
    }


def test_has_liked_is_serialized_only_once_set() -> None:
    body = LikesView.of(CountView("p", None, {}, None, True, "none"))
    assert "has_liked" not in body.model_dump(exclude_unset=True)
    body.has_liked = None  # authenticated, unconfirmable
    assert body.model_dump(exclude_unset=True)["has_liked"] is None
