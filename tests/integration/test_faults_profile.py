"""The --faults profile, on real servers: a scratch Toxiproxy and a Redis Cluster of six nodes
(the idem-store component, as `likes local up --faults` runs them) at their own port offset.
Clients are seeded with the nodes' own ports and learn the proxies from the cluster; a toxic on
one node's proxy cuts exactly what the clients use for that node. Proxies in front of the
bootstrap addresses only would carry nothing after the first request: these tests fail then.
(The brokers' and Cassandra's side of the profile: tests/unit/test_local_faults_profile.py.)"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import redis
from redis.cluster import ClusterNode, RedisCluster

from local import supervisor
from local.components import redis as local_redis
from local.components import toxiproxy
from local.layout import HOST, Layout, Ports

# Apart from the default (0), test (1000, 2000), test_cli (1500) and test_gateway (7000) stacks,
# and below the kernel's ephemeral ports (32768 up): at 4000 the Kafka proxies listened on
# 33292-33294, and a client connection that had taken one of those for its own end (Prometheus's
# did, on a dev machine) made the stack fail to start.
OFFSET = 3000


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Layout]:
    lay = Layout(home=Path(tmp_path_factory.mktemp("faults")), ports=Ports(OFFSET), faults=True)
    sup = supervisor.Supervisor(lay, [toxiproxy.Toxiproxy(lay), local_redis.IdemStore(lay)])

    def report(name: str, msg: str) -> None:
        pass

    try:
        sup.up(report)
        status = sup.settle(list(sup.all_servers()), report)
        assert all(s["healthy"] for s in status.values()), status
        yield lay
    finally:
        sup.down(report)


def _cluster(lay: Layout, timeout: float) -> RedisCluster:
    seeds = [ClusterNode(HOST, p) for p in lay.ports.idem_store]  # the nodes' own ports
    return RedisCluster(startup_nodes=seeds, password=local_redis.password(lay),
                        socket_timeout=timeout, decode_responses=True)  # fmt: skip


def test_every_proxy_listens_below_the_kernels_ephemeral_ports() -> None:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    lay = Layout(home=Path("unused"), ports=Ports(OFFSET), faults=True)
    assert max(listen for listen, _ in lay.proxies().values()) < low


def test_clients_learn_the_proxies_from_the_nodes(world: Layout) -> None:
    # every node, primaries and replicas, is known to the others by its proxy
    with local_redis.client(world, world.ports.idem_store[0], socket_timeout=2) as r:
        table = dict(r.execute_command("CLUSTER NODES"))
    assert {int(a.rsplit(":", 1)[1]) for a in table} == set(world.ports.idem_store_proxies)
    rc = _cluster(world, 2.0)
    try:
        ports = {n.port for n in rc.get_nodes()}  # what the client learned: proxies only
        assert ports and ports <= set(world.ports.idem_store_proxies), rc.get_nodes()
        key = f"faults:{uuid.uuid4()}"
        rc.set(key, "v")
        assert rc.get(key) == "v"
    finally:
        rc.close()


def test_a_toxic_on_a_nodes_proxy_cuts_what_the_clients_use(world: Layout) -> None:
    """A timeout toxic (nothing answers) on the proxy of the primary owning a key: a read of
    that key times out, a key on another primary still answers; after Toxiproxy's reset both
    answer again."""
    rc = _cluster(world, 1.0)
    by_port = {listen: name for name, (listen, _own) in world.proxies().items()}
    try:
        key = f"faults:{uuid.uuid4()}"
        rc.set(key, "7")
        owner = rc.get_node_from_key(key)
        other = next(
            k for k in (f"faults:{uuid.uuid4()}" for _ in range(200))
            if rc.get_node_from_key(k).port != owner.port
        )  # fmt: skip
        rc.set(other, "8")
        victim = by_port[owner.port]
        httpx.post(
            f"{toxiproxy.api_url(world)}/proxies/{victim}/toxics",
            json={"name": "test-cut", "type": "timeout", "stream": "downstream",
                  "attributes": {"timeout": 0}},
            timeout=5,
        ).raise_for_status()  # fmt: skip
        try:
            assert toxiproxy.toxics(world)[victim], "the toxic is on the victim's proxy"
            # straight to the owner's announced address, as the cluster client goes
            node = local_redis.client(world, owner.port, socket_timeout=1.0)
            with node, pytest.raises(redis.TimeoutError):
                node.get(key)
            assert rc.get(other) == "8"  # the other primary's proxy is untouched
        finally:
            toxiproxy.reset(world)
        assert not any(toxiproxy.toxics(world).values())
        fresh = _cluster(world, 2.0)
        try:
            assert fresh.get(key) == "7" and fresh.get(other) == "8"
        finally:
            fresh.close()
    finally:
        rc.close()


def test_switching_the_profile_back_leaves_every_replica_dialing_its_primary(
    world: Layout,
) -> None:
    """`likes chaos run` of a faults-profile experiment switches the stack back afterwards:
    every node restarts on its data, announcing its own port instead of its proxy's. Redis 7.0
    can take a primary's new port into its node table (from a third node's gossip, while the
    primary is still down) without moving the replica's link, which then dials a proxy that is
    gone: after kafka-cross-az-partition the count-cache's up failed with "primary without a
    replica" (its replica's master_port was the proxy's, CLUSTER NODES said the node's own).
    The race is Redis's, so this test does not force it; it checks what must hold after the
    switch, and `replication_target` on the real table. Runs last: it takes the world down."""

    def report(name: str, msg: str) -> None:
        pass

    supervisor.Supervisor(world, [toxiproxy.Toxiproxy(world), local_redis.IdemStore(world)]).down(
        report
    )
    plain = dataclasses.replace(world, faults=False)
    sup = supervisor.Supervisor(plain, [local_redis.IdemStore(plain)])
    try:
        sup.up(report)  # its bootstrap re-points a replica left behind, or fails after 60 s
        for port in plain.ports.idem_store:
            with local_redis.client(plain, port, decode_responses=True) as r:
                role = r.info("replication")
                nodes = str(r.execute_command("CLUSTER", "NODES"))
            if role["role"] == "slave":
                target = local_redis.replication_target(nodes)
                assert target is not None, nodes
                assert int(role["master_port"]) == target[1], (port, role)  # not a proxy's
                assert target[1] in plain.ports.idem_store, nodes
                assert role["master_link_status"] == "up", (port, role)
            else:
                assert local_redis.replication_target(nodes) is None
                assert int(role["connected_slaves"]) >= 1, (port, role)
    finally:
        sup.down(report)
