"""Alerts fire on the running stack: a fault is induced, the alert arrives at Alertmanager and
the receiver its severity routes to, with a start after the injection, and resolves once the
fault is undone. The local rules are the program's, time-scaled (local/observability_transforms
transform 6); `likes alerts --json` is what the test reads."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import signal
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any

import httpx
import redis

from chaos import process_faults
from cli import alerts as cli_alerts
from cli import runbook as runbook_cli
from infra import alert_rules
from infra import observability as obs
from local import observability_render
from local import observability_transforms as local_obs_transforms
from local import transforms as local_transforms
from local.components import gateway as gateway_local
from local.components.observability import OtelCollector
from services.canary import __main__ as canary_main
from services.canary.settings import CanarySettings
from services.contracts import clients, events, keys, routes, workloads
from services.contracts import kafka as kafka_contract
from services.contracts import metrics as metric_names
from tests.conftest import Stack
from tests.integration import faults
from tests.integration.faults import produce_like

Match = Callable[[dict[str, Any]], bool]


def _alerts(stack: Stack) -> list[dict[str, Any]]:
    """What `likes alerts --json --since 30m` prints (cli/alerts.listing), read in this process:
    the waits poll it every few seconds, and a CLI process costs ~2.5 s of CPU each time. The
    CLI itself is run once, in the first test (_cli_lists)."""
    ports = stack.layout.ports
    return cli_alerts.listing(
        f"http://{stack.host}:{ports.alertmanager}",
        f"http://{stack.host}:{ports.webhook_sink}",
        30 * 60,
    )


def _cli_lists(stack: Stack, alert: dict[str, Any]) -> None:
    """`likes alerts --json` lists `alert` as the test's in-process read did."""
    listed = json.loads(stack.cli("alerts", "--json", "--since", "30m").stdout)
    same = [a for a in listed if a["fingerprint"] == alert["fingerprint"]]
    assert same and same[0]["state"] == alert["state"], (alert, listed)
    assert same[0]["runbook_url"] == alert["runbook_url"], same


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
        time.sleep(2)
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


def _diagnosis(stack: Stack, alert: str, via_cli: bool = False) -> tuple[int, dict[str, Any]]:
    """`likes runbook diagnose ALERT --json`: its exit status (1: a check found trouble) and its
    one result. Read in this process (cli/runbook.diagnose_alert against the stack's Prometheus,
    time-scaled as the CLI's local default is) unless `via_cli`: a CLI process costs seconds of
    CPU, and the tests below ask some thirty times."""
    if via_cli:
        proc = stack.cli("runbook", "diagnose", alert, "--json", check=False)
        assert proc.returncode in (0, 1), proc.stderr
        ((result,),) = [json.loads(proc.stdout)]
        return proc.returncode, result
    rendered = _rendered_prometheus(stack.layout.stack)
    result = runbook_cli.diagnose_alert(
        alert, stack.prometheus_url, lambda q: local_obs_transforms.query(q, rendered)
    )
    return int(any(c["verdict"] == "trouble" for c in result["checks"])), result


@functools.cache
def _rendered_prometheus(stack_name: str) -> dict[str, Any]:
    return observability_render.load(stack_name).prometheus


def _diagnosis_sees_trouble(stack: Stack, alert: str) -> None:
    """While ALERT fires, `likes runbook diagnose ALERT` finds the trouble: at least one check
    of its runbook says so (printed for the notes: what on-call would read)."""
    code, result = _diagnosis(stack, alert)
    troubles = [(c["check"], c["readings"]) for c in result["checks"] if c["verdict"] == "trouble"]
    assert code == 1 and troubles, (alert, result["checks"])
    for check, readings in troubles:
        print(f"diagnose {alert}: {check} -> {'; '.join(readings)}")


def _diagnosed(
    stack: Stack, alert: str, metric: str, via_cli: bool = False
) -> tuple[int, dict[str, Any]]:
    """`likes runbook diagnose ALERT --json`: its exit status and its check that reads
    `metric` (the verdict and readings on-call would see)."""
    code, result = _diagnosis(stack, alert, via_cli)
    (check,) = [c for c in result["checks"] if metric in c["promql"]]
    return code, check


