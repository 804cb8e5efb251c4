"""CDN purge by surrogate key: an interface, Cloudflare's purge-by-tag, and a local recorder."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

from redis.cluster import RedisCluster

CF_MAX_TAGS = 100  # tags per purge request
RECORD_KEY = "cdn:purges"
RECORD_KEEP = 10_000


def surrogate_key(post_id: str) -> str:
    """The tag the read service puts in its Surrogate-Key / Cache-Tag header for a post."""
    return f"post-{post_id}"


def batches(tags: Sequence[str], size: int) -> Iterator[list[str]]:
    for i in range(0, len(tags), size):
        yield list(tags[i : i + size])


class Purger(Protocol):
    def purge(self, tags: list[str]) -> None: ...


class NullPurger:
    def purge(self, tags: list[str]) -> None:
        pass


class CloudflarePurger:
    """`client.cache.purge(zone_id=..., tags=[...])`, at most 100 tags per call.

    The SDK is imported on first use (it need not be installed where the purger isn't used); a
    pre-built client can be injected.
    """

    def __init__(self, zone_id: str, api_token: str = "", client: Any = None) -> None:
        self.zone_id = zone_id
        self._token = api_token
        self._client = client

    def _sdk(self) -> Any:
        if self._client is None:
            from cloudflare import Cloudflare  # type: ignore[import-not-found,unused-ignore]

            self._client = Cloudflare(api_token=self._token)
        return self._client

    def purge(self, tags: list[str]) -> None:
        client = self._sdk()
        for batch in batches(sorted(set(tags)), CF_MAX_TAGS):
            client.cache.purge(zone_id=self.zone_id, tags=batch)


class RecordingPurger:
    """Local stand-in: appends each purge (tags + time) to the Redis list `cdn:purges`, capped."""

    def __init__(self, rc: RedisCluster, key: str = RECORD_KEY, keep: int = RECORD_KEEP) -> None:
        self.rc = rc
        self.key = key
        self.keep = keep

    def purge(self, tags: list[str]) -> None:
        if not tags:
            return
        now = int(time.time() * 1000)
        pipe = self.rc.pipeline(transaction=False)
        for batch in batches(sorted(set(tags)), CF_MAX_TAGS):
            pipe.rpush(self.key, json.dumps({"tags": batch, "ts": now}))
        pipe.ltrim(self.key, -self.keep, -1)
        pipe.execute()

    def recorded(self) -> list[str]:
        """Every tag recorded (tests)."""
        out: list[str] = []
        for raw in self.rc.lrange(self.key, 0, -1):
            out.extend(json.loads(raw)["tags"])
        return out
