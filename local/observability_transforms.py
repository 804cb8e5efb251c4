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
6. Time, scaled by the one declared TIME_SCALE, so alerts fire here in minutes, not hours: every
   rule's `for`, every range in its PromQL (`[1h]`, `[5m:1m]`) and Alertmanager's group and
   repeat timers are divided by it. Scaling cannot go below what the data resolves: a range
   never shrinks under MIN_RANGE_SCRAPES scrape intervals (a rate needs samples to compare),
   a subquery step never under the evaluation interval, a timer never under 1 s. A rule over
   events slower than scrapes (SLOW_EVENTS_S: the canary judges one turn per convergence hold)
   keeps its ranges at MIN_RANGE_EVENTS of those events: a 15 m ratio of the canary's turns
   scaled to 20 s held no turn half the time, so CanaryDrift came and went during one drift.
7. Prometheus: the scrape and evaluation intervals -> LOCAL_INTERVAL (5 s; rendered 15 s), so the
   floors of transform 6 are a third as long: a scaled rate window of 20 s, not 60 s, and an
   alert fires and resolves about 40 s sooner. Not scaled by TIME_SCALE: a scrape costs what it
   costs (Cassandra's JMX exporter ~0.1 s of CPU), so every 5 s is ~2 % of a core, every 0.25 s
   would be a core.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from infra import observability as obs
from local.observability_render import Pod, Rendered
from services.contracts import convergence
from services.contracts import metrics as metric_names


class TransformError(Exception):
    """The rendered config has something the local translation does not know how to play."""


TIME_SCALE = 60  # transform 6: a rendered hour is a local minute
MIN_RANGE_SCRAPES = 4
MIN_RANGE_EVENTS = 2
# rules (by record or alert name) whose ranges count events that come no faster than this: the
# canary judges a turn once per convergence hold (services/canary: like or unlike, then the hold)
SLOW_EVENTS_S: dict[str, float] = {metric_names.CANARY_DRIFT_RATIO: convergence.HOLD_S}
LOCAL_INTERVAL = "5s"  # transform 7: scrape and rule evaluation

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "y": 31536000}
_DURATION = re.compile(r"(?:\d+(?:ms|[smhdwy]))+")
_PART = re.compile(r"(\d+)(ms|[smhdwy])")
# a range selector or subquery: [5m] [1h:1m] [3d:]
_RANGE = re.compile(r"\[(" + _DURATION.pattern + r")(?::(" + _DURATION.pattern + r")?)?\]")


def seconds(duration: str) -> float:
    """A Prometheus duration ("1h30m", "5m", "500ms") in seconds."""
    if not _DURATION.fullmatch(duration):
        raise TransformError(f"not a Prometheus duration: {duration!r}")
    return sum(int(n) * _UNITS[unit] for n, unit in _PART.findall(duration))


def scaled(duration: str, floor_s: float = 1.0) -> str:
    """Transform 6 for one duration: divided by TIME_SCALE, never below `floor_s`."""
    if seconds(duration) == 0:
        return duration  # "at once" stays at once
    s = max(seconds(duration) / TIME_SCALE, floor_s)
    return f"{round(s)}s" if s >= 1 else f"{round(s * 1000)}ms"


def scaled_expr(expr: str, min_range_s: float, min_step_s: float) -> str:
    """Transform 6 for PromQL: each range and subquery step scaled."""

    def one(m: re.Match[str]) -> str:
        rng = scaled(m.group(1), min_range_s)
        if ":" not in m.group(0):
            return f"[{rng}]"
        step = m.group(2)
        return f"[{rng}:{scaled(step, min_step_s) if step else ''}]"

    return _RANGE.sub(one, expr)


def _interval(rendered_prometheus: Mapping[str, Any], key: str) -> str:
    """Transform 7: the local scrape or evaluation interval (never longer than rendered)."""
    glob = rendered_prometheus.get("global") or {}
    rendered_s = seconds(glob.get(key, "1m"))
    return LOCAL_INTERVAL if seconds(LOCAL_INTERVAL) < rendered_s else glob.get(key, "1m")


def _floors(rendered_prometheus: Mapping[str, Any]) -> tuple[float, float]:
    """Transform 6's floors, at the intervals the local Prometheus runs (transform 7)."""
    scrape = seconds(_interval(rendered_prometheus, "scrape_interval"))
    evaluation = seconds(_interval(rendered_prometheus, "evaluation_interval"))
    return MIN_RANGE_SCRAPES * scrape, evaluation