def test_hung_worker_loops_page_through_their_alerts_and_all_resolve(stack: Stack) -> None:
    """The relay's and the aggregator's loops stop (their main threads, as a call that never
    returns would hold them) while their ops servers still answer scrapes: the heartbeat
    timestamps stop moving, which only the loop-hung rules see (the series are not absent).
    Then the lag page, and the canary's drift page: the canary's likes go through the gateway
    and the write path, the hung aggregator never folds them, and the count it reads after the
    convergence hold is not the edge-store's truth."""
    stalled = _named(alert_rules.AGGREGATOR_STALLED, reason="loop-hung")
    relay_hung = _named(alert_rules.OUTBOX_RELAY_HUNG)
    lag_slo = next(s for s in alert_rules.default_slos() if s.name == "consumer-lag")
    lagging = _named(alert_rules.alert_name(lag_slo), long_window="1h")
    drifting = _named(alert_rules.CANARY_DRIFT)
    _quiet(stack, "AggregatorStalled", stalled)
    _quiet(stack, "OutboxRelayHung", relay_hung)
    _quiet(stack, "the consumer-lag page", lagging)
    _quiet(stack, "CanaryDrift", drifting)
    status = stack.status()
    hung = contextlib.ExitStack()
    # on-call's first look before the fault: each loop turning
    loops = {
        alert_rules.AGGREGATOR_STALLED: metric_names.AGGREGATOR_LOOP_TIMESTAMP,
        alert_rules.OUTBOX_RELAY_HUNG: metric_names.OUTBOX_RELAY_LOOP_TIMESTAMP,
    }
    for alert, metric in loops.items():  # once through the CLI itself
        assert _diagnosed(stack, alert, metric, via_cli=True)[1]["verdict"] == "ok", alert

    def answers(name: str) -> Callable[[], bool]:
        def ok() -> bool:
            try:
                return httpx.get(f"{stack.ops_url(name)}/metrics", timeout=3).status_code == 200
            except httpx.HTTPError:
                return False

        return ok

    injected = time.time()
    try:
        for w in (workloads.OUTBOX_RELAY, workloads.AGGREGATOR):
            hung.enter_context(
                process_faults.hung_main_thread(int(status[w.name]["pid"]), answers(w.name))
            )
        produce_like(stack)
        fired = _wait(stack, "AggregatorStalled", stalled, "firing", 240)
        assert _at(fired["started_at"]) > injected
        assert fired["runbook_url"] == "runbooks/aggregator-stalled.md"
        _cli_lists(stack, fired)
        relay = _wait(stack, "OutboxRelayHung", relay_hung, "firing", 240)
        assert _at(relay["started_at"]) > injected
        assert relay["runbook_url"] == "runbooks/outbox-relay-hung.md"
        burn = _wait(stack, "the consumer-lag page", lagging, "firing", 240)
        assert _at(burn["started_at"]) > injected
        assert burn["labels"]["severity"] == alert_rules.SEVERITY_PAGE
        drift = _wait(stack, "CanaryDrift", drifting, "firing", 240)
        assert _at(drift["started_at"]) > injected
        assert drift["runbook_url"] == "runbooks/canary-drift.md"
        for name in (burn["name"], drift["name"]):
            _diagnosis_sees_trouble(stack, name)
        # the scrapes went on throughout: the hung loops' heartbeats were seen standing still
        stuck = _query(stack, f"max(time() - {metric_names.OUTBOX_RELAY_LOOP_TIMESTAMP})")
        assert stuck > alert_rules.LOOP_HUNG_AFTER_S, stuck
        # and the runbooks' checks name the cause: which loop, how long since it turned
        for alert, metric in loops.items():
            code, check = _diagnosed(stack, alert, metric)
            assert (code, check["verdict"]) == (1, "trouble"), check
            (reading,) = check["readings"]
            assert "the loop last turned" in reading, reading
            w = (
                workloads.AGGREGATOR
                if alert == alert_rules.AGGREGATOR_STALLED
                else workloads.OUTBOX_RELAY
            )
            assert reading.startswith(stack.ops_url(w.name).removeprefix("http://")), reading
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
        hung.close()
    resumed = time.time()
    done = _wait(stack, "AggregatorStalled", _after(stalled, resumed), "resolved", 240)
    _timing("AggregatorStalled", fired["started_at"], injected, done["ended_at"], resumed)
    done = _wait(stack, "OutboxRelayHung", _after(relay_hung, resumed), "resolved", 240)
    _timing("OutboxRelayHung", relay["started_at"], injected, done["ended_at"], resumed)
    done = _wait(stack, "the consumer-lag page", _after(lagging, resumed), "resolved", 300)
    _timing(
        alert_rules.alert_name(lag_slo), burn["started_at"], injected, done["ended_at"], resumed
    )
    done = _wait(stack, "CanaryDrift", _after(drifting, resumed), "resolved", 300)
    _timing("CanaryDrift", drift["started_at"], injected, done["ended_at"], resumed)
    healthy_from = time.time()
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
    # and they stay resolved: nothing flaps back within a few evaluations (a hold, not a wait:
    # a one-sided check would pass on a resolution that fires again at the next evaluation);
    # the wait for the canary's turn above counts towards it
    time.sleep(max(0.0, healthy_from + 20 - time.time()))
    again = [
        a
        for a in _alerts(stack)
        if a["state"] == "firing" and (stalled(a) or relay_hung(a) or lagging(a) or drifting(a))
    ]
    assert again == [], again


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
        time.sleep(2)


