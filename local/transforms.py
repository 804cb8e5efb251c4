"""The one list of differences between what the program renders and what the local stack runs.

Each workload starts from its rendered container (local/rendered.py); `local_process` applies the
transforms below and nothing else, and `check` (used by `likes local up` and the contract tests)
names the workload and the field when the render and the code disagree. Anything not listed
here runs exactly as rendered: env names and values, command, ports, probe paths.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import time
from dataclasses import dataclass, field

import jwt
from pydantic import ValidationError

from infra import otel_config
from local import issuer, rendered
from local import tls as local_tls
from local.components import kafka, schema_registry
from local.layout import HOST, Layout
from services.contracts import etcd, logins, registry, tls, topics, workloads
from services.contracts import kafka as kafka_contract
from services.contracts.settings import UnknownVariable
from services.schema import cql_roles

LOCAL_PARTITIONS = 6
KAFKA_TOPIC = "kubernetes:kafka.strimzi.io/v1:KafkaTopic"


@dataclass(frozen=True)
class Transform:
    id: str
    applies_to: str  # the part of a container spec it changes
    what: str
    why: str


TRANSFORMS: tuple[Transform, ...] = (
    Transform(
        "service-address",
        "env",
        "in-cluster Service addresses (count-cache, idem-store, feature-store, Scylla and its "
        "datacenter, Kafka, schema registry, etcd, hot pools) -> the local server that plays each",
        "one machine, one server per store, on loopback",
    ),
    Transform(
        "external-endpoint",
        "env",
        "the identity provider's JWKS -> the local issuer; Cloudflare's API (purge by tag) -> "
        "the local webhook sink, which keeps every purge; the OTLP collector's front tier -> the "
        "local collector (one, playing the tail-sampling tier: local/otelcol.py); the public "
        "API the canary calls -> the local gateway's listener (clients play the CDN here)",
        "no cloud accounts here; the local stand-ins keep what arrived for tests",
    ),
    Transform(
        "secret",
        "env",
        "secretKeyRef -> the value in <stack home>/secrets/secrets.json, created on first start "
        "(the canary's token: signed by the local identity provider for logins.CANARY_USER, "
        "signed again when it nears expiry)",
        "no Kubernetes Secrets here; the file never leaves the machine",
    ),
    Transform(
        "bind-address",
        "command",
        f"--host {workloads.BIND_ALL} -> --host {HOST}",
        "the stack lives on loopback; nothing listens on the machine's other interfaces",
    ),
    Transform(
        "port",
        "command, ports, probes",
        "the container ports (an HTTP service's API and ops ports; a worker's ops port) -> the "
        "workload's local ports (local/layout.py)",
        "every workload shares one host, so each needs its own port",
    ),
    Transform(
        "interpreter",
        "command",
        "`python` -> this checkout's virtualenv",
        "the image's interpreter is the venv here",
    ),
    Transform(
        "service-tls",
        "command",
        f"an HTTP service's --tls-dir {tls.MOUNT_DIR} (its certificate; the API requires the "
        "gateway's) -> its folder under <stack home>/tls (the --tls profile), or dropped (the "
        "quick profile: a plain-HTTP API, as the gateway's upstreams are then)",
        "cert-manager's Secrets are files of the stack's home here; the same names are issued",
    ),
    Transform(
        "operator-loop",
        "command",
        "Kopf (`kopf run ... -m operators.hotkeys.handlers`) -> its reconcile loop "
        "`python -m operators.hotkeys` with the same env",
        "no Kubernetes API here; the Kopf wiring is tested against kmock",
    ),
    Transform(
        "tls",
        "env",
        f"the mounted CA ({tls.CA_FILE}) -> the local CA's file (the --tls profile), or empty "
        "(the quick profile: plaintext to etcd, Kafka, Cassandra and the registry)",
        "cert-manager's Secrets are files of the stack's home here; plaintext starts faster and "
        "is what the benchmarks measure",
    ),
    Transform(
        "sidecar",
        "pod",
        "a workload's sidecar container (the abuse model server) -> its own process, started "
        "before the workload; the workload dials it at its local port instead of the pod's "
        "loopback",
        "no pods here; a process of its own is also what makes `model server down` a real "
        "process going away",
    ),
    Transform(
        "models-volume",
        "command",
        f"the abuse-models claim mounted at {workloads.MODELS_MOUNT} -> <stack home>/"
        "abuse-models (a first start trains the default model there)",
        "no PersistentVolumes here; `likes abuse train|use` write the same folder",
    ),
    Transform("replicas", "replicas", "replicas and HPA bounds -> 1 process", "one machine"),
    Transform(
        "partitions",
        "KafkaTopic",
        f"each rendered topic is created with its name and config, partitions scaled down to at "
        f"most {LOCAL_PARTITIONS}, replicas and min.insync.replicas capped by the local brokers",
        "a 2-core machine; one broker in the quick profile",
    ),
)

SECRETS_FILE = "secrets.json"
CANARY_TOKEN_TTL_S = 30 * 86400  # the local canary's token; signed again a day before it ends
CANARY_TOKEN_RENEW_S = 86400
CLOUDFLARE_SINK = "cloudflare"  # the sink's receiver name for Cloudflare API calls
# the secrets the program references, and how a first start makes a local value for each
REDIS_AUTH = "redis-auth/password"
RATELIMIT_REDIS_AUTH = f"{logins.RATELIMIT_REDIS_SECRET}/{logins.PASSWORD_KEY}"
ETCD_AUTH = f"{etcd.AUTH_SECRET}/{etcd.PASSWORD_KEY}"
ETCD_ROOT = f"{etcd.ROOT_SECRET}/{etcd.PASSWORD_KEY}"  # the program's etcd-auth Job only
CASSANDRA_AUTH = f"{cql_roles.AUTH_SECRET}/{cql_roles.PASSWORD_KEY}"
CASSANDRA_ADMIN = f"{cql_roles.ADMIN_SECRET}/{cql_roles.PASSWORD_KEY}"  # the schema Job only
KAFKA_AUTH = f"{kafka_contract.AUTH_SECRET}/{kafka_contract.PASSWORD_KEY}"
KAFKA_REGISTRY = f"{kafka_contract.REGISTRY_SECRET}/{kafka_contract.PASSWORD_KEY}"
KAFKA_ADMIN = f"{kafka_contract.ADMIN_SECRET}/{kafka_contract.PASSWORD_KEY}"  # local only
REGISTRY_AUTH = f"{registry.AUTH_SECRET}/{registry.PASSWORD_KEY}"
_SECRET_MAKERS = {
    ("redis-auth", "password"): lambda: secrets.token_urlsafe(24),
    (logins.RATELIMIT_REDIS_SECRET, logins.PASSWORD_KEY): lambda: secrets.token_urlsafe(24),
    ("cdn-purge", "token"): lambda: secrets.token_urlsafe(24),
    (etcd.AUTH_SECRET, etcd.PASSWORD_KEY): lambda: secrets.token_urlsafe(24),
    (etcd.ROOT_SECRET, etcd.PASSWORD_KEY): lambda: secrets.token_urlsafe(24),
    (cql_roles.AUTH_SECRET, cql_roles.PASSWORD_KEY): lambda: secrets.token_urlsafe(24),
    (cql_roles.ADMIN_SECRET, cql_roles.PASSWORD_KEY): lambda: secrets.token_urlsafe(24),
    (kafka_contract.AUTH_SECRET, kafka_contract.PASSWORD_KEY): lambda: secrets.token_urlsafe(24),
    (kafka_contract.REGISTRY_SECRET, kafka_contract.PASSWORD_KEY): lambda: secrets.token_urlsafe(
        24
    ),
    (kafka_contract.ADMIN_SECRET, kafka_contract.PASSWORD_KEY): lambda: secrets.token_urlsafe(24),
    (registry.AUTH_SECRET, registry.PASSWORD_KEY): lambda: secrets.token_urlsafe(24),
}


class Disagreement(Exception):
    """The rendered spec and the code disagree; names the workload and the field."""

    def __init__(self, workload: str, fieldname: str, problem: str) -> None:
        super().__init__(f"{workload}: {fieldname}: {problem}")
        self.workload, self.field, self.problem = workload, fieldname, problem


def local_port(layout: Layout, workload: str) -> int:
    p = layout.ports
    return {
        workloads.WRITE.name: p.write,
        workloads.READ.name: p.read,
        workloads.HOTKEY_SAMPLER.name: p.hotkey_sampler,
        workloads.OUTBOX_RELAY.name: p.relay,
        workloads.AGGREGATOR.name: p.aggregator,
        workloads.HOTKEY_OPERATOR.name: p.hotkey_operator,
        workloads.CONSUMER_LAG.name: p.consumer_lag,
        workloads.CANARY.name: p.canary,
        workloads.ABUSE_SCORER.name: p.abuse_scorer,
        workloads.ABUSE_MODEL.name: p.abuse_model,
    }[workload]


def local_ops_port(layout: Layout, workload: str) -> int:
    """Where a workload's probes and metrics are served locally (a worker's one port)."""
    p = layout.ports
    return {
        workloads.WRITE.name: p.write_ops,
        workloads.READ.name: p.read_ops,
        workloads.HOTKEY_SAMPLER.name: p.hotkey_sampler_ops,
        workloads.ABUSE_MODEL.name: p.abuse_model_ops,
    }.get(workload) or local_port(layout, workload)


def stack_secrets(layout: Layout) -> dict[str, str]:
    """`secret/key` -> value, created (0600) on first start and kept across `up`s."""
    path = layout.home / "secrets" / SECRETS_FILE
    try:
        values: dict[str, str] = json.loads(path.read_text())
    except FileNotFoundError:
        values = {}
    missing = {f"{s}/{k}": make() for (s, k), make in _SECRET_MAKERS.items()
               if not values.get(f"{s}/{k}")}  # fmt: skip
    canary = f"{logins.CANARY_SECRET}/{logins.CANARY_TOKEN_KEY}"
    if _expires_within(values.get(canary), CANARY_TOKEN_RENEW_S):
        missing[canary] = sign_token(layout, logins.CANARY_USER, CANARY_TOKEN_TTL_S)
    if missing:
        values.update(missing)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.touch(mode=0o600)
        tmp.write_text(json.dumps(values, indent=2))
        tmp.replace(path)
    return values


def _expires_within(token: str | None, seconds: float) -> bool:
    """A missing or unreadable token, or one that expires within `seconds`."""
    if not token:
        return True
    try:
        exp = jwt.decode(token, options={"verify_signature": False})["exp"]
    except (jwt.PyJWTError, KeyError):
        return True
    return bool(exp - time.time() < seconds)


def _addresses(layout: Layout) -> dict[str, str | None]:
    """Field name -> local value (None: drop the variable), for the address-like fields."""
    p = layout.ports
    return {
        "count_cache_nodes": ",".join(f"{HOST}:{x}" for x in p.count_cache[:3]),
        "idem_store_nodes": ",".join(f"{HOST}:{x}" for x in p.idem_store),
        "feature_store_nodes": ",".join(f"{HOST}:{x}" for x in p.feature_store),
        "cassandra_hosts": HOST,
        # the one node is its own contact point: its proxy's in the --faults profile
        "cassandra_port": str(layout.announced(p.cassandra_native)),
        "cassandra_local_dc": "datacenter1",  # SimpleSnitch's only datacenter
        "kafka_bootstrap": kafka.bootstrap_servers(layout),
        "schema_registry_url": schema_registry.url(layout),
        "etcd_host": HOST,
        "etcd_port": str(p.etcd_client),
        "hot_pools": ",".join(f"{HOST}:{x}" for x in p.hot_pools),
        "abuse_model_target": f"{HOST}:{p.abuse_model}",  # the sidecar transform
    }


def _tls(layout: Layout) -> dict[str, str | None]:
    # empty: plaintext, said explicitly (a staging or prod settings class refuses an unset CA)
    return {"tls_ca_file": local_tls.client_ca(layout) or ""}


def _external(layout: Layout) -> dict[str, str | None]:
    return {
        "jwks_url": f"http://{HOST}:{layout.ports.issuer}{issuer.JWKS_PATH}",
        "cloudflare_api_url": f"http://{HOST}:{layout.ports.webhook_sink}/{CLOUDFLARE_SINK}",
        "otlp_endpoint": f"http://{HOST}:{layout.ports.otel_http}{otel_config.OTLP_TRACES_PATH}",
        "gateway_url": f"http://{HOST}:{layout.ports.gateway}",
    }


@dataclass(frozen=True)
class Process:
    """What the local stack runs for one rendered workload."""

    workload: workloads.Workload
    argv: list[str]
    env: dict[str, str]  # the workload's whole environment (nothing inherited but PATH)
    port: int  # http: the API; worker, operator: the ops port
    ops_port: int  # probes and metrics
    liveness_path: str
    readiness_path: str
    applied: dict[str, list[str]] = field(default_factory=dict)  # transform id -> what changed
    sidecar: workloads.Sidecar | None = None  # this process is the workload's sidecar

    @property
    def name(self) -> str:
        """The local server's name: the workload's, or its sidecar's."""
        return self.sidecar.name if self.sidecar else self.workload.name


