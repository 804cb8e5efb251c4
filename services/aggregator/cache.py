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
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import NoScriptError
from redis.retry import Retry

from services.contracts import clients, hotkeys, keys

_CAS_FN = """
local function cas(agg, count, gen, reactions, fresh, ttl, subs, a, n)
  local cur = redis.call('HGET', agg, 'gen')
  if cur and tonumber(cur) >= tonumber(gen) then
    return 0
  end
  redis.call('HSET', agg, 'count', count, 'gen', gen, 'reactions', reactions, 'last_fresh', fresh)
  ttl = tonumber(ttl)
  if ttl > 0 then redis.call('EXPIRE', agg, ttl) end
  for i = a, a + n - 1, 2 do
    if ttl > 0 then
      redis.call('SET', subs[i], subs[i + 1], 'EX', ttl)
    else
      redis.call('SET', subs[i], subs[i + 1])
    end
  end
  return 1
end
"""
# KEYS[1] = aggregate, KEYS[2..] = sub-counters; ARGV = count, gen, reactions, last_fresh, ttl,
# then one value per sub-counter key. Returns 1 if written, 0 if the stored gen is >= gen.
_CAS = (
    _CAS_FN
    + """
local subs = {}
for i = 2, #KEYS do
  subs[#subs + 1] = KEYS[i]
  subs[#subs + 1] = ARGV[4 + i]
end
return cas(KEYS[1], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], subs, 1, #subs)
"""
)
# Many posts of ONE node in one call (the aggregator's windows): ARGV, per post: aggregate key,
# count, gen, reactions, last_fresh, ttl, n, then n items (sub-counter key, value, ...). Keys
# as arguments, with the cross-slot flag, as bloom.py's _ADD_MANY says why; a slot that moved
# fails the call ("non local key"): the caller refreshes and retries, each write gen-guarded.
_CAS_MANY = (
    "#!lua flags=allow-cross-slot-keys\n"
    + _CAS_FN
    + """
local out = {}
local a = 1
while a <= #ARGV do
  local n = tonumber(ARGV[a + 6])
  out[#out + 1] = cas(ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4], ARGV[a + 5],
                      ARGV, a + 7, n)
  a = a + 7 + n
end
return out
"""
)
CAS_MANY_CHUNK = 500  # posts per script run (~1 ms of the node's time)


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
        """items: (post_id, count, gen, reactions, last_fresh, subcounters) -> written?
        One script run per node per CAS_MANY_CHUNK posts, a node's runs in one pipeline."""
        by_node: dict[str, list[int]] = {}
        for i, (post_id, *_rest) in enumerate(items):
            node = self.rc.get_node_from_key(keys.count_key(post_id))
            by_node.setdefault(node.name, []).append(i)
        calls: list[tuple[Sequence[str], Sequence[Any]]] = []
        route: list[str] = []
        order: list[list[int]] = []
        for idx in by_node.values():
            for c in range(0, len(idx), CAS_MANY_CHUNK):
                part = idx[c : c + CAS_MANY_CHUNK]
                argv: list[Any] = []
                for i in part:
                    post_id, count, gen, reactions, fresh, subs = items[i]
                    ks, args = _args(post_id, count, gen, reactions, fresh, subs, self.ttl_s)
                    pairs = [x for k, v in zip(ks[1:], args[5:], strict=True) for x in (k, v)]
                    argv += [ks[0], *args[:5], len(pairs), *pairs]
                calls.append(((), argv))
                route.append(keys.count_key(items[part[0]][0]))
                order.append(part)
        out = [False] * len(items)
        for part, results in zip(order, clients.eval_per_node(self.rc, _CAS_MANY, calls, route),
                                 strict=True):  # fmt: skip
            for i, r in zip(part, results, strict=True):
                out[i] = bool(r)
        return out


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


# (post_id, count, gen, reactions, last_fresh): one aggregate to copy
CopyItem = tuple[str, int, int, Mapping[str, int], int]
COPY_CHUNK = 500  # copies per script run: ~1 ms of a pool's time, short enough to share it


