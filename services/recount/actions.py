"""What the reconciler changes: one post's correction cell, then its count-cache aggregate."""

from __future__ import annotations

from dataclasses import dataclass

from redis.cluster import RedisCluster

from services.aggregator import cache
from services.aggregator.core import aggregate
from services.aggregator.store import CounterStore
from services.recount import core


@dataclass(frozen=True)
class Applied:
    written: bool  # False: the correction cell moved since it was read (another recount)
    cache_written: bool | None = None  # False: the cache holds a newer gen (see `apply`)


def apply(
    store: CounterStore, rc: RedisCluster, c: core.Correction, now_ms: int, ttl_s: int
) -> Applied:
    """CAS the correction cell, then rewrite the aggregate from a fresh read of every cell.

    The fresh read (not the reading the correction came from) is what the aggregator does too:
    the cells only ever grow in gen, and this read follows the correction, so any aggregate the
    cache may hold with a gen >= this one was read after the correction and includes it."""
    post = c.cell.post_id
    ok = store.write_posts({post: [(c.cell, c.old, c.new)]})[post]
    if not ok:
        return Applied(False)
    a = aggregate(store.read_posts([post])[post])
    written = cache.set_aggregate(
        rc, post, a.count, a.gen, a.reactions, now_ms, a.subcounters, ttl_s=ttl_s
    )
    return Applied(True, written)
