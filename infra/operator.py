"""The hot-key operator (Kopf): its HotKeyPolicy CRD, the default policy, the ServiceAccount and
RBAC it runs with, and its Deployment."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import pulumi
import pulumi_kubernetes as k8s

from infra import k8s as kx

GROUP = "likes.io"
VERSION = "v1"
KIND = "HotKeyPolicy"
PLURAL = "hotkeypolicies"
HEALTH_PORT = 8080


@dataclass(frozen=True)
class OperatorArgs:
    namespace: str
    image: str
    hot_pools: int
    environment: Mapping[str, str]


def hotkeypolicy_schema(hot_pools: int) -> dict[str, Any]:
    """OpenAPI v3 schema of HotKeyPolicy.spec: what counts as hot and what to do about it."""
    return {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "spec": {
                "type": "object",
                "required": ["hotThresholdQps", "replicas", "keySplitShards", "cdnTtlSeconds"],
                "properties": {
                    "hotThresholdQps": {"type": "integer", "minimum": 1},
                    "coolDownSeconds": {"type": "integer", "minimum": 0, "default": 300},
                    # Hot counts are copied into this many of the hot pools.
                    "replicas": {"type": "integer", "minimum": 1, "maximum": hot_pools},
                    "keySplitShards": {"type": "integer", "minimum": 1, "maximum": 64},
                    "cdnTtlSeconds": {
                        "type": "object",
                        "required": ["hot", "cold"],
                        "properties": {
                            "hot": {"type": "integer", "minimum": 1, "maximum": 30},
                            "cold": {"type": "integer", "minimum": 1, "maximum": 30},
                        },
                    },
                    "etcdPrefix": {"type": "string", "pattern": "^/", "default": "/likes/"},
                },
            },
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
        },
    }


def default_policy(hot_pools: int) -> dict[str, Any]:
    return {
        "hotThresholdQps": 50000,
        "coolDownSeconds": 300,
        "replicas": hot_pools,
        "keySplitShards": 8,
        "cdnTtlSeconds": {"hot": 5, "cold": 30},
        "etcdPrefix": "/likes/",
    }


class Operator(pulumi.ComponentResource):
    crd_name: str

    def __init__(
        self, name: str, args: OperatorArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("likes:infra:Operator", name, None, opts)
        ns = args.namespace
        child = pulumi.ResourceOptions(parent=self)
        lbls = kx.labels("hotkey-operator", "operator", "app")
        match = kx.selector("hotkey-operator")
        ext = k8s.apiextensions.v1
        self.crd_name = f"{PLURAL}.{GROUP}"
        crd = ext.CustomResourceDefinition(
            f"{name}-crd",
            metadata=kx.meta_v1.ObjectMetaArgs(name=self.crd_name, labels=lbls),
            spec=ext.CustomResourceDefinitionSpecArgs(
                group=GROUP,
                scope="Namespaced",
                names=ext.CustomResourceDefinitionNamesArgs(
                    kind=KIND, plural=PLURAL, singular="hotkeypolicy", short_names=["hkp"]
                ),
                versions=[
                    ext.CustomResourceDefinitionVersionArgs(
                        name=VERSION,
                        served=True,
                        storage=True,
                        schema=ext.CustomResourceValidationArgs(
                            # Plain JSON Schema: passed through exactly as written.
                            open_apiv3_schema=cast(Any, hotkeypolicy_schema(args.hot_pools))
                        ),
                        subresources=ext.CustomResourceSubresourcesArgs(status={}),
                    )
                ],
            ),
            opts=child,
        )
        k8s.apiextensions.CustomResource(
            f"{name}-default-policy",
            api_version=f"{GROUP}/{VERSION}",
            kind=KIND,
            metadata=kx.meta("default", ns, lbls),
            spec=default_policy(args.hot_pools),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[crd]),
        )
        k8s.core.v1.ServiceAccount(
            "hotkey-operator", metadata=kx.meta("hotkey-operator", ns, lbls), opts=child
        )
        rbac = k8s.rbac.v1
        rules = [
            rbac.PolicyRuleArgs(
                api_groups=[GROUP], resources=[PLURAL], verbs=["get", "list", "watch", "patch"]
            ),
            rbac.PolicyRuleArgs(
                api_groups=[GROUP], resources=[f"{PLURAL}/status"], verbs=["get", "patch"]
            ),
            # Kopf discovers resources and namespaces, and posts events about what it did.
            rbac.PolicyRuleArgs(
                api_groups=["apiextensions.k8s.io"],
                resources=["customresourcedefinitions"],
                verbs=["list", "watch"],
            ),
            rbac.PolicyRuleArgs(api_groups=[""], resources=["namespaces"], verbs=["list", "watch"]),
            rbac.PolicyRuleArgs(
                api_groups=["", "events.k8s.io"], resources=["events"], verbs=["create"]
            ),
        ]
        rbac.ClusterRole(
            "likes-hotkey-operator",
            metadata=kx.meta("likes-hotkey-operator", None, lbls),
            rules=rules,
            opts=child,
        )
        rbac.ClusterRoleBinding(
            "likes-hotkey-operator",
            metadata=kx.meta("likes-hotkey-operator", None, lbls),
            role_ref=rbac.RoleRefArgs(
                api_group="rbac.authorization.k8s.io",
                kind="ClusterRole",
                name="likes-hotkey-operator",
            ),
            subjects=[
                rbac.SubjectArgs(kind="ServiceAccount", name="hotkey-operator", namespace=ns)
            ],
            opts=child,
        )
        health = f"http://0.0.0.0:{HEALTH_PORT}/healthz"
        k8s.apps.v1.Deployment(
            "hotkey-operator",
            metadata=kx.meta("hotkey-operator", ns, lbls),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=1,
                # Never two operators acting on the same hot-key set at once.
                strategy=k8s.apps.v1.DeploymentStrategyArgs(type="Recreate"),
                selector=kx.meta_v1.LabelSelectorArgs(match_labels=match),
                template=kx.core.PodTemplateSpecArgs(
                    metadata=kx.meta_v1.ObjectMetaArgs(labels=lbls),
                    spec=kx.core.PodSpecArgs(
                        service_account_name="hotkey-operator",
                        security_context=kx.pod_security(),
                        node_selector=kx.node_selector("system"),
                        containers=[
                            kx.core.ContainerArgs(
                                name="operator",
                                image=args.image,
                                command=[
                                    "kopf",
                                    "run",
                                    "--all-namespaces",
                                    "--standalone",
                                    f"--liveness={health}",
                                    "-m",
                                    "operators.hotkeys.handlers",  # the Kopf wiring
                                ],
                                env=[
                                    *kx.env({**args.environment, "PYTHONDONTWRITEBYTECODE": "1"}),
                                    # It writes hot counts into the hot pools (Redis AUTH).
                                    kx.secret_env("REDIS_PASSWORD", "redis-auth", "password"),
                                ],
                                ports=[
                                    kx.core.ContainerPortArgs(
                                        name="health", container_port=HEALTH_PORT
                                    )
                                ],
                                resources=kx.resources("200m", "256Mi", cpu_limit="1"),
                                liveness_probe=kx.http_probe("/healthz", HEALTH_PORT, delay=10),
                                readiness_probe=kx.http_probe("/healthz", HEALTH_PORT),
                                security_context=kx.security(),
                            )
                        ],
                    ),
                ),
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[crd]),
        )
        self.register_outputs({"crd_name": self.crd_name})