def query(expr: str, rendered_prometheus: Mapping[str, Any]) -> str:
    """Transform 6 for an ad-hoc query (a runbook's check) against the local Prometheus: its
    ranges scaled as the rules' are, so it reads the window the local alert did."""
    return scaled_expr(expr, *_floors(rendered_prometheus))


def rules(text: str, rendered_prometheus: Mapping[str, Any]) -> str:
    """Transform 6 for a rules file: every `for` and every range scaled."""
    min_range, min_step = _floors(rendered_prometheus)
    doc = yaml.safe_load(text)
    for group in doc.get("groups") or []:
        if "interval" in group:
            raise TransformError(f"group {group['name']}: a group interval is not scaled yet")
        for rule in group.get("rules") or []:
            slow = SLOW_EVENTS_S.get(rule.get("record") or rule.get("alert"), 0.0)
            floor = max(min_range, MIN_RANGE_EVENTS * slow)
            rule["expr"] = scaled_expr(str(rule["expr"]), floor, min_step)
            for key in ("for", "keep_firing_for"):
                if key in rule:
                    rule[key] = scaled(rule[key], 0.001)
    return yaml.safe_dump(doc, sort_keys=False, width=100)


def _scale_route(route: dict[str, Any]) -> None:
    for key in ("group_wait", "group_interval", "repeat_interval"):
        if key in route:
            route[key] = scaled(route[key])
    for child in route.get("routes") or []:
        _scale_route(child)


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


def port_key(workload: str, port_name: str) -> str:
    """The key of `jobs` (file_sd_groups) for a container port of a workload's pod by its name
    (a sidecar's), rather than the port the pod's annotations name."""
    return f"{workload}/{port_name}"


def file_sd_groups(
    rendered: Rendered, jobs: Mapping[str, list[str]], namespaces: list[str] | None
) -> list[dict[str, Any]]:
    """Transform 1: target groups for the components' metrics targets (job -> host:port list).
    A job keyed by port_key(workload, port name) is a named container port of that workload's
    pods (its i-th target in the i-th local pod): its group carries the container's and the
    port's names, and the pod's annotations the port of that pod's own target, as Kubernetes
    SD gives every declared port of a pod."""
    groups = []
    for job, targets in jobs.items():
        workload, _, port_name = job.partition("/")
        pod = rendered.pod(workload)
        if pod is None or (namespaces is not None and pod.namespace not in namespaces):
            continue  # no such pod in the cluster, or one the SD does not watch
        container = pod.container_with_port(port_name) if port_name else None
        if port_name and container is None:
            raise TransformError(f"{workload}'s pod declares no container port {port_name!r}")
        own = jobs.get(workload, [])
        for i, target in enumerate(targets):
            port = int(target.rsplit(":", 1)[1])
            if container is None:
                groups.append({"targets": [target], "labels": sd_labels(pod, _pod(pod, i), port)})
                continue
            if i >= len(own):
                raise TransformError(f"{job}: {target} has no local {workload} pod beside it")
            labels = sd_labels(pod, _pod(pod, i), int(own[i].rsplit(":", 1)[1]))
            labels |= {
                "__meta_kubernetes_pod_container_name": container,
                "__meta_kubernetes_pod_container_port_name": port_name,
                "__meta_kubernetes_pod_container_port_number": str(port),
                "__meta_kubernetes_pod_container_port_protocol": "TCP",
            }
            groups.append({"targets": [target], "labels": labels})
    return groups


def _pod(pod: Pod, i: int) -> str:
    return f"{pod.name}-local-{i}"


def prometheus(
    rendered: Rendered,
    jobs: Mapping[str, list[str]],
    addresses: Mapping[str, str],
    rules_dir: Path,
    targets_dir: Path,
) -> tuple[dict[str, Any], dict[Path, list[dict[str, Any]]]]:
    """Transforms 1-4 and 7: the local prometheus.yml and the file_sd files it reads."""
    cfg = copy.deepcopy(rendered.prometheus)
    glob = cfg.setdefault("global", {})
    for key in ("scrape_interval", "evaluation_interval"):
        glob[key] = _interval(rendered.prometheus, key)
    if "scrape_timeout" in glob:  # never longer than the interval (Prometheus refuses that)
        glob["scrape_timeout"] = glob["scrape_interval"]
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
    """Transforms 5 and 6: the local alertmanager.yml."""
    cfg = copy.deepcopy(rendered.alertmanager)
    _scale_route(cfg["route"])
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
