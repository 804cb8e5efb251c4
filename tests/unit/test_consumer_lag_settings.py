"""The consumer-lag exporter's watch list: which groups, and which topics each reads."""

from __future__ import annotations

import pytest

from services.abuse.settings import ScorerSettings
from services.consumer_lag.settings import LagSettings, parse_group_topics
from services.contracts import events
from services.contracts import kafka as kafka_contract


def test_by_default_the_aggregator_and_the_abuse_scorer_are_watched_on_what_they_read() -> None:
    s = LagSettings()
    assert s.groups == [kafka_contract.AGGREGATOR_GROUP, kafka_contract.ABUSE_GROUP]
    assert s.topics == list(events.EVENT_TOPICS)
    scorer = ScorerSettings()
    assert s.topics_of == {scorer.abuse_group_id: [scorer.source_topic]}


def test_group_topics_parse_and_a_bad_item_is_named() -> None:
    assert parse_group_topics("a=t1+t2, b=t3,") == {"a": ["t1", "t2"], "b": ["t3"]}
    assert parse_group_topics("") == {}
    for bad in ("a", "a=", "=t1"):
        with pytest.raises(ValueError, match=repr(bad)):
            parse_group_topics(bad)
