"""The per-user "has liked" filter: a Bloom filter in one Redis string, sized to what it holds.

Why this shape (issue 10, hole 2). The first design gave every liker a fixed 4096-item rbloom
filter (5.5 KB of Redis memory for a user with one like) without a TTL, written by every like: at
~150 k likers the count-cache was full, aggregate writes failed with OOM and the aggregator
livelocked. Now:

- A filter is a CACHE of the user's liked edges, built from the edge-store (one partition: the
  edge-store is partitioned by user) by the read service on a miss, sized for twice what the
  user holds, and expiring `FILTER_TTL_S` after it was built. Memory follows active readers'
  likes: 44 B for a user with up to 16 likes (+ Redis's ~60 B per key), not 5.5 KB per liker.
  A missing filter means "maybe": the reader confirms on the edge-store, as before.
- Writers (the write service after its edge commit; the aggregator for every like it folds,
  re-driving a write service whose add failed) only ADD to a filter that exists; they never
  create one. So a filter is either absent or complete, never partial.
- A rebuild first claims the key with a marker `~<token>`; an add that finds a marker deletes it
  (the rebuild read the edge-store perhaps before that like committed), and the rebuild installs
  its filter only if its marker is still there. A like committed before the marker is in the
  rebuild's read; one committed after deletes the marker. Either way the filter is complete.
- A user with more than `MAX_CAPACITY` liked edges gets the marker `!` (no filter: every
  has_liked is an edge-store point read) for `BIG_USER_TTL_S`.
- An add that takes a filter past its capacity deletes it: the next miss rebuilds a bigger one,
  so the false-positive rate stays near 1 % instead of degrading.
- Every key has a TTL and the count-cache evicts (`keys.EVICTION_POLICY`, allkeys-lru), so filters
  are evictable like aggregates: neither can starve the other into OOM errors, and an evicted
  filter is just a miss.

Layout of `bloom:{user_id}`:
  bytes 0..3   u32 big-endian, the items added (`BITFIELD ... INCRBY u32 0 1` on a new item)
  bytes 4..    the bit array, m = 8 * (len - 4) bits = BITS_PER_ITEM * capacity
  probe i of a post (i < K) is bit (h1 + i*h2) mod m, h1/h2 two 32-bit words of blake2b(post)
Values shorter than the smallest filter are markers. Positions are computed in the Lua script
from (h1, h2), so an add sends two integers whatever the filter's size (an rbloom filter can only
be merged with one of its own size, which would ship the whole array on every like).
"""

from __future__ import annotations

import hashlib
import math
import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from redis.crc import key_slot

from services.contracts import keys

K = 7  # probes per item: optimal for 10 bits per item (ln 2 * 10 = 6.9), ~0.8 % false positives
BITS_PER_ITEM = 10
MIN_CAPACITY = 32
MAX_CAPACITY = 65_536  # 80 KB; beyond it a filter costs more than the point reads it saves
HEADER_BYTES = 4
MIN_FILTER_BYTES = HEADER_BYTES + MIN_CAPACITY * BITS_PER_ITEM // 8
FILTER_TTL_S = 24 * 3600
BUILD_MARKER_TTL_S = 30
BIG_USER_TTL_S = 3600
BUILDING = b"~"
TOO_BIG = b"!"

# add(filter key, h1, h2): 1 added, 0 no filter (or a marker voided), 2 the filter reached its
# capacity and was dropped.
_ADD_FN = f"""
local function add(key, h1, h2)
  local len = redis.call('STRLEN', key)
  if len == 0 then return 0 end
  if len < {MIN_FILTER_BYTES} then
    local v = redis.call('GET', key)
    if string.sub(v, 1, 1) == '~' then redis.call('DEL', key) end
    return 0
  end
  local m = (len - {HEADER_BYTES}) * 8
  local new = 0
  for i = 0, {K - 1} do
    if redis.call('SETBIT', key, {HEADER_BYTES * 8} + math.fmod(h1 + i * h2, m), 1) == 0 then
      new = 1
    end
  end
  if new == 1 then
    local n = redis.call('BITFIELD', key, 'INCRBY', 'u32', 0, 1)[1]
    if n > m / {BITS_PER_ITEM} then
      redis.call('DEL', key)
      return 2
    end
  end
  return 1
end
"""
# KEYS[1] = filter; ARGV = h1, h2 (one like: the write service)
_ADD = _ADD_FN + "return add(KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]))\n"

