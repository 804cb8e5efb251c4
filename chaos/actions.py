"""The game days' actions, as Chaos Toolkit runs them (Python providers of the experiments in
chaos/experiments/): start and stop the traffic, and the faults on the local stack's servers.

Servers are named as `likes local status` names them, or by component (every server of it); the
stack is the one LIKES_HOME / LIKES_PORT_OFFSET name, as for `likes local`. Each fault is a real
signal to the real process (its process group): SIGKILL (a crash), SIGTERM (a clean stop),
SIGSTOP (a hang: the process holds its sockets and answers nothing). `up` undoes every one of
them: SIGCONT to every recorded server, then start what is not running and wait until it answers
(as `likes local up`); it is in every experiment's rollbacks, which run always. `restart` is the
method's own recovery step, for the servers it broke.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import json
import logging
import os
import signal
import threading
import time
from typing import Any

import httpx

from chaos import kafka_faults, traffic
from local import components, layout, supervisor, transforms
from local.components import schema_registry as schema_registry_local
from local.components import toxiproxy

log = logging.getLogger("chaos.actions")


_sup: supervisor.Supervisor | None = None


def stack_supervisor() -> supervisor.Supervisor:
    """The stack's supervisor, built once per process (rendering the program under mocks, from
    its cache, takes seconds; experiments call it several times)."""
    global _sup
    lay = layout.from_env()
    if _sup is None or _sup.layout != lay:
        _sup = supervisor.Supervisor(lay, components.build(lay, strict=True))
    return _sup


def use_profile(faults: bool) -> bool:
    """Bring the stack up in (or out of) the --faults profile, as `likes local down` then
    `likes local up --faults` (or --no-faults) would: every server restarts on its data, since
    the nodes announce other addresses. Returns whether anything changed (a no-op when the
    stack already runs that profile)."""
    global _sup
    sup = stack_supervisor()
    if sup.layout.faults == faults:
        return False

    def report(name: str, msg: str) -> None:
        log.info("%s: %s", name, msg)

    sup.down(report)
    lay = dataclasses.replace(sup.layout, faults=faults)
    layout.record_profile(lay)
    _sup = supervisor.Supervisor(lay, components.build(lay, strict=True))
    _up(_sup, list(_sup.components))
    return True


def _names(sup: supervisor.Supervisor, servers: list[str]) -> list[str]:
    known = sup.all_servers()
    out: list[str] = []
    for name in servers:
        if name in known:
            out.append(name)
        elif name in sup.components:
            out.extend(s.name for s in sup.components[name].servers())
        else:
            raise ValueError(
                f"no server or component named {name!r} in the local stack; "
                f"servers: {sorted(known)}; components: {sorted(sup.components)}"
            )
    return out


def start_traffic(
    users: int = 5000, posts: int = 8, writers: int = 4, readers: int = 2, write_rate: float = 30.0
) -> dict[str, Any]:
    """Likes (one per new user, each on its own address) and reads through the gateway, in the
    background, until `stop_traffic` or the hypothesis's check stops them."""
    lay = layout.from_env()
    t = traffic.Traffic(
        gateway_url=f"http://{layout.HOST}:{lay.ports.gateway}",
        token=transforms.signer(lay),  # per like: the key loaded once
        users=users, posts=posts, writers=writers, readers=readers, write_rate=write_rate,
    )  # fmt: skip
    _poison.clear()  # an earlier experiment's, in a game day's one process
    _ring.clear()
    _spike.clear()
    _viral.clear()
    _sampling.clear()
    traffic.begin(t)
    return {"run": t.run, "posts": t.post_ids}


def stop_traffic() -> dict[str, Any] | None:
    """Stop the traffic (idempotent); what the clients saw."""
    t = traffic.end()
    return None if t is None else t.summary()


def drop_answers(share: float = 0.33) -> float:
    """From now on the traffic's clients drop the first answer of `share` of their likes (sent,
    then not read) and retry the same Idempotency-Key (sdk-network-drop-retry)."""
    t = traffic.current()
    if t is None:
        raise RuntimeError("no traffic runs: start_traffic first")
    traffic.mark(f"drop {share:.0%} of answers")
    t.drop_answers = share
    return share


def keep_answers() -> int:
    """Undo `drop_answers` (idempotent: in the rollbacks too); how many answers were dropped.
    Fails when the clients were told to drop answers and none was: the fault never happened."""
    t = traffic.current()
    if t is None:
        return 0
    if t.drop_answers:
        t.drop_answers = 0.0
        traffic.mark("recovered: answers read")
        if not t.dropped:
            raise RuntimeError("no answer was dropped: every one came back within the drop wait")
    return t.dropped


def _signal(servers: list[str], sig: signal.Signals) -> list[str]:
    sup = stack_supervisor()
    running = sup.running()
    hit = []
    for name in _names(sup, servers):
        e = running.get(name)
        if e is None:
            continue
        try:
            os.killpg(e.pid, sig)
        except ProcessLookupError:
            continue
        hit.append(name)
    return hit


def kill(servers: list[str]) -> list[str]:
    """SIGKILL (a crash: no clean shutdown); returns the servers that were running."""
    sup = stack_supervisor()
    traffic.mark(f"kill {' '.join(servers)}")
    return [n for n in _names(sup, servers) if sup.kill(n)]


def stop(servers: list[str]) -> list[str]:
    """SIGTERM and wait (a clean stop, as a rolling deploy would)."""
    sup = stack_supervisor()
    traffic.mark(f"stop {' '.join(servers)}")
    return [n for n in _names(sup, servers) if sup.stop(n)]


_hung: dict[str, int] = {}  # server -> pid whose main thread hang_loop stopped


def _ops(server: str, path: str) -> int | None:
    """The status a worker's ops server answers on `path` now (None: no answer)."""
    lay = layout.from_env()
    url = f"http://{layout.HOST}:{transforms.local_ops_port(lay, server)}{path}"
    try:
        return httpx.get(url, timeout=3).status_code
    except httpx.HTTPError:
        return None


