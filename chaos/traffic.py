"""The game days' traffic: likes and reads through the gateway, from many users each on an
address of its own, while a fault is on; with a ledger of every like the platform accepted.

Each like is a new (user, post) pair of this run (one like per user: human traffic, so the
stack's abuse scorer leaves it alone), sent with an Idempotency-Key and retried with the same key
as a client would: on a 429 or 503 after its Retry-After (or a short backoff), on a transport
error or another 5xx after a backoff, until it gets a 202 or the run stops. Every attempt is a
`Sample` (time, status, latency, whether a 503 said Retry-After), so the report can draw the
timeline and the hypothesis can check what the clients saw. The ledger holds each pair that got
a 202: those likes must exist (invariant 1) and be counted (6) once the fault is gone.

The traffic runs in threads of the runner's process (Chaos Toolkit runs Python activities in
process): `start` is an experiment's first action, `current()` is what the probes check, `stop`
is idempotent and is in every experiment's rollbacks.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from services.client import client_ip
from services.contracts import routes

TRANSPORT = 0  # a Sample's status when no answer came (timeout, connection refused or reset)
CLEAN = {202, 429}  # the answers a write may give at any time; a 503 only with Retry-After
DROP_READ_S = 0.002  # how long a client that drops its answer waits for it after sending
# The share of reads of the long tail: a post nobody liked, read once (a feed's old post). The
# count-cache holds no aggregate for it, so the read goes on to the counter-store, as production's
# long tail does; with only the traffic's own posts, which the cache holds, an edge-store outage
# reached no read, and whether ReadBreakerOpen fired hung on the canary (2 runs of 3).
TAIL_READS = 0.25


@dataclass(frozen=True, slots=True)
class Sample:
    t: float  # seconds since the traffic started
    kind: str  # "write" or "read"
    status: int  # TRANSPORT when no answer came
    latency_s: float
    retry_after: bool = False


@dataclass
class Traffic:
    gateway_url: str
    token: Callable[[str], str]  # user -> bearer token of the stack's identity provider
    users: int = 400  # likes in all (one per user), spread over `posts`
    posts: int = 8
    writers: int = 4
    readers: int = 2
    write_rate: float = 40.0  # likes a second over all writers (first attempts)
    timeout_s: float = 3.0
    # the share of likes whose first answer the client drops (sdk-network-drop-retry): the
    # request is sent, the client stops reading after DROP_READ_S and retries the same key
    drop_answers: float = 0.0
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    samples: list[Sample] = field(default_factory=list)
    ledger: dict[tuple[str, str], str] = field(default_factory=dict)  # accepted pair -> key
    # accepted pair -> when its 202 came (time.time()): where a latency from the accept starts
    accepted_at: dict[tuple[str, str], float] = field(default_factory=dict)
    attempted: list[tuple[str, str]] = field(default_factory=list)  # every pair sent
    marks: list[tuple[float, str]] = field(default_factory=list)  # (t, what the method did)

    def __post_init__(self) -> None:
        if self.users < 1 or self.posts < 1 or self.writers < 1 or self.readers < 0:
            raise ValueError("users, posts and writers must be >= 1, readers >= 0")
        self.post_ids = [f"gd-{self.run}-p{i}" for i in range(self.posts)]
        self._next = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.started = time.monotonic()
        self.started_wall = time.time()
        self.stopped: float | None = None
        self.dropped = 0  # first answers the client dropped on purpose
        # read_spike's answers (its load generator counts them; they are not in `samples`)
        self.spike_reads = {"n": 0, "5xx": 0, "non_2xx": 0}

    # -- running ------------------------------------------------------------------------------
    def start(self) -> Traffic:
        self.started, self.started_wall = time.monotonic(), time.time()
        for i in range(self.writers):
            self._spawn(self._writer, f"writer-{i}")
        for i in range(self.readers):
            self._spawn(self._reader, f"reader-{i}")
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=self.timeout_s * 3 + 5)
        if self.stopped is None:
            self.stopped = time.monotonic()

    def mark(self, what: str) -> None:
        """Note a fault or a recovery on the timeline (the report shades between them)."""
        with self._lock:
            self.marks.append((round(time.monotonic() - self.started, 2), what))

    @property
    def running(self) -> bool:
        return not self._stop.is_set()

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=target, name=f"traffic-{name}", daemon=True)
        t.start()
        self._threads.append(t)

    def _pair(self) -> tuple[str, str] | None:
        with self._lock:
            if self._next >= self.users:
                return None
            n, self._next = self._next, self._next + 1
        pair = (f"gd-{self.run}-u{n}", self.post_ids[n % self.posts])
        with self._lock:
            self.attempted.append(pair)
        return pair

    def _record(self, s: Sample) -> None:
        with self._lock:
            self.samples.append(s)

    def _writer(self) -> None:
        gap = self.writers / self.write_rate
        with httpx.Client(timeout=self.timeout_s) as c:
            while not self._stop.is_set():
                began = time.monotonic()
                pair = self._pair()
                if pair is None:
                    return
                self._like(c, *pair)
                self._stop.wait(max(0.0, gap - (time.monotonic() - began)))

    def likes_as(
        self,
        likes: list[tuple[str, str, str, dict[str, str]]],
        workers: int = 8,
        retry_throttled: bool = True,
    ) -> int:
        """Likes of other clients than the writers' own, sent now beside them and kept in the
        same ledger: (user, post, token, headers) each (abuse-bot-storm's ring: its own tokens,
        addresses and devices). `retry_throttled=False`: a 429 is a like's last answer, as for
        a bot that moves on when its account is degraded (one like a minute). Returns how many
        were accepted."""
        from concurrent.futures import ThreadPoolExecutor

        with self._lock:
            self.attempted += [(u, p) for u, p, _t, _h in likes]

        def one(like: tuple[str, str, str, dict[str, str]]) -> None:
            with httpx.Client(timeout=self.timeout_s) as c:
                self._like(c, like[0], like[1], like[2], like[3], retry_throttled)

        with ThreadPoolExecutor(workers) as pool:
            list(pool.map(one, likes))
        with self._lock:
            return sum(1 for u, p, _t, _h in likes if (u, p) in self.ledger)

    def _like(
        self,
        c: httpx.Client,
        user: str,
        post: str,
        token: str | None = None,
        extra: dict[str, str] | None = None,
        retry_throttled: bool = True,
    ) -> None:
        key, token = str(uuid.uuid4()), token or self.token(user)
        headers = {"authorization": f"Bearer {token}", "idempotency-key": key,
                   routes.CLIENT_IP_HEADER: client_ip(token), **(extra or {})}  # fmt: skip
        body = {"post_id": post, "action": "like", "reaction": "like"}
        backoff = 0.2
        if self.drop_answers and random.random() < self.drop_answers:
            try:  # sent whole, then no answer read: what a phone losing its network leaves
                r = c.post(f"{self.gateway_url}{routes.WRITE_PATH}", json=body, headers=headers,
                           timeout=httpx.Timeout(self.timeout_s, read=DROP_READ_S))  # fmt: skip
            except httpx.ReadTimeout:
                with self._lock:
                    self.dropped += 1
            except httpx.TransportError:
                pass  # never sent: the retry below is a first attempt
            # an answer that beat the drop is read as the client's first: retried all the same
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                r = c.post(f"{self.gateway_url}{routes.WRITE_PATH}", json=body, headers=headers)
                status, after = r.status_code, r.headers.get("retry-after")
            except httpx.TransportError:
                status, after = TRANSPORT, None
            self._record(Sample(t0 - self.started, "write", status, time.monotonic() - t0,
                                after is not None))  # fmt: skip
            if status == 202:
                with self._lock:
                    self.ledger[(user, post)] = key
                    self.accepted_at[(user, post)] = time.time()
                return
            if 400 <= status < 500 and (status != 429 or not retry_throttled):
                return  # refused for good: not accepted, nothing to retry
            wait = _seconds(after) if after else backoff
            backoff = min(2.0, backoff * 2)
            self._stop.wait(min(wait, 5.0) * random.uniform(0.8, 1.2))

    def _reader(self) -> None:
        with httpx.Client(timeout=self.timeout_s) as c:
            while not self._stop.is_set():
                if random.random() < TAIL_READS:
                    post = f"gd-{self.run}-tail-{uuid.uuid4().hex[:12]}"
                else:
                    post = random.choice(self.post_ids)
                t0 = time.monotonic()
                try:
                    status = c.get(f"{self.gateway_url}{routes.read_path(post)}").status_code
                except httpx.TransportError:
                    status = TRANSPORT
                self._record(Sample(t0 - self.started, "read", status, time.monotonic() - t0))
                self._stop.wait(0.05)

    def read_spike(self, post: str, seconds: float, clients: int = 32) -> dict[str, Any]:
        """A flash crowd on `post`: the repository's load generator (bench/bench_read.py's: its
        own process, asyncio keep-alive connections, so the clients are not what limits the
        rate, as this process's threads were at ~120 reads/s) reads it through the gateway back
        to back for `seconds` over `clients` connections, each request from an address of its
        own (256 in turn). Blocks. Its answers count among the traffic's reads (`spike_reads`:
        a 5xx breaks the reads-never-5xx invariant like any other); returns the generator's
        figures (rps, p50/p99, non_2xx, 5xx)."""
        import json
        import subprocess
        import sys

        loadgen = Path(__file__).resolve().parent.parent / "bench" / "bench_read.py"
        if not loadgen.is_file():
            raise RuntimeError(f"no load generator at {loadgen}: a read spike runs from a clone")
        host, port = self.gateway_url.rsplit("//", 1)[1].rsplit(":", 1)
        from bench import bench_read

        # no traceparent of ours: the gateway puts its own on every read it routes
        requests = [
            bench_read.get(
                routes.read_path(post),
                {routes.CLIENT_IP_HEADER: f"100.{64 + i // 64}.{i % 64}.{1 + i % 250}"},
                traced=False,
            ).hex()
            for i in range(256)
        ]
        spec = {"host": host, "port": int(port), "requests": requests, "concurrency": clients,
                "duration": seconds, "warmup": 0.0}  # fmt: skip
        proc = subprocess.run([sys.executable, str(loadgen), "--loadgen"], input=json.dumps(spec),
                              capture_output=True, text=True, timeout=seconds + 120)  # fmt: skip
        if proc.returncode != 0:
            raise RuntimeError(f"the load generator failed:\n{proc.stderr[-2000:]}")
        out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
        with self._lock:
            self.spike_reads["n"] += int(out["n"]) + int(out["non_2xx"])
            self.spike_reads["5xx"] += int(out["5xx"])
            self.spike_reads["non_2xx"] += int(out["non_2xx"])
        return out

    # -- what the clients saw -----------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        with self._lock:
            samples = list(self.samples)
        writes = [s for s in samples if s.kind == "write"]
        reads = [s for s in samples if s.kind == "read"]

        def statuses(xs: list[Sample]) -> dict[str, int]:
            out: dict[str, int] = {}
            for s in xs:
                k = "transport" if s.status == TRANSPORT else str(s.status)
                out[k] = out.get(k, 0) + 1
            return dict(sorted(out.items()))

        return {
            "run": self.run,
            "posts": self.post_ids,
            "likes_sent": len(self.attempted),
            "likes_accepted": len(self.ledger),
            "answers_dropped": self.dropped,
            "writes": statuses(writes),
            "reads": statuses(reads),
            "unclean_writes": sum(1 for s in writes if not clean_write(s)),
            "read_5xx": sum(1 for s in reads if s.status >= 500) + self.spike_reads["5xx"],
            "spike_reads": dict(self.spike_reads),
            "read_transport": sum(1 for s in reads if s.status == TRANSPORT),
        }

    def timeline(self, bucket_s: float = 1.0) -> list[dict[str, float]]:
        """Per `bucket_s`: write and read success ratios and their p99 latency (ms)."""
        with self._lock:
            samples = list(self.samples)
        buckets: dict[int, list[Sample]] = {}
        for s in samples:
            buckets.setdefault(int(s.t // bucket_s), []).append(s)
        out = []
        for b in sorted(buckets):
            row: dict[str, float] = {"t": b * bucket_s}
            for kind, ok in (("write", {202}), ("read", {200})):
                xs = [s for s in buckets[b] if s.kind == kind]
                if xs:
                    row[f"{kind}_ok"] = sum(1 for s in xs if s.status in ok) / len(xs)
                    lat = sorted(s.latency_s for s in xs)
                    row[f"{kind}_p99_ms"] = 1000 * lat[min(len(lat) - 1, int(0.99 * len(lat)))]
            out.append(row)
        return out


def clean_write(s: Sample) -> bool:
    """A write answer the clients may see under any fault: 202, 429, or a 503 with Retry-After
    (invariant 5: fail closed, fail fast). A transport error is not one."""
    return s.status in CLEAN or (s.status == 503 and s.retry_after)


def _seconds(retry_after: str) -> float:
    try:
        return max(0.0, float(retry_after))
    except ValueError:
        return 1.0  # an HTTP date: not sent by this platform; back off a second


_current: Traffic | None = None


def current() -> Traffic | None:
    return _current


def begin(traffic: Traffic) -> Traffic:
    """Start `traffic` as the run's traffic (stopping any left from an earlier activity)."""
    global _current
    end()
    _current = traffic.start()
    return traffic


def end() -> Traffic | None:
    """Stop the run's traffic if any (idempotent); returns it, still readable."""
    if _current is not None:
        _current.stop()
    return _current


def mark(what: str) -> None:
    """Note `what` on the run's traffic timeline, if traffic runs."""
    if _current is not None:
        _current.mark(what)
