"""The count-cache writes: the aggregate hash and the sub-counters behind one generation CAS.

Layout (read by the read service):
- `count:{post_id}`      hash {count, gen, reactions (JSON object, top first), last_fresh (ms)}
- `count:{post_id}:s<n>` string, the post's count in shard n summed over regions

All keys of a post share the `{post_id}` hash tag, so one script updates them atomically on one
node: it writes only when the new `gen` is greater than the stored one, so a slow (stale) emitter
can overwrite neither the aggregate nor the sub-counters (invariant 4).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from redis.cluster import RedisCluster

from services.contracts import clients, keys

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