def _all_fire_and_resolve(
    stack: Stack,
    expected: dict[str, tuple[Match, str]],
    induce: Callable[[], None],
    undo: Callable[[], None],
    resolve_s: float = 240,
    fire_only: frozenset[str] = frozenset(),
) -> dict[str, dict[str, Any]]:
    """Each expected alert (what -> its match and runbook) fires after `induce`, with a start
    after it, and resolves after `undo` (but those in `fire_only`, whose windows outlast a test
    session: promtool tests their silence); returns the firing alerts."""
    for what, (match, _) in expected.items():
        _quiet(stack, what, match)
    injected = time.time()
    fired: dict[str, dict[str, Any]] = {}
    try:
        induce()  # inside: a fault half induced is undone too
        for what, (match, runbook) in expected.items():
            fired[what] = _wait(stack, what, match, "firing", 240)
            assert _at(fired[what]["started_at"]) > injected, (what, fired[what])
            assert fired[what]["runbook_url"] == f"runbooks/{runbook}.md", fired[what]
        for name in sorted({a["name"] for a in fired.values()}):
            _diagnosis_sees_trouble(stack, name)
    finally:
        # from here the fault is being undone: a resolution may arrive while `undo` still
        # waits for what it restarted (earlier episodes ended before `injected`: _quiet)
        undone = time.time()
        undo()
    for what, (match, _) in expected.items():
        if what in fire_only:
            print(
                f"{what}: started {_at(fired[what]['started_at']) - injected:.0f} s after the fault"
            )
            continue
        done = _wait(stack, what, _after(match, undone), "resolved", resolve_s)
        _timing(what, fired[what]["started_at"], injected, done["ended_at"], undone)
    return fired


def _timing(what: str, started: str, injected: float, ended: str, undone: float) -> None:
    """For the notes (pytest -rA shows it): how long the alert took to fire and to resolve."""
    print(f"{what}: started {_at(started) - injected:.0f} s after the fault, "
          f"ended {_at(ended) - undone:.0f} s after it was undone")  # fmt: skip


def _query(stack: Stack, query: str) -> float:
    """The one sample of an instant query on the stack's Prometheus."""
    got = httpx.get(f"{stack.prometheus_url}/api/v1/query", params={"query": query}, timeout=10)
    (sample,) = got.json()["data"]["result"]
    return float(sample["value"][1])


