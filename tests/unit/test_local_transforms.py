"""The local transforms: only the listed changes, and a disagreement between the program and the
code names the workload and the field (what `likes local up` prints)."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest

from local import layout, rendered, transforms
from local import tls as local_tls
from services.contracts import tls, workloads


@pytest.fixture(scope="module")
def staging() -> rendered.Rendered:
    return rendered.render("staging")


@pytest.fixture
def lay(tmp_path: Path) -> layout.Layout:
    return layout.Layout(home=tmp_path, ports=layout.Ports(0))


def test_every_workload_of_the_render_starts_and_checks(
    staging: rendered.Rendered, lay: layout.Layout
) -> None:
    for w in workloads.ALL:
        p = transforms.local_process(lay, w, staging.container(w.name))
        transforms.check_settings(p)  # the workload's own settings accept its env
        assert set(p.applied) <= {t.id for t in transforms.TRANSFORMS}
        assert p.env["LIKES_ENV"] == "staging"  # not turned into a local profile
        assert "--host" not in p.argv or p.argv[p.argv.index("--host") + 1] == layout.HOST


def test_the_tls_profile_points_the_mounted_ca_at_the_stacks_and_plaintext_says_so(
    staging: rendered.Rendered, lay: layout.Layout
) -> None:
    name = "LIKES_TLS_CA_FILE"
    for w in workloads.ALL:
        c = staging.container(w.name)
        assert c.env[name] == tls.CA_FILE  # the program: every workload reaches its stores by TLS
        plain = transforms.local_process(lay, w, c)
        assert plain.env[name] == "" and name in plain.applied["tls"]
        transforms.check_settings(plain)  # empty is plaintext, said explicitly: accepted
        on = transforms.local_process(replace(lay, tls=True), w, c)
        assert on.env[name] == str(local_tls.ca_file(lay))
        transforms.check_settings(on)


def test_an_http_service_serves_its_api_with_mtls_in_the_tls_profile_and_ops_apart(
    staging: rendered.Rendered, lay: layout.Layout
) -> None:
    def flag(argv: list[str], name: str) -> str | None:
        return argv[argv.index(name) + 1] if name in argv else None

    for w in (w for w in workloads.ALL if w.kind == "http"):
        c = staging.container(w.name)
        assert flag(c.command, "--tls-dir") == tls.MOUNT_DIR  # the program: mTLS always
        plain = transforms.local_process(lay, w, c)
        on = transforms.local_process(replace(lay, tls=True), w, c)
        assert flag(plain.argv, "--tls-dir") is None  # the quick profile: plain HTTP API
        assert flag(on.argv, "--tls-dir") == str(local_tls.workload_dir(lay, w.name))
        assert "service-tls" in plain.applied and "service-tls" in on.applied
        for p in (plain, on):
            assert flag(p.argv, "--port") == str(p.port) == str(transforms.local_port(lay, w.name))
            assert flag(p.argv, "--ops-port") == str(p.ops_port) != str(p.port)
    worker = transforms.local_process(lay, workloads.AGGREGATOR, staging.container("aggregator"))
    assert worker.port == worker.ops_port and "--tls-dir" not in worker.argv


def test_a_misspelled_variable_is_a_disagreement_naming_workload_and_field(
    staging: rendered.Rendered, lay: layout.Layout
) -> None:
    c = staging.container(workloads.AGGREGATOR.name)
    bad = replace(c, env={**c.env, "LIKES_KAFKA_BOOTSTRAPS": "x:9092"})
    p = transforms.local_process(lay, workloads.AGGREGATOR, bad)
    with pytest.raises(transforms.Disagreement) as e:
        transforms.check_settings(p)
    assert e.value.workload == "aggregator"
    assert "LIKES_KAFKA_BOOTSTRAPS" in str(e.value)


def test_an_unset_endpoint_is_refused_outside_local(
    staging: rendered.Rendered, lay: layout.Layout
) -> None:
    c = staging.container(workloads.WRITE.name)
    env = {k: v for k, v in c.env.items() if k != "LIKES_KAFKA_BOOTSTRAP"}
    p = transforms.local_process(lay, workloads.WRITE, replace(c, env=env))
    with pytest.raises(transforms.Disagreement, match="LIKES_KAFKA_BOOTSTRAP"):
        transforms.check_settings(p)


def test_a_probe_path_the_code_does_not_serve_is_a_disagreement(
    staging: rendered.Rendered,
) -> None:
    c = staging.container(workloads.OUTBOX_RELAY.name)
    assert c.readiness is not None
    bad = replace(c, readiness=rendered.Probe("/ready", c.readiness.port))
    with pytest.raises(transforms.Disagreement, match="readinessProbe"):
        transforms._check_probes(workloads.OUTBOX_RELAY, bad)


def test_a_worker_bound_to_loopback_in_the_render_is_a_disagreement(
    staging: rendered.Rendered, lay: layout.Layout
) -> None:
    # a pod whose worker binds 127.0.0.1 fails its kubelet probes (review C2)
    c = staging.container(workloads.AGGREGATOR.name)
    cmd = [("127.0.0.1" if a == workloads.BIND_ALL else a) for a in c.command]
    with pytest.raises(transforms.Disagreement, match=re.escape("--host 0.0.0.0")):
        transforms.local_process(lay, workloads.AGGREGATOR, replace(c, command=cmd))


def test_the_scorers_sidecar_is_its_own_process_which_the_scorer_dials(
    staging: rendered.Rendered, lay: layout.Layout
) -> None:
    w, sc = workloads.ABUSE_SCORER, workloads.ABUSE_MODEL
    procs = {p.name: p for p in transforms.processes(lay, "staging")}
    side, scorer = procs[sc.name], procs[w.name]
    assert list(procs).index(sc.name) < list(procs).index(w.name)  # started first

    def flag(name: str) -> str:
        return side.argv[side.argv.index(name) + 1]

    assert side.argv[1:3] == ["-m", sc.module] and side.sidecar is sc
    assert (flag("--host"), flag("--port"), flag("--ops-port")) == (
        layout.HOST, str(side.port), str(side.ops_port))  # fmt: skip
    assert flag("--model-dir") == str(lay.abuse_models)  # the models claim, played by a folder
    assert set(side.applied) <= {t.id for t in transforms.TRANSFORMS}
    # the scorer dials the sidecar's local port, not the pod's loopback port of the render
    assert scorer.env["LIKES_ABUSE_MODEL_TARGET"] == f"{layout.HOST}:{side.port}"
    assert staging.container(w.name).env["LIKES_ABUSE_MODEL_TARGET"] == sc.target
    # a render whose sidecar command lost the mount is a disagreement naming it
    c = staging.container(w.name, sc.name)
    bad = replace(c, command=[a for a in c.command if a not in ("--model-dir", "/models")])
    with pytest.raises(transforms.Disagreement, match="--model-dir") as e:
        transforms.sidecar_process(lay, w, sc, bad)
    assert e.value.workload == sc.name


def test_secrets_are_created_once_and_kept(lay: layout.Layout) -> None:
    first = transforms.stack_secrets(lay)
    assert first["redis-auth/password"]
    assert transforms.stack_secrets(lay) == first
    path = lay.home / "secrets" / transforms.SECRETS_FILE
    assert path.stat().st_mode & 0o077 == 0  # readable by its owner only


def test_up_stops_on_a_disagreement_naming_workload_and_field(
    staging: rendered.Rendered, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`likes local up` refuses a render whose aggregator sets a variable its code does not read,
    before starting anything, and says which workload and which variable."""
    import copy

    from typer.testing import CliRunner

    from local import cli

    resources = copy.deepcopy(staging.resources)
    for r in resources:
        meta = r["inputs"].get("metadata", {})
        if r["type"] == rendered.DEPLOYMENT and meta.get("name") == workloads.AGGREGATOR.name:
            (container,) = r["inputs"]["spec"]["template"]["spec"]["containers"]
            container["env"].append({"name": "LIKES_KAFKA_BOOTSTRAPS", "value": "kafka:9092"})
    monkeypatch.setattr(rendered, "render", lambda stack: rendered.Rendered(stack, resources))
    monkeypatch.setenv("LIKES_HOME", str(tmp_path))
    result = CliRunner().invoke(cli.app, ["up"])
    assert result.exit_code == 1
    out = " ".join(result.output.split())
    assert "workload aggregator" in out and "LIKES_KAFKA_BOOTSTRAPS" in out, out
    assert not (tmp_path / "state.json").exists()  # nothing was started


