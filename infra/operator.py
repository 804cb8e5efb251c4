"""The hot-key operator (Kopf): its HotKeyPolicy CRD, the default policy, the ServiceAccount and
RBAC it runs with, and its Deployment."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import pulumi
import pulumi_kubernetes as k8s

from infra import k8s as kx
from infra import tls as tls_infra
from operators.hotkeys import crd
from services.contracts import tls, workloads

GROUP, VERSION, KIND, PLURAL = crd.GROUP, crd.VERSION, crd.KIND, crd.PLURAL
WORKLOAD = workloads.HOTKEY_OPERATOR


@dataclass(frozen=True)
class OperatorArgs:
    namespace: str
    image: str
    hot_pools: int
    env: Mapping[str, object]  # rendered from the operator's settings class (program.py)
    cert_depends_on: tuple[pulumi.Resource, ...] = ()  # the internal CA's issuer


class Operator(pulumi.ComponentResource):
    crd_name: str

    def __init__(
        self, name: str, args: OperatorArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("likes:infra:Operator", name, None, opts)
        ns = args.namespace
        child = pulumi.ResourceOptions(parent=self)
        lbls = kx.labels(WORKLOAD.name, "operator", "app")
        match = kx.selector(WORKLOAD.name)
        ext = k8s.apiextensions.v1
        self.crd_name = crd.NAME
        definition = ext.CustomResourceDefinition(
            f"{name}-crd",
            metadata=kx.meta_v1.ObjectMetaArgs(name=self.crd_name, labels=lbls),
            spec=ext.CustomResourceDefinitionSpecArgs(
                group=GROUP,
                scope="Namespaced",
                names=ext.CustomResourceDefinitionNamesArgs(
                    kind=KIND,
                    plural=PLURAL,
                    singular=crd.SINGULAR,
                    short_names=list(crd.SHORT_NAMES),
                ),
                versions=[
                    ext.CustomResourceDefinitionVersionArgs(
                        name=VERSION,
                        served=True,
                        storage=True,
                        schema=ext.CustomResourceValidationArgs(
                            # Plain JSON Schema: passed through exactly as written.
                            open_apiv3_schema=cast(Any, crd.spec_schema(args.hot_pools))
                        ),
                        subresources=ext.CustomResourceSubresourcesArgs(status={}),
                    )
                ],
            ),
            opts=child,
        )
        k8s.apiextensions.CustomResource(
            f"{name}-default-policy",
            api_version=crd.API_VERSION,
            kind=KIND,
            metadata=kx.meta("default", ns, lbls),
            spec=crd.default_spec(args.hot_pools),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[definition]),
        )
        k8s.core.v1.ServiceAccount(
            WORKLOAD.name, metadata=kx.meta(WORKLOAD.name, ns, lbls), opts=child
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
            f"likes-{WORKLOAD.name}",
            metadata=kx.meta(f"likes-{WORKLOAD.name}", None, lbls),
            rules=rules,
            opts=child,
        )
        rbac.ClusterRoleBinding(
            f"likes-{WORKLOAD.name}",
            metadata=kx.meta(f"likes-{WORKLOAD.name}", None, lbls),
            role_ref=rbac.RoleRefArgs(
                api_group="rbac.authorization.k8s.io",
                kind="ClusterRole",
                name=f"likes-{WORKLOAD.name}",
            ),
            subjects=[rbac.SubjectArgs(kind="ServiceAccount", name=WORKLOAD.name, namespace=ns)],
            opts=child,
        )
        secret, cert = tls_infra.workload_certificate(WORKLOAD.name, ns, self, args.cert_depends_on)
        k8s.apps.v1.Deployment(
            WORKLOAD.name,
            metadata=kx.meta(WORKLOAD.name, ns, lbls),
            spec=k8s.apps.v1.DeploymentSpecArgs(
                replicas=1,
                # Never two operators acting on the same hot-key set at once.
                strategy=k8s.apps.v1.DeploymentStrategyArgs(type="Recreate"),
                selector=kx.meta_v1.LabelSelectorArgs(match_labels=match),
                template=kx.core.PodTemplateSpecArgs(
                    metadata=kx.meta_v1.ObjectMetaArgs(labels=lbls),
                    spec=kx.core.PodSpecArgs(
                        service_account_name=WORKLOAD.name,
                        security_context=kx.pod_security(),
                        node_selector=kx.node_selector("system"),
                        containers=[
                            kx.core.ContainerArgs(
                                name="operator",
                                image=args.image,
                                command=WORKLOAD.command(),
                                env=kx.env({**args.env, "PYTHONDONTWRITEBYTECODE": "1"}),
                                ports=[
                                    kx.core.ContainerPortArgs(
                                        name="health", container_port=WORKLOAD.ops_port
                                    )
                                ],
                                resources=kx.resources("200m", "256Mi", cpu_limit="1"),
                                liveness_probe=kx.http_probe(
                                    workloads.HEALTH_PATH, WORKLOAD.ops_port, delay=10
                                ),
                                readiness_probe=kx.http_probe(
                                    WORKLOAD.ready_path, WORKLOAD.ops_port
                                ),
                                security_context=kx.security(),
                                volume_mounts=[kx.mount("tls", tls.MOUNT_DIR, True)],
                            )
                        ],
                        volumes=[tls_infra.cert_volume("tls", secret)],
                    ),
                ),
            ),
            opts=pulumi.ResourceOptions(parent=self, depends_on=[definition, cert]),
        )
        self.register_outputs({"crd_name": self.crd_name})
