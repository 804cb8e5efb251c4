"""The contract suite: what the program renders for each stack, checked against the code it deploys.

The infra layer used to be verified only against itself (review H13). Each check below reads a
rendered resource (Pulumi mocks, `plans` fixture: one plan per stack per session) and the code
that resource configures, and fails when the two disagree:

- (a) env names and values: the workload's own settings class builds from its rendered env (C1)
- (b) bind address, container port, command port and probe port agree (C2)
- (c) probe paths are routes the code serves; readiness can turn false (H14)
- (d) the operator's Kopf module watches the CRD the program installs; its policy parses (C4)
- (e) the gateway mirrors reads to the sampler's Service, on routes the sampler serves (C8)
- (f) the topics the program creates are the code's topics
- (g) the idem-store is a Redis Cluster on both sides; Redis clients get the password (C3)
- (h) every internal server's login reaches the workloads from a Secret, never as a literal, and
      the program runs the applier that makes the server require it (issue 9)
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import re
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from urllib.parse import urlsplit

import jsonschema
import kopf
import pytest
import typer
import typer.core
import typer.main
import yaml
from cassandra.connection import DefaultEndPoint
from cassandra.policies import SimpleConvictionPolicy
from cassandra.pool import Host
from fastapi import FastAPI
from fastapi.testclient import TestClient
from pydantic import ValidationError
from redis.cluster import RedisCluster
from starlette.routing import Match

from cli import abuse as abuse_cli
from infra import alert_rules, config, envoy_config, observability, plan, program, stackfile
from infra import redis as infra_redis
from infra import schema_registry as infra_registry
from infra import scylla as infra_scylla
from infra import services as infra_services
from operators.hotkeys import handlers
from operators.hotkeys.policy import InvalidPolicy, Policy
from services.abuse import model_server
from services.abuse import settings as abuse_settings
from services.aggregator.settings import AggregatorSettings
from services.common import worker_http
from services.contracts import clients, etcd, events, keys, registry, routes, tls, workloads
from services.contracts import kafka as kafka_contract
from services.contracts.settings import Settings, UnknownVariable, parse_nodes
from services.schema import cql_roles, etcd_auth, migrate, registry_schemas
from tests.infra.conftest import STACKS, by_kind, named

# the `env` each stack's workloads must run under (never the local defaults)
ENV_OF_STACK = {"staging": "staging", "prod-us": "prod", "prod-eu": "prod"}
DUMMY_SECRET = "dummy-secret-from-a-secret-key-ref"
NOT_SETTINGS = frozenset({"PYTHONDONTWRITEBYTECODE"})  # the only non-LIKES_* env we set
# workloads that open a Redis connection (count-cache, idem-store or hot pools)
REDIS_CLIENTS = (
    workloads.WRITE, workloads.READ, workloads.AGGREGATOR, workloads.HOTKEY_OPERATOR,
)  # fmt: skip

WORKLOAD_CASES = [pytest.param(s, w, id=f"{s}-{w.name}") for s in STACKS for w in workloads.ALL]


def test_every_stack_has_a_known_env() -> None:
    assert set(STACKS) == set(ENV_OF_STACK)


# -- reading the render -------------------------------------------------------------------------
@dataclass(frozen=True)
class SecretKey:
    secret: str
    key: str


@dataclass(frozen=True)
class Container:
    namespace: str
    pod_labels: dict[str, str]
    command: list[str]
    env: dict[str, str | SecretKey]
    ports: list[int]
    liveness: tuple[str, int]
    readiness: tuple[str, int]
    annotations: dict[str, str]

    def resolved_env(self) -> dict[str, str]:
        """The env a pod would see, with every secretKeyRef standing in as a dummy value."""
        return {k: DUMMY_SECRET if isinstance(v, SecretKey) else v for k, v in self.env.items()}


def _probe(raw: dict[str, Any]) -> tuple[str, int]:
    return raw["httpGet"]["path"], int(raw["httpGet"]["port"])


def container_of(p: plan.Plan, w: workloads.Workload, name: str | None = None) -> Container:
    """The workload's container of its Deployment (Deployments are named by workload), or the
    one `name`d (a sidecar); a pod holds nothing else."""
    dep = named(p, "Deployment", w.name).inputs
    template = dep["spec"]["template"]
    main, *sidecars = template["spec"]["containers"]
    assert [s["name"] for s in sidecars] == ([w.sidecar.name] if w.sidecar else [])
    c = main if name is None else next(s for s in sidecars if s["name"] == name)
    env: dict[str, str | SecretKey] = {}
    for e in c.get("env", []):
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        env[e["name"]] = SecretKey(ref["name"], ref["key"]) if ref else str(e["value"])
    return Container(
        namespace=dep["metadata"]["namespace"],
        pod_labels=template["metadata"]["labels"],
        command=[*c.get("command", []), *c.get("args", [])],
        env=env,
        ports=[int(port["containerPort"]) for port in c.get("ports", [])],
        liveness=_probe(c["livenessProbe"]),
        readiness=_probe(c["readinessProbe"]),
        annotations=template["metadata"].get("annotations") or {},
    )


@pytest.fixture()
def build_settings(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Settings]:
    """The workload's settings class, constructed as a pod would: from exactly this env."""

    def build(w: workloads.Workload, env: dict[str, str]) -> Settings:
        with monkeypatch.context() as m:
            for k in list(os.environ):
                m.delenv(k)
            for k, v in env.items():
                m.setenv(k, v)
            return w.settings_class()()

    return build


def likes_env(c: Container) -> dict[str, str]:
    return {k: v for k, v in c.resolved_env().items() if k.startswith("LIKES_")}


# -- (a) env: names the settings class reads, values it accepts (C1) ----------------------------
@pytest.mark.parametrize(("stack", "w"), WORKLOAD_CASES)
def test_every_env_name_the_program_sets_is_read_by_the_workloads_settings(
    plans: dict[str, plan.Plan], stack: str, w: workloads.Workload
) -> None:
    c = container_of(plans[stack], w)
    names = set(c.env)
    unread = {n for n in names if n.startswith("LIKES_")} - w.settings_class().env_names()
    assert unread == set(), f"{w.name} sets {sorted(unread)}, which its settings never read"
    assert {n for n in names if not n.startswith("LIKES_")} <= NOT_SETTINGS


@pytest.mark.parametrize(("stack", "w"), WORKLOAD_CASES)
def test_the_workloads_settings_build_from_its_rendered_env(
    plans: dict[str, plan.Plan],
    build_settings: Callable[..., Settings],
    stack: str,
    w: workloads.Workload,
) -> None:
    c = container_of(plans[stack], w)
    env = likes_env(c)
    s = build_settings(w, env)
    assert s.env == ENV_OF_STACK[stack] == env["LIKES_ENV"]
    # every rendered variable reached a field (none silently fell back to a default)
    assert {type(s).env_name(f) for f in s.model_fields_set} >= set(env)
    assert s.redis_auth == DUMMY_SECRET
    # the check can fail: a misspelled name is refused, a missing endpoint is named
    with pytest.raises(UnknownVariable, match="LIKES_KAFKA_BOOTSTRAPS"):
        build_settings(w, {**env, "LIKES_KAFKA_BOOTSTRAPS": env["LIKES_KAFKA_BOOTSTRAP"]})
    without = {k: v for k, v in env.items() if k != "LIKES_KAFKA_BOOTSTRAP"}
    with pytest.raises(ValidationError, match="LIKES_KAFKA_BOOTSTRAP"):
        build_settings(w, without)


