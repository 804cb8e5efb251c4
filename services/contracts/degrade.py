"""Degraded accounts: the seed's "storm of bot likes: rate-limiter degrades the user's account
(1/min)". The abuse scorer degrades a user whose likes it voided `STORM_VOIDS` times within
`STORM_WINDOW_S` (counted beside this list, services/abuse/scorer.StormWatch); the write path then
admits one like per `GATE_S` from them and answers the rest 429 `degraded_account` with Retry-After,
before anything is written. Unlikes stay free.

Where the list lives: the idem-store (Redis Cluster, noeviction), the store the write path already
reads before every like and fails closed on. Not etcd: etcd is for small, rarely written
configuration (its values are capped at 1.5 MB a request and the whole store is meant to stay
small, the hot set and the kill switches), and a bot storm degrades users by the thousand. Each
entry is one key with a TTL (`DEGRADED_TTL_S`), ~100 B: a million degraded users is ~100 MB of a
cluster sized for the idempotency keys of a day of likes. A new entry is honoured by the next
like of that user: within milliseconds, on every write-service replica (no cache).

The check and the gate are one script on one node (both keys carry the user's hash tag): one
round trip per like.
"""

from __future__ import annotations

from typing import Any

from services.contracts import keys

GATE_S = 60  # a degraded user's likes: one per minute
DEGRADED_TTL_S = 24 * 3600
STORM_VOIDS = 5  # voids of one user's likes within STORM_WINDOW_S that degrade them
STORM_WINDOW_S = 600.0

# KEYS: degraded, gate; ARGV: gate seconds. 0: admitted; n > 0: refused, retry in n seconds.
_ADMIT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
if redis.call('SET', KEYS[2], '1', 'NX', 'EX', ARGV[1]) then return 0 end
local ttl = redis.call('TTL', KEYS[2])
if ttl < 1 then return 1 end
return ttl
"""


def admit(rc: Any, user_id: str) -> int:
    """0 if a like of `user_id` may go on; else the seconds until a degraded user's next one."""
    return int(rc.eval(_ADMIT, 2, keys.degraded_key(user_id), keys.gate_key(user_id), GATE_S))


def degrade(rc: Any, user_id: str, ttl_s: int = DEGRADED_TTL_S) -> bool:
    """Degrade `user_id` for `ttl_s`; True if they were not degraded already. The scorer's
    storm script sets the same key, as it counts the user's voids (scorer.StormWatch)."""
    return bool(rc.set(keys.degraded_key(user_id), "1", ex=ttl_s, nx=True))


def restore(rc: Any, user_id: str) -> bool:
    """Lift a degradation (a false positive); True if there was one."""
    return bool(rc.delete(keys.degraded_key(user_id), keys.gate_key(user_id)))


def is_degraded(rc: Any, user_id: str) -> bool:
    return bool(rc.exists(keys.degraded_key(user_id)))
