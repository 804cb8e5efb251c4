"""The count-cache writes: the aggregate hash and the sub-counters behind one generation CAS.

Layout (read by the read service):
- `count:{post_id}`      hash {count, gen, reactions (JSON object, top first), last_fresh (ms)}
- `count:{post_id}:s<n>` string, the post's count in shard n summed over regions

All keys of a post share the `{post_id}` hash tag, so one script updates them atomically on one
node: it writes only when the new `gen` is greater than the stored one, so a slow (stale) emitter
can overwrite neither the aggregate nor the sub-counters (invariant 4).
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError
from redis.retry import Retry

from services.contracts import clients, hotkeys, keys

# KEYS[1] = aggregate, KEYS[2..] = sub-counters; ARGV = count, gen, reactions, last_fresh, ttl,
# then one value per sub-counter key. Returns 1 if written, 0 if the stored gen is >= gen.
_CAS = """
local cur = redis.call('HGET', KEYS[1], 'gen')
local gen = tonumber(ARGV[2])
if cur and tonumber(cur) >= gen then
  return 0
end
redis.call('HSET', KEYS[1], 'count', ARGV[1], 'gen', ARGV[2], 'reactions', ARGV[3],
           'last_fresh', ARGV[4])
local ttl = tonumber(ARGV[5])
if ttl > 0 then redis.call('EXPIRE', KEYS[1], ttl) end
for i = 2, #KEYS do
  if ttl > 0 then
    redis.call('SET', KEYS[i], ARGV[4 + i], 'EX', ttl)
  else
    redis.call('SET', KEYS[i], ARGV[4 + i])
  end
end
return 1
"""


def _args(
    post_id: str,
    count: int,
    gen: int,
    reactions: Mapping[str, int],
    last_fresh: int,
    subcounters: Mapping[int, int] | None,
    ttl_s: int,
) -> tuple[list[str], list[Any]]:
    subs = sorted((subcounters or {}).items())
    ks = [keys.count_key(post_id), *(keys.sub_key(post_id, n) for n, _ in subs)]
    argv: list[Any] = [count, gen, json.dumps(dict(reactions)), last_fresh, ttl_s]
    argv += [v for _, v in subs]
    return ks, argv


def set_aggregate(
    rc: RedisCluster,
    post_id: str,
    count: int,
    gen: int,
    reactions: Mapping[str, int],
    last_fresh: int,
    subcounters: Mapping[int, int] | None = None,
    ttl_s: int = 0,
) -> bool:
    """Write the aggregate (and sub-counters) iff `gen` beats the stored generation."""
    ks, argv = _args(post_id, count, gen, reactions, last_fresh, subcounters, ttl_s)
    return bool(rc.eval(_CAS, len(ks), *ks, *argv))


class AggregateWriter:
    """Many posts' CAS writes, one plain pipeline per primary (`clients.eval_per_node`).

    A MOVED (failover, resharding) raises: the caller retries after `refresh()`, and every write
    is idempotent under its gen.
    """

    def __init__(self, rc: RedisCluster, ttl_s: int = 0) -> None:
        self.rc = rc
        self.ttl_s = ttl_s

    def refresh(self) -> None:
        self.rc.nodes_manager.initialize()

    def epoch(self) -> int:
        """The cluster's current epoch as one node sees it: every failover raises it."""
        raw = self.rc.execute_command("CLUSTER INFO", target_nodes=RedisCluster.RANDOM)
        if isinstance(raw, dict):
            return int(raw["cluster_current_epoch"])
        fields = dict(line.split(":", 1) for line in str(raw).splitlines() if ":" in line)
        return int(fields["cluster_current_epoch"])

    def write_many(
        self,
        items: Sequence[tuple[str, int, int, Mapping[str, int], int, Mapping[int, int]]],
    ) -> list[bool]:
        """items: (post_id, count, gen, reactions, last_fresh, subcounters) -> written?"""
        calls = [
            _args(post_id, count, gen, reactions, fresh, subs, self.ttl_s)
            for post_id, count, gen, reactions, fresh, subs in items
        ]
        return [bool(r) for r in clients.eval_per_node(self.rc, _CAS, calls)]


