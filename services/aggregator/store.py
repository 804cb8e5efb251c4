"""The counter-store side: read a post's cells, and compare-and-set the cells of a window.

Every write is a lightweight transaction conditioned on the applied offset the writer read, and
all of one post's cells go in ONE conditional batch (they share the partition `post_id`, so it is
a single Paxos round, atomic and isolated): one write per (post, cell) per window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent
from cassandra.query import BatchStatement, BatchType, ConsistencyLevel, Statement

from services.aggregator.core import NO_ROW, CellKey, CellRow, CellState
from services.contracts.clients import CASSANDRA_REFUSED

Plan = Sequence[tuple[CellKey, CellState, CellState]]  # (cell, state read, state to write)


def _applied(v: int | None) -> int:
    return NO_ROW if v is None else int(v)


class StoreError(Exception):
    """A counter-store call failed: the window is retried, never skipped."""


class PoisonPosts(StoreError):
    """The store refused some posts' statements for good (clients.CASSANDRA_REFUSED: e.g. a key
    longer than the 64 KiB a partition key may be). Retrying cannot help and would stall every
    partition of the consumer (review D9): the worker dead-letters those posts' events and goes
    on."""

    def __init__(self, errors: Mapping[str, str]) -> None:
        super().__init__(f"{len(errors)} post(s) refused: {next(iter(errors.values()))}")
        self.errors = dict(errors)


class CounterStore:
    def __init__(self, session: Session, concurrency: int = 64) -> None:
        self.session = session
        self.concurrency = concurrency
        p = session.prepare
        self.q_read = p(
            "SELECT region, shard, value, applied_window, reactions FROM counter_cells "
            "WHERE post_id = ?"
        )
        self.q_insert = p(
            "INSERT INTO counter_cells (post_id, region, shard, value, applied_window, reactions, "
            "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) IF NOT EXISTS"
        )
        self.q_update = p(
            "UPDATE counter_cells SET value = ?, applied_window = ?, reactions = ?, updated_at = ? "
            "WHERE post_id = ? AND region = ? AND shard = ? IF applied_window = ?"
        )

    def _run(self, stmts: list[tuple[Statement, Any]], post_ids: Sequence[str]) -> list[Any]:
        """Results in order. Any transient failure raises StoreError (retry the window); if the
        only failures are permanent, PoisonPosts names their posts."""
        if not stmts:
            return []
        results = execute_concurrent(
            self.session, stmts, concurrency=self.concurrency, raise_on_first_error=False
        )
        out = []
        poison: dict[str, str] = {}
        transient: Exception | None = None
        for pid, (ok, res) in zip(post_ids, results, strict=True):
            if ok:
                out.append(res)
            elif isinstance(res, CASSANDRA_REFUSED):
                poison[pid] = f"{type(res).__name__}: {res}"
            else:
                transient = res
        if transient is not None:
            raise StoreError(f"{type(transient).__name__}: {transient}")
        if poison:
            raise PoisonPosts(poison)
        return out

    def read_posts(self, post_ids: Sequence[str], serial: bool = False) -> dict[str, list[CellRow]]:
        """Every cell of each post. `serial` (LOCAL_SERIAL) after a lost CAS: it also finishes
        any in-flight Paxos round, so the retry starts from the latest committed state."""
        cl = ConsistencyLevel.LOCAL_SERIAL if serial else ConsistencyLevel.LOCAL_QUORUM
        stmts: list[tuple[Statement, Any]] = []
        for pid in post_ids:
            b = self.q_read.bind((pid,))
            b.consistency_level = cl
            stmts.append((b, None))
        out: dict[str, list[CellRow]] = {}
        for pid, rs in zip(post_ids, self._run(stmts, post_ids), strict=True):
            out[pid] = [
                CellRow(
                    r.region,
                    r.shard,
                    r.value or 0,
                    _applied(r.applied_window),
                    dict(r.reactions or {}),
                )
                for r in rs
            ]
        return out

    def _statement(self, post_id: str, plan: Plan, now: datetime) -> Statement:
        bound = []
        for cell, old, new in plan:
            reactions = dict(new.reactions)
            if old.exists:
                b = self.q_update.bind(
                    (new.value, new.applied, reactions, now, post_id, cell.region, cell.shard,
                     old.applied)
                )  # fmt: skip
            else:
                b = self.q_insert.bind(
                    (post_id, cell.region, cell.shard, new.value, new.applied, reactions, now)
                )
            bound.append(b)
        stmt: Statement
        if len(bound) == 1:
            stmt = bound[0]
        else:
            batch = BatchStatement(batch_type=BatchType.UNLOGGED)
            for b in bound:
                batch.add(b)
            stmt = batch
        stmt.consistency_level = ConsistencyLevel.LOCAL_QUORUM
        stmt.serial_consistency_level = ConsistencyLevel.LOCAL_SERIAL
        return stmt

    def write_posts(self, plans: Mapping[str, Plan]) -> dict[str, bool]:
        """One conditional write per post; post -> applied (False: a CAS was lost)."""
        now = datetime.now(UTC)
        ids = list(plans)
        stmts: list[tuple[Statement, Any]] = [
            (self._statement(pid, plans[pid], now), None) for pid in ids
        ]
        out = {}
        for pid, rs in zip(ids, self._run(stmts, ids), strict=True):
            rows = list(rs)
            out[pid] = bool(rows and rows[0].applied)
        return out

    def reachable(self) -> bool:
        return any(h.is_up for h in self.session.cluster.metadata.all_hosts())