def test_the_aggregator_purges_the_cdn_with_the_purge_token_secret(
    plans: dict[str, plan.Plan],
) -> None:
    for stack in STACKS:
        c = container_of(plans[stack], workloads.AGGREGATOR)
        name = AggregatorSettings.env_name
        assert c.env[name("cdn_purger")] == "cloudflare"
        token = c.env[name("cloudflare_api_token")]
        assert token == SecretKey(infra_services.CDN_PURGE_SECRET, "token")
        secret = named(plans[stack], "Secret", token.secret).inputs
        assert secret["metadata"]["namespace"] == c.namespace
        assert set(secret["stringData"]) == {token.key}


# -- (b) bind address and ports (C2) ------------------------------------------------------------
def _flag(command: list[str], flag: str) -> str:
    assert flag in command, f"{flag} missing from {command}"
    return command[command.index(flag) + 1]


@pytest.mark.parametrize(("stack", "w"), WORKLOAD_CASES)
def test_the_workload_binds_all_interfaces_on_the_port_its_probes_hit(
    plans: dict[str, plan.Plan], stack: str, w: workloads.Workload
) -> None:
    c = container_of(plans[stack], w)
    if w.kind == "operator":
        (liveness,) = [a for a in c.command if a.startswith("--liveness=")]
        url = urlsplit(liveness.removeprefix("--liveness="))
        host, port, path = url.hostname, url.port, url.path
        assert path == workloads.HEALTH_PATH  # Kopf serves its liveness endpoint on this path
    else:
        host, port = _flag(c.command, "--host"), int(_flag(c.command, "--port"))
    assert host == workloads.BIND_ALL, f"{w.name} binds {host}: the kubelet probes the pod IP"
    if w.kind == "http":  # the API on --port (mTLS), probes and metrics on --ops-port (plain)
        assert port == w.port
        port = int(_flag(c.command, "--ops-port"))
        assert c.ports == [w.port, port]
    else:
        assert c.ports == [port]
    assert port == w.ops_port
    assert c.liveness == (workloads.HEALTH_PATH, port)
    assert c.readiness == (w.ready_path, port)
    if c.annotations.get("prometheus.io/scrape") == "true":
        assert c.annotations["prometheus.io/port"] == str(port)
        assert c.annotations["prometheus.io/path"] == workloads.METRICS_PATH