def hang_loop(servers: list[str]) -> list[str]:
    """Stop each worker's consumer loop (its main thread, ptrace: chaos/process_faults.py) and
    leave its ops server running, as a stuck store call or a compaction stall would: /metrics
    answers, the loop's heartbeat stands still, /readyz fails after 30 s and /healthz after 2
    minutes. `restart_hung` (or `up`) ends it."""
    from chaos import process_faults

    sup = stack_supervisor()
    running = sup.running()
    traffic.mark(f"hang {' '.join(servers)}")
    for name in _names(sup, servers):
        e = running.get(name)
        if e is None:
            raise RuntimeError(f"{name} is not running")
        process_faults.stop_main_thread(e.pid, functools.partial(_answers, name))
        _hung[name] = e.pid
    return sorted(_hung)


def _answers(server: str) -> bool:
    from services.contracts import workloads

    return _ops(server, workloads.METRICS_PATH) == 200


def _release(name: str) -> None:
    from chaos import process_faults

    pid = _hung.pop(name, None)
    if pid is not None:
        with contextlib.suppress(OSError):  # gone (killed) or already let go
            process_faults.resume_main_thread(pid)


def restart_hung(servers: list[str]) -> dict[str, int | None]:
    """The restart on a new pod of a hung worker: its hang must show (/readyz answers 503, the
    loop not turning: raises otherwise), then SIGKILL and a restart. The kubelet does it once
    /healthz fails (a loop still for 2 minutes, LoopHealth.hung_after_s), the on-call sooner
    on AggregatorStalled's page. Returns the /readyz status each answered before the kill."""
    from services.contracts import workloads

    sup = stack_supervisor()
    names = _names(sup, servers)
    ready = {n: _ops(n, workloads.READY_PATH) for n in names}
    if any(status == 200 for status in ready.values()):
        for n in names:
            _release(n)
        raise RuntimeError(f"still ready after the hang: {ready}")
    kill(servers)
    for n in names:
        _release(n)
    restart(servers)
    return ready


def shard_of(component: str, key: str) -> tuple[str, str | None]:
    """The servers (primary, its replica or None) of the local Redis Cluster `component` that
    own `key`'s slot now, read from CLUSTER NODES (a failover moves them)."""
    from local.components import redis as local_redis

    sup = stack_supervisor()
    lay = sup.layout
    by_address = {s.address: n for n, (c, s) in sup.all_servers().items() if c.name == component}
    if not by_address:
        raise ValueError(f"{component!r} is not a Redis Cluster of the local stack")
    # the nodes name each other by the address they announce (a proxy's in the --faults profile)
    by_announced = {
        f"{host}:{lay.announced(int(port))}": n
        for a, n in by_address.items()
        for host, port in [a.rsplit(":", 1)]
    }
    last: Exception | None = None
    for address in sorted(by_address):
        try:
            with local_redis.client(lay, int(address.rsplit(":", 1)[1]), socket_timeout=2) as r:
                slot = int(r.execute_command("CLUSTER KEYSLOT", key))
                nodes = r.execute_command("CLUSTER NODES")
        except Exception as e:  # this node is down: ask the next
            last = e
            continue
        # redis-py parses the reply: {"ip:port": {"node_id", "flags", "master_id", "slots"}}
        table: dict[str, dict[str, Any]] = dict(nodes)
        live = {a: n for a, n in table.items() if "fail" not in n["flags"]}
        primary = next(
            (a for a, n in live.items()
             if "master" in n["flags"]
             and any(int(r[0]) <= slot <= int(r[-1]) for r in n["slots"])),
            None,
        )  # fmt: skip
        if primary is None:
            raise RuntimeError(f"no live primary of {component} owns slot {slot}")
        replica = next(
            (a for a, n in live.items() if n["master_id"] == live[primary]["node_id"]), None
        )
        return by_announced[primary], None if replica is None else by_announced[replica]
    raise RuntimeError(f"no node of {component} answers: {last}")


def kill_shard(component: str, with_replica: bool = True) -> list[str]:
    """SIGKILL the primary of `component` (a local Redis Cluster) that owns the count of the
    traffic's first post, and with `with_replica` its replica too (the whole shard: its slots
    have nobody left to serve them). Returns the servers killed."""
    t = traffic.current()
    post = t.post_ids[0] if t is not None else "chaos-probe"
    from services.contracts import keys

    primary, replica = shard_of(component, keys.count_key(post))
    victims = [primary, *([replica] if with_replica and replica else [])]
    return kill(victims)


def pause(servers: list[str]) -> list[str]:
    """SIGSTOP: the process hangs with its sockets open (a GC pause, a stuck disk)."""
    traffic.mark(f"pause {' '.join(servers)}")
    return _signal(servers, signal.SIGSTOP)


def resume(servers: list[str]) -> list[str]:
    """SIGCONT to servers paused by `pause`."""
    traffic.mark(f"resume {' '.join(servers)}")
    return _signal(servers, signal.SIGCONT)


def restart(servers: list[str]) -> list[str]:
    """Start the given servers' components again (what is not running) and wait until every
    server of them answers: `likes local up --only <components>`. Returns what was started."""
    sup = stack_supervisor()
    names = _names(sup, servers)
    resume(names)
    comps = sorted({sup.all_servers()[n][0].name for n in names})
    traffic.mark(f"restart {' '.join(servers)}")
    started = _up(sup, comps)
    traffic.mark("recovered")
    return started


def up() -> list[str]:
    """Undo every fault: SIGCONT to every recorded server, every toxic removed and every proxy
    enabled (the --faults profile), then start whatever is not running and wait until it answers
    (`likes local up`, minus its render when nothing is down). A loop `hang_loop` stopped is let
    go first."""
    for name in list(_hung):
        _release(name)
    _stop_bad_collector()
    sup = stack_supervisor()
    if sup.layout.faults:
        with contextlib.suppress(httpx.HTTPError):  # Toxiproxy itself down: started below
            toxiproxy.reset(sup.layout)
    for e in sup.running().values():
        with contextlib.suppress(ProcessLookupError):
            os.killpg(e.pid, signal.SIGCONT)
    running = sup.running()
    down = sorted({c.name for n, (c, _s) in sup.all_servers().items() if n not in running})
    return _up(sup, down) if down else []


def _report(name: str, msg: str) -> None:
    log.info("%s: %s", name, msg)


