"""The hot-key control plane's etcd values, and the data plane's last-good view of them.

Who writes what (all under keys.ETCD_PREFIX):
- `hotkeys/<post>` sampler, on its lease: {"rate": est. reads/s, "ts": ms}
- `heat/<post>`    sampler, on its lease: "hot" (read TTL 5 s; absent = cold, 30 s)
- `split/<post>`   operator or on-call:   {"factor": 8, "by": "operator"|"manual", "since": ms}
- `hotpool/<post>` operator:              {"pools": ["host:port", ...], "since": ms}

Always-replicate (the seed's mitigation for a flash spike the sampler misses): the aggregator
copies every aggregate it writes into all hot pools for ALWAYS_REPLICATE_TTL_S, so every post liked
in the last 5 minutes has a copy in each pool before anyone flags it; a read pod sends a post to the
pools as soon as its own reads of it reach LOCAL_HOT_READS_PER_S (no etcd round, no sampler
window). Copies are gen-guarded (HOT_COPY_LUA): neither the operator's nor the aggregator's copy
ever rolls a pool back.

A dead sampler's lease expires and its flags with it; the operator then demotes after the
cool-down. The data plane (`PrefixView`) keeps the last good copy for GRACE_S while etcd is
unreachable, then lets it expire (the seed's Config Store: gradual degradation, not a cliff).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import aetcd

from services.contracts import etcd, keys

log = logging.getLogger("hotkeys")

HOTPOOL_PREFIX = keys.ETCD_PREFIX + "hotpool/"
GRACE_S = 300.0  # last good config survives an etcd outage this long
# always-replicate scope: posts whose aggregate was written in the last 5 minutes
ALWAYS_REPLICATE_TTL_S = 300
# a read pod's own threshold to read a post from the hot pools before the sampler flags it
LOCAL_HOT_READS_PER_S = 200

# A pool's copy of `count:{post}`: written only if its `gen` is not older than the pool's (a slow
# writer never rolls a copy back), with a TTL so a copy nobody refreshes dies on its own.
_COPY_FN = """
local function copy(key, ttl, gen, fields)
  local cur = redis.call('HGET', key, 'gen')
  if cur and tonumber(cur) > tonumber(gen) then
    redis.call('EXPIRE', key, ttl)
    return 0
  end
  redis.call('DEL', key)
  redis.call('HSET', key, unpack(fields))
  redis.call('EXPIRE', key, ttl)
  return 1
end
"""
# KEYS[1] = the copy; ARGV = ttl, gen, then field, value pairs.
HOT_COPY_LUA = _COPY_FN + "return copy(KEYS[1], ARGV[1], ARGV[2], {unpack(ARGV, 3)})\n"


def copy_args(source: Mapping[Any, Any], ttl_s: int) -> list[Any]:
    """HOT_COPY_LUA's ARGV for a copy of `source` (a `count:{post}` hash as HGETALL returns it,
    decoded or not): the TTL, its gen (0 when absent), then its field and value pairs."""
    gen = source.get("gen", source.get(b"gen", 0)) or 0
    return [ttl_s, gen, *(item for pair in source.items() for item in pair)]


# Many copies in one call (the aggregator's always-replicate: one script per pool per chunk, not
# a command per post per pool). KEYS = the copies; ARGV, per key: ttl, gen, n, then n field and
# value items. Returns one 1 (written) or 0 (a newer gen is there) per key.
HOT_COPY_MANY_LUA = (
    _COPY_FN
    + """
local out = {}
local a = 1
for k = 1, #KEYS do
  local n = tonumber(ARGV[a + 2])
  out[k] = copy(KEYS[k], ARGV[a], ARGV[a + 1], {unpack(ARGV, a + 3, a + 2 + n)})
  a = a + 3 + n