# ARGV[1] = "key h1 h2 key h1 h2 ...": many filters in one call (the aggregator), as ONE argument
# (user ids hold no spaces: keys.USER_ID_PATTERN). One argument per key and hash cost redis-py an
# encode and a pack each, most of a bulk add's client time (py-spy of bench/bench_aggregator.py:
# 19 us per add). The filters are in different slots of ONE node: Redis Cluster refuses declared
# keys of several slots (CROSSSLOT), so they are passed as arguments, and the flag lets the script
# touch several slots (Redis >= 7). The caller sends each call to the node that owns every key in
# it; a key whose slot moved since ("non local key") fails the call, and the caller refreshes and
# retries: every add is idempotent.
_ADD_MANY = (
    "#!lua flags=allow-cross-slot-keys\n"
    + _ADD_FN
    + """
local out = {}
for key, h1, h2 in string.gmatch(ARGV[1], '(%S+) (%d+) (%d+)') do
  out[#out + 1] = add(key, tonumber(h1), tonumber(h2))
end
return out
"""
)
# filters per script call: a call holds its node for its duration (~1 µs per SETBIT, 7 per add:
# ~10 ms for 1000), short enough not to stall the node's other clients
ADD_MANY_CHUNK = 1000

# KEYS[1] = filter; ARGV = marker, value, ttl. Installs the value iff our marker is still there.
_INSTALL = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[2], 'EX', ARGV[3])
  return 1