def _up(sup: supervisor.Supervisor, comps: list[str]) -> list[str]:
    scope = [n for n, (c, _s) in sup.all_servers().items() if c.name in comps]
    started = sup.up(_report, comps)
    status = sup.settle(scope, _report)
    unhealthy = {n: status[n] for n in scope if not status[n]["healthy"]}
    if unhealthy:
        raise RuntimeError(f"not answering after the restart: {unhealthy}")
    return started


# --- network faults (the --faults profile) --------------------------------------------------

TOXIC = "game-day"  # the name of every toxic an experiment adds (one per proxy and direction)


def _toxiproxy_config() -> dict[str, Any]:
    """chaostoolkit-toxiproxy's configuration for the stack's Toxiproxy."""
    sup = stack_supervisor()
    if not sup.layout.faults:
        raise RuntimeError(
            "this experiment needs the --faults profile (likes local up --faults); "
            "`likes chaos run` switches to it for the experiments that declare it"
        )
    import logzero  # chaostoolkit-toxiproxy's logger: its debug lines are not the run's output

    logzero.loglevel(logging.WARNING)
    return {"toxiproxy_url": toxiproxy.api_url(sup.layout)}


def _proxies(servers: list[str]) -> list[str]:
    sup = stack_supervisor()
    proxied = sup.layout.proxies()
    out = [n for n in _names(sup, servers) if n in proxied]
    if not out:
        raise ValueError(f"none of {servers} is behind a proxy; proxied: {sorted(proxied)}")
    return out


def add_toxic(
    servers: list[str],
    toxic_type: str,
    attributes: dict[str, Any] | None = None,
    stream: str = "downstream",
) -> list[str]:
    """A Toxiproxy toxic (chaostoolkit-toxiproxy's create_toxic) on the proxy of each server
    (or of each server of a component): `latency` {latency, jitter} in ms, `timeout` {timeout:
    0} for a partition (the connection stays open, nothing comes back), `bandwidth`, ... One
    toxic per proxy and stream, named TOXIC; `up` removes them all."""
    from chaostoxi.toxic import actions as toxics

    config = _toxiproxy_config()
    names = _proxies(servers)
    traffic.mark(f"{toxic_type} {' '.join(servers)}")
    for name in names:
        if not toxics.create_toxic(
            for_proxy=name, toxic_name=f"{TOXIC}-{stream}", toxic_type=toxic_type,
            stream=stream, attributes=attributes or {}, configuration=config,
        ):  # fmt: skip
            raise RuntimeError(f"toxiproxy refused the {toxic_type} toxic on {name}")
    return names


def remove_toxics(servers: list[str]) -> list[str]:
    """Remove the toxics `add_toxic` put on these servers' proxies (both streams); idempotent."""
    from chaostoxi.toxic import actions as toxics

    config = _toxiproxy_config()
    names = _proxies(servers)
    for name in names:
        for stream in ("downstream", "upstream"):
            toxics.delete_toxic(
                for_proxy=name, toxic_name=f"{TOXIC}-{stream}", configuration=config
            )
    traffic.mark(f"recovered {' '.join(servers)}")
    return names


# --- data and control-plane faults ----------------------------------------------------------

_poison: list[str] = []  # the keys of the poison this run produced (probes.poison_dead_lettered)


def kafka_config() -> dict[str, Any]:
    """A Kafka client's settings for the stack, logged in as its services are."""
    from cli import stack_settings
    from services.contracts import kafka

    return kafka.from_settings(stack_settings.platform_settings())


def poisoned() -> tuple[str, ...]:
    """The keys of the poison produced since the traffic started."""
    return tuple(_poison)


def produce_poison(n: int = 3) -> list[str]:
    """`n` undecodable messages on likes.committed (chaos/kafka_faults.py); their keys."""
    traffic.mark(f"poison x{n}")
    keys = kafka_faults.produce_poison(kafka_config(), n)
    _poison.extend(keys)
    return keys


def prefer_leaders(topics: list[str]) -> int:
    """Each partition of `topics` led by its preferred replica (see kafka_faults.prefer_leaders):
    before a fault aimed at one broker, so that it leads its share. Raises if some still are
    not after 30 s."""
    left = kafka_faults.prefer_leaders(kafka_config(), topics)
    if left:
        raise RuntimeError(f"{left} partition(s) of {topics} still not led by their preferred "
                           "replica after 30 s")  # fmt: skip
    return left


_ring: list[tuple[str, str]] = []  # the (user, post) likes of this run's bot ring (bot_storm)


def ring() -> tuple[tuple[str, str], ...]:
    """The likes `bot_storm` sent since the traffic started."""
    return tuple(_ring)


def bot_storm(bots: int = 8, kill_on_first_void: list[str] | None = None) -> dict[str, Any]:
    """A bot ring likes every post of the traffic through the gateway, beside it: `bots` fresh
    accounts (an hour old) on one /24 of the run's own (198.18.0.0/15, the benchmarking range:
    the scorer remembers an hour of earlier runs' rings), sharing two device fingerprints, each
    liking every post within a second or two, as services/abuse/generator.py's rings do. Their
    likes go in the traffic's ledger: the invariants count them like any other.

    `kill_on_first_void`: servers SIGKILLed the moment the abuse scorer's void counter moves
    during the storm (abuse-scorer-crash-mid-publish: a crash while it voids the ring's batch,
    between its voids and its offset commit); raises if it voided nothing within
    KILL_ON_VOID_WAIT_S."""
    from services.contracts import signals

    t = traffic.current()
    if t is None:
        raise RuntimeError("no traffic runs: start_traffic first")
    lay = layout.from_env()
    n = int(t.run[:4], 16)
    net = f"198.{18 + (n >> 8) % 2}.{n % 256}"
    created = int(time.time()) - 3600
    sign = transforms.signer(lay)
    likes = []
    for i in range(bots):
        user = f"gd-{t.run}-bot{i}"
        token = sign(user, account_created=created)
        headers = {signals.CLIENT_IP_HEADER: f"{net}.{10 + i}",
                   signals.DEVICE_HEADER: f"ring-{t.run}-{i % 2}"}  # fmt: skip
        likes += [(user, post, token, headers) for post in t.post_ids]
    watcher = _KillOnFirstVoid(kill_on_first_void) if kill_on_first_void else None
    traffic.mark(f"bot storm: {bots} accounts on {net}.0/24")
    _ring.extend((u, p) for u, p, _t, _h in likes)
    # a degraded bot's 429 is its like's last answer, as for a bot that moves on: retried, the
    # degraded accounts (one like a minute) held the action for minutes
    accepted = t.likes_as(likes, retry_throttled=False)
    out: dict[str, Any] = {"bots": bots, "likes": len(likes), "accepted": accepted,
                           "network": f"{net}.0/24"}  # fmt: skip
    if watcher is not None:
        out["killed"] = watcher.wait()
    return out


