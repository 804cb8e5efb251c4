"""Alerts fire on the running stack: a fault is induced, the alert arrives at Alertmanager and
the receiver its severity routes to, with a start after the injection, and resolves once the
fault is undone. The local rules are the program's, time-scaled (local/observability_transforms
transform 6); `likes alerts --json` is what the test reads."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import httpx
import redis

from infra import alert_rules
from infra import observability as obs
from local import observability_render
from local.components import gateway as gateway_local
from services.contracts import metrics as metric_names
from services.contracts import routes, workloads
from tests.conftest import Stack
from tests.integration.faults import produce_like

Match = Callable[[dict[str, Any]], bool]


def _alerts(stack: Stack) -> list[dict[str, Any]]:
    return json.loads(stack.cli("alerts", "--json", "--since", "30m").stdout)


def _at(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def _wait(stack: Stack, what: str, match: Match, state: str, timeout: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    seen: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        seen = _alerts(stack)
        hits = [a for a in seen if a["state"] == state and match(a)]
        if hits:
            return hits[0]
        time.sleep(3)
    names = [(a["name"], a["state"]) for a in seen]
    raise AssertionError(f"{what} not {state} within {timeout} s; alerts: {names}")


def _named(name: str, **labels: str) -> Match:
    return lambda a: a["name"] == name and all(a["labels"].get(k) == v for k, v in labels.items())


def _after(match: Match, undone: float) -> Match:
    """A resolution of this fault: the sink may still hold an earlier episode's resolved
    notification of the same alert (same fingerprint), which ended before it."""
    return lambda a: match(a) and a["ended_at"] is not None and _at(a["ended_at"]) > undone


def _page_receiver(stack: Stack) -> str:
    rendered = observability_render.load(stack.layout.stack).alertmanager
    names = {r["name"] for r in rendered["receivers"]}
    return obs.PAGER_RECEIVER if obs.PAGER_RECEIVER in names else obs.TICKET_RECEIVER


def _delivered(stack: Stack, receiver: str, name: str, status: str, after: float) -> bool:
    sink = f"http://{stack.host}:{stack.layout.ports.webhook_sink}/{receiver}"
    for note in httpx.get(sink, timeout=5).json():
        payload = note["payload"]
        for a in payload.get("alerts", []) if isinstance(payload, dict) else []:
            if (a["labels"].get("alertname"), a["status"]) == (name, status) and _at(
                a["startsAt"]
            ) > after:
                return True
    return False


def test_a_hung_aggregator_pages_through_its_alerts_and_all_resolve(stack: Stack) -> None:
    """Its own alert, the lag page, and the canary's drift page: the canary's likes go through
    the gateway and the write path, the hung aggregator never folds them, and the count it reads
    after the convergence hold is not the edge-store's truth."""
    stalled = _named(alert_rules.AGGREGATOR_STALLED, reason="not-running")
    lag_slo = next(s for s in alert_rules.default_slos() if s.name == "consumer-lag")
    lagging = _named(alert_rules.alert_name(lag_slo), long_window="1h")
    drifting = _named(alert_rules.CANARY_DRIFT)
    _quiet(stack, "AggregatorStalled", stalled)
    _quiet(stack, "the consumer-lag page", lagging)
    _quiet(stack, "CanaryDrift", drifting)
    pid = int(stack.status()[workloads.AGGREGATOR.name]["pid"])
    injected = time.time()
    os.kill(pid, signal.SIGSTOP)  # hung: its scrapes time out, it consumes nothing
    try:
        produce_like(stack)
        fired = _wait(stack, "AggregatorStalled", stalled, "firing", 240)
        assert _at(fired["started_at"]) > injected
        assert fired["runbook_url"] == "runbooks/aggregator-stalled.md"
        burn = _wait(stack, "the consumer-lag page", lagging, "firing", 240)
        assert _at(burn["started_at"]) > injected
        assert burn["labels"]["severity"] == alert_rules.SEVERITY_PAGE
        drift = _wait(stack, "CanaryDrift", drifting, "firing", 240)
        assert _at(drift["started_at"]) > injected
        assert drift["runbook_url"] == "runbooks/canary-drift.md"
        # `likes slo` reads the same burn from Prometheus: above the page's 14.4 over "1h"
        # (a local minute), and budget spent
        slos = {r["slo"]: r for r in json.loads(stack.cli("slo", "--json").stdout)}
        assert {s.name for s in alert_rules.default_slos()} == set(slos)
        lag = slos["consumer-lag"]
        assert lag["objective"] == 0.99 and lag["period"] == "43200s"  # 30 d / 60
        assert lag["burn_rates"]["1h"] > 14.4, lag
        assert lag["budget_remaining"] < 1, lag
        # delivered where pages go, not only held by Alertmanager
        receiver = _page_receiver(stack)
        deadline = time.monotonic() + 60
        while not _delivered(stack, receiver, alert_rules.AGGREGATOR_STALLED, "firing", injected):
            assert time.monotonic() < deadline, f"AggregatorStalled never reached {receiver}"
            time.sleep(2)
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed = time.time()
    done = _wait(stack, "AggregatorStalled", _after(stalled, resumed), "resolved", 240)
    _timing("AggregatorStalled", fired["started_at"], injected, done["ended_at"], resumed)
    done = _wait(stack, "the consumer-lag page", _after(lagging, resumed), "resolved", 300)
    _timing(
        alert_rules.alert_name(lag_slo), burn["started_at"], injected, done["ended_at"], resumed
    )
    done = _wait(stack, "CanaryDrift", _after(drifting, resumed), "resolved", 300)
    _timing("CanaryDrift", drift["started_at"], injected, done["ended_at"], resumed)
    healthy_from = time.time()
    # and they stay resolved: nothing flaps back within a few evaluations (a hold, not a wait:
    # a one-sided check would pass on a resolution that fires again at the next evaluation)
    time.sleep(20)
    again = [
        a
        for a in _alerts(stack)
        if a["state"] == "firing" and (stalled(a) or lagging(a) or drifting(a))
    ]
    assert again == [], again
    # the canary judges turns again once it resolved, and they match the truth
    turns = metric_names.CANARY_TURNS

    def since(result: str) -> float:
        window = f"{time.time() - healthy_from + 15:.0f}s"
        return _query(stack, f'sum(increase({turns}{{result="{result}"}}[{window}])) or vector(0)')

    deadline = time.monotonic() + 120
    while since("match") < 1:
        assert time.monotonic() < deadline, "the canary judged no turn after the resolution"
        time.sleep(5)
    assert since("drift") < 1, "the canary still drifts after the aggregator resumed"