end
return 0
"""


def probes(post_id: str) -> tuple[int, int]:
    """(h1, h2): the same in every process and language (the Lua script recomputes positions)."""
    d = hashlib.blake2b(post_id.encode(), digest_size=8).digest()
    h1 = int.from_bytes(d[:4], "big")
    h2 = int.from_bytes(d[4:], "big") | 1  # odd: the K probes never collapse onto one bit
    return h1, h2


def capacity_for(n: int) -> int:
    """Room for twice what the user holds now, a power of two in [MIN, MAX]."""
    want = max(MIN_CAPACITY, 2 * n)
    return min(MAX_CAPACITY, 1 << math.ceil(math.log2(want)))


def build(post_ids: Sequence[str], capacity: int | None = None) -> bytes:
    """A filter holding post_ids (the rebuild's side), sized by `capacity_for` unless given;
    raises ValueError past MAX_CAPACITY."""
    if len(post_ids) > MAX_CAPACITY:
        raise ValueError(f"{len(post_ids)} items exceed a filter's {MAX_CAPACITY}")
    m = (capacity or capacity_for(len(post_ids))) * BITS_PER_ITEM
    bits = bytearray(m // 8)
    for p in post_ids:
        h1, h2 = probes(p)
        for i in range(K):
            pos = (h1 + i * h2) % m
            bits[pos >> 3] |= 0x80 >> (pos & 7)
    return len(post_ids).to_bytes(HEADER_BYTES, "big") + bytes(bits)


@dataclass(frozen=True)
class Filter:
    bits: bytes

    def __contains__(self, post_id: str) -> bool:
        m = len(self.bits) * 8
        h1, h2 = probes(post_id)
        for i in range(K):
            pos = (h1 + i * h2) % m
            if not self.bits[pos >> 3] & (0x80 >> (pos & 7)):
                return False
        return True

    @property
    def capacity(self) -> int:
        return len(self.bits) * 8 // BITS_PER_ITEM


def load(raw: bytes | None) -> Filter | None:
    """The filter from its stored bytes; None (= "maybe" for everything) if missing, a marker,
    or not a size this module writes."""
    if raw is None or len(raw) < MIN_FILTER_BYTES:
        return None
    bits = raw[HEADER_BYTES:]
    cap = len(bits) * 8 // BITS_PER_ITEM
    if cap * BITS_PER_ITEM != len(bits) * 8 or cap & (cap - 1) or cap > MAX_CAPACITY:
        return None
    return Filter(bytes(bits))


def is_missing(raw: bytes | None) -> bool:
    """True when nothing (not even a marker) is stored: the read service should rebuild."""
    return raw is None


def contains(f: Filter | None, post_id: str) -> bool:
    """False only when the user certainly has not liked the post."""
    return f is None or post_id in f


def _add_args(user_id: str, post_id: str) -> tuple[str, int, int]:
    h1, h2 = probes(post_id)
    return keys.bloom_key(user_id), h1, h2


class SyncRedis(Protocol):
    def eval(self, script: str, numkeys: int, *keys_and_args: Any) -> Any: ...
    def execute_command(self, *args: Any, **options: Any) -> Any: ...


def add(rc: SyncRedis, user_id: str, post_id: str) -> int:
    """Record that `user_id` liked `post_id` in their filter, if they have one (the writers'
    side; call after the edge commit). Idempotent."""
    key, h1, h2 = _add_args(user_id, post_id)
    return int(rc.eval(_ADD, 1, key, h1, h2))


def add_many(rc: Any, pairs: Iterable[tuple[str, str]], chunk: int = ADD_MANY_CHUNK) -> None:
    """`add` for many (user, post) pairs (the aggregator's side): one script call per node per
    up to `chunk` filters, all of a node's calls in one pipeline (one EVALSHA per filter was a
    command, a script run and a reply per like: a window of 100 k likes, 100 k of each)."""
    from services.contracts.clients import eval_per_node

    by_node: dict[str, list[str]] = {}
    hashed: dict[str, str] = {}  # a window's likes share few posts: hash each once
    node_of: dict[int, str] = {}  # slot -> its primary's name (get_node_from_key per key: 6 us)
    for user_id, post_id in dict.fromkeys(pairs):
        h = hashed.get(post_id)
        if h is None:
            h1, h2 = probes(post_id)
            h = hashed[post_id] = f"{h1} {h2}"
        key = keys.bloom_key(user_id)
        slot = key_slot(key.encode())
        node = node_of.get(slot)
        if node is None:
            node = node_of[slot] = rc.nodes_manager.get_node_from_slot(slot).name
        by_node.setdefault(node, []).append(f"{key} {h}")
    calls: list[tuple[Sequence[str], Sequence[Any]]] = []
    route: list[str] = []
    for adds in by_node.values():
        for i in range(0, len(adds), chunk):
            part = adds[i : i + chunk]
            calls.append(((), [" ".join(part)]))
            route.append(part[0].split(" ", 1)[0])  # every key of the call is on this key's node
    eval_per_node(rc, _ADD_MANY, calls, route=route)


async def add_async(rc: Any, user_id: str, post_id: str) -> int:
    """`add` for a redis.asyncio client."""
    key, h1, h2 = _add_args(user_id, post_id)
    return int(await rc.eval(_ADD, 1, key, h1, h2))


def new_marker() -> bytes:
    return BUILDING + secrets.token_hex(8).encode()


async def claim_async(rc: Any, user_id: str, marker: bytes) -> bool:
    """Start a rebuild: True iff nothing was stored (no filter, no other rebuild, no `!`)."""
    return bool(await rc.set(keys.bloom_key(user_id), marker, nx=True, ex=BUILD_MARKER_TTL_S))


async def install_async(rc: Any, user_id: str, marker: bytes, post_ids: Sequence[str]) -> bool:
    """Finish a rebuild: the filter (or `!` past MAX_CAPACITY) iff our marker is still there."""
    if len(post_ids) > MAX_CAPACITY:
        value, ttl = TOO_BIG, BIG_USER_TTL_S
    else:
        value, ttl = build(post_ids), FILTER_TTL_S
    return bool(await rc.eval(_INSTALL, 1, keys.bloom_key(user_id), marker, value, ttl))


def fetch(rc: SyncRedis, user_id: str) -> Filter | None:
    # NEVER_DECODE: the shared clients decode responses, the filter is binary
    raw = rc.execute_command("GET", keys.bloom_key(user_id), NEVER_DECODE=True)
    return load(raw)


def might_contain(rc: SyncRedis, user_id: str, post_id: str) -> bool:
    """The writers'/tools' synchronous check; the read service batches its own GET."""
    return contains(fetch(rc, user_id), post_id)
