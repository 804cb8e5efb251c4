"""Test session plumbing: the real local stack, started once through the `likes` CLI.

The tests' stack lives apart from a developer's (its own LIKES_HOME and a port offset), starts from
nothing, and is stopped at the end unless LIKES_KEEP_STACK=1. LIKES_TEST_REUSE=1 reuses a running
test stack instead of wiping it (quick iterations; CI never sets it).

LIKES_TEST_STACKS=2 (local/check.sh, with two xdist workers) gives the modules of SECOND_STACK
a second stack of their own (its own home, ports shifted by another 1000): they form their own
xdist group, so the worker that ran the tests needing no stack runs them on it while the first
stack's worker is still busy, instead of after everything else on one critical path.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import ssl
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aetcd
import pytest
from cassandra.auth import PlainTextAuthProvider
from confluent_kafka.schema_registry import SchemaRegistryClient

from local import components, layout, supervisor, transforms
from local import tls as local_tls
from services.contracts import etcd, kafka, registry, tls
from services.contracts.settings import HotPoolSettings

# scikit-learn's OpenMP threads (the abuse model's tests train and score) spin on the core the
# other xdist worker is using: measured with both cores busy, a training took 37 s of wall time
# and 33 s of CPU with the default, 20 s and 12 s with one thread. Set before anything loads
# the OpenMP runtime; inherited by the workers and by the processes the tests start.
os.environ.setdefault("OMP_NUM_THREADS", "1")
REPO = Path(__file__).resolve().parent.parent
TEST_HOME = Path(os.environ.get("LIKES_TEST_HOME", REPO / ".stack-test"))
TEST_OFFSET = int(os.environ.get("LIKES_TEST_PORT_OFFSET", "1000"))
LIKES = str(Path(sys.executable).parent / "likes")
# the modules run on the second stack with LIKES_TEST_STACKS=2: long waits on alert windows
# (~11 min of the suite), each test inducing and undoing its own faults; then game-day
# experiments, which the first stack's worker has no room for; then test_write_faults (~180 s):
# in a CI-like run the second stack's worker was done ~350 s before the first stack's; then
# test_recount (~110 s): the no-stack tests before the second stack lost ~200 s (ci27 had the
# two workers end 22 s apart)
SECOND_STACK = frozenset(
    {
        "tests/integration/test_alerts.py",
        "tests/integration/test_gameday.py",
        "tests/integration/test_recount.py",
        "tests/integration/test_write_faults.py",
    }
)
FIRST, SECOND = "stack", "stack-b"  # the stacks' names, and their xdist groups


@dataclass
class Stack:
    """Handles onto the running test stack: addresses, the supervisor, the CLI."""

    layout: layout.Layout
    env: dict[str, str]
    first_up: subprocess.CompletedProcess[str]
    stopped_servers: list[str] = field(default_factory=list)

    @property
    def supervisor(self) -> supervisor.Supervisor:
        return supervisor.Supervisor(self.layout, components.build(self.layout))

    def cli(
        self, *args: str, check: bool = True, timeout: float = 600
    ) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [LIKES, *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        if check and proc.returncode != 0:
            raise AssertionError(
                f"likes {' '.join(args)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
            )
        return proc

    def up(self) -> dict[str, dict[str, object]]:
        """Rerun the idempotent `likes local up`: restarts whatever a test stopped."""
        return json.loads(self.cli("local", "up", "--json").stdout.splitlines()[-1])

    def status(self) -> dict[str, dict[str, object]]:
        return json.loads(self.cli("local", "status", "--json").stdout)

    def pid(self, name: str) -> int:
        """The pid of the stack's running `name`, from the supervisor's records (what `status`
        lists, without its probe of every server: a CLI process and ~50 probes, TLS logins among
        them, took 15-20 s of a loaded CI machine each time a test only wanted a pid)."""
        running = self.supervisor.running()
        assert name in running, f"{name} is not running (running: {sorted(running)})"
        return running[name].pid

    # addresses, from the same Layout the CLI uses
    @property
    def host(self) -> str:
        return layout.HOST

    @property
    def count_cache_nodes(self) -> list[tuple[str, int]]:
        return [(layout.HOST, p) for p in self.layout.ports.count_cache]

    @property
    def idem_nodes(self) -> list[tuple[str, int]]:
        return [(layout.HOST, p) for p in self.layout.ports.idem_store]

    @property
    def etcd_port(self) -> int:
        return self.layout.ports.etcd_client

    @property
    def kafka_bootstrap(self) -> str:
        return ",".join(
            f"{layout.HOST}:{p}"
            for p in self.layout.ports.kafka_brokers[: self.layout.kafka_brokers]
        )

    @property
    def cassandra_port(self) -> int:
        return self.layout.ports.cassandra_native

    @property
    def registry_url(self) -> str:
        from local.components import schema_registry as registry_component

        return registry_component.url(self.layout)

    @property
    def ca_file(self) -> str | None:
        """The stack's CA (the test stack runs the --tls profile, as production serves TLS)."""
        return local_tls.client_ca(self.layout)

    @property
    def cassandra_ssl(self) -> ssl.SSLContext | None:
        """A driver session's TLS to the stack's Cassandra (what clients.cassandra_tls builds)."""
        return tls.cassandra_context(self.ca_file) if self.ca_file else None

    @property
    def registry_verify(self) -> ssl.SSLContext | bool:
        """httpx's `verify` for the stack's registry."""
        return tls.client_context(self.ca_file) if self.ca_file else True

    def service_url(self, name: str) -> str:
        """An HTTP service's API (write, read, hotkey-sampler) as the stack runs it: https with
        the gateway's mTLS in the --tls profile (httpx's `verify=stack.service_verify`)."""
        scheme = "https" if self.layout.tls else "http"
        return f"{scheme}://{layout.HOST}:{transforms.local_port(self.layout, name)}"

    def ops_url(self, name: str) -> str:
        """A workload's probes and metrics: plain HTTP in both profiles, as in the cluster."""
        return f"http://{layout.HOST}:{transforms.local_ops_port(self.layout, name)}"

    @property
    def service_verify(self) -> ssl.SSLContext | bool:
        """httpx's `verify` for a service's API: the stack's CA, and the gateway's certificate as
        the client's (the services require one; a test calling them directly plays the gateway)."""
        if not self.layout.tls:
            return True
        return tls.mtls_client_context(str(local_tls.workload_dir(self.layout, tls.GATEWAY)))

    @property
    def prometheus_url(self) -> str:
        return f"http://{layout.HOST}:{self.layout.ports.prometheus}"

    def workload_env(self, workload: str = "write") -> dict[str, str]:
        """The env the stack gives a rendered workload (what `likes local up` started it with)."""
        for p in transforms.processes(self.layout, self.layout.stack, check=False):
            if p.workload.name == workload:
                return {k: v for k, v in p.env.items() if k.startswith("LIKES_")}
        raise KeyError(workload)

    def settings(self, **overrides: object) -> HotPoolSettings:
        """The settings the stack's services run with (their rendered env, transformed): the
        read service's, a superset of the shared ones (it adds the hot pools)."""
        env = self.workload_env("read")
        values: dict[str, object] = {k.removeprefix("LIKES_").lower(): v for k, v in env.items()}
        return HotPoolSettings.model_validate({**values, **overrides})

    def token(self, user_id: str, ttl_s: int = 3600, account_created: int | None = None) -> str:
        """A bearer token from the stack's local identity provider."""
        return transforms.sign_token(self.layout, user_id, ttl_s, account_created)

    @property
    def redis_password(self) -> str:
        """Every local Redis requires it (the program's redis-auth secret, as played here)."""
        from local.components import redis as redis_component

        return redis_component.password(self.layout)

    @property
    def cassandra_login(self) -> tuple[str, str]:
        """The services' role and password (the program's scylla-auth secret, as played here):
        the local Cassandra refuses a session without a login."""
        from local.components import cassandra as cassandra_component

        return cassandra_component.service_login(self.layout)

    @property
    def cassandra_auth(self) -> PlainTextAuthProvider:
        return PlainTextAuthProvider(*self.cassandra_login)

    @property
    def etcd_credentials(self) -> etcd.Credentials:
        """etcd requires a login (the program's etcd-auth secret, as played here)."""
        from local.components import etcd as etcd_component

        return etcd_component.credentials(self.layout)

    def etcd(self, timeout: float = 15.0) -> aetcd.Client:
        """A client of the stack's etcd, logged in as the services are. The deadline is generous:
        a login is a TLS handshake plus etcd's bcrypt, seconds on a loaded 2-core machine, and no
        test measures it (one that needs a dead server to fail fast passes its own)."""
        return etcd.client(self.host, self.etcd_port, self.etcd_credentials, timeout, self.ca_file)

    @property
    def kafka_login(self) -> kafka.Credentials:
        """The services' Kafka user: the local brokers refuse a client without a login."""
        from local.components import kafka as kafka_component

        return kafka_component.login(self.layout, kafka.SERVICE_USER)

    def kafka_config(self) -> dict[str, Any]:
        """A Kafka client's connection settings, logged in as the services are (the local
        brokers run no authorizer: this user may also create and delete test topics)."""
        return kafka.client_config(self.kafka_bootstrap, self.kafka_login, self.ca_file)

    @property
    def registry_login(self) -> registry.Credentials:
        """The services' registry login: the local registry answers 401 without one."""
        from local.components import schema_registry as registry_component

        return registry_component.credentials(self.layout)

    def registry_client(self) -> SchemaRegistryClient:
        """confluent-kafka's registry client, logged in as the services are."""
        return SchemaRegistryClient(
            registry.client_config(self.registry_url, self.registry_login, ca_file=self.ca_file)
        )

    @property
    def gateway_url(self) -> str:
        """The API as clients reach it: the rendered Envoy."""
        return f"http://{layout.HOST}:{self.layout.ports.gateway}"

    @property
    def alertmanager_url(self) -> str:
        return f"http://{layout.HOST}:{self.layout.ports.alertmanager}"