class HotPoolMirror:
    """Always-replicate (contracts/hotkeys.py): every aggregate the aggregator wrote is copied
    into every hot pool with a TTL of `ttl_s`, so a post that goes viral has its count in the 4
    pools before the sampler flags it.

    Best effort by design: the count-cache is the read path's source and the operator re-copies
    flagged posts, so a pool that is down or slow costs a miss there, never a held window. The
    pools are written in parallel (one pipeline each), with a short timeout, and a pool that
    failed is skipped for `cooldown_s` so a dead one costs one timeout per cool-down, not one per
    window.

    What a pool missed (failed or skipped) is kept per pool, the latest copy per post, up to
    `missed_max` posts and no longer than the copies' TTL, and sent with its next copy once it
    answers: a pool back from an outage catches up on the posts liked meanwhile instead of
    missing them until their next like (the gen guard refuses any copy older than the pool's).
    """

    def __init__(
        self,
        addresses: Sequence[tuple[str, int]],
        password: str | None,
        *,
        ttl_s: int = hotkeys.ALWAYS_REPLICATE_TTL_S,
        timeout_s: float = 0.25,
        cooldown_s: float = 5.0,
        missed_max: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.ttl_s, self.cooldown_s, self.clock = ttl_s, cooldown_s, clock
        self.missed_max = missed_max
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
        self.sha = hashlib.sha1(hotkeys.HOT_COPY_MANY_LUA.encode()).hexdigest()
        self._down_until = [0.0] * len(self.clients)
        # per pool: post_id -> (the copy it missed, when)
        self._missed: list[OrderedDict[str, tuple[CopyItem, float]]] = [
            OrderedDict() for _ in self.clients
        ]
        self._pool = ThreadPoolExecutor(max(1, len(self.clients)), "hot-pool-copy")

    def _copy_into(self, i: int, calls: list[tuple[list[str], list[Any]]]) -> list[bool]:
        """calls: (keys, argv) of HOT_COPY_MANY_LUA, one script run each, all in one pipeline.
        Returns, per key in order, whether its copy was written (False: a newer gen was there)."""
        client = self.clients[i]
        for attempt in range(2):
            pipe = client.pipeline(transaction=False)
            for ks, argv in calls:
                pipe.evalsha(self.sha, len(ks), *ks, *argv)
            results = pipe.execute(raise_on_error=False)
            if attempt == 0 and any(isinstance(r, NoScriptError) for r in results):
                client.script_load(hotkeys.HOT_COPY_MANY_LUA)  # a restarted pool lost them
                continue
            errors = [r for r in results if isinstance(r, Exception)]
            if errors:
                raise errors[0]
            return [x == 1 for r in results for x in r]
        raise RuntimeError("unreachable")

    def _copy_args(
        self, count: int, gen: int, reactions: Mapping[str, int], fresh: int
    ) -> list[Any]:
        fields = {"count": count, "gen": gen, "reactions": json.dumps(dict(reactions))}
        fields["last_fresh"] = fresh
        return [self.ttl_s, gen, 2 * len(fields), *(x for kv in fields.items() for x in kv)]

    def _calls(self, items: Sequence[CopyItem]) -> list[tuple[list[str], list[Any]]]:
        calls: list[tuple[list[str], list[Any]]] = []
        for i in range(0, len(items), COPY_CHUNK):
            part = items[i : i + COPY_CHUNK]
            ks = [keys.count_key(post_id) for post_id, *_ in part]
            argv = [a for _p, c, g, r, f in part for a in self._copy_args(c, g, r, f)]
            calls.append((ks, argv))
        return calls

    def _remember(self, i: int, items: Sequence[CopyItem], now: float) -> None:
        missed = self._missed[i]
        for item in items:
            missed[item[0]] = (item, now)
            missed.move_to_end(item[0])
        while len(missed) > self.missed_max:
            missed.popitem(last=False)

    def _catch_up(self, i: int, items: Sequence[CopyItem], now: float) -> list[CopyItem]:
        """What pool `i` missed and still matters (not expired, not superseded by `items`)."""
        current = {item[0] for item in items}
        return [
            item
            for post_id, (item, when) in self._missed[i].items()
            if post_id not in current and now - when < self.ttl_s
        ]

    def copy_many(self, items: Sequence[CopyItem]) -> dict[str, int]:
        """items: (post_id, count, gen, reactions, last_fresh). Returns how many copies were
        written, refused as stale (a newer gen is there), failed and skipped (pool cooling),
        and how many a pool had missed and got now (redriven)."""
        out = {"written": 0, "stale": 0, "failed": 0, "skipped": 0, "redriven": 0}
        if not items or not self.clients:
            return out
        calls = self._calls(items)
        now = self.clock()
        live = []
        for i in range(len(self.clients)):
            if self._down_until[i] <= now:
                live.append(i)
            else:
                self._remember(i, items, now)
        out["skipped"] = len(items) * (len(self.clients) - len(live))
        extra = {i: self._catch_up(i, items, now) for i in live if self._missed[i]}
        futures = {
            i: self._pool.submit(
                self._copy_into, i, self._calls([*items, *extra[i]]) if extra.get(i) else calls
            )
            for i in live
        }
        for i, fut in futures.items():
            try:
                written = fut.result()
            except Exception:
                self._down_until[i] = self.clock() + self.cooldown_s
                self._remember(i, items, now)
                out["failed"] += len(items)
                continue
            self._missed[i].clear()
            n = sum(written[: len(items)])
            out["written"] += n
            out["stale"] += len(items) - n
            out["redriven"] += sum(written[len(items) :])  # missed copies the pool now has
        return out

    def close(self) -> None:
        self._pool.shutdown(wait=False)
        for c in self.clients:
            c.close()
