"""The --faults profile's one truth: each node a client reaches after bootstrap has its own
Toxiproxy proxy, and the node announces that proxy (Redis, Kafka) or is the services' contact
point through it (the one Cassandra node); without the profile nothing announces a proxy."""

from __future__ import annotations

from pathlib import Path

import pytest

from local import components, transforms
from local.components import cassandra, kafka, redis, toxiproxy
from local.layout import Layout, Ports


def lay(tmp_path: Path, faults: bool) -> Layout:
    return Layout(home=tmp_path, ports=Ports(1000), faults=faults)


def servers(layout: Layout) -> dict[str, str]:
    """Server name -> the address it listens on, as the stack's registry builds them."""
    return {s.name: s.address for c in components.build(layout, strict=False) for s in c.servers()}


def test_every_proxy_fronts_a_server_of_the_stack_on_its_own_port(tmp_path: Path) -> None:
    layout = lay(tmp_path, faults=True)
    built = servers(layout)
    proxied = layout.proxies()
    # every Redis Cluster node, every broker and the Cassandra node; nothing else
    clusters = ("count-cache-", "idem-store-", "feature-store-")
    expected = {n for n in built if n.startswith((*clusters, "kafka-"))}
    assert {n for n in expected if n.startswith("feature-store-")}, "the feature-store's nodes"
    assert set(proxied) == expected | {"cassandra"}
    for name, (listen, upstream) in proxied.items():
        assert built[name].endswith(f":{upstream}"), (name, built[name], upstream)
        assert listen in layout.ports.every() and listen != upstream
    listens = [listen for listen, _ in proxied.values()]
    assert len(set(listens)) == len(listens)
    assert "toxiproxy" in built and "toxiproxy" not in servers(lay(tmp_path, faults=False))


def test_the_proxy_config_is_what_toxiproxy_starts_with(tmp_path: Path) -> None:
    layout = lay(tmp_path, faults=True)
    specs = {s["name"]: s for s in toxiproxy.proxy_specs(layout)}
    assert specs["kafka-2"]["listen"] == f"127.0.0.1:{Ports(1000).kafka_broker_proxies[1]}"
    assert specs["kafka-2"]["upstream"] == f"127.0.0.1:{Ports(1000).kafka_brokers[1]}"
    # 6 nodes of each Redis Cluster (count-cache, idem-store, feature-store), 3 brokers, Cassandra
    assert all(s["enabled"] for s in specs.values()) and len(specs) == 3 * 6 + 3 + 1


@pytest.mark.parametrize("faults", [True, False])
def test_the_nodes_announce_their_proxy_only_in_the_profile(tmp_path: Path, faults: bool) -> None:
    layout = lay(tmp_path, faults)
    ports = layout.ports
    cache = redis.CountCache(layout)
    lines = cache.announce_lines(ports.count_cache[4])
    broker = kafka.Kafka(layout)._properties(3)
    contact = transforms._addresses(layout)["cassandra_port"]
    if faults:
        assert lines == [
            f"cluster-announce-port {ports.count_cache_proxies[4]}",
            f"cluster-announce-bus-port {ports.count_cache[4] + 10000}",  # the bus stays direct
        ]
        assert f"advertised.listeners=CLIENT://127.0.0.1:{ports.kafka_broker_proxies[2]}" in broker
        assert contact == str(ports.cassandra_native_proxy)
    else:
        assert lines == []
        assert f"advertised.listeners=CLIENT://127.0.0.1:{ports.kafka_brokers[2]}" in broker
        assert contact == str(ports.cassandra_native)
    # the servers themselves keep listening on their own ports
    assert cassandra.Cassandra(layout).servers()[0].address.endswith(f":{ports.cassandra_native}")


def test_a_profile_is_recorded_and_read_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from local import layout as layout_mod

    monkeypatch.setenv("LIKES_HOME", str(tmp_path))
    monkeypatch.setenv("LIKES_PORT_OFFSET", "1000")
    layout_mod.record_profile(lay(tmp_path, faults=True))
    assert layout_mod.from_env().faults is True
    assert layout_mod.recorded_faults(tmp_path) is True
    assert layout_mod.from_env(faults=False).faults is False  # an explicit choice wins


def test_benchmarks_refuse_a_stack_in_the_profile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from local import layout as layout_mod

    monkeypatch.setenv("LIKES_HOME", str(tmp_path))
    layout_mod.record_profile(lay(tmp_path, faults=False))
    assert layout_mod.for_benchmark().faults is False
    layout_mod.record_profile(lay(tmp_path, faults=True))
    with pytest.raises(SystemExit, match="--faults profile"):
        layout_mod.for_benchmark()
