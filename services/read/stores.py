"""The read path's stores: the count-cache (async Redis Cluster) and Cassandra (counter cells and
edges), behind the protocols of services/read/core.py.

Short socket timeouts and no backoff in the Redis client: a read falls through to the next tier
rather than waits. The Cassandra session is opened in the background and reopened on failure, so
the service starts, and answers, with Cassandra down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Sequence
from typing import Any

import orjson
from cassandra import ConsistencyLevel
from cassandra import Unavailable as CassandraUnavailable
from cassandra.cluster import Cluster, ResponseFuture, Session
from cassandra.query import PreparedStatement
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from services.contracts import bloom, clients, keys
from services.contracts.settings import Settings
from services.read.core import Aggregate, Totals
from services.read.metrics import BLOOM_REBUILDS

log = logging.getLogger("read.stores")


def _int(raw: Any) -> int | None:
    if raw is None:
        return None
    try:
        return int(raw)
    except (TypeError, ValueError):
        return None


# The fields of the aggregator's `count:{p}` hash that a read uses, in HMGET order: not HGETALL,
# which also returns the names and fields a read ignores (`gen`), all of them parsed per post.
AGGREGATE_FIELDS = ("count", "reactions", "last_fresh")


def parse_aggregate(values: Sequence[Any]) -> Aggregate | None:
    """The answer of `HMGET count:{p} *AGGREGATE_FIELDS`; None (a miss) when the hash is absent
    (every value None) or has no usable `count`."""
    count = _int(values[0])
    if count is None:
        return None
    reactions: dict[str, int] = {}
    try:
        raw = orjson.loads(values[1] or b"{}")
        if isinstance(raw, dict):
            reactions = {str(r): int(c) for r, c in raw.items()}
    except (ValueError, TypeError):
        pass  # the count is still good; only the breakdown is lost
    return Aggregate(count, reactions, _int(values[2]))


def sum_subcounters(values: Sequence[Any]) -> int | None:
    """A hit when any sub-counter is set; unset shards count 0."""
    parsed = [_int(v) for v in values]
    present = [v for v in parsed if v is not None]
    return sum(present) if present else None


class RedisCountCache:
    def __init__(self, settings: Settings, timeout_s: float = 0.4) -> None:
        self.rc = RedisCluster(
            startup_nodes=[ClusterNode(h, p) for h, p in settings.count_cache_startup],
            password=settings.redis_auth,
            # No socket timeout: every call on this client already runs under a deadline of its
            # caller's (core.Reader's asyncio.timeout per dependency call, the hot-pool fill's
            # and the filter rebuild's wait_for), and redis-py drops a connection whose command
            # was cancelled mid-reply. With one, redis-py wraps each send in asyncio.wait_for,
            # a task per command: 15 % of an anonymous read's CPU (bench/cpu_read.py, 212 -> 182
            # us; a batch of 50, 1,745 -> 1,413 us). A connect still gives up after timeout_s.
            socket_timeout=None,
            socket_connect_timeout=timeout_s,
            # one retry (it reloads the slot map after a failover), and no sleeping between
            retry=Retry(NoBackoff(), 1),
            decode_responses=False,  # the Bloom filter is binary
            max_connections=64,
        )

    async def aggregates(self, post_ids: Sequence[str]) -> list[Aggregate | Exception | None]:
        if len(post_ids) == 1:
            # execute_command, not hmget(): the same HMGET without its argument reshaping
            raw = await self.rc.execute_command(
                "HMGET", keys.count_key(post_ids[0]), *AGGREGATE_FIELDS
            )
            return [parse_aggregate(raw)]
        return await self._pipelined(
            [("HMGET", keys.count_key(p), *AGGREGATE_FIELDS) for p in post_ids], parse_aggregate
        )

    async def subcounters(self, post_ids: Sequence[str]) -> list[int | Exception | None]:
        if len(post_ids) == 1:
            return [sum_subcounters(await self.rc.mget(keys.sub_keys(post_ids[0])))]
        return await self._pipelined(
            [("MGET", *keys.sub_keys(p)) for p in post_ids], sum_subcounters
        )

    async def _pipelined(self, commands: list[tuple[str, ...]], parse: Any) -> list[Any]:
        """One pipeline (grouped by node); on a node failure, per-key calls so that keys on the
        live nodes still answer."""
        pipe = self.rc.pipeline(transaction=False)
        for c in commands:
            pipe.execute_command(*c)
        try:
            raw = await pipe.execute(raise_on_error=False)
        except Exception:
            raw = await asyncio.gather(
                *(self.rc.execute_command(*c) for c in commands), return_exceptions=True
            )
        return [r if isinstance(r, BaseException) else parse(r) for r in raw]

    async def aggregate_hash(self, post_id: str) -> dict[bytes, bytes]:
        """The whole `count:{post}` hash (gen included): what a hot-pool copy is made of."""
        raw = await self.rc.hgetall(keys.count_key(post_id))  # bytes: decode_responses=False
        return {bytes(k): bytes(v) for k, v in raw.items()}  # type: ignore[arg-type]

    async def bloom(self, user_id: str) -> bytes | None:
        raw = await self.rc.get(keys.bloom_key(user_id))
        return raw.encode() if isinstance(raw, str) else raw

    async def warm_up(self, timeout_s: float = 2.0) -> bool:
        """Load the slot map before the first request (it would otherwise eat that request's
        deadline); False, and no harm, when the cluster is down: the first read retries."""
        try:
            await asyncio.wait_for(self.rc.initialize(), timeout_s)
            return True
        except Exception as e:
            log.warning("count-cache unreachable at start", extra={"fields": {"error": repr(e)}})
            return False

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.rc.aclose()


def _aio(rf: ResponseFuture) -> asyncio.Future[Any]:
    """The driver's callback future as an asyncio future (callbacks run on the driver's thread)."""
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if fut.done():  # the caller's deadline cancelled it
            return
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)

    rf.add_callbacks(
        lambda rows: loop.call_soon_threadsafe(settle, True, rows),
        lambda exc: loop.call_soon_threadsafe(settle, False, exc),
    )
    return fut


class CassandraStore:
    """Counter cells and edges; `sums` and `edge_states` raise while no session is open."""

    def __init__(self, settings: Settings, timeout_s: float = 1.0) -> None:
        self.settings = settings
        self.timeout_s = timeout_s
        self.cluster: Cluster | None = None
        self.session: Session | None = None
        self.q_sum: PreparedStatement | None = None
        self.q_edges: PreparedStatement | None = None
        self.q_liked: PreparedStatement | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._connect_loop(), name="cassandra-connect")

    async def _connect_loop(self) -> None:
        delay = 0.5
        while self.session is None:
            try:
                await asyncio.to_thread(self._connect)
                log.info("cassandra session open")
            except Exception as e:
                log.warning("cassandra unreachable; retrying",
                            extra={"fields": {"error": repr(e), "retry_s": delay}})  # fmt: skip
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _connect(self) -> None:
        cluster, session = clients.cassandra(self.settings, request_timeout=self.timeout_s)
        q_sum = session.prepare("SELECT value, reactions FROM counter_cells WHERE post_id = ?")
        # counts are approximate by design: any one replica will do
        q_sum.consistency_level = ConsistencyLevel.LOCAL_ONE
        q_edges = session.prepare(
            "SELECT ref, state FROM edges WHERE user_id = ? AND kind = 'edge' AND ref IN ?"
        )
        # the liker must see their own write (made at LOCAL_QUORUM)
        q_edges.consistency_level = ConsistencyLevel.LOCAL_QUORUM
        self.q_sum, self.q_edges = q_sum, q_edges
        self.cluster, self.session = cluster, session

    def _ready(self) -> tuple[Session, PreparedStatement, PreparedStatement]:
        if self.session is None or self.q_sum is None or self.q_edges is None:
            raise ConnectionError("no cassandra session yet")
        return self.session, self.q_sum, self.q_edges

    async def sums(self, post_ids: Sequence[str]) -> list[Totals | Exception]:
        session, q_sum, _ = self._ready()
        rows_per_post = await asyncio.gather(
            *(_aio(session.execute_async(q_sum, (p,))) for p in post_ids),
            return_exceptions=True,
        )
        out: list[Totals | Exception] = []
        for rows in rows_per_post:
            if isinstance(rows, Exception):
                out.append(rows)
                continue
            if isinstance(rows, BaseException):
                raise rows
            count, reactions = 0, dict[str, int]()
            for r in rows:
                count += r.value or 0
                for name, n in (r.reactions or {}).items():
                    reactions[name] = reactions.get(name, 0) + n
            out.append(Totals(count, reactions))
        return out

    async def edge_states(self, user_id: str, post_ids: Sequence[str]) -> dict[str, str]:
        session, _, q_edges = self._ready()
        bound = q_edges.bind((user_id, list(post_ids)))
        try:
            rows = await _aio(session.execute_async(bound))
        except CassandraUnavailable:
            # a replica short of quorum: a possibly older answer beats none
            bound.consistency_level = ConsistencyLevel.LOCAL_ONE
            rows = await _aio(session.execute_async(bound))
        return {r.ref: r.state for r in rows}

    async def liked_posts(self, user_id: str, limit: int) -> list[str]:
        """The posts the user has liked, at most `limit` (the caller asks for one more than it
        can use, to tell "too many"). One partition, paged by the driver."""
        session, _, _ = self._ready()
        if self.q_liked is None:
            q = session.prepare("SELECT ref, state FROM edges WHERE user_id = ? AND kind = 'edge'")
            q.consistency_level = ConsistencyLevel.LOCAL_QUORUM  # sees the writers' commits
            q.fetch_size = 5000
            self.q_liked = q
        q = self.q_liked

        def read() -> list[str]:  # the driver pages as the result set is iterated
            out: list[str] = []
            for r in session.execute(q, (user_id,), timeout=self.timeout_s * 5):
                if r.state == "liked":
                    out.append(r.ref)
                    if len(out) >= limit:
                        break
            return out

        return await asyncio.to_thread(read)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.cluster is not None:
            await asyncio.to_thread(self.cluster.shutdown)


class FilterRebuilder:
    """Builds a user's has_liked filter from the edge-store after a miss (services/contracts/
    bloom.py has the protocol that keeps it complete), in the background: the request that saw
    the miss already answers from the edge-store. One rebuild per user at a time, at most
    `max_pending` in flight (beyond that a miss just stays a miss: counted, retried next read)."""

    def __init__(
        self, cache: RedisCountCache, store: CassandraStore, *, max_pending: int = 64,
        timeout_s: float = 5.0,
    ) -> None:  # fmt: skip
        self.cache = cache
        self.store = store
        self.max_pending = max_pending
        self.timeout_s = timeout_s
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def request(self, user_id: str) -> None:
        if user_id in self._tasks:
            return
        if len(self._tasks) >= self.max_pending:
            BLOOM_REBUILDS.labels("skipped").inc()
            return
        task = asyncio.create_task(self._rebuild(user_id), name=f"bloom-rebuild-{user_id}")
        self._tasks[user_id] = task
        task.add_done_callback(lambda _t: self._tasks.pop(user_id, None))

    async def _rebuild(self, user_id: str) -> None:
        try:
            outcome = await asyncio.wait_for(self._build(user_id), self.timeout_s)
        except Exception as e:
            outcome = "failed"
            log.warning("has_liked filter rebuild failed",
                        extra={"fields": {"error": repr(e)}})  # fmt: skip
        BLOOM_REBUILDS.labels(outcome).inc()

    async def _build(self, user_id: str) -> str:
        marker = bloom.new_marker()
        if not await bloom.claim_async(self.cache.rc, user_id, marker):
            return "exists"  # a filter, another rebuild, or a user with too many likes
        posts = await self.store.liked_posts(user_id, bloom.MAX_CAPACITY + 1)
        if await bloom.install_async(self.cache.rc, user_id, marker, posts):
            return "built"
        return "raced"  # a like landed during the read: the next miss builds again

    async def close(self) -> None:
        for t in list(self._tasks.values()):
            t.cancel()
        await asyncio.gather(*self._tasks.values(), return_exceptions=True)