class _Traffic(threading.Thread):
    """Clients through the gateway until `stop`: each turn reads a post nobody has counted and
    likes a new post as a new user; `written` keeps each like's (post, status)."""

    def __init__(self, stack: Stack, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.stack, self.stop = stack, stop
        self.written: list[tuple[str, int]] = []

    def run(self) -> None:
        with httpx.Client(base_url=self.stack.gateway_url, timeout=10) as client:
            while not self.stop.is_set():
                user, post = f"u-{uuid.uuid4().hex[:8]}", f"post-{uuid.uuid4()}"
                try:
                    client.get(routes.read_path(f"post-{uuid.uuid4()}"))
                    r = client.post(
                        routes.WRITE_PATH,
                        json={"post_id": post, "action": "like"},
                        headers={
                            "authorization": f"Bearer {self.stack.token(user)}",
                            "idempotency-key": str(uuid.uuid4()),
                        },
                    )
                    self.written.append((post, r.status_code))
                except httpx.TransportError:
                    pass
                self.stop.wait(0.2)


def test_a_slow_then_paused_cassandra_fires_each_alert_it_implies_and_all_resolve(
    stack: Stack,
) -> None:
    """First slow: stop-the-world pauses (faults.stop_the_world_pauses) make the reads of posts
    the count-cache lacks late but answered, too many of them over the read latency objective.
    Then paused whole (hung, not refusing), six alerts: the aggregator's flushes fail, the read
    breaker opens, reads of posts the count-cache lacks answer null (degraded: the read SLI's
    own term), writes fail closed after waiting out the edge-store's timeout (slow and failed),
    and the canary's turns fail."""
    slos = {s.name: s for s in alert_rules.default_slos()}
    slow_reads = _named(alert_rules.alert_name(slos["read-latency"]), long_window="1h")
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
        "the write latency burn": _named(
            alert_rules.alert_name(slos["write-latency"]), long_window="1h"
        ),
        alert_rules.CANARY_FAILING: _named(alert_rules.CANARY_FAILING, reason="errors"),
    }
    for what, match in {**expected, "the read latency burn": slow_reads}.items():
        _quiet(stack, what, match)
    stop = threading.Event()
    traffic = _Traffic(stack, stop)
    traffic.start()
    pid = stack.pid("cassandra")
    fired: dict[str, dict[str, Any]] = {}
    injected = time.time()
    with faults.stop_the_world_pauses(pid):
        slow = _wait(stack, "the read latency burn", slow_reads, "firing", 240)
        assert _at(slow["started_at"]) > injected, slow
        assert slow["runbook_url"] == "runbooks/read-latency.md"
        _diagnosis_sees_trouble(stack, slow["name"])
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
        for name in sorted({a["name"] for a in fired.values()}):
            _diagnosis_sees_trouble(stack, name)
    finally:
        os.kill(pid, signal.SIGCONT)
    resumed = time.time()
    try:
        for what, match in expected.items():
            done = _wait(stack, what, _after(match, resumed), "resolved", 300)
            _timing(what, fired[what]["started_at"], injected, done["ended_at"], resumed)
        # fast answers (the breaker's nulls, then the store's) resolved the latency page,
        # maybe while the store was still paused
        done = _wait(stack, "the read latency burn", _after(slow_reads, injected), "resolved", 300)
        _timing("the read latency burn", slow["started_at"], injected, done["ended_at"], resumed)
    finally:
        stop.set()
        traffic.join(timeout=30)
    assert fired[alert_rules.AGGREGATOR_FLUSH_FAILING]["runbook_url"] == (
        "runbooks/aggregator-flush-failing.md"
    )


def _node(stack: Stack, ports: list[int], role: str) -> tuple[int, redis.Redis]:
    """A node of the Redis Cluster on `ports` in `role` (Redis's "master" or "slave"): its
    index there and a client."""
    for i, port in enumerate(ports):
        r = redis.Redis(host=stack.host, port=port, password=stack.redis_password)
        if r.info("replication")["role"] == role:
            return i, r
        r.close()
    raise AssertionError(f"no {role} among {ports}")