def _where(name: str) -> tuple[Path, int]:
    """The stack's home and port offset."""
    if name == FIRST:
        return TEST_HOME, TEST_OFFSET
    return TEST_HOME.with_name(TEST_HOME.name + "-b"), TEST_OFFSET + 1000


def _env(name: str = FIRST) -> dict[str, str]:
    home, offset = _where(name)
    env = dict(os.environ)
    env["LIKES_HOME"] = str(home)
    env["LIKES_PORT_OFFSET"] = str(offset)
    env.pop("LIKES_KAFKA_BROKERS", None)
    return env


def _start(name: str) -> Stack:
    env = _env(name)
    home, offset = _where(name)
    # from nothing: stop a leftover test stack and wipe its data (LIKES_TEST_REUSE=1 keeps a
    # running one, for quick iterations on one test file)
    if os.environ.get("LIKES_TEST_REUSE") != "1":
        subprocess.run(
            [LIKES, "local", "down", "--wipe"], env=env, capture_output=True, timeout=300
        )
        if home.exists():
            shutil.rmtree(home)
    # the TLS profile: every test talks to etcd, Kafka, Cassandra and the registry over TLS,
    # as the program's clients do (LIKES_TEST_TLS=0: plaintext, to compare)
    profile = "--no-tls" if os.environ.get("LIKES_TEST_TLS") == "0" else "--tls"
    # without the faults profile by default (LIKES_TEST_FAULTS=1: every node behind its Toxiproxy
    # proxy, as the game day's network experiments need): on the whole suite it cost ~90 s of
    # the CI budget, and the profile has its own tests (test_faults_profile.py, a scratch world)
    faults = "--faults" if os.environ.get("LIKES_TEST_FAULTS") == "1" else "--no-faults"
    first = subprocess.run(
        [LIKES, "local", "up", profile, faults, "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    home = home.resolve()
    brokers = layout.recorded_brokers(home) or 3
    lay = layout.Layout(
        home=home,
        ports=layout.Ports(offset),
        kafka_brokers=brokers,
        stack=layout.recorded_stack(home) or layout.DEFAULT_STACK,
        tls=bool(layout.recorded_tls(home)),
        faults=bool(layout.recorded_faults(home)),
    )
    s = Stack(layout=lay, env=env, first_up=first)
    if first.returncode != 0:
        pytest.fail(
            f"`likes local up` failed ({first.returncode}):\n{first.stdout}\n{first.stderr}"
        )
    return s


class _Stacks:
    """The session's stacks, each started on first use and stopped at the session's end."""

    def __init__(self) -> None:
        self.started: dict[str, Stack] = {}
        self.failed: dict[str, BaseException] = {}

    def get(self, name: str) -> Stack:
        if name in self.failed:  # once: each module would otherwise wait out its own attempt
            raise self.failed[name]
        if name not in self.started:
            try:
                self.started[name] = _start(name)
            except BaseException as e:
                self.failed[name] = e
                raise
        return self.started[name]

    def stop(self) -> None:
        if os.environ.get("LIKES_KEEP_STACK") == "1":
            return
        for s in self.started.values():
            subprocess.run([LIKES, "local", "down"], env=s.env, capture_output=True, timeout=300)


@pytest.fixture(scope="session")
def _stacks() -> Iterator[_Stacks]:
    stacks = _Stacks()
    yield stacks
    stacks.stop()


def _stack_of(nodeid: str) -> str:
    second = os.environ.get("LIKES_TEST_STACKS") == "2" and nodeid.split("::")[0] in SECOND_STACK
    return SECOND if second else FIRST


@pytest.fixture(scope="module")
def stack(request: pytest.FixtureRequest, _stacks: _Stacks) -> Stack:
    """The running test stack this module's tests share (the first, or the second for the
    modules of SECOND_STACK when LIKES_TEST_STACKS=2)."""
    return _stacks.get(_stack_of(request.node.nodeid))


def _needs_stack(item: pytest.Item) -> bool:
    """It uses the `stack` fixture (the infra tests' `stack` parameter is a Pulumi stack's
    name: those need no local stack, and ran on the stack's worker, its critical path)."""
    params = getattr(getattr(item, "callspec", None), "params", {})
    return "stack" in getattr(item, "fixturenames", ()) and "stack" not in params


def pytest_itemcollected(item: pytest.Item) -> None:
    """The tests on the session's stack form one xdist group (local/check.sh runs `-n 2 --dist
    loadgroup`): one worker starts the stack and runs them in order, mostly waiting on the
    servers, while the other runs the rest meanwhile, a module per group (a module's servers,
    such as test_gateway's edge, start once and on one worker). Marked here, as each item is
    collected: xdist reads the groups in its own pytest_collection_modifyitems."""
    group = _stack_of(item.nodeid) if _needs_stack(item) else item.nodeid.split("::")[0]
    item.add_marker(pytest.mark.xdist_group(group))
    if _needs_stack(item):
        # the suite's timeout covers the test, not the start of its stack (which the first test
        # of each stack's group pays, bounded by its own `likes local up` timeout): the second
        # stack's start took 220-380 s of a loaded CI machine and left its first test too
        # little of the 600 s (CI, 2026-12-06)
        timeout = float(item.config.getini("timeout") or 0)
        item.add_marker(pytest.mark.timeout(timeout, func_only=True))


# how far the tests that need no stack step back on the CPU while the stack's tests run beside
# them on the other xdist worker: the stack group is the run's critical path, and its start-up and
# CPU-bound tests slowed by half when promtool and the Pulumi mocks took a core from them.
# Niceness is inherited, so the servers a module starts (test_gateway's edge) step back too.
NO_STACK_NICENESS = 10


def _step_back(niceness: int) -> None:
    # only root lowers it again; the stack's group runs first anyway
    with contextlib.suppress(PermissionError):
        os.setpriority(os.PRIO_PROCESS, 0, niceness)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _step_back(0 if _needs_stack(item) else NO_STACK_NICENESS)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # the stack's tests first; those marked `last` (the stack's teardown check) after every
    # other test of their group
    items.sort(key=lambda it: (it.get_closest_marker("last") is not None, not _needs_stack(it)))
