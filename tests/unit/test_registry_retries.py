"""How often the services' registry clients try a registry that refuses them (game day
registry-503-on-publish: the write path's client retried with up to ~7 s of backoff, so the
writes' clients timed out instead of getting a 503 with Retry-After). The real
SchemaRegistryClient against a loopback listener that accepts each connection and closes it at
once (a registry going down), counting the connections."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient

from services.contracts import clients, registry
from services.contracts.settings import Settings
from tests import loopback


@pytest.fixture
def closing_registry() -> Iterator[tuple[str, list[int]]]:
    with loopback.listener(loopback.reset) as (address, accepted):
        yield f"http://{address}", accepted


def test_the_write_paths_registry_client_asks_once(
    closing_registry: tuple[str, list[int]],
) -> None:
    url, accepted = closing_registry
    settings = Settings(schema_registry_url=url)
    client = clients.schema_registry(settings, retries=clients.FAIL_FAST_REGISTRY_RETRIES)
    with pytest.raises(Exception):  # noqa: B017 (the transport's own error, whichever it is)
        client.get_schema(1)
    assert accepted[0] == 1


def test_the_consumers_client_keeps_the_default_retries(
    closing_registry: tuple[str, list[int]],
) -> None:
    """The aggregator and the scorer can wait: one retry shows the default is kept (its
    backoff is jittered, so the test stops the client after the second attempt)."""
    url, accepted = closing_registry
    conf = registry.client_config(url, None, retries=1)
    conf.update({"retries.wait.ms": 10, "retries.max.wait.ms": 20})
    with pytest.raises(Exception):  # noqa: B017
        SchemaRegistryClient(conf).get_schema(1)
    assert accepted[0] == 2
    assert "max.retries" not in registry.from_settings(Settings(schema_registry_url=url))