def test_independent_outages_fire_their_alerts_and_resolve(stack: Stack) -> None:
    """Five independent faults at once (their alerts read disjoint series, so one wait serves
    all five): the canary stops (its SLIs go blind), Cloudflare's purge API answers 503 (the
    aggregator gives its purges up), one count-cache primary serves far more than the others
    (a hot post reaching its shard instead of the hot pools), Tempo is down (the sampler
    drops what it could not export once its retries run out), and over a thousand poison
    messages reach the DLQ in a (scaled) day. That page resolves when they leave the day's
    window, 24 local minutes on: promtool tests that side (infra/rules/likes.rules.test.yml)."""
    primary = _node(stack, stack.layout.ports.count_cache, "master")[1]
    stop, hot = threading.Event(), threading.Event()

    def hammer() -> None:  # thousands of commands a second on one primary, none on the others
        while not stop.is_set():
            if hot.is_set():
                pipe = primary.pipeline(transaction=False)
                for _ in range(200):
                    pipe.ping()
                pipe.execute()
            stop.wait(0.05)

    threads = [_Traffic(stack, stop), threading.Thread(target=hammer, daemon=True)]
    for t in threads:
        t.start()  # likes of new posts: counts change, so the aggregator purges

    def induce() -> None:
        stack.cli("local", "stop", workloads.CANARY.name)
        stack.cli("local", "stop", OtelCollector.TEMPO)
        faults.set_sink_outage(stack, local_transforms.CLOUDFLARE_SINK, 503)
        hot.set()
        faults.produce_poison(stack, alert_rules.DEAD_LETTER_DAILY_LIMIT + 1)

    def undo() -> None:
        hot.clear()
        faults.set_sink_outage(stack, local_transforms.CLOUDFLARE_SINK, None)
        stack.up()

    try:
        fired = _all_fire_and_resolve(
            stack,
            {
                alert_rules.CANARY_FAILING: (
                    _named(alert_rules.CANARY_FAILING, reason="not-running"),
                    "canary-failing",
                ),
                alert_rules.CDN_PURGE_FAILING: (
                    _named(alert_rules.CDN_PURGE_FAILING),
                    "cdn-purge-failing",
                ),
                alert_rules.COUNT_CACHE_SKEW: (
                    _named(alert_rules.COUNT_CACHE_SKEW),
                    "count-cache-shard-skew",
                ),
                alert_rules.TRACE_EXPORT_FAILING: (
                    _named(alert_rules.TRACE_EXPORT_FAILING),
                    "trace-export-failing",
                ),
                alert_rules.DEAD_LETTER_DAILY_GROWTH: (
                    _named(alert_rules.DEAD_LETTER_DAILY_GROWTH),
                    "dead-letter-growth",
                ),
            },
            induce,
            undo,
            fire_only=frozenset({alert_rules.DEAD_LETTER_DAILY_GROWTH}),
        )
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
    # the purges given up on were the sink's refusals: it holds purges again since
    purges = httpx.get(
        f"http://{stack.host}:{stack.layout.ports.webhook_sink}/{local_transforms.CLOUDFLARE_SINK}",
        timeout=10,
    ).json()
    assert purges and purges[-1]["received_at"] > time.time() - 300
    growth = fired[alert_rules.DEAD_LETTER_DAILY_GROWTH]
    assert growth["labels"]["severity"] == alert_rules.SEVERITY_PAGE


