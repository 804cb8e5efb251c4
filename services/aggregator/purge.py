"""CDN purge by surrogate key: an interface, Cloudflare's purge-by-tag (retried), the background
purger that keeps the aggregator's loop from waiting on the CDN, and a local recorder."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Protocol

import httpx
from redis.cluster import RedisCluster
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    stop_after_attempt,
    wait_exponential_jitter,
)

from services.aggregator import metrics

log = logging.getLogger("aggregator.purge")

CF_MAX_TAGS = 100  # tags per purge request
# A purge is retried a few times within seconds, then given up: every cached count expires on
# its own within 30 s (the CDN TTL is the safety net), so a later retry would purge nothing.
ATTEMPTS = 4
BACKOFF_INITIAL_S = 0.2
BACKOFF_MAX_S = 2.0
MAX_PENDING = 100_000  # keys waiting for the purge thread; past this they expire by TTL
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
    """The CDN refused or did not answer a purge. `transient`: worth retrying (no answer, 429,
    5xx); a 4xx such as a bad token is not."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message)
        self.transient = transient


def _transient(e: BaseException) -> bool:
    return isinstance(e, PurgeFailed) and e.transient


def _count_retry(state: RetryCallState) -> None:
    metrics.PURGE_RETRIES.inc()


class CloudflarePurger:
    """Cloudflare's purge by tag (`POST {api}/zones/{zone}/purge_cache {"tags": [...]}`, at most
    100 tags per call) over plain HTTPS: the REST call is all we need, so no SDK to install."""

    def __init__(
        self,
        zone_id: str,
        api_token: str,
        api_url: str = CLOUDFLARE_API,
        client: httpx.Client | None = None,
        attempts: int = ATTEMPTS,
    ) -> None:
        self.url = f"{api_url.rstrip('/')}/zones/{zone_id}/purge_cache"
        self.attempts = attempts
        self._headers = {"Authorization": f"Bearer {api_token}"}
        self._client = client or httpx.Client(timeout=5.0)

    def purge(self, tags: list[str]) -> None:
        """Purge every tag, 100 per call, each call retried with backoff while the failure is
        transient; raises PurgeFailed for the first batch given up on."""
        for batch in batches(sorted(set(tags)), CF_MAX_TAGS):
            retrying = Retrying(
                stop=stop_after_attempt(self.attempts),
                wait=wait_exponential_jitter(initial=BACKOFF_INITIAL_S, max=BACKOFF_MAX_S),
                retry=retry_if_exception(_transient),
                before_sleep=_count_retry,
                reraise=True,
            )
            retrying(self._post, batch)
            metrics.PURGED.inc(len(batch))

    def _post(self, batch: list[str]) -> None:
        try:
            r = self._client.post(self.url, json={"tags": batch}, headers=self._headers)
            body = r.json() if r.content else {}
        except (httpx.HTTPError, ValueError) as e:
            raise PurgeFailed(f"cloudflare purge: {e}", transient=True) from e
        if r.status_code >= 300 or not body.get("success", False):
            transient = r.status_code == 429 or r.status_code >= 500
            raise PurgeFailed(
                f"cloudflare purge: HTTP {r.status_code} {str(body)[:200]}", transient=transient
            )


class BackgroundPurger:
    """Purges on its own thread: the aggregator's loop hands the keys over and moves on, so a
    slow or failing CDN never delays a window or its offsets. Keys handed over while a purge
    runs are merged into the next one; past `max_pending` they are dropped (and counted): they
    expire by TTL. A batch the inner purger gives up on is counted and logged, not re-queued."""

    def __init__(self, inner: Purger, max_pending: int = MAX_PENDING) -> None:
        self.inner = inner
        self.max_pending = max_pending
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(target=self._run, name="cdn-purge", daemon=True)
        self._thread.start()

    def purge(self, tags: list[str]) -> None:
        with self._lock:
            room = self.max_pending - len(self._pending)
            new = [t for t in tags if t not in self._pending]
            if len(new) > room:
                metrics.PURGE_DROPPED.inc(len(new) - max(room, 0))
                new = new[: max(room, 0)]
            self._pending.update(new)
            if self._pending:
                self._idle.clear()
        self._wake.set()

    def wait_idle(self, timeout: float) -> bool:
        """True once every key handed over has been purged or given up on (tests, shutdown)."""
        return self._idle.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self._wake.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._lock:
                tags, self._pending = sorted(self._pending), set()
            for batch in batches(tags, CF_MAX_TAGS):
                try:
                    self.inner.purge(batch)
                except Exception as e:
                    metrics.PURGE_FAILURES.inc()
                    log.warning("CDN purge given up", extra={"fields": {"error": str(e)}})
            with self._lock:
                if not self._pending:
                    self._idle.set()
            if self._stop.is_set():
                return


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
        metrics.PURGED.inc(len(set(tags)))

    def recorded(self) -> list[str]:
        """Every tag recorded (tests)."""
        out: list[str] = []
        for raw in self.rc.lrange(self.key, 0, -1):
            out.extend(json.loads(raw)["tags"])
        return out