def _command(
    w: workloads.Workload,
    c: rendered.Container,
    port: int,
    ops_port: int,
    tls_dir: str | None,
) -> tuple[list[str], list[str]]:
    """The local argv for a rendered command, and the transforms it took."""
    cmd = list(c.command)
    applied = []
    if w.kind == "operator":
        if cmd[:2] != ["kopf", "run"] or cmd[-2:] != ["-m", w.module]:
            raise Disagreement(w.name, "command", f"expected Kopf running -m {w.module}: {cmd}")
        applied.append("operator-loop")
        return [sys.executable, "-m", "operators.hotkeys", "--host", HOST, "--port", str(port)], [
            *applied,
            "bind-address",
            "port",
        ]
    flags = [("--host", workloads.BIND_ALL, HOST, "bind-address")]
    if w.kind == "http":
        if cmd[:4] != ["python", "-m", workloads.SERVE_MODULE, w.module]:
            raise Disagreement(
                w.name, "command", f"expected python -m {workloads.SERVE_MODULE} {w.module}: {cmd}"
            )
        flags += [
            ("--port", str(c.ports.get("http")), str(port), "port"),
            ("--ops-port", str(c.ports.get("metrics")), str(ops_port), "port"),
        ]
    else:
        flags.append(("--port", str(c.ports.get("metrics")), str(port), "port"))
    for flag, old, new, tid in flags:
        if flag not in cmd or cmd[cmd.index(flag) + 1] != old:
            raise Disagreement(w.name, "command", f"expected {flag} {old}: {cmd}")
        cmd[cmd.index(flag) + 1] = new
        applied.append(tid)
    if w.kind == "http":  # service-tls
        if "--tls-dir" not in cmd or cmd[cmd.index("--tls-dir") + 1] != tls.MOUNT_DIR:
            raise Disagreement(w.name, "command", f"expected --tls-dir {tls.MOUNT_DIR}: {cmd}")
        at = cmd.index("--tls-dir")
        if tls_dir is None:
            del cmd[at : at + 2]
        else:
            cmd[at + 1] = tls_dir
        applied.append("service-tls")
    if cmd[0] != "python":
        raise Disagreement(w.name, "command", f"unknown interpreter {cmd[0]!r}")
    applied.append("interpreter")
    return [sys.executable, *cmd[1:]], applied


