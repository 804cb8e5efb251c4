"""Killing one count-cache primary: its replica takes over and writes to its slots succeed again."""

from __future__ import annotations

import time
import uuid

import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster

from local.components.redis import CLUSTER_NODE_TIMEOUT_MS
from tests.conftest import Stack

pytestmark = [pytest.mark.stack, pytest.mark.disruptive]

# the replica is promoted after the node timeout plus an election: allow generous slack on a
# loaded 2-core machine; this is a bound on a correctness property, not a timing assertion
FAILOVER_BOUND_S = CLUSTER_NODE_TIMEOUT_MS / 1000 * 10


def test_killing_a_primary_fails_over_to_its_replica(stack: Stack) -> None:
    nodes = [ClusterNode(h, p) for h, p in stack.count_cache_nodes]
    rc = RedisCluster(startup_nodes=nodes, password=stack.redis_password, decode_responses=True)
    key = f"count:{uuid.uuid4()}"
    rc.set(key, 1)
    victim = rc.get_node_from_key(key)
    victim_port = int(victim.port)
    victim_name = f"count-cache-{stack.layout.ports.count_cache.index(victim_port) + 1}"
    rc.close()

    stack.cli("local", "stop", "--kill", victim_name)
    killed_at = time.monotonic()
    with pytest.raises(redis.ConnectionError):
        redis.Redis(
            host=stack.host,
            port=victim_port,
            password=stack.redis_password,
            socket_connect_timeout=1,
        ).ping()

    recovered_after = None
    while time.monotonic() - killed_at < FAILOVER_BOUND_S:
        client = RedisCluster(
            startup_nodes=[n for n in nodes if n.port != victim_port],
            password=stack.redis_password,
            decode_responses=True,
        )
        try:
            client.set(key, 2)
            if client.get(key) == "2":
                recovered_after = time.monotonic() - killed_at
                new_owner = int(client.get_node_from_key(key).port)
                break
        except (redis.RedisError, redis.exceptions.RedisClusterException):
            time.sleep(0.5)
        finally:
            client.close()
    assert recovered_after is not None, f"no failover within {FAILOVER_BOUND_S}s"
    assert new_owner != victim_port
    print(f"count-cache failover: writes to the killed primary's slots succeeded again after "
          f"{recovered_after:.1f}s")  # fmt: skip

    # `up` restarts the killed node; it rejoins as a replica and the cluster is whole again
    status = stack.up()
    assert status[victim_name]["healthy"]
    info = redis.Redis(
        host=stack.host, port=victim_port, password=stack.redis_password, decode_responses=True
    ).info("replication")
    assert info["role"] == "slave"
