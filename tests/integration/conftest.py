"""Fixtures shared by the integration modules (the stack itself comes from tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cassandra.cluster import Session
from fastapi.testclient import TestClient

from services.contracts import clients
from services.write.main import create_app
from tests.conftest import Stack


@pytest.fixture(scope="module")
def app_client(stack: Stack) -> Iterator[TestClient]:
    """The write service in-process, configured for the test stack."""
    with TestClient(create_app(stack.settings())) as c:
        yield c


@pytest.fixture(scope="module")
def cql(stack: Stack) -> Iterator[Session]:
    """The services' own Cassandra client: reconnects within seconds after a restart."""
    cluster, session = clients.cassandra(stack.settings())
    yield session
    cluster.shutdown()