def sidecar_process(
    layout: Layout, w: workloads.Workload, sc: workloads.Sidecar, c: rendered.Container
) -> Process:
    """The workload's sidecar as its own process (the sidecar transform)."""
    port, ops_port = local_port(layout, sc.name), local_ops_port(layout, sc.name)
    cmd = list(c.command)
    if cmd[:3] != ["python", "-m", sc.module]:
        raise Disagreement(sc.name, "command", f"expected python -m {sc.module}: {cmd}")
    applied: dict[str, list[str]] = {"sidecar": ["pod"], "interpreter": ["command"]}
    for flag, old, new, tid in (
        ("--host", workloads.BIND_ALL, HOST, "bind-address"),
        ("--port", str(sc.port), str(port), "port"),
        ("--ops-port", str(sc.ops_port), str(ops_port), "port"),
        ("--model-dir", workloads.MODELS_MOUNT, str(layout.abuse_models), "models-volume"),
    ):
        if flag not in cmd or cmd[cmd.index(flag) + 1] != old:
            raise Disagreement(sc.name, "command", f"expected {flag} {old}: {cmd}")
        cmd[cmd.index(flag) + 1] = new
        applied.setdefault(tid, []).append("command")
    env = {k: v for k, v in c.env.items() if isinstance(v, str)}
    env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
    return Process(
        workload=w,
        argv=[sys.executable, *cmd[1:]],
        env=env,
        port=port,
        ops_port=ops_port,
        liveness_path=c.liveness.path if c.liveness else workloads.HEALTH_PATH,
        readiness_path=c.readiness.path if c.readiness else workloads.READY_PATH,
        applied=applied,
        sidecar=sc,
    )


