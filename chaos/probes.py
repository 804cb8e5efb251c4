"""The game days' steady state, measured: Chaos Toolkit probes of every experiment's hypothesis.

Before the method (no traffic yet) the hypothesis asks that every server of the local stack
answers. After it, `invariants_hold` stops the traffic and checks what DESIGN.md promises under
any fault, against the stores and the read path, never against the traffic's own belief:

- no accepted like lost (invariant 1): every like that got a 202 is an edge (void or not);
- counts converged (6, services/contracts/convergence.py): every post's count equals its
  non-void liked edges, and still does after the hold; no double count (2) is part of it;
- reads never 5xx (3);
- writes answered 202, 429 or a clean 503 with Retry-After (5), a transport error only where the
  experiment says a hang makes the clients time out (`allow_write_timeouts`);
- the alerts the catalog names for the mode fired after the traffic started and resolved
  (as Alertmanager delivered them to the stack's receivers).

Each check's figures are kept in `last` (the runner puts them in the journal and the report);
the probe's value is whether all held.
"""

from __future__ import annotations

import re
import time
import uuid
from collections import Counter
from datetime import datetime
from typing import Any

import httpx

from chaos import actions, catalog, traffic
from cli import stack_settings
from local import layout
from services.contracts import clients, convergence, dlq, events, routes
from services.contracts import kafka as kafka_contract

last: dict[str, Any] = {}
# how long past the convergence hold an expected alert may take to fire and resolve (locally the
# rules' `for` and ranges are scaled down: local/observability_transforms.py)
ALERT_WAIT_S = 60.0
SCORED_WAIT_S = 90.0  # the abuse scorer's catch-up after a bot storm (invariants_hold)
_ALERT = re.compile(r"^alert: (\w+) -> runbook ")
FIRE_ONLY = " (fire-only)"
NOT_CHECKED = {"Watchdog"}  # always firing: its check is that it keeps arriving, not a resolve


def _holds(mode_id: str | None) -> tuple[str, ...]:
    if not mode_id:
        return ()
    try:
        return catalog.mode(mode_id).holds
    except KeyError:
        return ()


def expected_alerts(mode_id: str | None) -> list[str]:
    """The alerts the catalog says the mode raises (none for an unknown or missing mode)."""
    names = [m.group(1) for h in _holds(mode_id) if (m := _ALERT.match(h))]
    return [n for n in names if n not in NOT_CHECKED]


def fire_only_alerts(mode_id: str | None) -> set[str]:
    """Those of `expected_alerts` marked `(fire-only)`: their window outlasts the experiment
    (DeadLetterDailyGrowth's day is 24 local minutes), so the check is that they fired."""
    return {m.group(1) for h in _holds(mode_id)
            if (m := _ALERT.match(h)) and h.endswith(FIRE_ONLY)}  # fmt: skip


def _fired_and_resolved(
    alerts: dict[str, dict[str, Any]], expected: list[str], fire_only: set[str] | None = None
) -> bool:
    return all(
        (a := alerts.get(name)) is not None
        and a["fired_s"] is not None
        and (
            name in (fire_only or set())
            or (a["resolved_s"] is not None and a["resolved_s"] > a["fired_s"])
        )
        for name in expected
    )


def stack_ready() -> bool:
    """Every server of the local stack answers a real request now."""
    from chaos import actions  # its supervisor is built once per process (a render: seconds)

    health = actions.stack_supervisor().check()
    down = {n: h.reason for n, h in health.items() if not h.healthy}
    last["not_ready"] = down
    return not down


