"""Which outbox shards this relay replica drains: one lease per shard, held in the edge-store
(table outbox_relay_leases, see 002_tables.cql for why there and not etcd).

Every replica heartbeats a membership row and computes the same assignment from the live members
(`assign`: shard s to the (s mod n)-th replica by id). It takes the free shards assigned to it,
renews the ones it holds, and gives back the ones assigned to another replica, so that after a
membership change settles every shard has exactly one owner. The LWTs guarantee at most one owner
at any moment; a replica that dies stops renewing, its member row and leases lapse after
RELAY_LEASE_TTL_S and the survivors take its shards at their next renewal (RELAY_TAKEOVER_S).

A replica trusts a lease until RELAY_LEASE_TTL_S minus one renewal after it SENT the renewal (its
own monotonic clock): it stops draining a shard before the lease can lapse in the store. Two owners
for a moment (a pass stalled past that point) only mean a row published twice, which every
consumer dedups on intent_uuid.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

from cassandra.cluster import Session
from cassandra.query import BatchStatement, ConsistencyLevel
from prometheus_client import Gauge

from services.contracts import convergence, metrics
from services.contracts import metrics as metric_names
from services.contracts.clients import CASSANDRA_ERRORS

log = logging.getLogger("relay.leases")

SCOPE = "outbox"
OWNED = Gauge(
    metrics.OUTBOX_RELAY_OWNED_SHARDS, "Outbox shards this relay replica holds a lease on"
)
# Whatever the reason (replicas that see different members, a take refused, a replica that
# heartbeats but cannot write its leases), a shard nobody holds is a shard nobody drains: the
# OutboxShardsUnowned alert reads this. Every replica reports what the lease table showed it.
UNOWNED = Gauge(
    metrics.OUTBOX_RELAY_UNOWNED_SHARDS,
    "Outbox shards with no relay lease, as the lease table showed this replica at its renewal",
)
MEMBERS = Gauge(metric_names.OUTBOX_RELAY_MEMBERS, "Live relay replicas this replica sees")


def assign(members: Sequence[str], shards: int) -> dict[str, frozenset[int]]:
    """Shard s goes to the (s mod n)-th member in id order: every replica that sees the same
    members computes the same, balanced assignment (shard counts differ by at most one)."""
    ordered = sorted(set(members))
    out: dict[str, set[int]] = {m: set() for m in ordered}
    for s in range(shards):
        out[ordered[s % len(ordered)]].add(s)
    return {m: frozenset(v) for m, v in out.items()}


class ShardLeases:
    def __init__(
        self,
        session: Session,
        replica: str,
        shards: int,
        *,
        ttl_s: int = convergence.RELAY_LEASE_TTL_S,
        renew_s: float = convergence.RELAY_LEASE_RENEW_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.session, self.replica, self.shards = session, replica, shards
        self.ttl_s, self.renew_s, self.clock = ttl_s, renew_s, clock
        self._valid_until: dict[int, float] = {}  # shard -> until when this replica trusts it
        self._renewed_at: float | None = None
        p = session.prepare
        self.q_beat = p(
            "INSERT INTO outbox_relay_leases (scope, kind, ref, owner) "
            "VALUES (?, 'member', ?, ?) USING TTL ?"
        )
        self.q_members = p(
            "SELECT ref FROM outbox_relay_leases WHERE scope = ? AND kind = 'member'"
        )
        self.q_members.consistency_level = ConsistencyLevel.LOCAL_QUORUM
        self.q_leases = p(
            "SELECT ref, owner FROM outbox_relay_leases WHERE scope = ? AND kind = 'shard'"
        )
        self.q_leases.consistency_level = ConsistencyLevel.LOCAL_SERIAL  # sees any LWT in flight
        self.q_take = p(
            "INSERT INTO outbox_relay_leases (scope, kind, ref, owner) "
            "VALUES (?, 'shard', ?, ?) IF NOT EXISTS USING TTL ?"
        )
        self.q_renew = p(
            "UPDATE outbox_relay_leases USING TTL ? SET owner = ? "
            "WHERE scope = ? AND kind = 'shard' AND ref = ? IF owner = ?"
        )
        self.q_give = p(
            "DELETE FROM outbox_relay_leases WHERE scope = ? AND kind = 'shard' AND ref = ? "
            "IF owner = ?"
        )
        self.q_leave = p(
            "DELETE FROM outbox_relay_leases WHERE scope = ? AND kind = 'member' AND ref = ?"
        )
        for q in (self.q_take, self.q_renew, self.q_give):
            q.serial_consistency_level = ConsistencyLevel.LOCAL_SERIAL
            q.consistency_level = ConsistencyLevel.LOCAL_QUORUM

    def holds(self, shard: int) -> bool:
        return self._valid_until.get(shard, 0.0) > self.clock()

    def owned(self) -> frozenset[int]:
        now = self.clock()
        return frozenset(s for s, t in self._valid_until.items() if t > now)

    def refresh(self, *, force: bool = False) -> frozenset[int]:
        """Once per renewal period (every call when `force`): heartbeat, then take, renew and
        give back leases toward this replica's share. Returns the shards it may drain now."""
        now = self.clock()
        if not force and self._renewed_at is not None and now - self._renewed_at < self.renew_s:
            return self.owned()
        self._renewed_at = now
        try:
            self._refresh(now)
        except CASSANDRA_ERRORS as e:  # keep what is still valid; the next call tries again
            log.warning("relay lease refresh failed", extra={"fields": {"error": str(e)}})
        owned = self.owned()
        OWNED.set(len(owned))
        return owned

    def _refresh(self, sent: float) -> None:
        ttl = int(self.ttl_s)
        self.session.execute(self.q_beat, (SCOPE, self.replica, self.replica, ttl))
        members = {r.ref for r in self.session.execute(self.q_members, (SCOPE,))}
        members.add(self.replica)  # whatever the read saw: this replica is alive
        MEMBERS.set(len(members))
        mine = assign(sorted(members), self.shards)[self.replica]
        owners = {int(r.ref): r.owner for r in self.session.execute(self.q_leases, (SCOPE,))}
        others = {s for s, owner in owners.items() if owner != self.replica}
        trust_until = sent + self.ttl_s - self.renew_s
        held = sorted(s for s, owner in owners.items() if owner == self.replica)
        for shard in held:
            if shard not in mine:
                self._give(shard)
        self._renew([s for s in held if s in mine], ttl, trust_until)
        for shard in range(self.shards):
            owner = owners.get(shard)
            if owner is None and shard in mine:
                res = self.session.execute(
                    self.q_take, (SCOPE, str(shard), self.replica, ttl)
                ).one()
                self._settle(shard, bool(res and res.applied), trust_until)
            elif owner != self.replica:  # another's: never ours until it lapses or is given back
                self._valid_until.pop(shard, None)
        # after our takes and give-backs: held by another replica, or by us now, or by nobody
        UNOWNED.set(sum(1 for s in range(self.shards) if s not in others and not self.holds(s)))

    def _renew(self, shards: Sequence[int], ttl: int, trust_until: float) -> None:
        """Renew the leases this replica holds and keeps: all in one conditional batch (they
        share the lease partition), one Paxos round instead of one per shard (16 every 2 s, a
        large part of what an idle relay cost the edge-store). A batch applies all or none: if
        any lease was lost meanwhile, each is renewed on its own."""
        if len(shards) > 1:
            batch = BatchStatement(
                consistency_level=ConsistencyLevel.LOCAL_QUORUM,
                serial_consistency_level=ConsistencyLevel.LOCAL_SERIAL,
            )
            for shard in shards:
                batch.add(self.q_renew, (ttl, self.replica, SCOPE, str(shard), self.replica))
            res = self.session.execute(batch).one()
            if res is not None and res.applied:
                for shard in shards:
                    self._settle(shard, True, trust_until)
                return
        for shard in shards:
            res = self.session.execute(
                self.q_renew, (ttl, self.replica, SCOPE, str(shard), self.replica)
            ).one()
            self._settle(shard, bool(res and res.applied), trust_until)

    def _settle(self, shard: int, applied: bool, trust_until: float) -> None:
        if applied:
            self._valid_until[shard] = trust_until
        else:
            self._valid_until.pop(shard, None)

    def _give(self, shard: int) -> None:
        self._valid_until.pop(shard, None)  # stop draining it first
        self.session.execute(self.q_give, (SCOPE, str(shard), self.replica))

    def release(self) -> None:
        """On a clean stop: give every lease back and leave, so the others take over at their
        next renewal instead of after the TTL."""
        held = list(self._valid_until)
        self._valid_until.clear()
        try:
            for shard in held:
                self.session.execute(self.q_give, (SCOPE, str(shard), self.replica))
            self.session.execute(self.q_leave, (SCOPE, self.replica))
        except CASSANDRA_ERRORS as e:  # they lapse after the TTL anyway
            log.warning("relay lease release failed", extra={"fields": {"error": str(e)}})
        OWNED.set(0)