def read_aggregate(rc: RedisCluster, post_id: str) -> dict[str, Any] | None:
    """The stored aggregate as typed fields (for tests and tools); None if absent."""
    raw = rc.hgetall(keys.count_key(post_id))
    if not raw:
        return None
    return {
        "count": int(raw["count"]),
        "gen": int(raw["gen"]),
        "reactions": json.loads(raw["reactions"]),
        "last_fresh": int(raw["last_fresh"]),
    }


class HotPoolMirror:
    """Always-replicate (contracts/hotkeys.py): every aggregate the aggregator wrote is copied
    into every hot pool with a TTL of `ttl_s`, so a post that goes viral has its count in the 4
    pools before the sampler flags it.

    Best effort by design: the count-cache is the read path's source and the operator re-copies
    flagged posts, so a pool that is down or slow costs a miss there, never a held window. The
    pools are written in parallel (one pipeline each), with a short timeout, and a pool that
    failed is skipped for `cooldown_s` so a dead one costs one timeout per cool-down, not one per
    window.
    """

    def __init__(
        self,
        addresses: Sequence[tuple[str, int]],
        password: str | None,
        *,
        ttl_s: int = hotkeys.ALWAYS_REPLICATE_TTL_S,
        timeout_s: float = 0.25,
        cooldown_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s, self.cooldown_s, self.clock = ttl_s, cooldown_s, clock
        self.addresses = [f"{h}:{p}" for h, p in addresses]
        self.clients = [
            redis.Redis(
                host=h,
                port=p,
                password=password,
                socket_timeout=timeout_s,
                socket_connect_timeout=timeout_s,
                retry=Retry(NoBackoff(), 0),
            )
            for h, p in addresses
        ]
        self.sha = hashlib.sha1(hotkeys.HOT_COPY_LUA.encode()).hexdigest()
        self._down_until = [0.0] * len(self.clients)
        self._pool = ThreadPoolExecutor(max(1, len(self.clients)), "hot-pool-copy")

    def _copy_into(self, i: int, calls: list[tuple[str, list[Any]]]) -> int:
        client = self.clients[i]
        for attempt in range(2):
            pipe = client.pipeline(transaction=False)
            for key, argv in calls:
                pipe.evalsha(self.sha, 1, key, *argv)
            results = pipe.execute(raise_on_error=False)
            if attempt == 0 and any(isinstance(r, NoScriptError) for r in results):
                client.script_load(hotkeys.HOT_COPY_LUA)  # a restarted pool lost its scripts
                continue
            errors = [r for r in results if isinstance(r, Exception)]
            if errors:
                raise errors[0]
            return sum(1 for r in results if r == 1)
        raise RuntimeError("unreachable")

    def _copy_args(
        self, count: int, gen: int, reactions: Mapping[str, int], fresh: int
    ) -> list[Any]:
        fields = {"count": count, "gen": gen, "reactions": json.dumps(dict(reactions))}
        fields["last_fresh"] = fresh
        return [self.ttl_s, gen, *(x for kv in fields.items() for x in kv)]

    def copy_many(
        self, items: Sequence[tuple[str, int, int, Mapping[str, int], int]]
    ) -> dict[str, int]:
        """items: (post_id, count, gen, reactions, last_fresh). Returns how many copies were
        written, refused as stale (a newer gen is there), failed and skipped (pool cooling)."""
        out = {"written": 0, "stale": 0, "failed": 0, "skipped": 0}
        if not items or not self.clients:
            return out
        calls = [
            (keys.count_key(post_id), self._copy_args(count, gen, reactions, fresh))
            for post_id, count, gen, reactions, fresh in items
        ]
        now = self.clock()
        live = [i for i in range(len(self.clients)) if self._down_until[i] <= now]
        out["skipped"] = len(items) * (len(self.clients) - len(live))
        futures = {i: self._pool.submit(self._copy_into, i, calls) for i in live}
        for i, fut in futures.items():
            try:
                written = fut.result()
            except Exception:
                self._down_until[i] = self.clock() + self.cooldown_s
                out["failed"] += len(items)
                continue
            out["written"] += written
            out["stale"] += len(items) - written
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        for c in self.clients:
            c.close()