KILL_ON_VOID_WAIT_S = 60.0


class _KillOnFirstVoid:
    """Polls the abuse scorer's void counter every 20 ms from now on, and SIGKILLs `servers`
    the moment it moves."""

    def __init__(self, servers: list[str]) -> None:
        from services.contracts import workloads

        self.servers = servers
        self._scorer = workloads.ABUSE_SCORER.name
        self._before = self._voids()
        self._done = threading.Event()
        self.killed: list[str] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._watch, name="kill-on-first-void",
                                        daemon=True)  # fmt: skip
        self._thread.start()

    def _voids(self) -> float:
        from services.contracts import metrics

        return _read_metric(metrics.ABUSE_VOIDS, server=self._scorer, result="voided")

    def _watch(self) -> None:
        deadline = time.monotonic() + KILL_ON_VOID_WAIT_S
        try:
            while not self._done.is_set() and time.monotonic() < deadline:
                if self._voids() > self._before:
                    self.killed = kill(self.servers)
                    return
                time.sleep(0.02)
        except BaseException as e:  # reported by wait()
            self.error = e

    def wait(self) -> list[str]:
        self._thread.join(KILL_ON_VOID_WAIT_S + 10)
        self._done.set()
        if self.error is not None:
            raise RuntimeError(f"watching {self._scorer}'s voids failed: {self.error}")
        if not self.killed:
            raise RuntimeError(
                f"{self._scorer} voided none of the storm's likes within "
                f"{KILL_ON_VOID_WAIT_S:.0f} s: {self.servers} not killed"
            )
        return self.killed


def read_edges(
    session: Any, query: Any, pairs: list[tuple[str, str]]
) -> tuple[dict[tuple[str, str], Any], list[tuple[str, str]]]:
    """Each (user, post) edge's row by the prepared `query` (None: no edge), and the pairs still
    unread after EDGE_READ_ATTEMPTS, as a timeout is read again a second later. The probes read
    a game day's ledger (~1,300 likes) right after its recovery, when a loaded machine's
    Cassandra timed out a read; the driver's concurrent executor raised that one error (its
    raise_on_first_error, on by default) and failed the whole probe (CI, abuse-model-down)."""
    from cassandra import OperationTimedOut, ReadTimeout, Unavailable
    from cassandra.concurrent import execute_concurrent_with_args

    got: dict[tuple[str, str], Any] = {}
    todo = list(pairs)
    for attempt in range(EDGE_READ_ATTEMPTS):
        if attempt:
            time.sleep(1.0)
        rows = execute_concurrent_with_args(
            session, query, todo, concurrency=32, raise_on_first_error=False
        )
        failed = []
        for pair, (ok, result) in zip(todo, rows, strict=True):
            if ok:
                got[pair] = result.one()
            elif isinstance(result, OperationTimedOut | ReadTimeout | Unavailable):
                failed.append(pair)
            else:
                raise result
        todo = failed
        if not todo:
            break
    return got, todo


EDGE_READ_ATTEMPTS = 3
EDGE_READ_TIMEOUT_S = 10.0


def void_likes(
    pairs: list[tuple[str, str]],
) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """Which of these (user, post) likes are void in the edge-store now, and which could not be
    read (each caller decides which way an unread one counts against it)."""
    from cli import stack_settings
    from services.contracts import clients

    cluster, session = clients.cassandra(
        stack_settings.platform_settings(), request_timeout=EDGE_READ_TIMEOUT_S
    )
    try:
        q = session.prepare(
            "SELECT void FROM edges WHERE user_id = ? AND kind = 'edge' AND ref = ?"
        )
        rows, unread = read_edges(session, q, pairs)
        return {pair for pair, row in rows.items() if row is not None and row.void}, set(unread)
    finally:
        cluster.shutdown()


def expect_ring_unvoided() -> dict[str, int]:
    """While the model server is down (abuse-model-down): none of the bot ring's accepted likes
    is void yet; the scorer defers them, it neither skips nor guesses. Raises otherwise."""
    t = traffic.current()
    if t is None:
        raise RuntimeError("no traffic runs: start_traffic first")
    accepted = [p for p in _ring if p in t.ledger]
    if not accepted:
        raise RuntimeError("the bot ring has no accepted like: bot_storm first")
    void, unread = void_likes(accepted)
    if void or unread:
        raise RuntimeError(f"{len(void)} of the ring's {len(accepted)} likes voided while the "
                           f"model server was down, e.g. {sorted(void)[:3]}; "
                           f"{len(unread)} unread")  # fmt: skip
    traffic.mark(f"ring's {len(accepted)} likes deferred, none void")
    return {"ring_likes_accepted": len(accepted), "void": 0}


_models: dict[str, str] = {}  # "good" (the version served before) and "bad" (deploy_bad_model)


def deploy_bad_model() -> dict[str, Any]:
    """A bad model deploy: a copy of the model being served, saved as a new version whose
    threshold is 0 (every like it scores is voided), then served (`likes abuse use`): the model
    servers load it within their reload interval. `rollback_model` undoes it."""
    from cli import abuse as abuse_cli
    from services.abuse import model

    t = traffic.current()
    directory = model.default_dir()
    good = model.current_version(directory)
    if good is None:
        raise RuntimeError(f"no current abuse model in {directory}")
    served = model.load(directory, good)
    bad = model.Model(
        f"{good}-bad-{t.run if t else 'gameday'}", served.estimator, 0.0,
        {**served.meta, "threshold": 0.0, "note": "game day: a bad deploy that voids every like"},
    )  # fmt: skip
    bad.meta["version"] = bad.version
    model.save(bad, directory, make_current=False)
    _models.update(good=good, bad=bad.version)
    traffic.mark(f"abuse model {bad.version} served (threshold 0)")
    _quietly(abuse_cli.use, bad.version, model_dir=None, yes=True, as_json=True)
    return {"good": good, "bad": bad.version}