def local_process(layout: Layout, w: workloads.Workload, c: rendered.Container) -> Process:
    port, ops_port = local_port(layout, w.name), local_ops_port(layout, w.name)
    tls_dir = str(local_tls.workload_dir(layout, w.name)) if layout.tls else None
    argv, cmd_applied = _command(w, c, port, ops_port, tls_dir)
    cls = w.settings_class()
    by_env = {cls.env_name(f): v for f, v in _addresses(layout).items() if f in cls.model_fields}
    external = {cls.env_name(f): v for f, v in _external(layout).items() if f in cls.model_fields}
    tls_files = {cls.env_name(f): v for f, v in _tls(layout).items() if f in cls.model_fields}
    values = stack_secrets(layout)
    env: dict[str, str] = {}
    # the env transforms that replace a rendered value, each with its {name: local value}
    replacements = (
        ("external-endpoint", external),
        ("tls", tls_files),
        ("service-address", by_env),
    )
    applied: dict[str, list[str]] = {t: [] for t, _ in replacements}
    applied["secret"] = []
    for name, value in c.env.items():
        if isinstance(value, rendered.SecretRef):
            ref = f"{value.secret}/{value.key}"
            if ref not in values:
                raise Disagreement(w.name, f"env {name}", f"references unknown secret {ref}")
            applied["secret"].append(name)
            value = values[ref]
        for tid, local in replacements:
            if name in local:
                applied[tid].append(name)
                new = local[name]
                if new is not None:  # None: the variable is dropped
                    env[name] = new
                break
        else:
            env[name] = value
    # endpoints the program leaves at their production default (Cloudflare's API) are pointed
    # at the local stand-in too
    for name, new in external.items():
        if name not in c.env and new is not None:
            env[name] = new
            applied["external-endpoint"].append(name)
    env["PATH"] = os.environ.get("PATH", "/usr/bin:/bin")
    for t in cmd_applied:
        applied.setdefault(t, []).append("command")
    return Process(
        workload=w,
        argv=argv,
        env=env,
        port=port,
        ops_port=ops_port,
        liveness_path=c.liveness.path if c.liveness else workloads.HEALTH_PATH,
        readiness_path=c.readiness.path if c.readiness else w.ready_path,
        applied={k: v for k, v in applied.items() if v},
    )


