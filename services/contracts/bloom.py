"""The per-user "has liked" Bloom filter shared by the writers and the read service.

`bloom:{user_id}` holds the bytes of an `rbloom.Bloom.save_bytes()` built with the parameters
below: an 8-byte header (the number of hash functions) followed by the bit array. Every filter has
the same parameters, so OR-ing the bytes of two filters is their union: a writer adds a post by
OR-ing a one-item filter into the user's key (`BITOP OR` through the scratch key, which shares the
hash tag). A missing filter means "maybe": the reader then asks the edge-store.

The filter can only say "no" for posts it was never told about, so every liked edge must be
`add`ed (idempotent: OR-ing twice changes nothing) and the key must not be rebuilt partially.
"""

from __future__ import annotations

import hashlib
from typing import Any, Protocol

from rbloom import Bloom

from services.contracts import keys

EXPECTED_ITEMS = 4096  # per user; beyond it the false-positive rate (not correctness) degrades
FALSE_POSITIVE_RATE = 0.01  # ~4.9 KB per user

# atomic: a concurrent writer cannot overwrite the scratch key between our SET and BITOP
_OR_SCRIPT = """
redis.call('SET', KEYS[2], ARGV[1])
redis.call('BITOP', 'OR', KEYS[1], KEYS[1], KEYS[2])
redis.call('DEL', KEYS[2])
return 1
"""


def stable_hash(item: Any) -> int:
    """A 128-bit signed hash that is the same in every process (rbloom's default is not)."""
    data = item.encode() if isinstance(item, str) else bytes(item)
    return int.from_bytes(hashlib.blake2b(data, digest_size=16).digest(), "big", signed=True)


def new_filter() -> Bloom:
    return Bloom(EXPECTED_ITEMS, FALSE_POSITIVE_RATE, hash_func=stable_hash)


FILTER_BYTES = len(new_filter().save_bytes())


def one_item(post_id: str) -> bytes:
    """The bytes a writer ORs into a user's filter to add one post."""
    f = new_filter()
    f.add(post_id)
    return bytes(f.save_bytes())


def load(raw: bytes | None) -> Bloom | None:
    """The filter from its stored bytes; None (= "maybe" for everything) if missing or foreign."""
    if raw is None or len(raw) != FILTER_BYTES:
        return None
    try:
        return Bloom.load_bytes(raw, stable_hash)
    except (ValueError, TypeError):
        return None


def contains(f: Bloom | None, post_id: str) -> bool:
    """False only when the user certainly has not liked the post."""
    return f is None or post_id in f


class SyncRedis(Protocol):
    def eval(self, script: str, numkeys: int, *keys_and_args: Any) -> Any: ...
    def execute_command(self, *args: Any, **options: Any) -> Any: ...


def add(rc: SyncRedis, user_id: str, post_id: str) -> None:
    """Record that `user_id` liked `post_id` (the writers' side; call after the edge commit)."""
    rc.eval(
        _OR_SCRIPT, 2, keys.bloom_key(user_id), keys.bloom_scratch_key(user_id), one_item(post_id)
    )


async def add_async(rc: Any, user_id: str, post_id: str) -> None:
    """`add` for a redis.asyncio client."""
    await rc.eval(
        _OR_SCRIPT, 2, keys.bloom_key(user_id), keys.bloom_scratch_key(user_id), one_item(post_id)
    )


def fetch(rc: SyncRedis, user_id: str) -> Bloom | None:
    # NEVER_DECODE: the shared clients decode responses, the filter is binary
    raw = rc.execute_command("GET", keys.bloom_key(user_id), NEVER_DECODE=True)
    return load(raw)


def might_contain(rc: SyncRedis, user_id: str, post_id: str) -> bool:
    """The writers'/tools' synchronous check; the read service batches its own GET."""
    return contains(fetch(rc, user_id), post_id)
