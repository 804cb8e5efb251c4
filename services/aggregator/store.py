"""The counter-store side: read posts' cells, write a window's cells, CAS a correction cell.

The aggregator's cells are written LAST-WRITE-WINS BY OFFSET, not with a lightweight
transaction: each cell row is written `USING TIMESTAMP CELL_TS_BASE + applied offset`. Why that
is exact (issue 10, speed): a cell is fed by one topic-partition (core.cell_region), and its
value after offset N is a function of that partition's log up to N (the offset filter, and a
dedup decided by the log alone: core.py's module docstring). So any writer's row for offset N
is THE row for N, and of two writers (a previous owner mid-rebalance and its successor) the one
further along the log wins in Cassandra's own reconciliation, on every replica, without a read:
a stale writer's row is shadowed, never merged. The CAS this replaces cost a Paxos round per
post per window: on the local stack 1,400-1,900 conditional writes/s against 10,000+ rows/s in
10-post unlogged batches, and it was 36 % of the aggregator's wall time.

What that demands of the rest: nothing else writes these rows (the reconciler writes its own
`@recount` cell, with a CAS: `write_posts`); CELL_TS_BASE lies above every wall-clock timestamp
until the year 2255, so a row written at wall time (by the CAS of older versions) loses to the
first offset-stamped write, which folded it in. A tie (two writers at the same offset) can only
differ if their dedup sets differed, which the warm re-read on assignment prevents; were it to
happen, Cassandra keeps the larger value per column and the reconciler repairs the post.

Reads go in `IN` queries of READ_CHUNK posts, writes in unlogged batches of WRITE_CHUNK posts
grouped by replica (one round trip each; atomic and isolated per post, which is all a post's
cells need). A chunk the store refuses for good is retried post by post, so PoisonPosts names
only the posts at fault.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from cassandra.cluster import Session
from cassandra.concurrent import execute_concurrent
from cassandra.query import BatchStatement, BatchType, ConsistencyLevel, Statement

from services.aggregator.core import NO_ROW, CellKey, CellRow, CellState
from services.contracts.clients import CASSANDRA_REFUSED

Plan = Sequence[tuple[CellKey, CellState, CellState]]  # (cell, state read, state to write)

CELL_TS_BASE = 1 << 53  # µs: the year 2255; a cell's write timestamp is this + its applied offset
READ_CHUNK = 50  # posts per IN query
# Posts per unlogged batch. The node's CPU is the cost of a cell write: measured on the dev
# stack, 7,300 one-cell posts cost it 2.1 s of CPU in batches of 10 and 1.5 s in batches of 40
# (~1.3 ms a request plus ~170 us a row), and bench_aggregator's flush went from 3.6 to 3.2 s
# (4 runs each). Cassandra warns of a batch over 10 partitions (rate-limited in its log) and of
# one over 5 KiB (not rate-limited: the local node's threshold is raised to Scylla's order,
# local/cassandra/cassandra.yaml); 100 rows stay well under its 50 KiB refusal.
WRITE_CHUNK = 40
WRITE_CHUNK_ROWS = 100  # and rows per batch (a split post has a cell per shard)


def _applied(v: int | None) -> int:
    return NO_ROW if v is None else int(v)


def _one_or_batch(bound: Sequence[Statement]) -> Statement:
    """One statement as itself, several as an unlogged batch; LOCAL_QUORUM."""
    stmt: Statement
    if len(bound) == 1:
        stmt = bound[0]
    else:
        batch = BatchStatement(batch_type=BatchType.UNLOGGED)
        for b in bound:
            batch.add(b)
        stmt = batch
    stmt.consistency_level = ConsistencyLevel.LOCAL_QUORUM
    return stmt


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
        self.q_read_many = p(
            "SELECT post_id, region, shard, value, applied_window, reactions FROM counter_cells "
            "WHERE post_id IN ?"
        )
        self.q_put = p(
            "INSERT INTO counter_cells (post_id, region, shard, value, applied_window, reactions, "
            "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?) USING TIMESTAMP ?"
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

    def _run_chunks(
        self, chunks: list[list[str]], make: Callable[[list[str]], Statement]
    ) -> list[tuple[list[str], Any]]:
        """One statement per chunk of posts; a chunk refused for good is re-run post by post
        (`_run` then raises PoisonPosts naming only the posts at fault)."""
        results = execute_concurrent(
            self.session,
            [(make(c), None) for c in chunks],
            concurrency=self.concurrency,
            raise_on_first_error=False,
        )
        out: list[tuple[list[str], Any]] = []
        single: list[str] = []
        for chunk, (ok, res) in zip(chunks, results, strict=True):
            if ok:
                out.append((chunk, res))
            elif isinstance(res, CASSANDRA_REFUSED):
                single += chunk
            else:
                raise StoreError(f"{type(res).__name__}: {res}")
        if single:
            rs = self._run([(make([p]), None) for p in single], single)
            out += [([p], r) for p, r in zip(single, rs, strict=True)]
        return out

    @staticmethod
    def _row(r: Any) -> CellRow:
        return CellRow(r.region, r.shard, r.value or 0, _applied(r.applied_window),
                       dict(r.reactions or {}))  # fmt: skip

    def read_posts(self, post_ids: Sequence[str]) -> dict[str, list[CellRow]]:
        """Every cell of each post (no cell: an empty list)."""
        out: dict[str, list[CellRow]] = {p: [] for p in post_ids}

        def make(chunk: list[str]) -> Statement:
            b = self.q_read_many.bind((chunk,))
            b.consistency_level = ConsistencyLevel.LOCAL_QUORUM
            return b

        ids = list(out)  # distinct
        chunks = [ids[i : i + READ_CHUNK] for i in range(0, len(ids), READ_CHUNK)]
        for _chunk, rs in self._run_chunks(chunks, make):
            for r in rs:
                out[r.post_id].append(self._row(r))
        return out

    def _chunks_by_replica(self, plans: Mapping[str, Plan]) -> list[list[str]]:
        """Posts in write chunks, each chunk's posts sharing a first replica where the driver
        knows the ring (a batch is sent to its first statement's replica, token-aware)."""
        md = self.session.cluster.metadata
        ks = self.session.keyspace
        groups: dict[Any, list[str]] = {}
        for pid in plans:
            try:
                replicas = md.get_replicas(ks, pid.encode())
            except Exception:
                replicas = []
            groups.setdefault(replicas[0] if replicas else None, []).append(pid)
        chunks: list[list[str]] = []
        for posts in groups.values():
            chunk: list[str] = []
            rows = 0
            for pid in posts:
                n = len(plans[pid])
                if chunk and (len(chunk) >= WRITE_CHUNK or rows + n > WRITE_CHUNK_ROWS):
                    chunks.append(chunk)
                    chunk, rows = [], 0
                chunk.append(pid)
                rows += n
            if chunk:
                chunks.append(chunk)
        return chunks

    def write_cells(self, plans: Mapping[str, Plan]) -> None:
        """The window's cells, last write wins by offset (see the module docstring): no
        condition, no read; a replay writes the same rows again, harmlessly."""
        now = datetime.now(UTC)

        def make(chunk: list[str]) -> Statement:
            bound = []
            for pid in chunk:
                for cell, _old, new in plans[pid]:
                    ts = CELL_TS_BASE + new.applied
                    row = (pid, cell.region, cell.shard, new.value, new.applied, new.reactions)
                    bound.append(self.q_put.bind((*row[:5], dict(row[5]), now, ts)))
            return _one_or_batch(bound)

        self._run_chunks(self._chunks_by_replica(plans), make)

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
        stmt = _one_or_batch(bound)
        stmt.serial_consistency_level = ConsistencyLevel.LOCAL_SERIAL
        return stmt

    def write_posts(self, plans: Mapping[str, Plan]) -> dict[str, bool]:
        """One conditional write per post; post -> applied (False: a CAS was lost). For cells
        with a writer that is not a partition's consumer (the reconciler's correction cell);
        the aggregator's own cells go through `write_cells`."""
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
