"""The abuse features (services/abuse/features.py) with their state in the feature-store (a Redis
Cluster of its own, infra/redis.py), so that several scorer replicas compute one user's features
from all of that user's likes.

Why: likes.committed is keyed by post, so each replica reads a share of every user's likes; a
feature kept in process memory would see half a bot's pace with two replicas. No single key
would make every feature local (they are keyed by user, /24, address and device), so the state
is shared instead of partitioned.

Shape: per like, one script call per thing its features are keyed by (the user; its /24, its
address, its device), each call's keys under one hash tag (services/contracts/keys.py), so each
is atomic on the one node that owns its slot. A batch's calls go in one pipeline per node
(`clients.eval_per_node`, EVALSHA), in the batch's order: the calls on one key run in the order
of its likes, so each row sees the likes before it and itself, as `Features.observe` does.

Same rows: the scripts keep what the in-memory tables keep (the user's likes of the hour, capped
at MAX_EVENTS, with the counts of their /24s, addresses and devices; the users of a /24, address
or device in the hour, capped at MAX_USERS; a /24's likes of the last minute, capped at
MAX_EVENTS), evict as they do (at `<= ts - window`), and the entropies use the one formula
(`features.entropy_bits`) on the counts the scripts sum (n and sum c ln c: two numbers, not
every address of a proxy ring). Times travel as repr/%.17g strings, never as Lua's 14-digit
numbers, so windows and `since_previous_s` are exact. What differs, on purpose:
- Time moves forward per key, not globally (no replica sees every key): a like's windows end
  at its key's newest time if that is later, and a late like is kept at its own time (one
  older than the window is not kept: it left the window already). With likes in order, the
  same.
- Observing a like again changes nothing (its id is in the user's ZSET and the /24's: a
  retried batch, or a batch a rebalance hands to another replica, does not count twice). Its
  pace answers as of its first observation (likes observed since with the same or an earlier
  timestamp aside); its counts of addresses, devices and users include what was observed since.
- Keys expire instead of an LRU over `max_keys`: every key is PEXPIREd `HORIZON_S` at each
  touch (the /24's minute of likes too: a batch held through an outage comes back with likes
  older than the wall clock, and its window is event time), by which time, for a scorer that
  keeps up with the log, every entry it holds has left its window.
- A stored member that does not parse (none is written so) is skipped by the eviction, never
  a script error that would hold every batch.

Memory (feature-store), measured: 152 B of dataset memory per like of generator traffic
(tests/integration/test_shared_features.py prints it with -s: 4,676 likes, 1,919 keys). The
user's ZSET member ("id|ip|/24|device", ~40 B) stays in a listpack below 128 likes an hour
(zset-max-listpack-entries), so a human's likes cost the member and a few bytes; the rest are
the per-key overheads of a user's four keys and the /24, address and device keys, spread over
few likes. At the seed's peak of 93 K likes/s held for the whole 1 h horizon: 93e3 x 3600 =
335 M likes, ~51 GB. The in-memory store needed the same 51 GB in ONE process, which is why it
could not scale; in the idem-store (where this state lived first) it would have filled prod-us's
3 x 16 GiB at ~70 K likes/s, and that store never evicts: a full idem-store fails every like's
dedup closed. So the state has a cluster of its own, sized for the peak (prod: 4 shards x 16
GiB, maxmemory 80 %: 51.2 GiB; stacks/Pulumi.prod-*.yaml) and evicting when full
(keys.EVICTION_POLICY, allkeys-lru): past its size the least recently touched users, /24s,
addresses and devices lose their history (their next like scores as a first one), which only
weakens scores, never a count, and never holds a batch
(tests/integration/test_shared_features.py fills a small one). Its script (an HVALS of the
user's /24s and addresses per like) runs on these nodes too, not on the ones the write path
dedups every like on.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
from collections.abc import Sequence
from typing import Any

from redis.cluster import RedisCluster

from services.abuse import features as f
from services.contracts import clients, events, keys


class FeatureStoreUnavailable(Exception):
    """The feature-store could not observe a batch (down, unreachable, a slot moved): the
    caller holds the batch and retries it, which is safe (observing again changes nothing)."""


# One script, two kinds of call, told apart by their key count: one pipeline per node carries a
# batch's calls of every kind.
#   user (4 keys: likes ZSET, /24s, addresses, devices HASHes)
#     ARGV ts, member "id|ip|/24|device", ip, /24, device ('' = none), horizon, cap, ttl_ms,
#          pace windows short, minute (s)
#     -> {ts, previous ts or '', likes short, minute, hour, n /24, sum c ln c /24,
#         n addresses, sum c ln c addresses, devices}
#   seen (1 key: users ZSET; a /24: 2 keys, + its likes ZSET)
#     ARGV ts, user, like id, horizon, max users, cap, ttl_ms, window_s
#     -> {users, likes in the window (or -1)}
_SCRIPT = r"""
local function fmt(x) return string.format('%.17g', x) end