def test_independent_worker_and_cache_faults_fire_their_alerts_and_resolve(stack: Stack) -> None:
    """Five more independent faults at once: the relay hangs whole (SIGSTOP: no replica
    reports its shard leases), the lag exporter stops (consumer lag unknown, not zero), a
    count-cache replica is lost (its primary has none), the canary's posts' counts in the
    count-cache jump between 0 and a million (a stale writer, a failover to a lagging replica):
    after its own like the canary reads a count below one it saw, and an idem-store node is
    given a maxmemory just above what it holds (the local stack sets none: the program's nodes
    have one). Deleting those keys undoes the flicker: the next read fills from the
    counter-store. The idem-store node is a replica, which applies its primary's writes past
    its maxmemory, so no like is refused meanwhile."""
    relay = stack.pid(workloads.OUTBOX_RELAY.name)
    replica_index = _node(stack, stack.layout.ports.count_cache, "slave")[0]
    replica = f"count-cache-{replica_index + 1}"
    idem_replica = _node(stack, stack.layout.ports.idem_store, "slave")[1]
    env = stack.workload_env(workloads.CANARY.name)
    settings = CanarySettings.model_validate(
        {k.removeprefix("LIKES_").lower(): v for k, v in env.items()}
    )
    posts = canary_main.post_ids(settings)
    rc = clients.count_cache(stack.settings())
    stop, flickering = threading.Event(), threading.Event()

    def stale_writer() -> None:
        while not stop.is_set():
            if flickering.is_set():
                for post in posts:
                    if rc.exists(keys.count_key(post)):
                        rc.hset(keys.count_key(post), "count", random.choice((0, 1_000_000)))
            stop.wait(0.25)

    writer = threading.Thread(target=stale_writer, daemon=True)
    writer.start()

    def induce() -> None:
        os.kill(relay, signal.SIGSTOP)
        stack.cli("local", "stop", workloads.CONSUMER_LAG.name)
        stack.cli("local", "stop", replica)
        flickering.set()
        used = int(idem_replica.info("memory")["used_memory"])
        idem_replica.config_set("maxmemory", int(used / 0.95))  # 95 %: over the 85 % line

    def undo() -> None:
        os.kill(relay, signal.SIGCONT)  # before `up`, which would find it unhealthy
        flickering.clear()
        idem_replica.config_set("maxmemory", 0)  # the local stack's: no limit
        time.sleep(1)  # the writer's last pass
        for post in posts:
            rc.delete(keys.count_key(post))
        stack.up()

    try:
        _all_fire_and_resolve(
            stack,
            {
                alert_rules.OUTBOX_SHARDS_UNOWNED: (
                    _named(alert_rules.OUTBOX_SHARDS_UNOWNED, reason="no-relay-reporting"),
                    "outbox-shards-unowned",
                ),
                alert_rules.CONSUMER_LAG_UNKNOWN: (
                    _named(alert_rules.CONSUMER_LAG_UNKNOWN),
                    "consumer-lag-unknown",
                ),
                alert_rules.COUNT_CACHE_REPLICATION: (
                    _named(alert_rules.COUNT_CACHE_REPLICATION, reason="primary-without-replica"),
                    "count-cache-replication-lag",
                ),
                alert_rules.COUNT_FLICKER: (_named(alert_rules.COUNT_FLICKER), "count-flicker"),
                alert_rules.IDEM_STORE_NEARLY_FULL: (
                    _named(alert_rules.IDEM_STORE_NEARLY_FULL),
                    "idem-store-nearly-full",
                ),
            },
            induce,
            undo,
        )
    finally:
        stop.set()
        writer.join(timeout=10)
        idem_replica.config_set("maxmemory", 0)
    assert _query(stack, f"sum(increase({metric_names.CANARY_FLICKERS}[10m]))") > 0