def _quiet(stack: Stack, what: str, match: Match, timeout: float = 240) -> None:
    """Wait until `match` is not firing: an earlier test's fault may still be resolving."""

    def active() -> bool:
        if any(a["state"] == "firing" and match(a) for a in _alerts(stack)):
            return True
        # Prometheus too: an alert still pending from an earlier fault would fire with that
        # fault's start (startsAt is when the condition began), before this test's injection
        rules = httpx.get(f"{stack.prometheus_url}/api/v1/alerts", timeout=10).json()
        return any(
            match({"name": a["labels"].get("alertname"), "labels": a["labels"]})
            for a in rules["data"]["alerts"]
        )

    deadline = time.monotonic() + timeout
    while active():
        assert time.monotonic() < deadline, f"{what} still pending or firing before the test"
        time.sleep(3)


def _fires_and_resolves(
    stack: Stack,
    what: str,
    match: Match,
    induce: Callable[[], None],
    undo: Callable[[], None],
    runbook: str,
) -> None:
    _quiet(stack, what, match)
    injected = time.time()
    induce()
    try:
        fired = _wait(stack, what, match, "firing", 240)
        assert _at(fired["started_at"]) > injected
        assert fired["runbook_url"] == f"runbooks/{runbook}.md"
    finally:
        undo()
    undone = time.time()
    done = _wait(stack, what, _after(match, undone), "resolved", 240)
    _timing(what, fired["started_at"], injected, done["ended_at"], undone)


def _timing(what: str, started: str, injected: float, ended: str, undone: float) -> None:
    """For the notes (pytest -rA shows it): how long the alert took to fire and to resolve."""
    print(f"{what}: started {_at(started) - injected:.0f} s after the fault, "
          f"ended {_at(ended) - undone:.0f} s after it was undone")  # fmt: skip


def test_no_relay_reporting_fires_outbox_shards_unowned_and_resolves(stack: Stack) -> None:
    pid = int(stack.status()[workloads.OUTBOX_RELAY.name]["pid"])
    _fires_and_resolves(
        stack,
        "OutboxShardsUnowned",
        _named(alert_rules.OUTBOX_SHARDS_UNOWNED, reason="no-relay-reporting"),
        lambda: os.kill(pid, signal.SIGSTOP),
        lambda: os.kill(pid, signal.SIGCONT),
        "outbox-shards-unowned",
    )


def test_a_stopped_lag_exporter_fires_consumer_lag_unknown_and_resolves(stack: Stack) -> None:
    _fires_and_resolves(
        stack,
        "ConsumerLagUnknown",
        _named(alert_rules.CONSUMER_LAG_UNKNOWN),
        lambda: stack.cli("local", "stop", workloads.CONSUMER_LAG.name),
        stack.up,
        "consumer-lag-unknown",
    )


def test_a_lost_count_cache_replica_fires_replication_lag_and_resolves(stack: Stack) -> None:
    names = {port: f"count-cache-{i + 1}" for i, port in enumerate(stack.layout.ports.count_cache)}
    replica = None
    for port, name in names.items():
        r = redis.Redis(host=stack.host, port=port, password=stack.redis_password)
        if r.info("replication")["role"] == "slave":
            replica = name
            break
    assert replica is not None, "the count-cache has no replica"
    _fires_and_resolves(
        stack,
        "CountCacheReplicationLag",
        _named(alert_rules.COUNT_CACHE_REPLICATION, reason="primary-without-replica"),
        lambda: stack.cli("local", "stop", replica),
        stack.up,
        "count-cache-replication-lag",
    )


