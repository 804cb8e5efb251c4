"""The local stack's complete list of changes to the Prometheus and Alertmanager configs the
program renders (local/rendered.py). Everything not listed runs as rendered.

1. Prometheus: Kubernetes pod discovery -> `file_sd_configs`. Debian's Prometheus is built
   without Kubernetes SD, and there are no pods: each local component's metrics target becomes a
   file_sd target with the `__meta_kubernetes_*` labels Kubernetes SD would give the rendered pod
   of that workload (namespace, pod name, pod labels, annotations), so the rendered relabeling
   runs unchanged. Only the one in-cluster fact is replaced: the prometheus.io/port annotation
   carries the local port (as does every annotation of obs.PORT_ANNOTATIONS). Only pods in the
   namespaces the rendered SD watches are listed. Operators' custom resources (Strimzi's
   KafkaNodePool, the ScyllaCluster) count as workloads: their pod templates are what the
   operators' pods carry.
2. Prometheus: in-cluster addresses (Alertmanager, the fixed `__address__` of a job scraping
   through an exporter) -> local ones, from an explicit table (an address missing from it is an
   error, not a silent skip).
3. Prometheus: `remote_write` dropped (no Mimir locally).
4. Prometheus: `rule_files` -> the local copy of the rendered rules ConfigMap.
5. Alertmanager: every receiver's integrations (PagerDuty, webhooks) -> one webhook to the local
   sink (local/webhook_sink.py) at `/<receiver>`; a receiver with none stays silent, as rendered.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from infra import observability as obs
from local.observability_render import Pod, Rendered


class TransformError(Exception):
    """The rendered config has something the local translation does not know how to play."""


def sd_labels(pod: Pod, pod_name: str, port: int) -> dict[str, str]:
    """What Kubernetes SD (role: pod) attaches to a target of this pod listening on `port`."""
    annotations = dict(pod.annotations)
    for name in obs.PORT_ANNOTATIONS:
        if name in annotations:
            annotations[name] = str(port)  # the local port, not the pod's
    out = {"__meta_kubernetes_namespace": pod.namespace, "__meta_kubernetes_pod_name": pod_name}
    for kind, values in (("label", pod.labels), ("annotation", annotations)):
        for name, value in values.items():
            out[obs.sd_label(kind, name)] = value
            out[obs.sd_label(f"{kind}present", name)] = "true"
    return out


def file_sd_groups(
    rendered: Rendered, jobs: Mapping[str, list[str]], namespaces: list[str] | None
) -> list[dict[str, Any]]:
    """Transform 1: target groups for the components' metrics targets (job -> host:port list)."""
    groups = []
    for job, targets in jobs.items():
        pod = rendered.pod(job)
        if pod is None or (namespaces is not None and pod.namespace not in namespaces):
            continue  # no such pod in the cluster, or one the SD does not watch
        for i, target in enumerate(targets):
            port = int(target.rsplit(":", 1)[1])
            labels = sd_labels(pod, f"{pod.name}-local-{i}", port)
            groups.append({"targets": [target], "labels": labels})
    return groups


def prometheus(
    rendered: Rendered,
    jobs: Mapping[str, list[str]],
    addresses: Mapping[str, str],
    rules_dir: Path,
    targets_dir: Path,
) -> tuple[dict[str, Any], dict[Path, list[dict[str, Any]]]]:
    """Transforms 1-4: the local prometheus.yml and the file_sd files it reads."""
    cfg = copy.deepcopy(rendered.prometheus)
    files: dict[Path, list[dict[str, Any]]] = {}
    for scrape in cfg.get("scrape_configs") or []:
        file_sd = []
        for i, sd in enumerate(scrape.pop("kubernetes_sd_configs", None) or []):
            if sd.get("role") != "pod" or set(sd) - {"role", "namespaces"}:
                raise TransformError(f"job {scrape['job_name']}: cannot play Kubernetes SD {sd}")
            names = (sd.get("namespaces") or {}).get("names")
            path = targets_dir / f"{scrape['job_name']}-{i}.json"
            files[path] = file_sd_groups(rendered, jobs, names)
            file_sd.append({"files": [str(path)]})
        if file_sd:
            scrape["file_sd_configs"] = file_sd
        for relabel in scrape.get("relabel_configs") or []:
            # a fixed __address__ (the multi-target exporter the `redis` job scrapes through)
            if relabel.get("target_label") == "__address__" and "source_labels" not in relabel:
                relabel["replacement"] = _local(relabel["replacement"], addresses)
    for am in (cfg.get("alerting") or {}).get("alertmanagers") or []:
        for static in am.get("static_configs") or []:
            static["targets"] = [_local(t, addresses) for t in static.get("targets") or []]
    cfg.pop("remote_write", None)
    cfg["rule_files"] = [str(rules_dir / "*.yml")]
    return cfg, files


def _local(address: str, addresses: Mapping[str, str]) -> str:
    """Transform 2."""
    try:
        return addresses[address]
    except KeyError:
        raise TransformError(f"no local server plays {address}: add it to the table") from None


def alertmanager(rendered: Rendered, sink_url: str) -> dict[str, Any]:
    """Transform 5: the local alertmanager.yml."""
    cfg = copy.deepcopy(rendered.alertmanager)
    for receiver in cfg.get("receivers") or []:
        kinds = [k for k, v in receiver.items() if k.endswith("_configs") and v]
        if not kinds:
            continue
        first = receiver[kinds[0]][0]
        hook: dict[str, Any] = {"url": f"{sink_url}/{receiver['name']}"}
        if "send_resolved" in first:
            hook["send_resolved"] = first["send_resolved"]
        for kind in kinds:
            del receiver[kind]
        receiver["webhook_configs"] = [hook]
    return cfg
