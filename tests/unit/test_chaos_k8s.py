"""The production variants (`likes chaos run ID --target k8s`, chaos/k8s.py), offline: valid
experiments with chaostoolkit-kubernetes installed, selectors that match the pods the program
renders, and a pod-kill run against kmock (an emulated Kubernetes API) whose verdict follows
whether the pods came back."""

from __future__ import annotations

import asyncio
import copy
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kmock
import pytest
from chaoslib.exceptions import InvalidActivity, InvalidExperiment
from chaoslib.experiment import ensure_experiment_is_valid

from chaos import catalog, k8s, runner
from local import rendered

STACK = "prod-us"
PODS = "v1/pods"


@pytest.fixture(scope="module")
def variants() -> dict[str, dict[str, Any] | str]:
    return k8s.variants(STACK)


@pytest.fixture(scope="module")
def render() -> rendered.Rendered:
    return rendered.render(STACK)


def _selector(s: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in s.split(","))


def _terminations(e: dict[str, Any]) -> list[dict[str, Any]]:
    return [a["provider"]["arguments"] for a in e["method"]]


def test_every_process_fault_has_a_variant_and_the_others_say_why(
    variants: dict[str, dict[str, Any] | str],
) -> None:
    runnable = {m.id for m in catalog.modes() if m.enactable and m.has_experiment}
    assert set(variants) == runnable
    none = {i: v for i, v in variants.items() if isinstance(v, str)}
    # a hang (SIGSTOP) and a whole shard are what a pod deletion cannot stand for
    assert set(none) == {
        "kafka-consumer-lag-spike",
        "sdk-optimistic-state-stuck",
        "write-kafka-publish-timeout",
        "read-count-cache-shard-unavailable",
        "idem-store-shard-unavailable",
        "read-counter-store-unavailable",
        "aggregator-poison-event",
        "dlq-unavailable",
        "registry-503-on-publish",
        "write-edge-store-quorum-loss",  # network faults (Toxiproxy)
        "kafka-cross-az-partition",
        "sdk-network-drop-retry",  # the clients' own
        "count-cache-cold-restart",  # a FLUSHALL
        "aggregator-oom-viral-post",  # an etcd split, then the kill
        "etcd-bad-config-push",
        "etcd-stale-hotkey-flag",
        "registry-incompatible-schema",
        "counter-store-hot-post",  # an etcd split
        "cdn-stale-after-purge-failure",  # the CDN's purge API, not a pod
        "dlq-unbounded-growth",  # poison records
        "abuse-bot-storm",  # the clients' own
        "abuse-bad-model-deploy",  # a model version, not a pod
        "aggregator-state-stall",  # a hung thread
        "gateway-sampler-misses-flash-spike",  # an etcd flag
        "otel-bad-sampling-config",  # a collector config
        "count-cache-hot-key-under-replicated",  # hot-pool copies deleted
        "registry-cache-poisoning",  # the registry's backing topic rewritten
    }, none
    assert "Toxiproxy" in none["kafka-cross-az-partition"]
    assert "pod-level counterpart" in none["kafka-consumer-lag-spike"]
    assert "one shard" in none["idem-store-shard-unavailable"]
    assert "not to a pod" in none["dlq-unavailable"]


def test_the_variants_are_valid_experiments_with_the_kubernetes_extension(
    variants: dict[str, dict[str, Any] | str],
) -> None:
    for mode_id, e in variants.items():
        if isinstance(e, dict):
            ensure_experiment_is_valid(copy.deepcopy(e))  # imports chaosk8s, checks arguments
            assert e["configuration"] == {"mode": mode_id, "target": "k8s", "stack": STACK}


def test_validation_catches_an_argument_terminate_pods_does_not_take(
    variants: dict[str, dict[str, Any] | str],
) -> None:
    e = copy.deepcopy(variants["aggregator-crash"])
    assert isinstance(e, dict)
    e["method"][0]["provider"]["arguments"]["selector"] = "app=x"  # a typo of label_selector
    with pytest.raises((InvalidActivity, InvalidExperiment)):
        ensure_experiment_is_valid(e)


def test_each_selector_matches_pods_the_program_renders(
    variants: dict[str, dict[str, Any] | str], render: rendered.Rendered
) -> None:
    """Read the render independently of chaos/k8s.py: a workload's selector must be a subset of
    a rendered pod template's labels in the same namespace; Strimzi's and the Scylla Operator's
    pods carry the rendered cluster's name."""
    templates: list[tuple[str, dict[str, str]]] = []
    clusters: dict[str, set[tuple[str, str]]] = {"Kafka": set(), "ScyllaCluster": set()}
    brokers: set[tuple[str, str]] = set()  # (namespace, cluster) of a node pool with brokers
    for r in render.resources:
        kind, meta = r["type"].rsplit(":", 1)[-1], r["inputs"].get("metadata") or {}
        if not r["type"].startswith("kubernetes:"):
            continue
        if kind in ("Deployment", "StatefulSet"):
            labels = r["inputs"]["spec"]["template"]["metadata"]["labels"]
            templates.append((meta.get("namespace", "default"), labels))
        elif kind in clusters:
            clusters[kind].add((meta.get("namespace", "default"), meta["name"]))
        elif kind == "KafkaNodePool" and "broker" in r["inputs"]["spec"]["roles"]:
            brokers.add((meta.get("namespace", "default"), meta["labels"]["strimzi.io/cluster"]))
    checked = 0
    for e in variants.values():
        if isinstance(e, str):
            continue
        for args in _terminations(e):
            want, ns = _selector(args["label_selector"]), args["ns"]
            if "strimzi.io/cluster" in want:
                assert want["strimzi.io/broker-role"] == "true"
                assert (ns, want["strimzi.io/cluster"]) in clusters["Kafka"] & brokers
            elif "scylla/cluster" in want:
                assert (ns, want["scylla/cluster"]) in clusters["ScyllaCluster"]
            else:
                assert any(n == ns and want.items() <= labels.items() for n, labels in templates), (
                    args,
                    "no rendered pod template carries these labels",
                )
            checked += 1
    assert checked >= 10