@pytest.mark.parametrize("stack", STACKS)
def test_the_abuse_scorer_dials_its_model_sidecar_which_reads_the_models_claim(
    plans: dict[str, plan.Plan], build_settings: Callable[..., Settings], stack: str
) -> None:
    p, w, sidecar = plans[stack], workloads.ABUSE_SCORER, workloads.ABUSE_MODEL
    scorer = build_settings(w, likes_env(container_of(p, w)))
    c = container_of(p, w, sidecar.name)
    # the sidecar's command, parsed by the model server's own flags (an unknown one exits)
    module = ["python", "-m", sidecar.module]
    assert c.command[:3] == module
    args = model_server.parser().parse_args(c.command[3:])
    # it serves on every interface (the kubelet probes the pod IP) the port the scorer dials on
    # the pod's loopback, and its probes hit the ops port it serves
    assert scorer.abuse_model_target == f"127.0.0.1:{args.port}"  # type: ignore[attr-defined]
    assert args.host == workloads.BIND_ALL and sorted(c.ports) == sorted([args.port, args.ops_port])
    assert c.liveness == (workloads.HEALTH_PATH, args.ops_port)
    assert c.readiness == (workloads.READY_PATH, args.ops_port)
    # the models it reads are the shared claim's (ReadWriteMany: every scorer pod, the trainer)
    pod = named(p, "Deployment", w.name).inputs["spec"]["template"]["spec"]
    (raw,) = [x for x in pod["containers"] if x["name"] == sidecar.name]
    (mount,) = [m for m in raw["volumeMounts"] if m["mountPath"] == str(args.model_dir)]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    claim = named(p, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"])
    assert claim.inputs["spec"]["accessModes"] == ["ReadWriteMany"]
    assert mount.get("readOnly") is True  # the trainer publishes; a server only reads
    # small batches: OpenMP threads would only spin (infra/services.py `_sidecar`)
    assert {"name": "OMP_NUM_THREADS", "value": "1"} in raw["env"]


def test_the_scorers_feature_store_follows_its_replica_bound(
    configs: dict[str, config.StackConfig],
) -> None:
    """likes.committed is keyed by post: two scorer replicas each read a share of every user's
    likes, and in-process features would see half a bot's pace. The program renders the store
    from max_replicas, never from a second switch: a scorer pinned to one replica keeps its
    features in memory; one the HPA may scale past one reads the shared store, through its own
    settings class's env name. Every stack scales it now (infra/config.py says to what), so
    every stack runs the shared store, and no replica past the source topic's partitions."""
    w = workloads.ABUSE_SCORER
    name = w.settings_class().env_name("abuse_feature_store")

    def rendered(cfg: config.StackConfig, lo: int, hi: int) -> str:
        scale = cfg.services.abuse_scorer.model_copy(
            update={"min_replicas": lo, "max_replicas": hi}
        )
        services = cfg.services.model_copy(update={"abuse_scorer": scale})
        return program.workload_env(cfg.model_copy(update={"services": services}), {}, [])[w.name][
            name
        ]

    for stack, cfg in configs.items():
        scale = cfg.services.abuse_scorer
        assert program.workload_env(cfg, {}, [])[w.name][name] == abuse_settings.feature_store_for(
            scale.max_replicas
        ), stack
        assert rendered(cfg, 2, 4) == "shared", stack
        assert rendered(cfg, 1, 1) == "memory", stack
        assert program.workload_env(cfg, {}, [])[w.name][name] == "shared", stack
        assert 2 <= scale.min_replicas <= scale.max_replicas <= cfg.kafka.partitions, stack


def _cli_command(argv: list[str]) -> tuple[Callable[..., Any], dict[str, Any]]:
    """`python -m MODULE ARGS...` resolved by the module's own Typer app, as it would run: the
    function a command line calls and the parameters it gets (a renamed command or option, or
    a value its type refuses, raises)."""
    assert argv[:2] == ["python", "-m"], argv
    cmd = typer.main.get_command(importlib.import_module(argv[2]).app)
    name, rest, ctx = "likes", argv[3:], None
    while isinstance(cmd, typer.core.TyperGroup):
        ctx = cmd.context_class(cmd, info_name=name, parent=ctx)
        name, cmd, rest = cmd.resolve_command(ctx, rest)
    ctx = cmd.make_context(name, rest, parent=ctx)
    assert cmd.callback is not None
    return inspect.unwrap(cmd.callback), ctx.params


@pytest.mark.parametrize("stack", STACKS)
def test_the_models_publisher_trains_with_the_gate_into_the_claim_the_sidecar_reads(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    """Issue 13: the CronJob is what puts a model on the claim in production. Its command is
    `likes abuse train` with the gate (a version below the goals never becomes current), and it
    writes where the sidecar reads: the same claim, mounted writable at the path the sidecar's
    own flags name."""
    p, w, sidecar = plans[stack], workloads.ABUSE_SCORER, workloads.ABUSE_MODEL
    job = named(p, "CronJob", infra_services.MODELS_PUBLISHER).inputs
    pod = job["spec"]["jobTemplate"]["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    train, params = _cli_command([*c.get("command", []), *c.get("args", [])])
    assert train is abuse_cli.train
    assert params["gate"] is True and params["as_json"] is True
    # the sidecar's --model-dir, parsed by the model server, and the claim behind its mount
    deployment = named(p, "Deployment", w.name).inputs
    served = deployment["spec"]["template"]["spec"]
    (raw,) = [x for x in served["containers"] if x["name"] == sidecar.name]
    model_dir = model_server.parser().parse_args(raw["command"][3:]).model_dir
    assert str(params["model_dir"]) == str(model_dir) == workloads.MODELS_MOUNT
    (read,) = [m for m in raw["volumeMounts"] if m["mountPath"] == str(model_dir)]
    (write,) = [m for m in c["volumeMounts"] if m["mountPath"] == str(params["model_dir"])]
    assert not write.get("readOnly")
    claims = [
        next(v for v in spec["volumes"] if v["name"] == m["name"])["persistentVolumeClaim"]
        for spec, m in ((served, read), (pod, write))
    ]
    assert claims[0]["claimName"] == claims[1]["claimName"] == infra_services.MODELS_CLAIM
    assert not claims[1].get("readOnly")
    # a pod mounts only claims of its own namespace
    assert job["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    # the exit codes that fail the Job at once are the command's own refusals
    (verdicts,) = [r for r in job["spec"]["jobTemplate"]["spec"]["podFailurePolicy"]["rules"]
                   if r["action"] == "FailJob"]  # fmt: skip
    assert verdicts["onExitCodes"]["containerName"] == c["name"]
    assert set(verdicts["onExitCodes"]["values"]) == {abuse_cli.EXIT_REFUSED, abuse_cli.EXIT_ERROR}
    assert abuse_cli.EXIT_OK not in verdicts["onExitCodes"]["values"]


@pytest.mark.parametrize(
    "w", [w for w in workloads.ALL if w.kind == "worker"], ids=lambda w: w.name
)
def test_worker_entry_points_take_the_host_the_program_passes(w: workloads.Workload) -> None:
    # the rendered `--host 0.0.0.0` must be a flag the module parses, or it exits at start
    out = subprocess.run(
        [sys.executable, "-m", w.module, "--help"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert "--host" in out.stdout and "--port" in out.stdout


def test_http_services_entry_point_takes_the_flags_the_program_passes() -> None:
    out = subprocess.run(
        [sys.executable, "-m", workloads.SERVE_MODULE, "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    rendered_flags = {a for a in workloads.WRITE.command() if a.startswith("--")}
    assert rendered_flags == {"--host", "--port", "--ops-port", "--tls-dir"}
    assert all(flag in out.stdout for flag in rendered_flags), out.stdout


# -- (c) probe paths are served; readiness can fail ---------------------------------------------
def _app(w: workloads.Workload) -> FastAPI:
    """The workload's app as uvicorn --factory builds it, lifespan not started (no stores)."""
    factory = importlib.import_module(w.module).create_app
    app: FastAPI = factory(w.settings_class()(env="local"))
    return app


@pytest.fixture()
def local_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in list(os.environ):
        if k.startswith("LIKES_"):
            monkeypatch.delenv(k)


def _serves(app: FastAPI, method: str, path: str) -> bool:
    """Whether the app's router dispatches `method path` to a route (included routers too:
    this FastAPI keeps them as one entry of `app.routes`, so a flat path list would miss them)."""
    scope = {"type": "http", "method": method, "path": path, "root_path": ""}
    return any(r.matches(scope)[0] == Match.FULL for r in app.routes)


@pytest.mark.usefixtures("local_env")
@pytest.mark.parametrize("w", [w for w in workloads.ALL if w.kind == "http"], ids=lambda w: w.name)
def test_http_workloads_serve_their_probe_and_metrics_paths(w: workloads.Workload) -> None:
    app = _app(w)
    for path in (workloads.HEALTH_PATH, workloads.READY_PATH, workloads.METRICS_PATH):
        assert _serves(app, "GET", path), f"{w.name} does not serve GET {path}"
    assert not _serves(app, "GET", "/healthz-typo")  # the matcher can say no


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def test_workers_serve_their_probe_and_metrics_paths_and_readiness_turns_false() -> None:
    checks = {"edge-store": True}
    server = worker_http.serve("127.0.0.1", 0, lambda: dict(checks))
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert _get(base + workloads.HEALTH_PATH)[0] == 200
        assert _get(base + workloads.READY_PATH)[0] == 200
        status, body = _get(base + workloads.METRICS_PATH)
        assert status == 200 and b"# HELP" in body
        checks["edge-store"] = False
        status, body = _get(base + workloads.READY_PATH)
        assert status == 503 and json.loads(body)["checks"] == {"edge-store": False}
        assert _get(base + "/nope")[0] == 404
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize(
    "w", [w for w in workloads.ALL if w.kind == "worker"], ids=lambda w: w.name
)
def test_worker_modules_serve_ops_through_worker_http_on_the_parsed_address(
    w: workloads.Workload,
) -> None:
    spec = importlib.util.find_spec(f"{w.module}.__main__")
    assert spec is not None and spec.origin is not None
    source = Path(spec.origin).read_text()
    assert re.search(r"worker_http\.serve\(\s*args\.host,\s*args\.port", source), (
        f"{w.module} does not serve its probes on --host/--port"
    )


def _host(state: str) -> Host:
    h = Host(DefaultEndPoint("127.0.0.1"), SimpleConvictionPolicy)
    if state == "up":
        h.set_up()
    elif state == "down":
        h.set_down()
    return h  # "unknown": the driver never reached it (is_up is None)


class _Idem:
    def ping(self) -> bool:
        return True


@pytest.mark.usefixtures("local_env")
@pytest.mark.parametrize(
    ("hosts", "ready"),
    [
        (["down", "down", "down"], False),  # H14: all_hosts() lists down hosts too
        (["unknown"], False),
        ([], False),
        (["down", "up"], True),
    ],
)
def test_write_readiness_is_false_when_the_driver_has_no_live_edge_store_host(
    hosts: list[str], ready: bool
) -> None:
    app = _app(workloads.WRITE)
    # the lifespan is not run: the writer's driver objects stand in (real cassandra Hosts)
    metadata = SimpleNamespace(all_hosts=lambda: [_host(h) for h in hosts])
    app.state.writer = SimpleNamespace(
        idem=_Idem(), session=SimpleNamespace(cluster=SimpleNamespace(metadata=metadata))
    )
    app.state.clock = SimpleNamespace(ok=lambda: True)  # checked on the real store: test_relay
    r = TestClient(app).get(workloads.READY_PATH)
    assert r.status_code == (200 if ready else 503)
    assert r.json()["checks"]["edge-store"] is ready
    # and a clock too far from the edge-store's is not ready either (review D11)
    app.state.clock = SimpleNamespace(ok=lambda: False)
    r = TestClient(app).get(workloads.READY_PATH)
    assert r.status_code == 503 and r.json()["checks"]["clock"] is False


# -- (d) the operator and its CRD (C4) ----------------------------------------------------------
def _crd(p: plan.Plan) -> dict[str, Any]:
    (crd,) = by_kind(p, "CustomResourceDefinition")
    return crd.inputs


def _strip_k8s_extensions(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _strip_k8s_extensions(v) for k, v in schema.items()
                if not k.startswith("x-kubernetes")}  # fmt: skip
    if isinstance(schema, list):
        return [_strip_k8s_extensions(v) for v in schema]
    return schema


@pytest.mark.parametrize("stack", STACKS)
def test_the_operator_watches_the_crd_the_program_installs(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    crd = _crd(plans[stack])["spec"]
    served = [v["name"] for v in crd["versions"] if v["served"]]
    group, plural, kind = crd["group"], crd["names"]["plural"], crd["names"]["kind"]
    assert (group, plural) == (handlers.GROUP, handlers.PLURAL)
    assert handlers.VERSION in served
    # the module the Deployment runs registers a handler that selects exactly that resource
    c = container_of(plans[stack], workloads.HOTKEY_OPERATOR)
    module = _flag(c.command, "-m")
    assert module == workloads.HOTKEY_OPERATOR.module
    importlib.import_module(module)
    resource = kopf.Resource(group, handlers.VERSION, plural, kind=kind, namespaced=True)
    other = kopf.Resource("likes.example.com", handlers.VERSION, plural, kind=kind)
    ours = [
        h
        for h in kopf.get_default_registry()._spawning.get_all_handlers()
        if h.fn.__module__ == module
    ]
    assert ours and all(h.selector is not None and h.selector.check(resource) for h in ours)
    assert not any(h.selector is not None and h.selector.check(other) for h in ours)
    # and may read it: RBAC on the CRD's group and plural
    role = next(r for r in by_kind(plans[stack], "ClusterRole") if "hotkey-operator" in r.name)
    assert any(
        group in rule["apiGroups"] and plural in rule["resources"] and "watch" in rule["verbs"]
        for rule in role.inputs["rules"]
    )


@pytest.mark.parametrize("stack", STACKS)
def test_the_default_policy_parses_with_the_operators_reading_and_the_crd_schema(
    plans: dict[str, plan.Plan], configs: dict[str, config.StackConfig], stack: str
) -> None:
    crd = _crd(plans[stack])
    (policy,) = by_kind(plans[stack], crd["spec"]["names"]["kind"])
    served = next(v for v in crd["spec"]["versions"] if v["name"] == handlers.VERSION)
    assert policy.inputs["apiVersion"] == f"{crd['spec']['group']}/{served['name']}"
    parsed = Policy.from_spec(policy.inputs["spec"])
    assert parsed.replication_factor <= configs[stack].redis.hot_pools
    schema = _strip_k8s_extensions(served["schema"]["openAPIV3Schema"])
    validator = jsonschema.Draft4Validator(schema)  # OpenAPI v3.0: boolean exclusiveMinimum
    validator.validate(policy.inputs)
    # both readings can fail: the old infra spec's fields, and a value out of the schema's range
    with pytest.raises(InvalidPolicy, match="hotThresholdQps"):
        Policy.from_spec({**policy.inputs["spec"], "hotThresholdQps": 1000})
    too_many = {**policy.inputs["spec"], "replicationFactor": configs[stack].redis.hot_pools + 1}
    with pytest.raises(jsonschema.ValidationError):
        validator.validate({**policy.inputs, "spec": too_many})


@pytest.mark.parametrize("stack", STACKS)
def test_the_operator_copies_into_every_hot_pool_the_program_declares(
    plans: dict[str, plan.Plan],
    configs: dict[str, config.StackConfig],
    build_settings: Callable[..., Settings],
    stack: str,
) -> None:
    w = workloads.HOTKEY_OPERATOR
    s = build_settings(w, likes_env(container_of(plans[stack], w)))
    pools = [r for r in by_kind(plans[stack], "StatefulSet") if r.name.startswith("hot-pool-")]
    # each address names the pool's one pod (<sts>-0.<sts>.<ns>...): one server per address
    names = [h.split(".")[:2] for h, _ in s.hot_pool_addresses]  # type: ignore[attr-defined]
    assert all(pod == f"{sts}-0" for pod, sts in names), names
    assert {sts for _, sts in names} == {r.inputs["metadata"]["name"] for r in pools}
    assert len(s.hot_pool_addresses) == configs[stack].redis.hot_pools  # type: ignore[attr-defined]


# -- (e) the gateway's mirror reaches the sampler (C8) ------------------------------------------
def _walk_routes(o: Any) -> Iterator[dict[str, Any]]:
    if isinstance(o, dict):
        if "match" in o and "route" in o:
            yield o
        for v in o.values():
            yield from _walk_routes(v)
    elif isinstance(o, list):
        for v in o:
            yield from _walk_routes(v)


def _concrete(match: dict[str, Any]) -> tuple[str, str]:
    """(method, a path the route matches): the request Envoy would mirror."""
    (method,) = [h["stringMatch"]["exact"] for h in match["headers"] if h["name"] == ":method"]
    if "path" in match:
        return method, match["path"]
    path = routes.read_path("p-1")
    assert re.fullmatch(match["safeRegex"]["regex"], path), match
    return method, path


@pytest.mark.usefixtures("local_env")
@pytest.mark.parametrize("stack", STACKS)
def test_the_gateway_mirrors_reads_to_the_samplers_service_on_routes_it_serves(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    bootstrap = json.loads(named(plans[stack], "ConfigMap", "envoy").inputs["data"]["envoy.json"])
    mirrored = [
        (r, m) for r in _walk_routes(bootstrap) for m in r["route"].get("requestMirrorPolicies", [])
    ]
    assert {m["cluster"] for _, m in mirrored} == {envoy_config.SAMPLER_CLUSTER}
    # the mirror cluster resolves the sampler's Service, on the port its pods listen on
    (cluster,) = [
        c
        for c in bootstrap["staticResources"]["clusters"]
        if c["name"] == envoy_config.SAMPLER_CLUSTER
    ]
    (endpoint,) = [e for loc in cluster["loadAssignment"]["endpoints"] for e in loc["lbEndpoints"]]
    address = endpoint["endpoint"]["address"]["socketAddress"]
    sampler = container_of(plans[stack], workloads.HOTKEY_SAMPLER)
    svc = named(plans[stack], "Service", workloads.HOTKEY_SAMPLER.name).inputs
    assert (
        address["address"]
        == f"{svc['metadata']['name']}.{svc['metadata']['namespace']}.svc.cluster.local"
    )
    assert svc["metadata"]["namespace"] == sampler.namespace
    (port,) = svc["spec"]["ports"]
    assert int(address["portValue"]) == int(port["port"])
    assert int(port["targetPort"]) in sampler.ports
    assert svc["spec"]["selector"].items() <= sampler.pod_labels.items()
    # the mirrored requests are the public read routes, and the sampler app serves each
    requests = {_concrete(r["match"]) for r, _ in mirrored}
    assert requests == {("GET", routes.read_path("p-1")), ("POST", routes.BATCH_READ_PATH)}
    app = _app(workloads.HOTKEY_SAMPLER)
    for method, path in requests:
        assert _serves(app, method, path), f"the sampler does not serve {method} {path}"
    assert not _serves(app, "GET", "/v1/samples")  # the matcher can say no


# -- (f) topics ---------------------------------------------------------------------------------
@pytest.mark.usefixtures("local_env")
@pytest.mark.parametrize("stack", STACKS)
def test_the_program_creates_exactly_the_codes_topics(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    created = {t.inputs["metadata"]["name"] for t in by_kind(plans[stack], "KafkaTopic")}
    assert created == {*events.EVENT_TOPICS, events.DEAD_LETTER}
    agg = AggregatorSettings()  # the aggregator's own topic names, without a test prefix
    assert {*agg.source_topics, agg.dead_letter_topic} == created


@pytest.mark.parametrize("stack", STACKS)
def test_the_aggregator_consumes_every_topic_mirrormaker_brings_here(
    plans: dict[str, plan.Plan], stack: str, build_settings: Callable[..., Settings]
) -> None:
    # review D3: MirrorMaker 2 mirrored the peers' events into <peer>.likes.*, read by nothing
    p = plans[stack]
    agg = build_settings(workloads.AGGREGATOR, likes_env(container_of(p, workloads.AGGREGATOR)))
    assert isinstance(agg, AggregatorSettings)
    brought: set[str] = set()
    for mm2 in by_kind(p, "KafkaMirrorMaker2"):
        for m in mm2.inputs["spec"]["mirrors"]:
            pattern = re.compile(m["topicsPattern"])
            alias = m["source"]["alias"]  # DefaultReplicationPolicy: "<source alias>.<topic>"
            brought |= {f"{alias}.{t}" for t in events.EVENT_TOPICS if pattern.fullmatch(t)}
    assert set(agg.mirrored_topics) == brought
    if stack.startswith("prod-"):
        assert brought, f"{stack} has a peer region: something must be mirrored"


# -- (g) Redis: the idem-store is a cluster on both sides; AUTH everywhere (C3) -----------------
class _RecordingCluster(RedisCluster):
    """A RedisCluster that records how it was built instead of connecting."""

    def __init__(self, **kwargs: Any) -> None:  # no super(): nothing to connect to here
        self.kwargs = kwargs


@pytest.mark.parametrize("stack", STACKS)
def test_the_idem_store_is_a_redis_cluster_in_the_program_and_in_the_client(
    plans: dict[str, plan.Plan],
    build_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
    stack: str,
) -> None:
    p = plans[stack]
    conf = named(p, "ConfigMap", "idem-store-conf").inputs["data"]["redis.conf"].splitlines()
    assert "cluster-enabled yes" in conf
    job = named(p, "Job", "idem-store-create").inputs
    assert "--cluster create" in job["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    sts = named(p, "StatefulSet", "idem-store").inputs
    redis_port = next(
        int(port["containerPort"])
        for port in sts["spec"]["template"]["spec"]["containers"][0]["ports"]
        if port["name"] == "redis"
    )
    s = build_settings(workloads.WRITE, likes_env(container_of(p, workloads.WRITE)))
    ns = sts["metadata"]["namespace"]
    assert s.idem_store_startup == [(f"idem-store.{ns}.svc.cluster.local", redis_port)]
    monkeypatch.setattr(clients, "RedisCluster", _RecordingCluster)
    for factory in (clients.idem_store, clients.count_cache):
        client = factory(s)
        assert isinstance(client, RedisCluster), f"{factory.__name__} is not a cluster client"
        kw = client.kwargs  # type: ignore[attr-defined]
        assert kw["password"] == DUMMY_SECRET
        nodes = [(n.host, n.port) for n in kw["startup_nodes"]]
        seeds = s.idem_store_nodes if factory is clients.idem_store else s.count_cache_nodes
        assert nodes == parse_nodes(seeds)


@pytest.mark.parametrize("stack", STACKS)
def test_the_scorer_reaches_the_feature_store_the_program_declares_and_it_evicts(
    plans: dict[str, plan.Plan],
    configs: dict[str, config.StackConfig],
    build_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
    stack: str,
) -> None:
    """The shared features' cluster: declared once (a cluster of its own, no AOF, evicting
    when full, sized from the stack's config), and the scorer, only, is rendered its seeds,
    which its settings read and its client dials."""
    p, cfg = plans[stack], configs[stack]
    conf = named(p, "ConfigMap", "feature-store-conf").inputs["data"]["redis.conf"].splitlines()
    policy = keys.EVICTION_POLICY["feature-store"]
    assert policy != "noeviction" and policy.endswith("-lru")
    assert {"cluster-enabled yes", "appendonly no", f"maxmemory-policy {policy}"} <= set(conf)
    mb = int(cfg.redis.feature_store_memory_gi * 0.8 * 1024)
    assert f"maxmemory {mb}mb" in conf
    sts = named(p, "StatefulSet", "feature-store").inputs
    assert sts["spec"]["replicas"] == 2 * cfg.redis.feature_store_shards  # one replica each
    job = named(p, "Job", "feature-store-create").inputs
    assert "--cluster-replicas 1" in job["spec"]["template"]["spec"]["containers"][0]["command"][-1]
    redis_port = next(
        int(port["containerPort"])
        for port in sts["spec"]["template"]["spec"]["containers"][0]["ports"]
        if port["name"] == "redis"
    )
    ns = sts["metadata"]["namespace"]
    s = build_settings(workloads.ABUSE_SCORER, likes_env(container_of(p, workloads.ABUSE_SCORER)))
    assert isinstance(s, abuse_settings.ScorerSettings)
    assert s.feature_store_startup == [(f"feature-store.{ns}.svc.cluster.local", redis_port)]
    name = abuse_settings.ScorerSettings.env_name("feature_store_nodes")
    for w in workloads.ALL:  # nobody else is told where it is
        if w is not workloads.ABUSE_SCORER:
            assert name not in likes_env(container_of(p, w)), w.name
    monkeypatch.setattr(clients, "RedisCluster", _RecordingCluster)
    kw = clients.feature_store(s).kwargs  # type: ignore[attr-defined]
    assert kw["password"] == DUMMY_SECRET
    assert [(n.host, n.port) for n in kw["startup_nodes"]] == s.feature_store_startup


@pytest.mark.parametrize(("stack", "w"), WORKLOAD_CASES)
def test_redis_clients_get_the_password_from_the_redis_auth_secret(
    plans: dict[str, plan.Plan], stack: str, w: workloads.Workload
) -> None:
    c = container_of(plans[stack], w)
    name = Settings.env_name("redis_password")
    if w not in REDIS_CLIENTS and name not in c.env:
        return
    ref = c.env.get(name)
    assert ref == SecretKey(infra_services.AUTH_SECRET, "password"), f"{w.name}: {name} = {ref}"
    secret = next(
        r.inputs
        for r in by_kind(plans[stack], "Secret")
        if r.inputs["metadata"]["name"] == ref.secret
        and r.inputs["metadata"]["namespace"] == c.namespace
    )
    assert set(secret["stringData"]) == {ref.key}
    # and the Redis servers require it: AUTH that nobody checks protects nothing. The server
    # reads `requirepass` from a file of the same Secret that redis.conf includes (not argv)
    for role in ("count-cache", "idem-store", "feature-store", "hot-pool-0"):
        spec = named(plans[stack], "StatefulSet", role).inputs["spec"]["template"]["spec"]
        conf = named(plans[stack], "ConfigMap", f"{role}-conf").inputs["data"]["redis.conf"]
        assert f"include {infra_redis.AUTH_CONF_DIR}/{infra_redis.AUTH_CONF_KEY}" in conf, role
        auth = next(v for v in spec["volumes"] if v["name"] == "auth")["secret"]
        assert auth["secretName"] == infra_redis.AUTH_SECRET, role
        ns = named(plans[stack], "StatefulSet", role).inputs["metadata"]["namespace"]
        redis_secret = named(plans[stack], "Secret", infra_redis.AUTH_SECRET, ns).inputs
        assert infra_redis.AUTH_CONF_KEY in redis_secret["stringData"], role


# -- metrics: what the rules select is what the code emits (C5, O2) -----------------------------
# every module that defines a metric our workloads export (importing registers them)
METRIC_MODULES = (
    "services.common.http",
    "services.common.worker_http",
    "services.read.metrics",
    "services.read.hotkeys",
    "services.aggregator.metrics",
    "services.relay.core",
    "services.consumer_lag.metrics",
    "services.canary.metrics",
    "services.hotkey_sampler.main",
    "operators.hotkeys.local_loop",
)
SELECTOR = re.compile(r"\b(likes_[a-z0-9_]+)\{([^}]*)\}|\{__name__=~\"(likes_[^\"]+)\"")
MATCHER = re.compile(r"([a-zA-Z_]+)\s*(=~|!=|!~|=)\s*\"([^\"]*)\"")


def code_metrics() -> dict[str, tuple[str, ...]]:
    """Sample name -> label names, for every likes_* metric the code defines."""
    for m in METRIC_MODULES:
        importlib.import_module(m)
    from prometheus_client import REGISTRY

    out: dict[str, tuple[str, ...]] = {}
    for name, collector in REGISTRY._names_to_collectors.items():
        if name.startswith("likes_"):
            out[name] = tuple(getattr(collector, "_labelnames", ()))
    return out


def rule_expressions(p: plan.Plan) -> list[str]:
    data = named(p, "ConfigMap", observability.RULES_CONFIG_MAP).inputs["data"]
    exprs = []
    for text in data.values():
        for group in yaml.safe_load(text)["groups"]:
            exprs += [r["expr"] for r in group["rules"]]
    return exprs


@pytest.mark.parametrize("stack", STACKS)
def test_every_metric_and_label_the_rules_select_is_emitted_by_the_code(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    emitted = code_metrics()
    http_workloads = {w.name for w in workloads.ALL if w.kind == "http"}
    seen = 0
    for expr in rule_expressions(plans[stack]):
        for name, matchers, name_regex in SELECTOR.findall(expr):
            seen += 1
            if name_regex:  # {__name__=~"likes_.+_x"}: at least one metric of ours matches
                assert any(re.fullmatch(name_regex, n) for n in emitted), name_regex
                continue
            assert name in emitted, f"the rules read {name}, which no code emits"
            for label, _op, value in MATCHER.findall(matchers):
                if label == "le":  # a histogram bucket's own label
                    continue
                assert label in emitted[name], f"{name} has no label {label!r}"
                if label == alert_rules.SERVICE_LABEL:
                    assert value in http_workloads, f"{name}: no workload is called {value!r}"
    assert seen > 10  # the parse found the selectors (an empty parse would pass vacuously)


def test_the_metric_check_can_fail() -> None:
    emitted = code_metrics()
    assert "likes_http_requests_total" in emitted
    assert "svc" not in emitted["likes_http_requests_total"]  # the label a relabel once wrote
    assert "likes_read_requests_total" not in emitted


# -- every Deployment that runs our image runs a module that exists (review H6) ------------------
@pytest.mark.parametrize("stack", STACKS)
def test_every_deployment_of_our_image_is_a_workload_whose_module_exists(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    image = plans[stack].find("kubernetes:apps/v1:Deployment", workloads.WRITE.name)
    ours = image.inputs["spec"]["template"]["spec"]["containers"][0]["image"]
    found = set()
    for d in plans[stack].of_type("kubernetes:apps/v1:Deployment"):
        (c, *_) = d.inputs["spec"]["template"]["spec"]["containers"]
        if c["image"] != ours:
            continue
        name = d.inputs["metadata"]["name"]
        assert name in workloads.BY_NAME, f"{stack} deploys {name}, which no workload defines"
        module = workloads.BY_NAME[name].module
        assert importlib.util.find_spec(module) is not None, f"{name} runs missing {module}"
        found.add(name)
    assert found == {w.name for w in workloads.SERVICES}


# -- (h) logins of the internal servers: from Secrets, and enforced (issue 9) --------------------
# (user field, password field) -> the user the program renders and the Secret holding the password
LOGINS = {
    ("cassandra_user", "cassandra_password"): (
        cql_roles.SERVICE_ROLE,
        SecretKey(cql_roles.AUTH_SECRET, cql_roles.PASSWORD_KEY),
    ),
    ("etcd_user", "etcd_password"): (
        etcd.SERVICE_USER,
        SecretKey(etcd.AUTH_SECRET, etcd.PASSWORD_KEY),
    ),
    ("kafka_user", "kafka_password"): (
        kafka_contract.SERVICE_USER,
        SecretKey(kafka_contract.AUTH_SECRET, kafka_contract.PASSWORD_KEY),
    ),
    ("schema_registry_user", "schema_registry_password"): (
        registry.SERVICE_USER,
        SecretKey(registry.AUTH_SECRET, registry.PASSWORD_KEY),
    ),
}


def secret_in(p: plan.Plan, namespace: str, ref: SecretKey) -> dict[str, Any]:
    found = [
        r.inputs
        for r in by_kind(p, "Secret")
        if r.inputs["metadata"]["name"] == ref.secret
        and r.inputs["metadata"]["namespace"] == namespace
    ]
    assert found, f"no Secret {ref.secret} in {namespace}"
    (secret,) = found
    assert ref.key in secret["stringData"], f"{ref.secret} has no key {ref.key}"
    return secret


@pytest.mark.parametrize(("stack", "w"), WORKLOAD_CASES)
def test_every_workload_logs_in_with_a_password_from_a_secret_in_its_namespace(
    plans: dict[str, plan.Plan], stack: str, w: workloads.Workload
) -> None:
    c = container_of(plans[stack], w)
    for (user, password), (want_user, ref) in LOGINS.items():
        assert c.env.get(Settings.env_name(user)) == want_user, f"{w.name}: {user}"
        assert c.env.get(Settings.env_name(password)) == ref, f"{w.name}: {password} literal"
        secret_in(plans[stack], c.namespace, ref)


@pytest.mark.parametrize("stack", STACKS)
def test_no_secret_value_outside_a_kubernetes_secret(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    """A config secret reaches a Kubernetes object only as a Secret's data: never in argv, an env
    literal, a ConfigMap or a custom resource (the plan masks a secret Output as [secret]; a
    secret unwrapped into a plain string would show the offline placeholder)."""
    leaks = [
        f"{r.inputs.get('kind') or r.type} {r.name}"
        for r in plans[stack].resources
        if r.type.startswith("kubernetes:")
        and r.inputs.get("kind") != "Secret"
        and any(m in json.dumps(r.inputs) for m in (plan.SECRET_MARK, stackfile.PLACEHOLDER))
    ]
    assert leaks == []


class _RecordingEtcd:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs


@pytest.mark.parametrize(("stack", "w"), WORKLOAD_CASES)
def test_the_etcd_client_logs_in_with_the_rendered_user_and_password(
    plans: dict[str, plan.Plan],
    build_settings: Callable[..., Settings],
    monkeypatch: pytest.MonkeyPatch,
    stack: str,
    w: workloads.Workload,
) -> None:
    s = build_settings(w, likes_env(container_of(plans[stack], w)))
    monkeypatch.setattr(etcd, "Client", _RecordingEtcd)
    kw = etcd.from_settings(s, timeout=1.0).kwargs  # type: ignore[attr-defined]
    assert kw.get("ca_file") == tls.CA_FILE  # the program's etcd serves TLS (infra/etcd.py)
    assert (kw["username"], kw["password"]) == (etcd.SERVICE_USER, DUMMY_SECRET)
    assert (kw["host"], kw["port"]) == (s.etcd_host, s.etcd_port)


@pytest.mark.parametrize("stack", STACKS)
def test_the_etcd_auth_job_runs_the_applier_with_passwords_from_secrets(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    p = plans[stack]
    job = named(p, "Job", "etcd-auth").inputs
    (c,) = job["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["python", "-m", etcd_auth.__name__]
    assert importlib.util.find_spec(etcd_auth.__name__) is not None
    env = _job_env(c)
    ns = job["metadata"]["namespace"]
    root = env[etcd_auth.ROOT_PASSWORD_ENV]
    assert root == SecretKey(etcd.ROOT_SECRET, etcd.PASSWORD_KEY)
    secret_in(p, ns, root)
    assert env[Settings.env_name("etcd_user")] == etcd.SERVICE_USER
    service = env[Settings.env_name("etcd_password")]
    assert service == SecretKey(etcd.AUTH_SECRET, etcd.PASSWORD_KEY)
    secret_in(p, ns, service)
    # the etcd the workloads talk to is the one the Job sets up
    write = likes_env(container_of(p, workloads.WRITE))
    assert env[Settings.env_name("etcd_host")] == write[Settings.env_name("etcd_host")]
    assert env[Settings.env_name("etcd_port")] == write[Settings.env_name("etcd_port")]


@pytest.mark.parametrize(("stack", "w"), WORKLOAD_CASES)
def test_the_cassandra_session_logs_in_with_the_rendered_role_and_password(
    plans: dict[str, plan.Plan],
    build_settings: Callable[..., Settings],
    stack: str,
    w: workloads.Workload,
) -> None:
    s = build_settings(w, likes_env(container_of(plans[stack], w)))
    auth = clients.cassandra_auth(s)
    assert auth is not None
    assert (auth.username, auth.password) == (cql_roles.SERVICE_ROLE, DUMMY_SECRET)


def _job_env(container: dict[str, Any]) -> dict[str, str | SecretKey]:
    env: dict[str, str | SecretKey] = {}
    for e in container["env"]:
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        env[e["name"]] = SecretKey(ref["name"], ref["key"]) if ref else str(e["value"])
    return env


@pytest.mark.parametrize("stack", STACKS)
def test_scylla_requires_logins_and_the_migration_job_makes_the_roles(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    p = plans[stack]
    (cluster,) = by_kind(p, "ScyllaCluster")
    racks = cluster.inputs["spec"]["datacenter"]["racks"]
    assert {r.get("scyllaConfig") for r in racks} == {infra_scylla.CONFIG_MAP}
    ns = cluster.inputs["metadata"]["namespace"]
    conf = named(p, "ConfigMap", infra_scylla.CONFIG_MAP).inputs
    assert conf["metadata"]["namespace"] == ns
    scylla_yaml = yaml.safe_load(conf["data"]["scylla.yaml"])
    assert scylla_yaml == {
        "authenticator": "PasswordAuthenticator",
        "authorizer": "CassandraAuthorizer",
        "client_encryption_options": {  # TLS on the client port (tests/infra/test_tls.py)
            "enabled": True,
            "certificate": f"{infra_scylla.TLS_DIR}/tls.crt",
            "keyfile": f"{infra_scylla.TLS_DIR}/tls.key",
            "truststore": f"{infra_scylla.TLS_DIR}/ca.crt",
            "require_client_auth": False,
        },
    }
    (job,) = [j for j in by_kind(p, "Job") if j.name == "scylla-migrate"]
    (c,) = job.inputs["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["python", "-m", migrate.__name__]
    assert importlib.util.find_spec(migrate.__name__) is not None
    env = _job_env(c)
    for name, ref in (
        (migrate.ADMIN_PASSWORD_ENV, SecretKey(cql_roles.ADMIN_SECRET, cql_roles.PASSWORD_KEY)),
        (migrate.SERVICE_PASSWORD_ENV, SecretKey(cql_roles.AUTH_SECRET, cql_roles.PASSWORD_KEY)),
    ):
        assert env[name] == ref
        secret_in(p, job.inputs["metadata"]["namespace"], ref)
    assert (
        env[migrate.CONTACT_POINTS_ENV]
        == likes_env(container_of(p, workloads.WRITE))[Settings.env_name("cassandra_hosts")]
    )


# -- Kafka and the schema registry: SCRAM logins, ACLs, basic auth, the registration step --------
@pytest.mark.parametrize(("stack", "w"), WORKLOAD_CASES)
def test_the_kafka_and_registry_clients_log_in_with_the_rendered_users(
    plans: dict[str, plan.Plan],
    build_settings: Callable[..., Settings],
    stack: str,
    w: workloads.Workload,
) -> None:
    s = build_settings(w, likes_env(container_of(plans[stack], w)))
    conf = clients.kafka_config(s)
    assert conf["security.protocol"] == kafka_contract.SECURITY_PROTOCOL
    assert conf["sasl.mechanism"] == kafka_contract.SASL_MECHANISM
    assert (conf["sasl.username"], conf["sasl.password"]) == (
        kafka_contract.SERVICE_USER,
        DUMMY_SECRET,
    )
    assert conf["ssl.ca.location"] == tls.CA_FILE
    reg = registry.from_settings(s)
    assert reg["basic.auth.user.info"] == f"{registry.SERVICE_USER}:{DUMMY_SECRET}"
    assert reg["url"] == s.schema_registry_url
    assert reg["url"].startswith("https://") and reg["ssl.ca.location"] == tls.CA_FILE


def _kafka_users(p: plan.Plan) -> dict[str, dict[str, Any]]:
    return {u.inputs["metadata"]["name"]: u.inputs for u in by_kind(p, "KafkaUser")}


@pytest.mark.parametrize("stack", STACKS)
def test_the_kafka_client_listener_requires_scram_and_each_user_gets_only_its_acls(
    plans: dict[str, plan.Plan], configs: dict[str, config.StackConfig], stack: str
) -> None:
    p = plans[stack]
    (cluster,) = by_kind(p, "Kafka")
    spec = cluster.inputs["spec"]["kafka"]
    ns = cluster.inputs["metadata"]["namespace"]
    # the listener the workloads' bootstrap names requires a SCRAM login
    write = likes_env(container_of(p, workloads.WRITE))
    port = int(str(write[Settings.env_name("kafka_bootstrap")]).rsplit(":", 1)[1])
    (listener,) = [x for x in spec["listeners"] if x["port"] == port]
    assert listener["authentication"] == {"type": kafka_contract.STRIMZI_AUTH}
    assert all(x.get("authentication") for x in spec["listeners"]), "a listener without login"
    assert spec["authorization"] == {"type": "simple"}
    users = _kafka_users(p)
    peers = tuple(peer.region for peer in configs[stack].peers)
    k = kafka_contract
    for name, secret, acls in (
        (k.SERVICE_USER, k.AUTH_SECRET, k.service_acls(peers)),
        (k.REGISTRY_USER, k.REGISTRY_SECRET, k.REGISTRY_ACLS),
    ):
        u = users[name]
        assert u["metadata"]["namespace"] == ns
        auth = u["spec"]["authentication"]
        assert auth["type"] == kafka_contract.STRIMZI_AUTH
        ref = auth["password"]["valueFrom"]["secretKeyRef"]
        secret_in(p, ns, SecretKey(ref["name"], ref["key"]))
        assert ref == {"name": secret, "key": kafka_contract.PASSWORD_KEY}
        assert u["spec"]["authorization"] == {
            "type": "simple", "acls": [a.strimzi() for a in acls]
        }  # fmt: skip
    # every user of the cluster is authorized by ACLs (simple authorization denies the rest)
    assert all(u["spec"]["authorization"]["acls"] for u in users.values())
    # the services' ACLs: the platform's topics (and the peers' mirrors of them), its groups
    topics = {a.name for a in kafka_contract.service_acls(peers) if a.type == "topic"}
    prefix = kafka_contract.TOPIC_PREFIX
    assert topics == {prefix, *(events.mirrored(r, prefix) for r in peers)}
    assert not any("Create" in a.operations or "All" in a.operations
                   for a in kafka_contract.service_acls(peers))  # fmt: skip
    for t in (*events.EVENT_TOPICS, events.DEAD_LETTER):
        assert t.startswith(kafka_contract.TOPIC_PREFIX)


def test_the_aggregators_group_is_one_the_services_acls_admit() -> None:
    from services.aggregator.settings import AggregatorSettings

    group = str(AggregatorSettings.model_fields["agg_group_id"].default)
    assert group.startswith(kafka_contract.GROUP_PREFIX)


@pytest.mark.parametrize("stack", ["prod-us", "prod-eu"])
def test_mirrormaker_logs_in_to_this_cluster_with_the_user_operators_secret(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    p = plans[stack]
    users = _kafka_users(p)
    mirrors = by_kind(p, "KafkaMirrorMaker2")
    assert mirrors
    for m in mirrors:
        target = m.inputs["spec"]["target"]
        auth = target["authentication"]
        assert auth["type"] == kafka_contract.STRIMZI_AUTH
        # Strimzi's User Operator writes the password into a Secret named after the user
        assert auth["passwordSecret"]["secretName"] == auth["username"]
        assert auth["username"] in users
        for source in m.inputs["spec"]["mirrors"]:
            assert source["source"]["authentication"]["type"] == kafka_contract.STRIMZI_AUTH


def _container_env(c: dict[str, Any]) -> dict[str, str | SecretKey]:
    return _job_env(c)


@pytest.mark.parametrize("stack", STACKS)
def test_the_schema_registry_requires_basic_auth_and_logs_in_to_kafka(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    p = plans[stack]
    dep = named(p, "Deployment", "schema-registry").inputs
    ns = dep["metadata"]["namespace"]
    pod = dep["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    env = _container_env(c)
    assert env["SCHEMA_REGISTRY_AUTHENTICATION_METHOD"] == "BASIC"
    assert env["SCHEMA_REGISTRY_AUTHENTICATION_REALM"] == registry.REALM
    assert env["SCHEMA_REGISTRY_AUTHENTICATION_ROLES"] == registry.ROLE
    jaas_path = f"{infra_registry.AUTH_DIR}/{infra_registry.JAAS_FILE}"
    assert env["SCHEMA_REGISTRY_OPTS"] == f"-Djava.security.auth.login.config={jaas_path}"
    # the JAAS and password files come from a Secret mounted where the options say
    (mount,) = [m for m in c["volumeMounts"] if m["mountPath"] == infra_registry.AUTH_DIR]
    (vol,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    login = secret_in(p, ns, SecretKey(vol["secret"]["secretName"], infra_registry.JAAS_FILE))
    assert infra_registry.PASSWORD_FILE in login["stringData"]  # (values masked in the plan)
    # Confluent 8 runs Jetty 12, whose module registry.jaas_file names (unit-tested): the 7.x
    # package would log no one in
    assert int(c["image"].rsplit(":", 1)[1].split(".")[0]) >= 8
    # its own Kafka login, from a Secret, over the listener the workloads use
    assert env["SCHEMA_REGISTRY_KAFKASTORE_SECURITY_PROTOCOL"] == kafka_contract.SECURITY_PROTOCOL
    assert env["SCHEMA_REGISTRY_KAFKASTORE_SASL_MECHANISM"] == kafka_contract.SASL_MECHANISM
    jaas = env["SCHEMA_REGISTRY_KAFKASTORE_SASL_JAAS_CONFIG"]
    assert jaas == SecretKey(kafka_contract.REGISTRY_SECRET, kafka_contract.JAAS_KEY)
    secret_in(p, ns, jaas)
    write = likes_env(container_of(p, workloads.WRITE))
    assert (
        env["SCHEMA_REGISTRY_KAFKASTORE_BOOTSTRAP_SERVERS"]
        == write[Settings.env_name("kafka_bootstrap")]
    )
    # a probe carries no login: the port, not an HTTP path that answers 401
    assert "tcpSocket" in c["livenessProbe"] and "tcpSocket" in c["readinessProbe"]


@pytest.mark.parametrize("stack", STACKS)
def test_the_registration_job_runs_the_applier_with_the_login_from_a_secret(
    plans: dict[str, plan.Plan], stack: str
) -> None:
    p = plans[stack]
    (job,) = [j for j in by_kind(p, "Job") if j.name == "schema-registry-register"]
    (c,) = job.inputs["spec"]["template"]["spec"]["containers"]
    assert c["command"] == ["python", "-m", registry_schemas.__name__]
    assert importlib.util.find_spec(registry_schemas.__name__) is not None
    env = _job_env(c)
    write = likes_env(container_of(p, workloads.WRITE))
    url = Settings.env_name("schema_registry_url")
    assert env[url] == write[url]
    assert env[Settings.env_name("schema_registry_user")] == registry.SERVICE_USER
    ref = env[Settings.env_name("schema_registry_password")]
    assert ref == SecretKey(registry.AUTH_SECRET, registry.PASSWORD_KEY)
    secret_in(p, job.inputs["metadata"]["namespace"], ref)


def test_producers_never_register_schemas() -> None:
    class _Registry:  # the serializer only stores its client at construction
        pass

    ser = clients.like_serializer(_Registry())  # type: ignore[arg-type]
    assert ser._auto_register is False
    assert ser._use_latest_version is False
