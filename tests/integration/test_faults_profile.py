"""The --faults profile on the test stack (which runs it): clients reach every Redis Cluster node
and broker through the proxy that node announces, and the Cassandra node through its own, so a
toxic on a node's proxy reaches exactly what the services use. Proxies in front of bootstrap
addresses only would carry nothing after the first request: these tests fail then."""

from __future__ import annotations

import uuid

import httpx
import pytest
import redis
from confluent_kafka.admin import AdminClient

from local.components import redis as local_redis
from local.components import toxiproxy
from services.contracts import clients, keys
from tests.conftest import Stack

pytestmark = pytest.mark.stack


def _port(address: str) -> int:
    return int(address.rsplit(":", 1)[1])


def test_clients_learn_the_proxies_from_the_nodes(stack: Stack) -> None:
    lay = stack.layout
    assert lay.faults, "the test stack runs the faults profile (tests/conftest.py)"
    ports = lay.ports
    settings = stack.settings()
    for make, proxies, own in (
        (clients.count_cache, ports.count_cache_proxies, ports.count_cache),
        (clients.idem_store, ports.idem_store_proxies, ports.idem_store),
    ):
        rc = make(settings, timeout=2.0)
        try:
            # seeded with the nodes' own ports (the rendered env), told the proxies by the cluster
            assert {n.port for n in rc.get_nodes()} == set(proxies), rc.get_nodes()
            assert not {n.port for n in rc.get_nodes()} & set(own)
        finally:
            rc.close()
    md = AdminClient(stack.kafka_config()).list_topics(timeout=10)
    assert {b.port for b in md.brokers.values()} == set(ports.kafka_broker_proxies)
    # one Cassandra node: the services' contact point is its proxy
    assert int(settings.cassandra_port) == ports.cassandra_native_proxy


def test_a_toxic_on_a_nodes_proxy_cuts_what_the_clients_use(stack: Stack) -> None:
    """A timeout toxic (nothing answers) on the proxy of the count-cache primary owning a key:
    a read of that key times out, a key on another primary still answers; after Toxiproxy's
    reset both answer again."""
    lay = stack.layout
    rc = clients.count_cache(stack.settings(), timeout=1.0)
    by_port = {listen: name for name, (listen, _own) in lay.proxies().items()}
    try:
        key = keys.count_key(f"faults-{uuid.uuid4()}")
        rc.set(key, 7)
        owner = rc.get_node_from_key(key)
        other = next(
            k for k in (keys.count_key(f"faults-{uuid.uuid4()}") for _ in range(100))
            if rc.get_node_from_key(k).port != owner.port
        )  # fmt: skip
        rc.set(other, 8)
        victim = by_port[owner.port]
        r = httpx.post(
            f"{toxiproxy.api_url(lay)}/proxies/{victim}/toxics",
            json={"name": "test-cut", "type": "timeout", "stream": "downstream",
                  "attributes": {"timeout": 0}},
            timeout=5,
        )  # fmt: skip
        r.raise_for_status()
        try:
            assert toxiproxy.toxics(lay)[victim], "the toxic is on the victim's proxy"
            # straight to the owner's announced address, as the cluster client goes
            node = local_redis.client(lay, owner.port, socket_timeout=1.0)
            with node, pytest.raises(redis.TimeoutError):
                node.get(key)
            assert int(rc.get(other)) == 8  # the other primary's proxy is untouched
        finally:
            toxiproxy.reset(lay)
        assert not any(toxiproxy.toxics(lay).values())
        fresh = clients.count_cache(stack.settings(), timeout=2.0)
        try:
            assert int(fresh.get(key)) == 7 and int(fresh.get(other)) == 8
        finally:
            fresh.close()
    finally:
        rc.close()