def check_settings(process: Process) -> None:
    """The workload's own settings class, built from the env the process gets: an unknown name,
    a missing endpoint or a bad value is a Disagreement naming the field."""
    w = process.workload
    cls = w.settings_class()
    saved = dict(os.environ)
    try:
        os.environ.clear()
        os.environ.update(process.env)
        cls()
    except UnknownVariable as e:
        raise Disagreement(w.name, "env", str(e)) from e
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"]) or "settings"
        raise Disagreement(w.name, f"env {where}", err["msg"]) from e
    finally:
        os.environ.clear()
        os.environ.update(saved)


def processes(layout: Layout, stack: str, check: bool = True) -> list[Process]:
    """Every workload of the rendered stack, transformed, and (`check`) checked against the code."""
    r = rendered.render(stack)
    out = []
    for w in workloads.ALL:
        container = r.container(w.name)
        if check:
            _check_probes(w, container)
        if w.sidecar is not None:  # started first: the workload dials it
            side = r.container(w.name, w.sidecar.name)
            if check:
                _check_probes(w, side, w.sidecar)
            out.append(sidecar_process(layout, w, w.sidecar, side))
        p = local_process(layout, w, container)
        if check:
            check_settings(p)
        out.append(p)
    return out


def workload_env(layout: Layout, workload: str) -> dict[str, str]:
    """The LIKES_* env the stack gives one rendered workload (what `likes local up` starts it
    with): for a tool that must reach the stores exactly as that workload does."""
    for p in processes(layout, layout.stack, check=False):
        if p.name == workload:
            return {k: v for k, v in p.env.items() if k.startswith("LIKES_")}
    raise KeyError(workload)