def test_the_cli_does_not_import_the_program_until_a_command_needs_it() -> None:
    """`likes --help`, `likes hotkeys …` and on-call's other commands paid ~0.75 s for Pulumi
    (and Envoy's typed config) on every call (review section 5)."""
    import subprocess
    import sys

    heavy = "('pulumi', 'envoy_data_plane')"
    code = f"import sys, cli.main; print(sorted(m for m in {heavy} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_the_local_redis_clusters_keep_the_programs_availability_and_durability(
    staging: rendered.Rendered, lay: layout.Layout
) -> None:
    """One lost shard stops only its own slots (cluster-require-full-coverage no) and the
    idem-store keeps its AOF, in the program's ConfigMaps and in the local nodes' conf files
    alike (locally every key stopped once a shard was gone: the game days could not tell one
    shard's loss from the whole store's)."""
    from local.components.redis import CountCache, IdemStore

    for component, aof in ((IdemStore(lay), True), (CountCache(lay), False)):
        program = set(rendered_conf(staging, f"{component.name}-conf"))
        component.prepare()
        for port in component.ports():
            local = set((lay.conf / f"{component.name}-{port}.conf").read_text().splitlines())
            assert "cluster-require-full-coverage no" in program & local
            if aof:
                assert {"appendonly yes", "appendfsync everysec"} <= program & local


def rendered_conf(r: rendered.Rendered, config_map: str) -> list[str]:
    return r.config_map(config_map)["redis.conf"].splitlines()