def rollback_model(since: str = "10m") -> dict[str, Any]:
    """The runbook's rollback of a bad model deploy: `likes abuse use <previous>`, a reload
    interval for the model servers (and the scorer's batch in flight) to be done with the bad
    one, then `likes abuse unvoid --model-version <bad> --since SINCE`: its voids taken back,
    their likes counted again. Idempotent (nothing deployed: nothing done; an unvoid finds
    nothing left to take back)."""
    from cli import abuse as abuse_cli
    from cli import unvoid as unvoid_cli
    from services.abuse import model, model_server

    if not _models:
        return {}
    good, bad = _models["good"], _models["bad"]
    if model.current_version(model.default_dir()) != good:
        _quietly(abuse_cli.use, good, model_dir=None, yes=True, as_json=True)
        traffic.mark(f"abuse model {good} served again")
        time.sleep(model_server.RELOAD_S + 5)
    out = _quietly(unvoid_cli.unvoid, model_version=bad, since=since, dry_run=False, yes=True,
                   json_out=True)  # fmt: skip
    traffic.mark(f"voids of {bad} taken back")
    _models.clear()
    return {"good": good, "bad": bad, "unvoid": json.loads(out.splitlines()[-1])}


def _quietly(command: Any, *args: Any, **kwargs: Any) -> str:
    """A CLI command's function called in-process, its --json output captured (the game day's
    own --json is the only thing on stdout); returns that output."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        command(*args, **kwargs)
    return buf.getvalue()


_spike: dict[str, Any] = {}  # what the last read_spike saw (probes.spike_on_hot_pools)


def _scrape(url: str) -> list[Any]:
    """Every sample a Prometheus /metrics page at `url` holds."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url, timeout=5).text
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def _read_metric(name: str, server: str | None = None, **labels: str) -> float:
    """A stack server's counter `name` (with `labels`), from its /metrics: the read service's
    unless `server` names another workload."""
    from services.contracts import workloads

    lay = layout.from_env()
    port = transforms.local_ops_port(lay, server or workloads.READ.name)
    return sum(
        sample.value
        for sample in _scrape(f"http://{layout.HOST}:{port}{workloads.METRICS_PATH}")
        if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items())
    )


_viral: list[str] = []  # the post cold_viral_post made (read_spike's `viral` target)


def cold_viral_post() -> str:
    """A post liked once, then left alone, whose hot-pool copies are gone, as for a post whose
    last write is older than the always-replicate TTL: the count-cache primary is its only home
    until the sampler flags it and the operator copies it out. Returns its id."""
    import redis as redis_py

    from services.contracts import keys, settings, workloads

    t = traffic.current()
    if t is None:
        raise RuntimeError("no traffic runs: start_traffic first")
    lay = layout.from_env()
    post, user = f"gd-{t.run}-viral", f"gd-{t.run}-viral-fan"
    if not t.likes_as([(user, post, transforms.sign_token(lay, user), {})], workers=1):
        raise RuntimeError(f"the like of {post} was not accepted")
    env = transforms.workload_env(lay, workloads.READ.name)
    s = settings.HotPoolSettings.model_validate(
        {k.removeprefix(settings.PREFIX).lower(): v for k, v in env.items()
         if k.removeprefix(settings.PREFIX).lower() in settings.HotPoolSettings.model_fields}
    )  # fmt: skip
    deadline = time.monotonic() + 30
    pools = s.hot_pool_addresses
    while time.monotonic() < deadline:  # counted and copied out by the aggregator first
        copied = 0
        for host, port in pools:
            with redis_py.Redis(host=host, port=port, password=s.redis_auth, socket_timeout=2) as r:
                copied += int(r.exists(keys.count_key(post)))
        if copied == len(pools):
            break
        time.sleep(0.5)
    for host, port in pools:  # then aged out, as the TTL would have
        with redis_py.Redis(host=host, port=port, password=s.redis_auth, socket_timeout=2) as r:
            r.delete(keys.count_key(post))
    _viral[:] = [post]
    traffic.mark(f"{post}: liked, its hot-pool copies gone")
    return post


def _flagged(post: str) -> bool:
    """The hot-key sampler's flag on `post` is in etcd now."""
    from cli import etcd_commands
    from services.contracts import keys

    async def get(client: Any) -> bool:
        return await client.get((keys.HOTKEYS_PREFIX + post).encode()) is not None

    return bool(etcd_commands.run(get))


def read_spike(seconds: float = 20.0, clients: int = 32, target: str = "first") -> dict[str, Any]:
    """A flash crowd: `clients` connections read one post through the gateway back to back for
    `seconds` (traffic.Traffic.read_spike), from many addresses: the traffic's first post
    (`first`) or the one `cold_viral_post` made (`viral`). Records how many of its reads the
    read service answered from the hot pools (its likes_read_hot_pool_total{result="hit"} moved
    by) and whether the sampler had flagged the post by the end."""
    from services.contracts import metrics as names

    t = traffic.current()
    if t is None:
        raise RuntimeError("no traffic runs: start_traffic first")
    if target not in ("first", "viral") or (target == "viral" and not _viral):
        raise ValueError(f"target: first, or viral after cold_viral_post; not {target!r}")
    post = t.post_ids[0] if target == "first" else _viral[0]
    traffic.mark(f"read spike on {post}")
    hits = _read_metric(names.READ_HOT_POOL, result="hit")
    began = time.monotonic()
    load = t.read_spike(post, seconds, clients)
    took = time.monotonic() - began
    hot = _read_metric(names.READ_HOT_POOL, result="hit") - hits
    flagged = _flagged(post)
    traffic.mark("read spike over")
    reads = int(load["n"]) + int(load["non_2xx"])
    _spike.clear()
    _spike.update(post=post, reads=reads, per_s=round(reads / took, 1), hot_pool_hits=int(hot),
                  flagged=flagged, non_2xx=load["non_2xx"],
                  p99_ms=round(load["p99_ms"], 1))  # fmt: skip
    return dict(_spike)


