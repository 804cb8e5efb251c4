"""What runs is what the program renders: each workload process of the running stack, read back
from /proc, against its rendered container. Any difference outside local/transforms.py fails.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from local import rendered, transforms
from services.contracts import workloads
from tests.conftest import Stack

pytestmark = pytest.mark.stack


def running(stack: Stack, name: str) -> tuple[list[str], dict[str, str]]:
    """argv and environment of the stack's process for `name`, as the kernel has them."""
    pid = stack.pid(name)
    proc = Path(f"/proc/{pid}")
    argv = proc.joinpath("cmdline").read_bytes().rstrip(b"\0").decode().split("\0")
    env = dict(
        kv.split("=", 1)
        for kv in proc.joinpath("environ").read_bytes().rstrip(b"\0").decode().split("\0")
        if "=" in kv
    )
    return argv, env


@pytest.mark.parametrize("workload", [w.name for w in workloads.ALL])
def test_each_workload_runs_its_rendered_spec(stack: Stack, workload: str) -> None:
    w = workloads.BY_NAME[workload]
    container = rendered.render(stack.layout.stack).container(workload)
    expected = transforms.local_process(stack.layout, w, container)
    argv, env = running(stack, workload)

    # the command: exactly the rendered one after the listed transforms
    assert argv == expected.argv

    # the env: every rendered variable is there, with the rendered value unless a listed
    # transform changed it; nothing else reaches the process (no inherited LIKES_*)
    changed = {
        name
        for t in ("service-address", "external-endpoint", "secret", "tls")
        for name in expected.applied.get(t, [])
    }
    for name, value in container.env.items():
        if name in changed:
            # as the transform says (the tls one: the stack's CA file, or empty for plaintext)
            assert env.get(name, "") == expected.env.get(name, ""), f"{workload}: {name}"
            continue
        assert env.get(name) == value, f"{workload}: {name} runs as {env.get(name)!r}"
    # (a transform may add one only to point a production default at a local stand-in)
    added = set(expected.applied.get("external-endpoint", [])) - set(container.env)
    extra = {k for k in env if k.startswith("LIKES_")} - set(container.env) - added
    assert not extra, f"{workload} got variables the program does not render: {extra}"
    assert set(env) - set(container.env) - added <= {"PATH"}
    for name in added:
        assert env[name] == expected.env[name] and "127.0.0.1" in env[name]

    # the rendered probes answer on the local port
    base = f"http://{stack.host}:{expected.ops_port}"  # plain HTTP, as the kubelet probes
    assert container.liveness is not None and container.readiness is not None
    assert httpx.get(base + container.liveness.path, timeout=5).status_code == 200
    assert httpx.get(base + container.readiness.path, timeout=5).status_code == 200


@pytest.mark.parametrize("workload", [w.name for w in workloads.ALL if w.sidecar is not None])
def test_each_sidecar_runs_its_rendered_container_as_a_process_of_its_own(
    stack: Stack, workload: str
) -> None:
    """The abuse model server, a container of the scorer's pod in the program, is its own
    process here (the sidecar transform): the rendered command with only the listed flags
    changed, the rendered env and nothing else, and the rendered probes answering."""
    w = workloads.BY_NAME[workload]
    assert w.sidecar is not None
    container = rendered.render(stack.layout.stack).container(workload, w.sidecar.name)
    expected = transforms.sidecar_process(stack.layout, w, w.sidecar, container)
    argv, env = running(stack, w.sidecar.name)
    assert argv == expected.argv
    rendered_env = {k: v for k, v in container.env.items() if isinstance(v, str)}
    assert {k: env.get(k) for k in rendered_env} == rendered_env
    assert set(env) - set(container.env) <= {"PATH"}, "variables the program does not render"
    base = f"http://{stack.host}:{expected.ops_port}"
    assert container.liveness is not None and container.readiness is not None
    assert httpx.get(base + container.liveness.path, timeout=5).status_code == 200
    assert httpx.get(base + container.readiness.path, timeout=5).status_code == 200


def test_the_transform_list_is_all_that_was_applied(stack: Stack) -> None:
    listed = {t.id for t in transforms.TRANSFORMS}
    for p in transforms.processes(stack.layout, stack.layout.stack):
        assert set(p.applied) <= listed, p.applied
        # and each workload really took the loopback ones (else it would bind 0.0.0.0)
        assert "bind-address" in p.applied and "port" in p.applied


def test_status_lists_the_rendered_probe_as_health(stack: Stack) -> None:
    # `status` and `up` probe the rendered readiness path: a workload whose readiness fails
    # is reported unhealthy (the aggregator's probe is its /readyz, which checks its stores)
    status = stack.status()
    for w in workloads.ALL:
        assert status[w.name]["healthy"] is True, (w.name, status[w.name])


def test_the_topics_are_the_rendered_ones_scaled_down(stack: Stack) -> None:
    from confluent_kafka.admin import AdminClient, ConfigResource

    admin = AdminClient(stack.kafka_config())
    meta = admin.list_topics(timeout=10).topics
    rendered_topics = rendered.render(stack.layout.stack).of_type(transforms.KAFKA_TOPIC)
    assert rendered_topics
    for r in rendered_topics:
        name, spec = r["inputs"]["metadata"]["name"], r["inputs"]["spec"]
        assert name in meta, f"the program declares {name}; the local Kafka lacks it"
        assert len(meta[name].partitions) == min(spec["partitions"], transforms.LOCAL_PARTITIONS)
        (fut,) = admin.describe_configs([ConfigResource("topic", name)]).values()
        running = {k: v.value for k, v in fut.result(10).items()}
        for key, value in spec["config"].items():
            want = str(value).lower() if isinstance(value, bool) else str(value)
            if key == "min.insync.replicas":
                want = str(min(int(want), stack.layout.kafka_brokers))
            assert running[key] == want, f"{name}: {key} runs as {running[key]}, rendered {want}"
