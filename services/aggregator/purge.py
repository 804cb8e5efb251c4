"""CDN purge by surrogate key: an interface, Cloudflare's purge-by-tag, and a local recorder."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from typing import Protocol

import httpx
from redis.cluster import RedisCluster

CF_MAX_TAGS = 100  # tags per purge request
CLOUDFLARE_API = "https://api.cloudflare.com/client/v4"
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


class PurgeFailed(Exception):
    """The CDN refused or did not answer a purge; the aggregator counts it and retries later."""


class CloudflarePurger:
    """Cloudflare's purge by tag (`POST {api}/zones/{zone}/purge_cache {"tags": [...]}`, at most
    100 tags per call) over plain HTTPS: the REST call is all we need, so no SDK to install."""

    def __init__(
        self,
        zone_id: str,
        api_token: str,
        api_url: str = CLOUDFLARE_API,
        client: httpx.Client | None = None,
    ) -> None:
        self.url = f"{api_url.rstrip('/')}/zones/{zone_id}/purge_cache"
        self._headers = {"Authorization": f"Bearer {api_token}"}
        self._client = client or httpx.Client(timeout=5.0)

    def purge(self, tags: list[str]) -> None:
        for batch in batches(sorted(set(tags)), CF_MAX_TAGS):
            try:
                r = self._client.post(self.url, json={"tags": batch}, headers=self._headers)
                body = r.json() if r.content else {}
            except (httpx.HTTPError, ValueError) as e:
                raise PurgeFailed(f"cloudflare purge: {e}") from e
            if r.status_code >= 300 or not body.get("success", False):
                raise PurgeFailed(f"cloudflare purge: HTTP {r.status_code} {str(body)[:200]}")


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