def invariants_hold(
    timeout_s: float = 90.0,
    allow_write_timeouts: bool = False,
    poison_dead_lettered: bool = False,
    configuration: dict[str, Any] | None = None,
) -> bool:
    """Stop the traffic and check the invariants (the module's docstring); with no traffic run
    yet (the hypothesis before the method), that the stack is ready. The experiment's
    `configuration.mode` names its catalog entry, whose `alert: X -> runbook` lines are the
    alerts that must have fired during the run and resolved after it."""
    t = traffic.current()
    if t is None:
        return stack_ready()
    expected = expected_alerts((configuration or {}).get("mode"))
    fire_only = fire_only_alerts((configuration or {}).get("mode"))
    traffic.end()
    summary = t.summary()
    # a bot ring's likes are voided by the abuse scorer, maybe late (it was down, or killed):
    # each void lowers the truth, so the counts are judged once every like is scored, or one
    # matched before a void and "drifted" by it after (a void is not a lost like)
    scored = _ring_scored() if actions.ring() else None
    edges = _Edges(t)
    truth, lost = edges.read()  # once: an edge, void or not, never goes away
    started = time.monotonic()
    trace: list[tuple[float, int]] = []  # (t, likes the counts are off by, over all posts)

    def drift() -> dict[str, int | None]:
        # count minus truth, both read now: the truth moves while the abuse scorer voids (it
        # may be catching up on a backlog), and a count must follow it
        nonlocal truth
        counts = _counts(t)
        truth = edges.read()[0]
        out: dict[str, int | None] = {}
        for p in t.post_ids:
            c = counts[p]
            out[p] = None if c is None else c - truth[p]
        off = sum(abs(d) if d is not None else truth[p] for p, d in out.items())
        trace.append((round(time.monotonic() - t.started, 2), off))
        return out

    try:
        conv = convergence.wait_converged(drift, {p: 0 for p in t.post_ids}, timeout_s=timeout_s)
    finally:
        edges.close()
    checks = {
        "no_accepted_like_lost": not lost,
        "counts_converged": conv.converged,
        "reads_never_5xx": summary["read_5xx"] == 0,
        "writes_clean": _writes_clean(t, allow_write_timeouts),
    }
    if scored is not None:
        checks["ring_scored"] = scored
    poison: dict[str, Any] = {}
    if poison_dead_lettered:
        produced = list(actions.poisoned())
        found = _dead_lettered(produced, kafka_contract.AGGREGATOR_GROUP)
        poison = {"produced": len(produced), "dead_lettered": len(found)}
        checks["poison_dead_lettered"] = bool(produced) and found == set(produced)
    alerts = alerts_since(t.started_wall)
    deadline = time.monotonic() + ALERT_WAIT_S
    while not _fired_and_resolved(alerts, expected, fire_only) and time.monotonic() < deadline:
        time.sleep(2)
        alerts = alerts_since(t.started_wall)
    checks["alerts_fired_and_resolved"] = _fired_and_resolved(alerts, expected, fire_only)
    last.clear()
    last.update(
        alerts=alerts,
        expected_alerts=expected,
        fire_only=sorted(fire_only),
        checks=checks, traffic=summary, timeline=t.timeline(), marks=t.marks, drift=trace,
        lost=[list(p) for p in lost[:20]],
        truth=truth,
        poison=poison,
        convergence={"converged": conv.converged, "first_match_s": conv.first_match_s,
                     "last_drift": conv.last_seen, "broke_drift": conv.broke, "said": str(conv),
                     "checked_for_s": round(time.monotonic() - started, 1)},
    )  # fmt: skip
    return all(checks.values())


def post_cells_spread(shards: int = 8) -> bool:
    """After `invariants_hold` (the traffic stopped, the counts converged): the traffic's first
    post (split `shards` ways during the run) has a counter-store cell with a non-zero value for
    each of shards 0..shards-1, so its events were spread over that many cells. Before the
    method (no traffic yet): true."""
    t = traffic.current()
    if t is None:
        return True
    post = t.post_ids[0]
    cluster, session = clients.cassandra(stack_settings.platform_settings())
    try:
        rows = session.execute("SELECT shard, value FROM counter_cells WHERE post_id = %s", (post,))
        by_shard = Counter[int]()
        for r in rows:
            by_shard[r.shard] += r.value or 0
    finally:
        cluster.shutdown()
    spread = all(by_shard[i] > 0 for i in range(shards))
    last.setdefault("checks", {})["cells_spread"] = spread
    last["cells"] = {"post_id": post, "by_shard": {str(k): v for k, v in sorted(by_shard.items())}}
    return spread