def spike() -> dict[str, Any]:
    """What the last `read_spike` of the run saw."""
    return dict(_spike)


# otel-bad-sampling-config: the collector the experiment started itself, and what each policy did
_bad_collector: dict[str, Any] = {}
_sampling: dict[str, dict[str, float]] = {}
SAMPLING_POLICIES: dict[str, dict[str, Any]] = {
    "keep-all": {"name": "keep-all", "type": "always_sample"},
    "drop-all": {"name": "drop-all", "type": "probabilistic",
                 "probabilistic": {"sampling_percentage": 0}},
}  # fmt: skip


def _collector() -> Any:
    from infra import otel_config

    return stack_supervisor().components[otel_config.COLLECTOR]


def _sampled() -> dict[str, float]:
    """The collector's tail-sampling decisions so far, from its own /metrics: traces kept
    (sampled="true") and dropped ("false")."""
    from services.contracts import metrics as names

    lay = layout.from_env()
    out = {"true": 0.0, "false": 0.0}
    for sample in _scrape(f"http://{layout.HOST}:{lay.ports.otel_metrics}/metrics"):
        if sample.name.startswith(names.OTELCOL_TRACES_SAMPLED):
            key = sample.labels.get("sampled", "")
            if key in out:
                out[key] += sample.value
    return out


def bad_sampling(policy: str = "keep-all", seconds: float = 25.0) -> dict[str, float]:
    """A bad sampling config pushed to the collector: the stack's collector stopped and the same
    binary started on the same ports with the rendered config's tail-sampling policies replaced
    by one, `keep-all` (every trace: storage cost explodes) or `drop-all` (none: blind), for
    `seconds`. Returns the traces it kept and dropped meanwhile (its own counters); `up` puts
    the rendered collector back."""
    import subprocess

    import yaml

    from local.components.base import ProbeFailed, http_probe

    if policy not in SAMPLING_POLICIES:
        raise ValueError(f"policy: one of {sorted(SAMPLING_POLICIES)}, not {policy!r}")
    sup, comp = stack_supervisor(), _collector()
    _stop_bad_collector()
    sup.stop(comp.name)
    cfg = yaml.safe_load(comp.config_path.read_text())
    cfg["processors"]["tail_sampling"]["policies"] = [SAMPLING_POLICIES[policy]]
    path = comp.layout.conf / f"otelcol-{policy}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    log_file = (comp.layout.logs / f"otelcol-{policy}.log").open("ab")
    proc = subprocess.Popen([str(comp.binary), f"--config={path}"], stdout=log_file,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    _bad_collector.update(proc=proc, policy=policy)
    deadline = time.monotonic() + 30
    while True:
        try:
            http_probe(f"{comp.health_url}/")
            break
        except ProbeFailed as e:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the {policy} collector did not start: {log_file.name}") from e
            time.sleep(0.5)
    traffic.mark(f"sampling: {policy}")
    time.sleep(seconds)
    seen = _sampled()  # a new process: its counters started at 0
    _sampling[policy] = seen
    return seen


def _stop_bad_collector() -> None:
    proc = _bad_collector.pop("proc", None)
    _bad_collector.clear()
    if proc is not None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except Exception:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)


def good_sampling() -> list[str]:
    """Undo `bad_sampling`: the experiment's collector stopped, the rendered one started
    (idempotent: in the rollbacks too)."""
    _stop_bad_collector()
    traffic.mark("sampling: rendered")
    return up()


def sampling() -> dict[str, dict[str, float]]:
    """What each bad policy kept and dropped this run."""
    return dict(_sampling)


def refuse_records(topics: list[str]) -> list[str]:
    """The brokers refuse every record written to `topics` until `accept_records`."""
    traffic.mark(f"refuse {' '.join(topics)}")
    kafka_faults.set_records_refused(kafka_config(), topics, True)
    return topics


def accept_records(topics: list[str]) -> list[str]:
    """Undo `refuse_records` (idempotent: in the rollbacks as well)."""
    kafka_faults.set_records_refused(kafka_config(), topics, False)
    traffic.mark(f"accept {' '.join(topics)}")
    return topics


def _outage_url(receiver: str) -> str:
    from local import webhook_sink

    lay = layout.from_env()
    return f"http://{layout.HOST}:{lay.ports.webhook_sink}/{webhook_sink.OUTAGE}/{receiver}"


def purge_api_outage(status: int = 503) -> int:
    """The local Cloudflare API (the webhook sink's receiver) answers `status` to every purge
    until `end_purge_api_outage`: the aggregator's purges really fail and are given up on."""
    traffic.mark(f"purge API answers {status}")
    httpx.put(_outage_url(transforms.CLOUDFLARE_SINK), json={"status": status},
              timeout=5).raise_for_status()  # fmt: skip
    return status


def end_purge_api_outage() -> bool:
    """Undo `purge_api_outage` (idempotent: in the rollbacks as well)."""
    r = httpx.delete(_outage_url(transforms.CLOUDFLARE_SINK), timeout=5)
    r.raise_for_status()
    traffic.mark("purge API back")
    return bool(r.json().get("ended"))


def set_flag(switch: str, on: bool = True) -> dict[str, Any]:
    """`likes flags set SWITCH on|off`, audited as the CLI's, with the game day as the reason."""
    from cli import flags as flags_cli
    from services.contracts import flags

    traffic.mark(f"flag {switch} {'on' if on else 'off'}")
    return flags_cli.put(flags.Switch(switch), on, "game day").to_json()


def unset_flag(switch: str) -> bool:
    """`likes flags unset SWITCH` (the workloads treat it as off); idempotent."""
    from cli import flags as flags_cli
    from services.contracts import flags

    return flags_cli.remove(flags.Switch(switch))