def test_a_read_service_the_gateway_cannot_reach_burns_the_read_budget(stack: Stack) -> None:
    """The read service never answers 5xx, so its own metrics cannot see itself gone: the read
    SLI counts the gateway's 5xx on the read cluster (Envoy's stats, scraped as workload=envoy)."""
    read_slo = next(s for s in alert_rules.default_slos() if s.name == "read-availability")
    burning = _named(alert_rules.alert_name(read_slo), long_window="1h")
    stop = threading.Event()
    answers: list[int] = []

    def readers() -> None:  # clients behind the CDN, reading a post through the gateway
        with httpx.Client(base_url=stack.gateway_url, timeout=5) as client:
            while not stop.is_set():
                try:
                    answers.append(client.get(routes.read_path("post-slo")).status_code)
                except httpx.TransportError:
                    answers.append(0)
                stop.wait(0.1)

    traffic = threading.Thread(target=readers, daemon=True)
    traffic.start()
    try:
        _fires_and_resolves(
            stack,
            alert_rules.alert_name(read_slo),
            burning,
            lambda: stack.cli("local", "stop", workloads.READ.name),
            stack.up,
            "read-availability",
        )
    finally:
        stop.set()
        traffic.join(timeout=10)
    assert 503 in answers and 200 in answers, sorted(set(answers))
    # what fired it: the gateway's term, from Envoy's own series under the workload the program
    # annotates (its pods' scrape annotations; the local Envoy's stats listener)
    query = (
        f"sum(increase({metric_names.ENVOY_CLUSTER_RQ_XX}{{{alert_rules.WORKLOAD_LABEL}="
        f'"{gateway_local.ENVOY}",{metric_names.ENVOY_CLUSTER_LABEL}='
        f'"{metric_names.GATEWAY_READ_CLUSTER}",envoy_response_code_class="5"}}[15m]))'
    )
    assert _query(stack, query) > 0


def _query(stack: Stack, query: str) -> float:
    """The one sample of an instant query on the stack's Prometheus."""
    got = httpx.get(f"{stack.prometheus_url}/api/v1/query", params={"query": query}, timeout=10)
    (sample,) = got.json()["data"]["result"]
    return float(sample["value"][1])


def test_a_paused_cassandra_fires_each_alert_it_implies_and_all_resolve(stack: Stack) -> None:
    """One fault, four alerts: with the counter-store, edge-store and cells paused (hung, not
    refusing), the aggregator's flushes fail, the read breaker opens, reads of posts the
    count-cache lacks answer null (degraded: the read SLI's own term), writes fail closed."""
    slos = {s.name: s for s in alert_rules.default_slos()}
    expected: dict[str, Match] = {
        alert_rules.AGGREGATOR_FLUSH_FAILING: _named(alert_rules.AGGREGATOR_FLUSH_FAILING),
        alert_rules.READ_BREAKER_OPEN: _named(
            alert_rules.READ_BREAKER_OPEN, dependency="counter-store"
        ),
        "the read burn": _named(
            alert_rules.alert_name(slos["read-availability"]), long_window="1h"
        ),
        "the write burn": _named(
            alert_rules.alert_name(slos["write-availability"]), long_window="1h"
        ),
    }
    for what, match in expected.items():
        _quiet(stack, what, match)
    stop = threading.Event()

    def clients() -> None:  # readers of posts nobody has counted, and writers, via the gateway
        with httpx.Client(base_url=stack.gateway_url, timeout=10) as client:
            while not stop.is_set():
                user, post = f"u-{uuid.uuid4().hex[:8]}", f"post-{uuid.uuid4()}"
                try:
                    client.get(routes.read_path(post))
                    client.post(
                        routes.WRITE_PATH,
                        json={"post_id": post, "action": "like"},
                        headers={
                            "authorization": f"Bearer {stack.token(user)}",
                            "idempotency-key": str(uuid.uuid4()),
                        },
                    )
                except httpx.TransportError:
                    pass
                stop.wait(0.2)

    traffic = threading.Thread(target=clients, daemon=True)
    traffic.start()
    pid = int(stack.status()["cassandra"]["pid"])
    fired: dict[str, dict[str, Any]] = {}
    injected = time.time()
    os.kill(pid, signal.SIGSTOP)
    try:
        produce_like(stack)  # a window for the aggregator to flush into the paused store
        for what, match in expected.items():
            fired[what] = _wait(stack, what, match, "firing", 240)
            assert _at(fired[what]["started_at"]) > injected, (what, fired[what])
        # the read burn is the degraded answers' doing: the service still answered every read
        degraded = _query(
            stack,
            f'sum(increase({metric_names.READ_TIER}{{{metric_names.READ_TIER_LABEL}="none"}}[2m]))',
        )
        assert degraded > 0, degraded
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed = time.time()
    try:
        for what, match in expected.items():
            done = _wait(stack, what, _after(match, resumed), "resolved", 300)
            _timing(what, fired[what]["started_at"], injected, done["ended_at"], resumed)
    finally:
        stop.set()
        traffic.join(timeout=30)
    assert fired[alert_rules.AGGREGATOR_FLUSH_FAILING]["runbook_url"] == (
        "runbooks/aggregator-flush-failing.md"
    )