def _check_probes(
    w: workloads.Workload, c: rendered.Container, sidecar: workloads.Sidecar | None = None
) -> None:
    name = sidecar.name if sidecar else w.name
    port = sidecar.ops_port if sidecar else w.ops_port
    for kind, probe, path in (
        ("livenessProbe", c.liveness, workloads.HEALTH_PATH),
        ("readinessProbe", c.readiness, workloads.READY_PATH if sidecar else w.ready_path),
    ):
        if probe is None:
            raise Disagreement(name, kind, "the program renders none")
        if probe.path != path or probe.port != port:
            raise Disagreement(
                name, kind, f"{probe.path} on {probe.port}; the code serves {path} on {port}"
            )


def token_claims(layout: Layout) -> tuple[str, str]:
    """(issuer, audience) the stack's services require, as the program renders them."""
    c = rendered.render(layout.stack).container(workloads.WRITE.name)
    names = workloads.WRITE.settings_class()
    iss, aud = c.env.get(names.env_name("jwt_issuer")), c.env.get(names.env_name("jwt_audience"))
    if not isinstance(iss, str) or not isinstance(aud, str):
        raise Disagreement(workloads.WRITE.name, "env", "renders no JWT issuer/audience")
    return iss, aud


def signer(layout: Layout) -> issuer.Signer:
    """Tokens of the stack's local identity provider for many users: the key is loaded and the
    claims rendered once (together ~0.1-0.2 s, against ~1 ms a signature), so traffic that
    signs per like must hold one of these, not call sign_token."""
    return issuer.Signer(layout.home, *token_claims(layout))


def sign_token(
    layout: Layout, user_id: str, ttl_s: int = 3600, account_created: int | None = None
) -> str:
    """A token from the stack's local identity provider, valid for the stack's services
    (`account_created`: epoch seconds, see local/issuer.Signer). One token: see `signer`."""
    return signer(layout)(user_id, ttl_s, account_created)


def topic_specs(layout: Layout, stack: str) -> list[topics.TopicSpec]:
    """The topics the program declares, as the local Kafka plays them (the `partitions`
    transform): same names and config, fewer partitions, replication within the local brokers."""
    rf = min(3, layout.kafka_brokers)
    out = []
    for r in rendered.render(stack).of_type(KAFKA_TOPIC):
        spec = r["inputs"]["spec"]
        config = {k: str(v).lower() if isinstance(v, bool) else str(v)
                  for k, v in spec.get("config", {}).items()}  # fmt: skip
        if "min.insync.replicas" in config:
            config["min.insync.replicas"] = str(min(int(config["min.insync.replicas"]), rf))
        name = r["inputs"]["metadata"]["name"]
        out.append(topics.TopicSpec(name, min(int(spec["partitions"]), LOCAL_PARTITIONS), config))
    if not out:
        raise rendered.RenderError(f"stack {stack} declares no KafkaTopic")
    return out
