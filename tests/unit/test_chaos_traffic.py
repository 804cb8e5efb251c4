"""The game day's clients against a tiny HTTP server standing in for the gateway: a client told to
drop its answers sends the like whole, stops reading, and retries the same Idempotency-Key."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from chaos import traffic

SLOW_S = 0.05  # the stand-in answers after this: longer than the client's drop wait


class Gateway(ThreadingHTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.seen: list[tuple[str, str]] = []  # (idempotency key, post) of each whole request
        self.reads: list[str] = []  # the path of each GET
        self.lock = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    server: Gateway

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        with self.server.lock:
            self.server.seen.append((self.headers["idempotency-key"], body["post_id"]))
        if body["post_id"].startswith("throttled"):  # a degraded account's like
            self.send_response(429)
            self.send_header("retry-after", "0")
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"{}")
            return
        time.sleep(SLOW_S)
        try:
            self.send_response(202)
            self.send_header("content-length", "2")
            self.end_headers()
            self.wfile.write(b"{}")
        except OSError:
            pass  # the client left: its answer is lost, as a phone's would be

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.reads.append(self.path)
        self.send_response(200)
        self.send_header("content-length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[Gateway]:
    g = Gateway()
    threading.Thread(target=g.serve_forever, daemon=True).start()
    yield g
    g.shutdown()


def _run_until(
    gateway: Gateway, done: Callable[[traffic.Traffic], bool], **kwargs: Any
) -> traffic.Traffic:
    """Traffic against the stand-in until `done` (20 s at most), then stopped."""
    t = traffic.Traffic(
        gateway_url=f"http://127.0.0.1:{gateway.server_address[1]}",
        token=lambda u: "t." + u,
        **kwargs,
    )
    t.start()
    deadline = time.monotonic() + 20
    while not done(t) and time.monotonic() < deadline:
        time.sleep(0.05)
    t.stop()
    return t


@pytest.mark.parametrize("share", [0.0, 1.0])
def test_a_dropped_answer_is_retried_with_the_same_key(gateway: Gateway, share: float) -> None:
    t = _run_until(
        gateway, lambda t: len(t.ledger) >= 12,
        users=12, posts=3, writers=3, readers=0, write_rate=100.0, drop_answers=share,
    )  # fmt: skip
    assert len(t.ledger) == 12, t.summary()
    assert set(t.accepted_at) == set(t.ledger)  # each accept's time (bench_abuse's --steady-s)
    assert all(t.started_wall <= at <= time.time() for at in t.accepted_at.values())
    sent: dict[str, int] = {}
    for key, _post in gateway.seen:
        sent[key] = sent.get(key, 0) + 1
    # every accepted like's key reached the server: twice (dropped, then retried) or once
    assert set(sent) == set(t.ledger.values())
    assert sorted(sent.values()) == [2 if share else 1] * 12
    assert t.summary()["answers_dropped"] == (12 if share else 0)
    assert t.summary()["unclean_writes"] == 0  # a dropped answer is the client's, not a sample


def test_a_throttled_like_is_final_when_asked(gateway: Gateway) -> None:
    """bench_abuse's rings: a bot whose account is degraded moves on at its 429 (retried, a
    ring's likes would take a minute each and its pace would be the gate's)."""
    t = traffic.Traffic(
        gateway_url=f"http://127.0.0.1:{gateway.server_address[1]}", token=lambda u: "t." + u,
        users=1, writers=1, readers=0,
    )  # fmt: skip
    likes = [("bot", "throttled-p", "t.bot", {}), ("bot", "p", "t.bot", {})]
    assert t.likes_as(likes, workers=2, retry_throttled=False) == 1
    assert set(t.ledger) == set(t.accepted_at) == {("bot", "p")}
    assert sorted(post for _key, post in gateway.seen) == ["p", "throttled-p"]  # sent once each
    assert t.attempted == [("bot", "throttled-p"), ("bot", "p")]


def test_reads_go_to_the_traffics_posts_and_to_a_long_tail_read_once_each(
    gateway: Gateway,
) -> None:
    """A quarter of the reads are of posts nobody liked (traffic.TAIL_READS), each read once: the
    count-cache holds nothing for them, so they reach the counter-store as production's do."""
    from services.contracts import routes

    t = _run_until(
        gateway, lambda _: len(gateway.reads) >= 200,
        users=1, posts=3, writers=1, readers=2, write_rate=1.0,
    )  # fmt: skip
    with gateway.lock:
        reads = list(gateway.reads)
    own = {routes.read_path(p) for p in t.post_ids}
    tail = [r for r in reads if r not in own]
    assert len(reads) >= 200
    assert 0.1 < len(tail) / len(reads) < 0.4, (len(tail), len(reads))
    assert len(set(tail)) == len(tail)  # each tail post once
    assert {r for r in reads if r in own} == own  # and the traffic's own posts too
