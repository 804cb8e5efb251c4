"""`likes status` on the running stack: each view reads its store and says what is wrong with
it, so on-call sees a lost replica before the failover that would lose writes."""

from __future__ import annotations

import json
from typing import Any

import pytest
import redis

from services.contracts import events
from services.contracts import kafka as kafka_contract
from tests.conftest import Stack

pytestmark = pytest.mark.stack


def _views(stack: Stack, *args: str) -> tuple[int, dict[str, dict[str, Any]]]:
    proc = stack.cli("status", *args, "--json", check=False)
    assert proc.returncode in (0, 1), proc.stderr
    return proc.returncode, {v["view"]: v for v in json.loads(proc.stdout)}


def test_every_view_reads_its_store_and_a_lost_replica_is_a_problem(stack: Stack) -> None:
    code, views = _views(stack, *())
    assert set(views) == {"lag", "cache", "kafka", "cassandra", "etcd"}
    stores = ("cache", "kafka", "cassandra", "etcd")  # lag is what earlier tests left behind
    assert {v: views[v]["problems"] for v in stores} == {v: [] for v in stores}
    for store in ("count-cache", "idem-store", "feature-store"):  # every Redis Cluster
        nodes = [r for r in views["cache"]["rows"] if r["store"] == store]
        assert sorted(r["role"] for r in nodes) == ["master"] * 3 + ["slave"] * 3, store
    committed = [r for r in views["kafka"]["rows"] if r["topic"] == events.COMMITTED]
    assert committed and all(len(r["isr"]) == len(r["replicas"]) == 3 for r in committed)
    assert [r["up"] for r in views["cassandra"]["rows"]] == [True]
    assert [r["leader"] for r in views["etcd"]["rows"]] == [True]
    watched = {kafka_contract.AGGREGATOR_GROUP, kafka_contract.ABUSE_GROUP}
    assert {r["group"] for r in views["lag"]["rows"]} == watched

    # a count-cache replica stops: its primary is one failure away from losing writes
    roles = {}
    for i, (host, port) in enumerate(stack.count_cache_nodes, 1):
        r = redis.Redis(host=host, port=port, password=stack.redis_password, decode_responses=True)
        info = r.info("replication")
        roles[i] = (port, info["role"], info.get("master_port"))
        r.close()
    replica, (_, _, primary_port) = next((i, x) for i, x in roles.items() if x[1] == "slave")
    stack.cli("local", "stop", f"count-cache-{replica}")
    try:
        code, views = _views(stack, "cache")
    finally:
        stack.up()
    assert code == 1
    assert (
        f"count-cache {host}:{primary_port}: a primary without a replica"
        in views["cache"]["problems"]
    ), views["cache"]["problems"]
