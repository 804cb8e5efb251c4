"""In-cluster platform: namespaces, the zone-aware gp3 StorageClass, and the operators the
datastores need (cert-manager, Strimzi, Scylla Operator) as Helm releases."""

from __future__ import annotations

from dataclasses import dataclass

import pulumi
import pulumi_kubernetes as k8s

from services.contracts import workloads

NS_APPS = workloads.NAMESPACE
NS_EDGE = "likes-edge"
NS_DATA = "likes-data"
NS_OBSERVABILITY = "likes-observability"
NS_OPERATORS = "likes-operators"
STORAGE_CLASS = "gp3"
# The operators' admission webhooks, which the API server calls (infra/netpol.py opens them):
# cert-manager's is set here (its chart's default too); the Scylla Operator's webhook server
# listens on a port its chart fixes.
CERT_MANAGER_WEBHOOK_PORT = 10250
SCYLLA_WEBHOOK_PORT = 5000

# Pinned chart versions; bump deliberately (CRD changes ride along with the operator).
CHARTS = {
    "cert-manager": ("https://charts.jetstack.io", "cert-manager", "v1.19.1"),
    "strimzi": ("", "oci://quay.io/strimzi-helm/strimzi-kafka-operator", "1.0.0"),
    "scylla-operator": (
        "https://scylla-operator-charts.storage.googleapis.com/stable",
        "scylla-operator",
        "1.19.0",
    ),
}


@dataclass(frozen=True)
class PlatformArgs:
    # Pod Security level per namespace is fixed; nothing varies per stack yet.
    environment: str


class Platform(pulumi.ComponentResource):
    operators: list[pulumi.Resource]
    namespaces: dict[str, k8s.core.v1.Namespace]

    def __init__(
        self, name: str, args: PlatformArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("likes:infra:Platform", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        # "restricted" wherever our own images run; datastores and operators need "baseline"
        # (Scylla tunes sysctls through its node setup DaemonSet).
        levels = {
            NS_APPS: "restricted",
            NS_EDGE: "restricted",
            NS_OBSERVABILITY: "restricted",
            NS_DATA: "baseline",
            NS_OPERATORS: "privileged",
        }
        self.namespaces = {
            ns: k8s.core.v1.Namespace(
                f"ns-{ns}",
                metadata=k8s.meta.v1.ObjectMetaArgs(
                    name=ns,
                    labels={
                        "app.kubernetes.io/part-of": "likes",
                        "pod-security.kubernetes.io/enforce": level,
                    },
                ),
                opts=child,
            )
            for ns, level in levels.items()
        }
        k8s.storage.v1.StorageClass(
            "storage-gp3",
            metadata=k8s.meta.v1.ObjectMetaArgs(
                name=STORAGE_CLASS,
                annotations={"storageclass.kubernetes.io/is-default-class": "true"},
            ),
            provisioner="ebs.csi.aws.com",
            # Bind only once the pod is scheduled, so the EBS volume lands in the pod's zone.
            volume_binding_mode="WaitForFirstConsumer",
            allow_volume_expansion=True,
            reclaim_policy="Retain",
            parameters={"type": "gp3", "encrypted": "true"},
            opts=child,
        )
        ops_ns = self.namespaces[NS_OPERATORS]
        after_ns = pulumi.ResourceOptions(parent=self, depends_on=[ops_ns])
        cert_manager = self._release(
            "cert-manager",
            {"crds": {"enabled": True}, "webhook": {"securePort": CERT_MANAGER_WEBHOOK_PORT}},
            after_ns,
        )
        # Our NetworkPolicies say who reaches Kafka (infra/netpol.py); Strimzi's would open each
        # listener to every namespace.
        strimzi = self._release(
            "strimzi", {"watchAnyNamespace": True, "generateNetworkPolicy": False}, after_ns
        )
        scylla = self._release(
            "scylla-operator",
            {"replicas": 2},
            pulumi.ResourceOptions(parent=self, depends_on=[ops_ns, cert_manager]),
        )
        self.operators = [cert_manager, strimzi, scylla]
        self.register_outputs({"namespaces": list(self.namespaces)})

    def _release(
        self, key: str, values: dict[str, object], opts: pulumi.ResourceOptions
    ) -> k8s.helm.v3.Release:
        repo, chart, version = CHARTS[key]
        return k8s.helm.v3.Release(
            f"op-{key}",
            name=key,
            chart=chart,
            version=version,
            namespace=NS_OPERATORS,
            repository_opts=k8s.helm.v3.RepositoryOptsArgs(repo=repo) if repo else None,
            values=values,
            atomic=True,
            opts=opts,
        )