def split_post(factor: int = 8) -> dict[str, Any]:
    """`likes hotkeys split POST FACTOR` on the traffic's first post (audited as the CLI's):
    its writes spread over `factor` sub-keys, as the operator splits a viral post."""
    from services.contracts import hotkeys, keys

    post = _first_post()
    flag = hotkeys.SplitFlag(factor, "manual", hotkeys.now_ms())
    traffic.mark(f"split {post} x{factor}")
    _put("hotkeys split", {"post_id": post, "factor": factor},
         {keys.SPLIT_PREFIX + post: flag.encode()})  # fmt: skip
    return {"post_id": post, "factor": factor}


def unsplit_post() -> bool:
    """Undo `split_post` (`likes hotkeys unsplit POST`); idempotent: in the rollbacks too."""
    from services.contracts import keys

    post = _first_post()
    return bool(_delete("hotkeys unsplit", [keys.SPLIT_PREFIX + post], {"post_id": post}))


def _first_post() -> str:
    t = traffic.current()
    if t is None:
        raise RuntimeError("no traffic runs: start_traffic names the posts")
    return t.post_ids[0]


def restart_cold(servers: list[str]) -> list[str]:
    """`restart`, then FLUSHALL on every primary of the (Redis Cluster) component: it comes
    back cold, as a cluster restarted without its snapshots would (the local nodes reload
    theirs and would come back warm). Returns what was started."""
    from redis.cluster import RedisCluster

    from cli import stack_settings
    from services.contracts import clients

    started = restart(servers)
    settings = stack_settings.platform_settings()
    rc = clients.count_cache(settings, timeout=5.0)
    try:
        rc.flushall(target_nodes=RedisCluster.PRIMARIES)
    finally:
        rc.close()
    traffic.mark("flushed")
    return started


def _incompatible_like_schema() -> tuple[dict[str, Any], str, str]:
    """The like event's value schema broken for its readers: a field without a default removed
    (a reader needs it: resolution fails), another's type changed. (schema, dropped, retyped)"""
    from services.contracts import events

    schema = json.loads(events.LIKE_EVENT_SCHEMA)
    fields = schema["fields"]
    dropped = next(f["name"] for f in fields if "default" not in f and f["type"] == "string")
    changed = next(f for f in fields if f["type"] == "int")
    schema["fields"] = [
        {**f, "type": "string"} if f is changed else f for f in fields if f["name"] != dropped
    ]
    return schema, dropped, changed["name"]