def anonymous_max_age(at_most: int = 30) -> bool:
    """Every traffic post's anonymous read through the gateway answers `Cache-Control` with a
    max-age in 1..`at_most` s (the edge copy's bound when a purge is lost: the read service's
    cold TTL, services/read/heat.py). Before the method (no traffic yet): true."""
    t = traffic.current()
    if t is None:
        return True
    ages: dict[str, int | None] = {}
    with httpx.Client(timeout=5) as c:
        for post in t.post_ids:
            r = c.get(f"{t.gateway_url}{routes.read_path(post)}")
            m = re.search(r"max-age=(\d+)", r.headers.get("cache-control", ""))
            ages[post] = int(m.group(1)) if r.status_code == 200 and m else None
    ok = all(a is not None and 0 < a <= at_most for a in ages.values())
    last.setdefault("checks", {})["edge_ttl_bounded"] = ok
    last["max_age"] = ages
    return ok


def storm_voided(min_voided: float = 0.8, min_degraded: float = 0.5) -> bool:
    """After `invariants_hold` (which waited until every count equals its post's non-void liked
    edges): at least `min_voided` of the bot ring's accepted likes (actions.bot_storm) are void
    in the edge-store, and at least `min_degraded` of its accounts are degraded (the write path
    lets them like once a minute). How many of the other clients' likes were voided is
    reported. Before the method (no traffic yet): true."""
    from services.contracts import degrade

    t = traffic.current()
    if t is None:
        return True
    bots = [p for p in actions.ring() if p in t.ledger]
    users = sorted({u for u, _p in actions.ring()})
    void, _unread = actions.void_likes(sorted(t.ledger))  # an unread like is not void here
    idem = clients.idem_store(stack_settings.platform_settings(), timeout=2.0)
    degraded = sum(degrade.is_degraded(idem, u) for u in users)
    voided = sum(1 for p in bots if p in void)
    ok = bool(bots) and voided >= min_voided * len(bots) and degraded >= min_degraded * len(users)
    last.setdefault("checks", {})["storm_voided"] = ok
    last["storm"] = {"ring_likes_accepted": len(bots), "ring_likes_voided": voided,
                     "accounts": len(users), "degraded": degraded,
                     "other_likes_voided": len(void) - voided}  # fmt: skip
    return ok


def none_voided() -> bool:
    """After `invariants_hold`: none of the traffic's accepted likes is void in the edge-store
    (a bad model's voids all taken back: abuse-bad-model-deploy). Before the method: true."""
    t = traffic.current()
    if t is None:
        return True
    found, unread = actions.void_likes(sorted(t.ledger))
    void = sorted(found | unread)  # an unread like may be void: it fails the check
    last.setdefault("checks", {})["none_voided"] = not void
    last["voided"] = {"accepted": len(t.ledger), "void": len(void), "e.g.": void[:5]}
    return not void


def spike_on_hot_pools(min_share: float = 0.5, flagged: bool = False) -> bool:
    """After `invariants_hold`: at least `min_share` of the run's read spike (actions.read_spike)
    was answered from the hot pools, not from the post's count-cache primary; with `flagged`,
    the hot-key sampler had flagged the post by the spike's end. Before the method: true."""
    t = traffic.current()
    if t is None:
        return True
    seen = actions.spike()
    reads, hits = seen.get("reads", 0), seen.get("hot_pool_hits", 0)
    ok = reads > 0 and hits >= min_share * reads and (seen.get("flagged", False) or not flagged)
    last.setdefault("checks", {})["spike_on_hot_pools"] = ok
    last["spike"] = seen
    return ok


