"""Key names of the count-cache, idem-store, feature-store and etcd, in one place.

The braces are Redis Cluster hash tags: every key of one post (aggregate, sub-counters) lands in
the same slot, so one MGET reads them all; a user's Bloom filter and its scratch key likewise.
"""

from __future__ import annotations

ETCD_PREFIX = "/likes/"
HOTKEYS_PREFIX = ETCD_PREFIX + "hotkeys/"
HEAT_PREFIX = ETCD_PREFIX + "heat/"
SPLIT_PREFIX = ETCD_PREFIX + "split/"
FLAGS_PREFIX = ETCD_PREFIX + "flags/"

# What each Redis role may evict when full, for the program's redis.conf and the local servers.
# The count-cache and hot pools are caches rebuilt from the counter-store / edge-store: evict
# rather than refuse writes (every key they hold also carries a TTL). The idem-store never
# evicts: a lost dedup key is a double count, so a full store refuses writes (fail closed).
# The feature-store (the abuse scorer's shared feature state, services/abuse/shared_features.py)
# evicts: a lost feature only weakens a score (a user's pace restarts from the likes seen
# since), never a count, and a refused write would hold every scoring batch. allkeys-lru rather
# than volatile-lru: every feature key carries a TTL, so the two pick from the same keys today,
# but volatile-lru refuses writes (OOM) once no key with a TTL is left to evict, and a full
# store must evict, never refuse, whatever a key (a future one, a hand-made one) carries.
EVICTION_POLICY = {
    "count-cache": "allkeys-lru",
    "hot-pool": "allkeys-lru",
    "idem-store": "noeviction",
    "feature-store": "allkeys-lru",
}

SPLIT_FACTOR = 8  # sub-keys post_id:0..7 of a split (hot) post

# What a post id may be, for every API: ':' is reserved for the sub-keys of split posts
# (post_id:n) and braces would break the Redis hash tags above.
POST_ID_PATTERN = r"^[A-Za-z0-9_.\-]{1,128}$"
# What a user id (a token's `sub`) may be before it goes into a key: identity providers use
# printable ids ('auth0|abc', emails, UUIDs); braces would break the hash tag of bloom:{user}.
USER_ID_PATTERN = r"^[A-Za-z0-9_.@|:+\-]{1,128}$"
# A reaction name (like, love, wow, ...): a JSON key of the aggregate and a map key of the cells.
REACTION_PATTERN = r"^[a-z_]{1,32}$"


def count_key(post_id: str) -> str:
    return f"count:{{{post_id}}}"


def sub_key(post_id: str, shard: int) -> str:
    return f"count:{{{post_id}}}:s{shard}"


def sub_keys(post_id: str, shards: int = SPLIT_FACTOR) -> list[str]:
    return [sub_key(post_id, n) for n in range(shards)]


def idem_key(user_id: str, post_id: str, intent_uuid: str) -> str:
    return f"idem:{user_id}:{post_id}:{intent_uuid}"


def published_key(event_id: str) -> str:
    """In the idem-store: Kafka acked this outbox event, but its row could not be deleted (the
    edge-store failed the cleanup). The relay reads it before republishing the row: a copy that
    late could be past the aggregator's dedup horizon and count twice (services/relay/core.py)."""
    return f"outbox:published:{event_id}"


def bloom_key(user_id: str) -> str:
    return f"bloom:{{{user_id}}}"


def bloom_scratch_key(user_id: str) -> str:
    return f"bloom:{{{user_id}}}:tmp"


def kafka_key(post_id: str, shard: int) -> str:
    """Partition key: a split post spreads over SPLIT_FACTOR keys (and so partitions)."""
    return post_id if shard == 0 else f"{post_id}:{shard}"


def degraded_key(user_id: str) -> str:
    """In the idem-store: the user is degraded (services/contracts/degrade.py)."""
    return f"abuse:degraded:{{{user_id}}}"


def gate_key(user_id: str) -> str:
    """In the idem-store, the same slot as degraded_key: a degraded user's last admitted like."""
    return f"abuse:gate:{{{user_id}}}"


def storm_key(user_id: str) -> str:
    """In the idem-store, the same slot as degraded_key: the user's voided likes of the last
    storm window (ZSET, services/abuse/scorer.StormWatch), so one script counts and degrades."""
    return f"abuse:storm:{{{user_id}}}"


# In the feature-store: the abuse scorer's shared feature state (services/abuse/shared_features.py).
# One hash tag per thing a feature is keyed by, so the keys one script call touches share a slot.
def abuse_user_keys(user_id: str) -> list[str]:
    """A user's likes of the last hour (ZSET), and the counts of their /24s, addresses and
    devices among those likes (HASHes)."""
    tag = f"abuse:f:{{u:{user_id}}}"
    return [f"{tag}:likes", f"{tag}:subnets", f"{tag}:ips", f"{tag}:devices"]


def abuse_seen_keys(kind: str, value: str) -> list[str]:
    """Who was seen on a /24 (`kind` "sub": also its likes of the last minute), an address
    ("ip") or a device ("dev") (ZSETs)."""
    tag = f"abuse:f:{{{kind}:{value}}}"
    return [f"{tag}:users", f"{tag}:likes"] if kind == "sub" else [f"{tag}:users"]