def register_incompatible_schema() -> dict[str, Any]:
    """A bad deploy step: a version of the like event's value schema that breaks FORWARD
    compatibility (`_incompatible_like_schema`), registered as the deploy step registers
    (services/schema/registry_schemas.apply). Returns the registry's refusal; raises if the
    registry accepted it (after deleting that version)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    from cli import stack_settings
    from services.contracts import events, registry
    from services.schema import registry_schemas

    schema, dropped, retyped = _incompatible_like_schema()
    subject = f"{events.COMMITTED}-value"
    client = SchemaRegistryClient(registry.from_settings(stack_settings.platform_settings()))
    before = client.get_versions(subject)
    traffic.mark("incompatible schema")
    try:
        registry_schemas.apply(client, {subject: json.dumps(schema)})
    except registry_schemas.RegistrationError as e:
        after = client.get_versions(subject)
        if after != before:
            raise RuntimeError(
                f"{subject} versions changed although refused: {before} -> {after}"
            ) from e
        return {"subject": subject, "refused": str(e), "versions": after,
                "dropped": dropped, "retyped": retyped}  # fmt: skip
    version = client.get_latest_version(subject).version
    if version is not None and version not in before:
        client.delete_version(subject, version)
    raise RuntimeError(f"the registry accepted an incompatible {subject} (version {version})")


def _bad_values(posts: list[str]) -> dict[str, bytes]:
    """A bad control-plane push for `posts`: each flagged hot at a million reads a second, its
    heat hint malformed JSON, a split past the aggregator's 8 shards, a hot-pool list naming a
    pool nobody serves."""
    from services.contracts import hotkeys, keys

    out: dict[str, bytes] = {}
    for post in posts:
        out[keys.HOTKEYS_PREFIX + post] = hotkeys.encode_hot(1e6, hotkeys.now_ms())
        out[keys.HEAT_PREFIX + post] = b"hot!"
        out[keys.SPLIT_PREFIX + post] = hotkeys.SplitFlag(64, "game day", 0).encode()
        out[hotkeys.HOTPOOL_PREFIX + post] = hotkeys.encode_pools(["127.0.0.1:1"], 0)
    return out


def _put(command: str, args: dict[str, Any], values: dict[str, bytes]) -> list[str]:
    """Write `values` into etcd, audited as `command` (the game day's control-plane pushes)."""
    from cli import etcd_commands

    async def put(client: Any) -> list[str]:
        for key, value in values.items():
            await client.put(key.encode(), value)
        return sorted(values)

    return list(etcd_commands.audited(command, args, put))


def _delete(command: str, keys_: list[str], args: dict[str, Any] | None = None) -> int:
    """Delete `keys_` from etcd, audited as `command` (with `args`); how many existed."""
    from cli import etcd_commands

    async def delete(client: Any) -> int:
        return sum([bool(await client.delete(key.encode())) for key in keys_])

    return int(etcd_commands.audited(command, args or {}, delete))


def push_bad_config() -> list[str]:
    """Write `_bad_values` for every post of the traffic into etcd (audited, as the game day)."""
    t = traffic.current()
    if t is None:
        raise RuntimeError("no traffic runs: start_traffic names the posts")
    values = _bad_values(t.post_ids)
    traffic.mark("bad config push")
    return _put("game day: bad config push", {"keys": len(values)}, values)


def remove_bad_config() -> int:
    """Delete what `push_bad_config` wrote (idempotent: in the rollbacks too)."""
    t = traffic.current()
    if t is None:
        return 0
    removed = _delete("game day: bad config removed", list(_bad_values(t.post_ids)))
    traffic.mark("recovered: bad config removed")
    return removed


def _stale_flag_values(post: str) -> dict[str, bytes]:
    """What the sampler and the operator write for a hot post (services/contracts/hotkeys.py):
    a hot-key flag and the list of every hot pool, for `post`, which is not hot."""
    from services.contracts import hotkeys, keys

    pools = [f"{layout.HOST}:{p}" for p in layout.from_env().ports.hot_pools]
    return {
        keys.HOTKEYS_PREFIX + post: hotkeys.encode_hot(5000.0, hotkeys.now_ms()),
        hotkeys.HOTPOOL_PREFIX + post: hotkeys.encode_pools(pools, hotkeys.now_ms()),
    }


def push_stale_hot_flag() -> dict[str, Any]:
    """A hot-key flag and hot-pool list for the traffic's first post, which nothing made hot
    (with hotkeys-freeze on, the operator leaves them in place): a stale flag."""
    post = _first_post()
    traffic.mark(f"stale hot flag {post}")
    written = _put("game day: stale hot flag", {"post_id": post}, _stale_flag_values(post))
    return {"post_id": post, "keys": written}


def remove_stale_hot_flag() -> int:
    """Delete what `push_stale_hot_flag` wrote (idempotent: in the rollbacks too)."""
    if traffic.current() is None:
        return 0
    removed = _delete("game day: stale hot flag removed", list(_stale_flag_values(_first_post())))
    traffic.mark("recovered: stale flag removed")
    return removed


# -- registry cache poisoning ----------------------------------------------------------------
REGISTRY = schema_registry_local.SchemaRegistry.name  # the component and its one server
_schema_versions: list[Any] = []  # what poison_schema_record rewrote: its records as they were


def _schemas_store() -> Any:
    """The registry's backing log (`_schemas`), written as the registry writes it (its Kafka
    user, acks=all)."""
    from local.components import kafka as kafka_local
    from local.schema_registry.store import KafkaSchemaStore
    from services.contracts import kafka as kafka_contract

    lay = layout.from_env()
    return KafkaSchemaStore(
        kafka_local.bootstrap_servers(lay),
        login=kafka_local.login(lay, kafka_contract.REGISTRY_USER),
        ca_file=kafka_local.ca_file(lay),
    )


def _rewrite(versions: list[Any], schema: str | None) -> None:
    """Every record of `versions` tombstoned, then written again with `schema` (None: its own):
    the registry keeps the first text it applied for an id while any version still uses it, so
    an id's text changes only once no version holds it."""
    store = _schemas_store()
    try:
        for sv in versions:
            store.append(sv.record()[0], None)
        for sv in versions:
            store.append(*dataclasses.replace(sv, schema=schema or sv.schema).record())
    finally:
        store.close()
    # it replays its log at start only; restarted without its deploy step while poisoned (the
    # step would register the good schema again, refused as incompatible with the bad one)
    kill([REGISTRY])
    sup = stack_supervisor()
    traffic.mark(f"restart {REGISTRY}")
    sup.start_component(sup.components[REGISTRY], _report, bootstrap=schema is None)
    traffic.mark("recovered")


def poison_schema_record() -> dict[str, Any]:
    """The registry serves a bad schema for the live id of the like event: its records in the
    backing topic rewritten with `_incompatible_like_schema()` and the registry restarted
    (a registry never serves a bad schema through its API). A consumer that fetches the id now
    caches it: every like it reads fails to decode. `restore_schema_record` undoes it."""
    import avro.schema

    from local.schema_registry.store import replay
    from services.contracts import events

    if _schema_versions:
        raise RuntimeError("a poisoned schema is still in place: restore_schema_record first")
    store = _schemas_store()
    try:
        state = replay(store)
    finally:
        store.close()
    schema_id = state.id_for(avro.schema.parse(events.LIKE_EVENT_SCHEMA))
    if schema_id is None:
        raise RuntimeError("the like event's schema is not registered")
    versions = state.usages(schema_id)
    bad, dropped, retyped = _incompatible_like_schema()
    _schema_versions[:] = versions
    traffic.mark(f"schema id {schema_id} poisoned")
    _rewrite(versions, json.dumps(bad))
    return {"id": schema_id, "versions": len(versions), "dropped": dropped, "retyped": retyped}


def restore_schema_record() -> int:
    """Undo `poison_schema_record`: the records as they were, the registry restarted. Idempotent
    (in the rollbacks too); the number of records restored."""
    if not _schema_versions:
        return 0
    versions = list(_schema_versions)
    _rewrite(versions, None)
    _schema_versions.clear()
    traffic.mark("schema restored")
    return len(versions)


def await_alert(name: str, timeout_s: float = 150.0) -> float:
    """Hold the fault until Alertmanager has delivered `name` firing (since the traffic
    started): seconds after the traffic's start. Raises after `timeout_s`: the alert never
    came, and the experiment fails there rather than after a fixed pause that guessed."""
    from chaos import probes

    t = traffic.current()
    since = t.started_wall if t is not None else time.time()
    deadline = time.monotonic() + timeout_s
    while True:
        fired = probes.alerts_since(since).get(name, {}).get("fired_s")
        if fired is not None:
            traffic.mark(f"{name} fired")
            return float(fired)
        if time.monotonic() > deadline:
            raise RuntimeError(f"{name} did not fire within {timeout_s:.0f} s")
        time.sleep(2)


def replay_dead_letters() -> dict[str, Any]:
    """`likes dlq replay --all --since <the run> --reconcile --yes --json`: every dead letter of
    the run back to the consumer that failed it (those past the aggregator's dedup horizon
    too: the reconciler then checks their posts). Letters that still cannot be read (poison)
    are refused and reported; anything else that fails raises."""
    import typer

    from cli import dlq as dlq_cli

    t = traffic.current()
    since = f"{int(time.time() - t.started_wall) + 10 if t else 600}s"
    buf, code = io.StringIO(), 0
    with contextlib.redirect_stdout(buf):
        try:
            dlq_cli.replay(None, all_=True, since=since, set_=None, reconcile=True, yes=True,
                           as_json=True)  # fmt: skip
        except typer.Exit as e:
            code = e.exit_code
    if code not in (dlq_cli.EXIT_OK, dlq_cli.EXIT_REFUSED):
        raise RuntimeError(f"likes dlq replay exited {code}: {buf.getvalue()[-500:]}")
    result = json.loads(buf.getvalue().splitlines()[-1])
    traffic.mark(f"{len(result['replayed'])} dead letters replayed")
    return {"replayed": len(result["replayed"]), "refused": len(result["refused"]),
            "reconciled": result["reconciled"]}  # fmt: skip