def sampling_moved() -> bool:
    """After `invariants_hold` (the product unaffected): each bad policy the run pushed did what
    it says, counted by the collector itself: `keep-all` kept traces and dropped none,
    `drop-all` dropped traces and kept none. Before the method: true."""
    t = traffic.current()
    if t is None:
        return True
    seen = actions.sampling()
    ok = bool(seen) and all(
        (v["true"] > 0 and v["false"] == 0) if policy == "keep-all"
        else (v["false"] > 0 and v["true"] == 0)
        for policy, v in seen.items()
    )  # fmt: skip
    last.setdefault("checks", {})["sampling_moved"] = ok
    last["sampling"] = seen
    return ok


def _dead_lettered(keys: list[str], group: str, timeout_s: float = 30.0) -> set[str]:
    """Which of these message keys likes.dead-letter holds a record of, sent by `group`."""
    from confluent_kafka import Consumer, TopicPartition

    wanted, found = set(keys), set[str]()
    c = Consumer({**actions.kafka_config(), "group.id": f"gameday-{uuid.uuid4()}",
                  "enable.auto.commit": False})  # fmt: skip
    try:
        md = c.list_topics(events.DEAD_LETTER, timeout=10).topics[events.DEAD_LETTER]
        parts = [TopicPartition(events.DEAD_LETTER, p, 0) for p in md.partitions]
        ends = {tp.partition: c.get_watermark_offsets(tp, timeout=10)[1] for tp in parts}
        c.assign(parts)
        deadline = time.monotonic() + timeout_s
        while found != wanted and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                key = (m.key() or b"").decode(errors="replace")
                headers: Any = m.headers()  # a list of (name, bytes) as consumed
                if key in wanted and dlq.header_map(headers).get(dlq.GROUP) == group:
                    found.add(key)
            elif m is None and all(tp.offset >= ends[tp.partition] for tp in c.position(parts)):
                break
    finally:
        c.close()
    return found


def _ring_scored(timeout_s: float = SCORED_WAIT_S) -> bool:
    """The stack's abuse scorer has committed every like likes.committed holds now (it commits
    after a batch's voids are written), within `timeout_s`."""
    return clients.caught_up(actions.kafka_config(), kafka_contract.ABUSE_GROUP,
                             events.COMMITTED, timeout_s)  # fmt: skip


def _writes_clean(t: traffic.Traffic, allow_timeouts: bool) -> bool:
    for s in t.samples:
        if s.kind != "write" or traffic.clean_write(s):
            continue
        if allow_timeouts and s.status == traffic.TRANSPORT:
            continue
        return False
    return True


class _Edges:
    """Per post, its non-void liked edges among every pair sent (a like whose answer was lost
    may exist too); `liked`: the pairs with a liked edge, void or not."""

    def __init__(self, t: traffic.Traffic) -> None:
        self.t = t
        # the truth is read while the stack recovers on a loaded machine: a generous timeout,
        # and a read that still times out is read again (actions.read_edges), never taken for
        # a missing edge, nor failing the hypothesis (a kafka-broker-loss run deviated on one)
        self.cluster, self.session = clients.cassandra(
            stack_settings.platform_settings(), request_timeout=actions.EDGE_READ_TIMEOUT_S
        )
        self.query = self.session.prepare(
            "SELECT state, void FROM edges WHERE user_id = ? AND kind = 'edge' AND ref = ?"
        )
        self.liked: set[tuple[str, str]] = set()

    def _rows(self, pairs: list[tuple[str, str]]) -> dict[tuple[str, str], Any]:
        got, unread = actions.read_edges(self.session, self.query, pairs)
        if unread:
            raise TimeoutError(f"{len(unread)} edges unread after {actions.EDGE_READ_ATTEMPTS} "
                               f"attempts, e.g. {unread[:3]}")  # fmt: skip
        return got

    def read(self) -> tuple[dict[str, int], list[tuple[str, str]]]:
        pairs = sorted(set(self.t.attempted))
        rows = self._rows(pairs)
        truth: Counter[str] = Counter({p: 0 for p in self.t.post_ids})
        liked: set[tuple[str, str]] = set()
        for pair in pairs:
            row = rows[pair]
            if row is not None and row.state == "liked":
                liked.add(pair)
                if not row.void:
                    truth[pair[1]] += 1
        self.liked = liked
        return dict(truth), sorted(p for p in self.t.ledger if p not in liked)

    def close(self) -> None:
        self.cluster.shutdown()