local function user_call()
  local likes, subs, ips, devs = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  local member, ip, sub, dev = ARGV[2], ARGV[3], ARGV[4], ARGV[5]
  local horizon, cap, ttl = tonumber(ARGV[6]), tonumber(ARGV[7]), ARGV[8]
  local short, minute = tonumber(ARGV[9]), tonumber(ARGV[10])
  local own = redis.call('ZSCORE', likes, member)
  local new = not own
  own = own or ARGV[1]
  local tss = own  -- where the windows end: the like's time, or its key's newest if later
  if new then
    local newest = redis.call('ZRANGE', likes, -1, -1, 'WITHSCORES')
    if newest[2] and tonumber(newest[2]) > tonumber(own) then tss = newest[2] end
  end
  local ts = tonumber(tss)
  -- a like older than the window (late, or retried after it left) is not kept: it would count
  -- as of the newest like otherwise
  local keep = new and tonumber(own) > ts - horizon
  local function dec(h, field)
    if redis.call('HINCRBY', h, field, -1) <= 0 then redis.call('HDEL', h, field) end
  end
  local function forget(m)
    local _, i, s, d = string.match(m, '^([^|]*)|([^|]*)|([^|]*)|([^|]*)$')
    if not d then return end  -- not ours (never written so): nothing it could have counted
    if i ~= '' and s ~= '' then dec(ips, i); dec(subs, s) end
    if d ~= '' then dec(devs, d) end
  end
  if new then
    local expired = fmt(ts - horizon)
    local old = redis.call('ZRANGEBYSCORE', likes, '-inf', expired)
    for _, m in ipairs(old) do forget(m) end
    if #old > 0 then redis.call('ZREMRANGEBYSCORE', likes, '-inf', expired) end
    local over = keep and (redis.call('ZCARD', likes) - cap + 1) or 0
    if over > 0 then
      for _, m in ipairs(redis.call('ZRANGE', likes, 0, over - 1)) do forget(m) end
      redis.call('ZREMRANGEBYRANK', likes, 0, over - 1)
    end
  end
  local prev = ''
  local near = redis.call('ZREVRANGEBYSCORE', likes, tss, '-inf', 'WITHSCORES', 'LIMIT', 0, 2)
  for j = 1, #near, 2 do
    if near[j] ~= member then prev = near[j + 1]; break end
  end
  if keep then
    redis.call('ZADD', likes, own, member)
    if ip ~= '' and sub ~= '' then
      redis.call('HINCRBY', ips, ip, 1)
      redis.call('HINCRBY', subs, sub, 1)
    end
    if dev ~= '' then redis.call('HINCRBY', devs, dev, 1) end
  end
  local function entropy(h)
    local n, s = 0, 0
    for _, c in ipairs(redis.call('HVALS', h)) do
      c = tonumber(c)
      n = n + c
      if c > 1 then s = s + c * math.log(c) end
    end
    return n, fmt(s)
  end
  local nsub, ssub = entropy(subs)
  local nip, sip = entropy(ips)
  local ndev = redis.call('HLEN', devs)
  for k = 1, 4 do redis.call('PEXPIRE', KEYS[k], ttl) end
  return {tss, prev,
          redis.call('ZCOUNT', likes, '(' .. fmt(ts - short), tss),
          redis.call('ZCOUNT', likes, '(' .. fmt(ts - minute), tss),
          redis.call('ZCOUNT', likes, '(' .. fmt(ts - horizon), tss),
          nsub, ssub, nip, sip, ndev}
end

local function seen_call()
  local users, user, id = KEYS[1], ARGV[2], ARGV[3]
  local horizon, max_users, cap = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
  local ttl, window = ARGV[7], tonumber(ARGV[8])
  local own = ARGV[1]
  local tss = own
  local again = KEYS[2] and redis.call('ZSCORE', KEYS[2], id)
  if not again then
    local newest = redis.call('ZRANGE', users, -1, -1, 'WITHSCORES')
    if newest[2] and tonumber(newest[2]) > tonumber(own) then tss = newest[2] end
  end
  local ts = tonumber(tss)
  redis.call('ZADD', users, 'GT', own, user)
  redis.call('ZREMRANGEBYSCORE', users, '-inf', fmt(ts - horizon))
  local over = redis.call('ZCARD', users) - max_users
  if over > 0 then redis.call('ZREMRANGEBYRANK', users, 0, over - 1) end
  redis.call('PEXPIRE', users, ttl)
  local recent = -1
  if KEYS[2] then
    local likes = KEYS[2]
    if not again and tonumber(own) > ts - window then
      redis.call('ZREMRANGEBYSCORE', likes, '-inf', fmt(ts - window))
      local extra = redis.call('ZCARD', likes) - cap + 1
      if extra > 0 then redis.call('ZREMRANGEBYRANK', likes, 0, extra - 1) end
      redis.call('ZADD', likes, own, id)
    end
    recent = redis.call('ZCOUNT', likes, '(' .. fmt(ts - window), tss)
    redis.call('PEXPIRE', likes, ttl)
  end
  return {redis.call('ZCARD', users), recent}