def test_a_node_is_one_pod_a_component_every_pod_and_kill_means_no_grace(
    variants: dict[str, dict[str, Any] | str],
) -> None:
    def only(mode_id: str) -> dict[str, Any]:
        e = variants[mode_id]
        assert isinstance(e, dict)
        (args,) = _terminations(e)
        return args

    broker = only("kafka-broker-loss")  # local kafka-2: one broker
    assert (broker.get("qty"), broker.get("rand"), broker.get("all")) == (1, True, None)
    assert broker["grace_period"] == 0
    agg = only("aggregator-crash")
    assert (agg["label_selector"], agg["ns"], agg["all"]) == (
        "app.kubernetes.io/name=aggregator",
        "likes",
        True,
    )
    assert agg["grace_period"] == 0
    assert "grace_period" not in only("otel-tempo-down")  # stop: the pod's own grace (SIGTERM)
    model = only("abuse-model-down")  # a sidecar: its pod is the scorer's; the ring is traffic
    assert model["label_selector"] == "app.kubernetes.io/name=abuse-scorer"
    crash = only("abuse-scorer-crash-mid-publish")  # the storm's kill, without its timing
    assert (crash["label_selector"], crash["grace_period"]) == (
        "app.kubernetes.io/name=abuse-scorer",
        0,
    )


def _pod(name: str, app: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "likes",
            "uid": name,
            "labels": {"app.kubernetes.io/name": app},
        },
        "spec": {"containers": [{"name": app, "image": "likes"}]},
        "status": {"phase": "Running"},
    }


class Cluster:
    """kmock's emulated Kubernetes API on its own event loop in a thread: chaoslib runs an
    experiment in the main thread only (it installs signal handlers), with a blocking client."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.api: kmock.KubernetesEmulator | None = None
        self._ready, self._stop = threading.Event(), asyncio.Event()
        self._thread = threading.Thread(target=self.loop.run_until_complete, args=(self._serve(),))

    async def _serve(self) -> None:
        async with kmock.KubernetesEmulator() as api, kmock.Server(api):
            api.resources.load_bundled()
            self.api = api
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> Cluster:
        self._thread.start()
        assert self._ready.wait(30), "kmock did not start"
        return self

    def __exit__(self, *_: object) -> None:
        self.loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    @property
    def url(self) -> str:
        assert self.api is not None
        return str(self.api.url).rstrip("/")

    def put_pod(self, name: str, app: str) -> None:
        def put() -> None:
            assert self.api is not None
            self.api.objects[PODS, "likes", name] = _pod(name, app)

        self.loop.call_soon_threadsafe(put)

    def requests(self) -> list[Any]:
        return list(self.api or [])

    def recreate_after_delete(self, name: str, app: str) -> None:
        """The Deployment's ReplicaSet, as far as this test goes: a new pod once one is gone."""

        async def watch() -> None:
            assert self.api is not None
            while not any(r.method == "DELETE" for r in self.api):
                await asyncio.sleep(0.05)
            self.api.objects[PODS, "likes", name] = _pod(name, app)

        asyncio.run_coroutine_threadsafe(watch(), self.loop)


@pytest.fixture()
def cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[Cluster]:
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")  # the secrets' host is used
    with Cluster() as c:
        c.put_pod("aggregator-7d9f-abcde", "aggregator")
        yield c


def _run(cluster: Cluster, tmp_path: Path) -> runner.Result:
    e = k8s.experiment("aggregator-crash", STACK)
    e["method"][-1]["pauses"] = {"after": 1}  # not the minute a cluster's pods would take
    return runner.run_k8s(
        "aggregator-crash", tmp_path, STACK, {"KUBERNETES_HOST": cluster.url}, experiment=e
    )


def test_a_pod_kill_run_against_kmock_deletes_the_aggregator_and_passes(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.recreate_after_delete("aggregator-7d9f-fghij", "aggregator")
    result = _run(cluster, tmp_path)
    assert (result.verdict, result.failed_activities) == ("passed", []), result
    assert result.checks["pods_deleted"] == ["aggregator-7d9f-abcde"]
    reqs = cluster.requests()
    lists = [r for r in reqs if r.method == "GET" and str(r.url.path).endswith("/pods")]
    assert lists and all(
        r.params.get("labelSelector") == "app.kubernetes.io/name=aggregator" for r in lists
    )
    (delete,) = [r for r in reqs if r.method == "DELETE"]
    assert str(delete.url.path) == "/api/v1/namespaces/likes/pods/aggregator-7d9f-abcde"
    assert (delete.data or {}).get("gracePeriodSeconds") == 0
    assert Path(str(result.journal)).exists()


def test_pods_that_do_not_come_back_make_it_deviate(cluster: Cluster, tmp_path: Path) -> None:
    result = _run(cluster, tmp_path)
    assert result.verdict == "deviated", result
    assert result.checks["pods_deleted"] == ["aggregator-7d9f-abcde"]