def _counts(t: traffic.Traffic) -> dict[str, int | None]:
    out: dict[str, int | None] = {}
    with httpx.Client(timeout=5) as c:
        for post in t.post_ids:
            try:
                r = c.get(f"{t.gateway_url}{routes.read_path(post)}")
                out[post] = int(r.json()["count"]) if r.status_code == 200 else None
            except (httpx.HTTPError, ValueError, KeyError):
                out[post] = None
    return out


def alerts_since(since: float) -> dict[str, dict[str, Any]]:
    """What Alertmanager delivered to the stack's receivers (the local webhook sink) since
    `since` (epoch s): per alert name, its receivers and the seconds after `since` it was first
    notified firing and last notified resolved. For the report; a check that an experiment's
    alert fired and resolved comes with the alert timing each mode needs."""
    lay = layout.from_env()
    try:
        r = httpx.get(f"http://{layout.HOST}:{lay.ports.webhook_sink}/", timeout=5)
        entries = r.json() if r.status_code == 200 else []
    except (httpx.HTTPError, ValueError):
        return {}
    return alert_timings(entries, since)


def alert_timings(entries: list[dict[str, Any]], since: float) -> dict[str, dict[str, Any]]:
    """`alerts_since` of the sink's `entries` (each {receiver, received_at, payload}). An alert
    still firing from before `since` counts as fired (Alertmanager repeats its notification):
    telling it from this run's own needs a wait for the expected alerts to be quiet first, which
    measured up to 180 s an experiment in CI (tests run back to back; see issue 14's note). It is
    told apart in the report instead: `carried_over` when every firing notification of the
    alert since `since` is of an episode that started before it (the alert's `startsAt`), so its
    firing cannot be put down to this run's fault."""
    out: dict[str, dict[str, Any]] = {}
    for e in entries:
        at = float(e.get("received_at", 0)) - since
        payload = e.get("payload")
        if at < 0 or not isinstance(payload, dict):
            continue
        for a in payload.get("alerts") or []:
            name = (a.get("labels") or {}).get("alertname")
            if not name:
                continue
            seen = out.setdefault(
                name,
                {"receivers": [], "fired_s": None, "resolved_s": None, "carried_over": None},
            )
            if e["receiver"] not in seen["receivers"]:
                seen["receivers"].append(e["receiver"])
            if a.get("status") == "firing":
                if seen["fired_s"] is None:
                    seen["fired_s"] = round(at, 1)
                began = _epoch(a.get("startsAt"))
                earlier = began is not None and began < since
                seen["carried_over"] = earlier and seen["carried_over"] is not False
            elif a.get("status") == "resolved":
                seen["resolved_s"] = round(at, 1)
    return out


def _epoch(rfc3339: Any) -> float | None:
    """Alertmanager's RFC 3339 time (nanoseconds and a Z) as epoch seconds; None if unreadable."""
    if not isinstance(rfc3339, str):
        return None
    m = re.match(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", rfc3339)
    if m is None:
        return None
    zone = "+00:00" if m.group(3) == "Z" else m.group(3)
    whole = datetime.fromisoformat(m.group(1) + zone).timestamp()
    return whole + float(m.group(2) or 0)
