"""Small builders for the Kubernetes objects every component declares.

They encode the platform's defaults once: requests and limits, probes, non-root and read-only
root filesystem, zone spread, the workload-class node placement, and the labels the policies use.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

ZONE_KEY = "topology.kubernetes.io/zone"
HOST_KEY = "kubernetes.io/hostname"
WORKLOAD_LABEL = "likes.io/workload"
# `datastore` marks objects the public-endpoint policy guards.
TIER_LABEL = "likes.io/tier"
NONROOT_UID = 65532

core = k8s.core.v1
meta_v1 = k8s.meta.v1


def labels(app: str, component: str, tier: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": app,
        "app.kubernetes.io/component": component,
        "app.kubernetes.io/part-of": "likes",
        TIER_LABEL: tier,
    }


def selector(app: str) -> dict[str, str]:
    # Selectors are immutable on Deployments/StatefulSets: keep them to the one stable label.
    return {"app.kubernetes.io/name": app}


def meta(
    name: str,
    namespace: str | None,
    lbls: Mapping[str, str],
    annotations: Mapping[str, pulumi.Input[str]] | None = None,
) -> meta_v1.ObjectMetaArgs:
    return meta_v1.ObjectMetaArgs(
        name=name,
        namespace=namespace,
        labels=dict(lbls),
        annotations=dict(annotations) if annotations else None,
    )


def zone_spread(
    match: Mapping[str, str], max_skew: int = 1
) -> list[core.TopologySpreadConstraintArgs]:
    """Hard spread over zones (a zone loss takes at most its share), soft spread over hosts."""
    sel = meta_v1.LabelSelectorArgs(match_labels=dict(match))
    return [
        core.TopologySpreadConstraintArgs(
            max_skew=max_skew,
            topology_key=ZONE_KEY,
            when_unsatisfiable="DoNotSchedule",
            label_selector=sel,
        ),
        core.TopologySpreadConstraintArgs(
            max_skew=1,
            topology_key=HOST_KEY,
            when_unsatisfiable="ScheduleAnyway",
            label_selector=sel,
        ),
    ]


def node_selector(workload_class: str) -> dict[str, str]:
    return {WORKLOAD_LABEL: workload_class}


def tolerations(workload_class: str) -> list[core.TolerationArgs]:
    # Datastore node groups are tainted so only their workloads land there.
    return [
        core.TolerationArgs(
            key=WORKLOAD_LABEL, operator="Equal", value=workload_class, effect="NoSchedule"
        )
    ]


def resources(
    cpu: str, memory: str, cpu_limit: str | None = None, memory_limit: str | None = None
) -> core.ResourceRequirementsArgs:
    # Memory limit == request by default: an over-committed datastore gets OOM-killed at random.
    return core.ResourceRequirementsArgs(
        requests={"cpu": cpu, "memory": memory},
        limits={"cpu": cpu_limit or cpu, "memory": memory_limit or memory},
    )


def http_probe(
    path: str, port: int | str, period: int = 10, failures: int = 3, delay: int = 0
) -> core.ProbeArgs:
    return core.ProbeArgs(
        http_get=core.HTTPGetActionArgs(path=path, port=port),
        period_seconds=period,
        failure_threshold=failures,
        initial_delay_seconds=delay,
        timeout_seconds=2,
    )


def tcp_probe(
    port: int | str, period: int = 10, failures: int = 3, delay: int = 0
) -> core.ProbeArgs:
    return core.ProbeArgs(
        tcp_socket=core.TCPSocketActionArgs(port=port),
        period_seconds=period,
        failure_threshold=failures,
        initial_delay_seconds=delay,
        timeout_seconds=2,
    )


def exec_probe(
    command: Sequence[str], period: int = 10, failures: int = 3, delay: int = 0
) -> core.ProbeArgs:
    return core.ProbeArgs(
        exec_=core.ExecActionArgs(command=list(command)),
        period_seconds=period,
        failure_threshold=failures,
        initial_delay_seconds=delay,
        timeout_seconds=3,
    )


def security(read_only: bool = True, uid: int = NONROOT_UID) -> core.SecurityContextArgs:
    return core.SecurityContextArgs(
        run_as_non_root=True,
        run_as_user=uid,
        run_as_group=uid,
        allow_privilege_escalation=False,
        read_only_root_filesystem=read_only,
        capabilities=core.CapabilitiesArgs(drop=["ALL"]),
        seccomp_profile=core.SeccompProfileArgs(type="RuntimeDefault"),
    )


def pod_security(uid: int = NONROOT_UID) -> core.PodSecurityContextArgs:
    return core.PodSecurityContextArgs(
        run_as_non_root=True, run_as_user=uid, run_as_group=uid, fs_group=uid
    )


# The API server as a pod dials it (its in-cluster Service); infra/netpol.py opens its endpoint.
KUBE_API_HOST = "kubernetes.default.svc"
KUBE_API_PORT = 443  # the Service's, and the EKS endpoint's
KUBE_API = f"{KUBE_API_HOST}:{KUBE_API_PORT}"


@dataclass(frozen=True)
class Dial:
    """A connection a component's pods open because the config it rendered names the address
    (Envoy's clusters, a collector's exporter, Alertmanager's receivers): the component reports
    it beside the config, and infra/netpol.py opens exactly that, so the policy follows the
    config."""

    namespace: str
    app: str  # the dialling pods' app.kubernetes.io/name
    address: str  # host:port or a URL, as the config names it
    why: str
    protocols: tuple[str, ...] = ("TCP",)


@dataclass(frozen=True)
class SecretRef:
    """An env value read from a Secret's key (never a literal in the manifest)."""

    secret: str
    key: str


def env(values: Mapping[str, object]) -> list[core.EnvVarArgs]:
    """Env vars in order; a SecretRef becomes a secretKeyRef, anything else its str()."""
    return [
        secret_env(k, v.secret, v.key)
        if isinstance(v, SecretRef)
        else core.EnvVarArgs(name=k, value=v if isinstance(v, str) else str(v))
        for k, v in values.items()
    ]


def secret_env(name: str, secret: str, key: str) -> core.EnvVarArgs:
    return core.EnvVarArgs(
        name=name,
        value_from=core.EnvVarSourceArgs(
            secret_key_ref=core.SecretKeySelectorArgs(name=secret, key=key)
        ),
    )


# The digest of the credentials a setup Job applies, on its pod template (credentials_digest).
CREDENTIALS_ANNOTATION = "likes.io/credentials-sha256"
# The Kubernetes provider's annotation: create or update the object without waiting for it to
# become ready (a Job: to complete)
SKIP_AWAIT = "pulumi.com/skipAwait"


def credentials_digest(values: Mapping[str, pulumi.Input[str]]) -> pulumi.Output[str]:
    """A sha256 over named secret values, for a pod-template annotation: a rotated password
    changes the template, and pulumi-kubernetes replaces a Job whose `.spec.template` changed
    (Jobs are immutable), deleting the old one first since the name stays. The values never
    appear; the digest is not secret (unsecret, or the plan would mask it and a rotation would
    show no change). The stack's passwords are generated, so a digest cannot be guessed back."""
    names = sorted(values)

    def digest(secrets: list[str]) -> str:
        # length-prefixed JSON: ("ab", "c") and ("a", "bc") never collide
        return hashlib.sha256(
            json.dumps(list(zip(names, secrets, strict=True))).encode()
        ).hexdigest()

    joined = pulumi.Output.all(*(values[n] for n in names)).apply(digest)
    return pulumi.Output.unsecret(joined)


def setup_job_spec(
    labels: Mapping[str, str],
    container: core.ContainerArgs,
    volumes: Sequence[core.VolumeArgs] | None = None,
    backoff_limit: int = 20,
    credentials: Mapping[str, pulumi.Input[str]] | None = None,
    *,
    verdicts: Sequence[int] = (),
    deadline_s: int | None = None,
    node_class: str | None = None,
) -> k8s.batch.v1.JobSpecArgs:
    """A pod run to completion: a setup step (schema migration, store logins), restarted on
    failure until its store is ready, or a CronJob's run (the abuse model's publisher); no
    service-account token, non-root. `credentials`: the secret values it applies (name ->
    value), whose digest keys the Job: a rotation re-runs it.

    `verdicts`: exit codes that are the command's own answer, not an accident (a refusal, a bad
    option): the same inputs would fail the same way, so they fail the Job at once. Its pods are
    then never restarted in place (a pod failure policy needs restartPolicy Never): a failed
    pod stays, with its logs, and another one is started for any other failure (OOM, a lost
    node), up to `backoff_limit`; a pod evicted or preempted does not count. `deadline_s`: the
    longest the Job may run (a hung run would otherwise hold a CronJob's Forbid lock).
    `node_class`: the workload class whose nodes run it (default: any untainted node)."""
    annotations = {CREDENTIALS_ANNOTATION: credentials_digest(credentials)} if credentials else None
    failure_policy = None
    if verdicts:
        b = k8s.batch.v1
        failure_policy = b.PodFailurePolicyArgs(
            rules=[
                b.PodFailurePolicyRuleArgs(
                    action="FailJob",
                    on_exit_codes=b.PodFailurePolicyOnExitCodesRequirementArgs(
                        container_name=container.name, operator="In", values=list(verdicts)
                    ),
                ),
                b.PodFailurePolicyRuleArgs(
                    action="Ignore",
                    on_pod_conditions=[
                        b.PodFailurePolicyOnPodConditionsPatternArgs(
                            type="DisruptionTarget", status="True"
                        )
                    ],
                ),
            ]
        )
    return k8s.batch.v1.JobSpecArgs(
        backoff_limit=backoff_limit,
        active_deadline_seconds=deadline_s,
        pod_failure_policy=failure_policy,
        template=core.PodTemplateSpecArgs(
            metadata=meta_v1.ObjectMetaArgs(labels=dict(labels), annotations=annotations),
            spec=core.PodSpecArgs(
                restart_policy="Never" if verdicts else "OnFailure",
                automount_service_account_token=False,
                security_context=pod_security(),
                node_selector=node_selector(node_class) if node_class else None,
                containers=[container],
                volumes=list(volumes) if volumes is not None else None,
            ),
        ),
    )


def rolling_update() -> k8s.apps.v1.DeploymentStrategyArgs:
    """Never fewer ready pods than wanted during a rollout; a quarter more at most."""
    return k8s.apps.v1.DeploymentStrategyArgs(
        type="RollingUpdate",
        rolling_update=k8s.apps.v1.RollingUpdateDeploymentArgs(max_unavailable=0, max_surge="25%"),
    )


def pdb(
    name: str,
    namespace: str,
    match: Mapping[str, str],
    lbls: Mapping[str, str],
    opts: pulumi.ResourceOptions,
    *,
    min_available: int | str | None = None,
    max_unavailable: int | str | None = None,
) -> k8s.policy.v1.PodDisruptionBudget:
    return k8s.policy.v1.PodDisruptionBudget(
        name,
        metadata=meta(name, namespace, lbls),
        spec=k8s.policy.v1.PodDisruptionBudgetSpecArgs(
            selector=meta_v1.LabelSelectorArgs(match_labels=dict(match)),
            min_available=min_available,
            max_unavailable=max_unavailable,
        ),
        opts=opts,
    )


def service_account(
    name: str, namespace: str, lbls: Mapping[str, str], opts: pulumi.ResourceOptions
) -> core.ServiceAccount:
    # Pods that never call the API server get no token mounted.
    return core.ServiceAccount(
        name,
        metadata=meta(name, namespace, lbls),
        automount_service_account_token=False,
        opts=opts,
    )


def headless_service(
    name: str,
    namespace: str,
    lbls: Mapping[str, str],
    match: Mapping[str, str],
    ports: Mapping[str, int],
    opts: pulumi.ResourceOptions,
    *,
    headless: bool = True,
    publish_not_ready: bool = False,
) -> core.Service:
    return core.Service(
        name,
        metadata=meta(name, namespace, lbls),
        spec=core.ServiceSpecArgs(
            type="ClusterIP",
            cluster_ip="None" if headless else None,
            selector=dict(match),
            publish_not_ready_addresses=publish_not_ready or None,
            ports=[
                core.ServicePortArgs(name=pname, port=port, target_port=port)
                for pname, port in ports.items()
            ],
        ),
        opts=opts,
    )


def hpa(
    name: str,
    namespace: str,
    lbls: Mapping[str, str],
    target_kind: str,
    min_replicas: int,
    max_replicas: int,
    opts: pulumi.ResourceOptions,
    cpu_percent: int = 65,
) -> k8s.autoscaling.v2.HorizontalPodAutoscaler:
    a = k8s.autoscaling.v2
    return a.HorizontalPodAutoscaler(
        name,
        metadata=meta(name, namespace, lbls),
        spec=a.HorizontalPodAutoscalerSpecArgs(
            scale_target_ref=a.CrossVersionObjectReferenceArgs(
                api_version="apps/v1", kind=target_kind, name=name
            ),
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            metrics=[
                a.MetricSpecArgs(
                    type="Resource",
                    resource=a.ResourceMetricSourceArgs(
                        name="cpu",
                        target=a.MetricTargetArgs(
                            type="Utilization", average_utilization=cpu_percent
                        ),
                    ),
                )
            ],
            # Scale up fast for a viral spike, down slowly so a lull doesn't shed warm pods.
            behavior=a.HorizontalPodAutoscalerBehaviorArgs(
                scale_up=a.HPAScalingRulesArgs(
                    stabilization_window_seconds=0,
                    policies=[a.HPAScalingPolicyArgs(type="Percent", value=100, period_seconds=15)],
                ),
                scale_down=a.HPAScalingRulesArgs(stabilization_window_seconds=300),
            ),
        ),
        opts=opts,
    )


def config_volume(name: str, config_map: str) -> core.VolumeArgs:
    return core.VolumeArgs(name=name, config_map=core.ConfigMapVolumeSourceArgs(name=config_map))


def secret_volume(name: str, secret: str, items: dict[str, str]) -> core.VolumeArgs:
    """A Secret's keys as files (key → path), readable by the pod's fsGroup only (0440)."""
    return core.VolumeArgs(
        name=name,
        secret=core.SecretVolumeSourceArgs(
            secret_name=secret,
            default_mode=0o440,
            items=[core.KeyToPathArgs(key=k, path=v) for k, v in items.items()],
        ),
    )


def empty_dir(name: str, size: str = "256Mi") -> core.VolumeArgs:
    return core.VolumeArgs(name=name, empty_dir=core.EmptyDirVolumeSourceArgs(size_limit=size))


def mount(name: str, path: str, read_only: bool = False) -> core.VolumeMountArgs:
    return core.VolumeMountArgs(name=name, mount_path=path, read_only=read_only or None)


def pvc_template(
    name: str, size_gi: int, storage_class: str = "gp3"
) -> core.PersistentVolumeClaimArgs:
    return core.PersistentVolumeClaimArgs(
        metadata=meta_v1.ObjectMetaArgs(name=name),
        spec=core.PersistentVolumeClaimSpecArgs(
            access_modes=["ReadWriteOnce"],
            storage_class_name=storage_class,
            resources=core.VolumeResourceRequirementsArgs(requests={"storage": f"{size_gi}Gi"}),
        ),
    )


def child(
    parent: pulumi.Resource, depends_on: Sequence[pulumi.Resource] = ()
) -> pulumi.ResourceOptions:
    return pulumi.ResourceOptions(parent=parent, depends_on=list(depends_on) or None)