end

if #KEYS == 4 then return user_call() end
return seen_call()
"""

_TTL_MS = str(int(f.HORIZON_S * 1000))


def like_id(o: f.Observation) -> str:
    """A short id for the like (12 characters): what makes observing it twice a no-op. The
    event's id; generated traffic (no id) is identified by who liked what when."""
    ident = o.event_id or f"{o.user_id}|{o.post_id}|{o.ts!r}"
    return base64.urlsafe_b64encode(
        hashlib.blake2b(ident.encode(), digest_size=9).digest()
    ).decode()


class SharedFeatures:
    """`Features`' rows from state in the feature-store (`rc`, a Redis Cluster client). `prefix`
    namespaces the state (the scorer passes its topic prefix: a test or a benchmark on its own
    copies of the topics keeps its own features too)."""

    def __init__(self, rc: RedisCluster, prefix: str = "") -> None:
        self.rc = rc
        self.prefix = prefix

    def observe_many(
        self, likes: Sequence[f.Observation | events.LikeEvent]
    ) -> list[tuple[float, ...]]:
        """Each like's row, as `Features.observe` would give them in this order; raises
        FeatureStoreUnavailable (nothing to undo: observing the batch again is safe)."""
        obs = [o if isinstance(o, f.Observation) else f.Observation.from_event(o) for o in likes]
        calls: list[tuple[Sequence[str], Sequence[Any]]] = []
        where: list[tuple[int, int, int]] = []  # per like: its /24, address and device calls
        for o in obs:
            ip, dev = o.client_ip or None, o.device or None
            sub = f.subnet_of(ip) if ip else None
            lid, ts = like_id(o), repr(o.ts)
            member = f"{lid}|{ip or ''}|{sub or ''}|{dev or ''}"
            calls.append((keys.abuse_user_keys(self.prefix + o.user_id),
                          (ts, member, ip or "", sub or "", dev or "", f.HORIZON_S,
                           f.MAX_EVENTS, _TTL_MS, f.PACE_SHORT_S, f.PACE_MINUTE_S)))  # fmt: skip
            seen = [-1, -1, -1]
            for j, (kind, value) in enumerate((("sub", sub), ("ip", ip), ("dev", dev))):
                if value is None or (kind != "dev" and ip is None):
                    continue
                seen[j] = len(calls)
                calls.append((keys.abuse_seen_keys(kind, self.prefix + value),
                              (ts, o.user_id, lid, f.HORIZON_S, f.MAX_USERS, f.MAX_EVENTS,
                               _TTL_MS, f.SUBNET_WINDOW_S)))  # fmt: skip
            where.append((seen[0], seen[1], seen[2]))
        try:
            out = clients.eval_per_node(self.rc, _SCRIPT, calls)
        except clients.REDIS_ERRORS as e:
            self._refresh()  # a MOVED (failover, resharding): the retry finds the new owner
            raise FeatureStoreUnavailable(f"{type(e).__name__}: {e}") from e
        rows: list[tuple[float, ...]] = []
        i = 0
        for o, (si, ai, di) in zip(obs, where, strict=True):
            rows.append(_row(o, out[i], *(out[x] if x >= 0 else None for x in (si, ai, di))))
            i += 1 + sum(x >= 0 for x in (si, ai, di))
        return rows

    def _refresh(self) -> None:
        # still unreachable: the next attempt refreshes again
        with contextlib.suppress(*clients.REDIS_ERRORS):
            self.rc.nodes_manager.initialize()


def _row(o: f.Observation, u: list[Any], sub: Any, ip: Any, dev: Any) -> tuple[float, ...]:
    tss, prev, w10, w60, n, nsub, ssub, nip, sip, ndev = u
    ts = float(tss)
    since = ts - float(prev) if prev else f.HORIZON_S
    has_ip = int(nsub) > 0
    subnet_h = f.entropy_bits(int(nsub), float(ssub)) if has_ip else f.NAN
    ip_h = max(0.0, f.entropy_bits(int(nip), float(sip)) - subnet_h) if has_ip else f.NAN
    nan = f.NAN
    return (
        float(w10),
        float(w60),
        float(n),
        since,
        subnet_h,
        ip_h,
        float(sub[0]) if sub else nan,
        float(ip[0]) if ip else nan,
        float(sub[1]) if sub else nan,
        float(dev[0]) if dev else nan,
        float(ndev),
        nan if o.account_created is None else max(0.0, ts - o.account_created),
    )


__all__ = ["FeatureStoreUnavailable", "SharedFeatures", "like_id"]