end
return out
"""
)

T = TypeVar("T")


def now_ms() -> int:
    return int(time.time() * 1000)


def post_of(key: bytes, prefix: str) -> str:
    return key[len(prefix.encode()) :].decode(errors="replace")


def _json(raw: bytes | str) -> dict[str, Any]:
    try:
        d = json.loads(raw)
    except (ValueError, TypeError):
        return {}
    return d if isinstance(d, dict) else {}


# -- values ---------------------------------------------------------------------------------------
def encode_hot(rate: float, ts_ms: int) -> bytes:
    return json.dumps({"rate": round(rate, 1), "ts": ts_ms}).encode()


def decode_hot(raw: bytes | str) -> float:
    """The estimated rate; 0 for garbage (a bad value must not promote a key)."""
    try:
        return max(0.0, float(_json(raw).get("rate", 0.0)))
    except (TypeError, ValueError):
        return 0.0


@dataclass(frozen=True)
class SplitFlag:
    factor: int
    by: str = "operator"
    since_ms: int = 0

    def encode(self) -> bytes:
        return json.dumps({"factor": self.factor, "by": self.by, "since": self.since_ms}).encode()


def decode_split(raw: bytes | str) -> SplitFlag | None:
    """None for garbage; a bare number is accepted (an on-call `etcdctl put`)."""
    d = _json(raw)
    try:
        factor = int(d["factor"]) if d else int(raw)
    except (KeyError, TypeError, ValueError):
        return None
    factor = min(max(factor, 1), keys.SPLIT_FACTOR)  # the aggregator knows shards 0..7 only
    return SplitFlag(factor, str(d.get("by", "manual")), int(d.get("since", 0) or 0))


def encode_pools(pools: list[str], since_ms: int) -> bytes:
    return json.dumps({"pools": pools, "since": since_ms}).encode()


def decode_pools(raw: bytes | str) -> list[str]:
    pools = _json(raw).get("pools")
    return [str(p) for p in pools] if isinstance(pools, list) else []


# -- last good -----------------------------------------------------------------------------------
@dataclass
class LastGood(Generic[T]):
    """A value read from the control plane, kept for `grace_s` after the last successful read."""

    empty: T
    grace_s: float = GRACE_S
    clock: Callable[[], float] = time.monotonic
    value: T | None = None
    ok_at: float | None = None

    def ok(self, value: T) -> None:
        self.value, self.ok_at = value, self.clock()

    def get(self) -> T:
        if self.value is None or self.ok_at is None:
            return self.empty
        if self.clock() - self.ok_at > self.grace_s:
            return self.empty  # expired: behave as if nothing were hot or split
        return self.value

    @property
    def expired(self) -> bool:
        return self.ok_at is None or self.clock() - self.ok_at > self.grace_s


class PrefixView(Generic[T]):
    """Polls one etcd prefix every `interval_s` into {post: decoded value}; readers call
    `current()`, which never blocks and serves the last good map through an etcd outage."""

    def __init__(
        self,
        host: str,
        port: int,
        prefix: str,
        decode: Callable[[bytes], T | None],
        *,
        interval_s: float = 0.5,
        timeout_s: float = 1.0,
        grace_s: float = GRACE_S,
        clock: Callable[[], float] = time.monotonic,
        credentials: etcd.Credentials | None = None,
        ca_file: str | None = None,
    ) -> None:
        self.host, self.port, self.prefix = host, port, prefix
        self.credentials, self.ca_file = credentials, ca_file
        self.decode = decode
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self.last_good: LastGood[dict[str, T]] = LastGood({}, grace_s, clock)
        self._client: aetcd.Client | None = None
        self._task: asyncio.Task[None] | None = None

    def current(self) -> dict[str, T]:
        return self.last_good.get()

    async def refresh(self) -> None:
        if self._client is None:
            self._client = etcd.client(
                self.host, self.port, self.credentials, self.timeout_s, self.ca_file
            )
        client = await etcd.connected(self._client)  # a login has its own, longer deadline
        result = await asyncio.wait_for(client.get_prefix(self.prefix.encode()), self.timeout_s)
        out: dict[str, T] = {}
        for kv in result:
            v = self.decode(kv.value)
            if v is not None:
                out[post_of(kv.key, self.prefix)] = v
        self.last_good.ok(out)  # swapped whole: readers never see a half-built map

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"view:{self.prefix}")

    async def close(self) -> None:
        task, self._task = self._task, None
        client, self._client = self._client, None
        await etcd.stop_poller(task, client)

    async def _run(self) -> None:
        failing = False
        while True:
            try:
                await self.refresh()
                failing = False
            except asyncio.CancelledError:
                raise
            except Exception as e:
                if not failing:
                    fields = {"prefix": self.prefix, "error": repr(e)}
                    log.warning(
                        "etcd unreachable; keeping the last good view", extra={"fields": fields}
                    )
                failing = True
                await self._drop()
            await asyncio.sleep(self.interval_s)

    async def _drop(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            with contextlib.suppress(Exception):
                await client.close()