def test_kafka_refusing_writes_and_the_read_service_gone_fire_their_alerts_and_resolve(
    stack: Stack,
) -> None:
    """Two independent faults at once (their alerts read disjoint series). Kafka refuses every
    write to the dead-letter topic, the group offsets and likes.committed (the brokers refuse
    every record there: faults.records_refused): a poison message is skipped with its dead
    letter refused (log-and-advance), the aggregator's offset commits fail, and the like a user
    sends meanwhile is a 202 that waits in the outbox, older than the relay's drain budget, and
    is counted once Kafka takes it again. And the read and write services are gone: neither
    answers 5xx, so their own metrics cannot see themselves gone; their SLIs count the gateway's
    5xx on their clusters (Envoy's stats, scraped as workload=envoy)."""
    slos = {s.name: s for s in alert_rules.default_slos()}
    read_slo = slos["read-availability"]
    expected = {
        alert_rules.DEAD_LETTER_UNAVAILABLE: _named(alert_rules.DEAD_LETTER_UNAVAILABLE),
        alert_rules.AGGREGATOR_COMMIT_FAILING: _named(alert_rules.AGGREGATOR_COMMIT_FAILING),
        "the read burn": _named(alert_rules.alert_name(read_slo), long_window="1h"),
        "the write burn": _named(
            alert_rules.alert_name(slos["write-availability"]), long_window="1h"
        ),
        alert_rules.OUTBOX_EVENTS_STALE: _named(alert_rules.OUTBOX_EVENTS_STALE),
    }
    for what, match in expected.items():
        _quiet(stack, what, match)
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
    writing = _Traffic(stack, stop)  # users liking through the gateway
    post = f"post-{uuid.uuid4()}"
    fired: dict[str, dict[str, Any]] = {}
    injected = time.time()
    try:
        with faults.records_refused(stack, events.DEAD_LETTER, kafka_contract.OFFSETS_TOPIC):
            faults.produce_poison(stack)  # taken: likes.committed still accepts it
            with faults.records_refused(stack, events.COMMITTED):
                r = httpx.post(
                    f"{stack.gateway_url}{routes.WRITE_PATH}",
                    json={"post_id": post, "action": "like"},
                    headers={"authorization": f"Bearer {stack.token(f'u-{uuid.uuid4().hex[:8]}')}",
                             "idempotency-key": str(uuid.uuid4())},
                    timeout=30,
                )  # fmt: skip
                assert r.status_code == 202, r.text
                try:
                    writing.start()
                    stack.cli("local", "stop", workloads.READ.name)
                    stack.cli("local", "stop", workloads.WRITE.name)
                    # the dead letter's page first: its window holds one refused send for a
                    # (scaled) hour, the others hold while their faults do
                    for what, match in expected.items():
                        fired[what] = _wait(stack, what, match, "firing", 240)
                    for name in sorted({a["name"] for a in fired.values()}):
                        _diagnosis_sees_trouble(stack, name)
                finally:
                    stack.up()
        undone = time.time()
        for what, alert in fired.items():
            assert _at(alert["started_at"]) > injected, (what, alert)
        assert fired[alert_rules.OUTBOX_EVENTS_STALE]["runbook_url"] == (
            "runbooks/outbox-events-stale.md"
        )
        assert fired[alert_rules.DEAD_LETTER_UNAVAILABLE]["runbook_url"] == (
            "runbooks/dead-letter-unavailable.md"
        )
        assert fired["the read burn"]["runbook_url"] == "runbooks/read-availability.md"
        assert fired["the write burn"]["runbook_url"] == "runbooks/write-availability.md"
        # nothing accepted is lost: the like that waited in the outbox is counted
        deadline = time.monotonic() + 120
        while httpx.get(f"{stack.gateway_url}{routes.read_path(post)}", timeout=5).json()[
            "count"
        ] != 1:  # fmt: skip
            assert time.monotonic() < deadline, "the like accepted in the fault was never counted"
            time.sleep(2)
        # the aggregator retries its failed commits until the offsets topic takes them again; the
        # dead letters were refused sends: that page resolves once they leave its window
        for what, match in expected.items():
            dead_letter = what == alert_rules.DEAD_LETTER_UNAVAILABLE
            # (an episode before `injected` ended before it: _quiet; the read burn may end
            # while the refusals are still being lifted)
            since = _at(fired[what]["started_at"]) if dead_letter else injected
            done = _wait(stack, what, _after(match, since), "resolved", 240)
            _timing(what, fired[what]["started_at"], injected, done["ended_at"], undone)
    finally:
        stop.set()
        traffic.join(timeout=10)
        writing.join(timeout=10)
    assert 503 in answers and 200 in answers, sorted(set(answers))
    writes = {status for _, status in writing.written}
    assert 503 in writes and 202 in writes, sorted(writes)  # the gateway's, then the service's
    # what fired the read burn: the gateway's term, from Envoy's own series under the workload
    # the program annotates (its pods' scrape annotations; the local Envoy's stats listener)
    query = (
        f"sum(increase({metric_names.ENVOY_CLUSTER_RQ_XX}{{{alert_rules.WORKLOAD_LABEL}="
        f'"{gateway_local.ENVOY}",{metric_names.ENVOY_CLUSTER_LABEL}='
        f'"{metric_names.GATEWAY_READ_CLUSTER}",envoy_response_code_class="5"}}[15m]))'
    )
    assert _query(stack, query) > 0
    # and the partition the poison was on is not left lagging: its position was committed
    deadline = time.monotonic() + 120
    while _query(stack, f"max({metric_names.CONSUMER_LAG_SECONDS}) or vector(0)") > 30:
        assert time.monotonic() < deadline, "a partition lags on after the commits came back"
        time.sleep(2)
    # and it holds: a lag that only dipped would be growing again within a few scrapes
    hold = time.monotonic() + 20
    while time.monotonic() < hold:
        assert _query(stack, f"max({metric_names.CONSUMER_LAG_SECONDS})") <= 30
        time.sleep(2)
