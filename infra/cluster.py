"""EKS cluster over the three private subnets, one managed node group per workload class
(per zone for datastores), and the Kubernetes provider every in-cluster component uses."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pulumi
import pulumi_aws as aws
import pulumi_kubernetes as k8s

from infra import k8s as kx
from infra.config import NodeGroupConfig

# Classes whose nodes only their own workloads may use (noisy neighbours hurt tail latency).
TAINTED_CLASSES = frozenset({"redis", "scylla", "kafka"})
_NODE_POLICIES = (
    "AmazonEKSWorkerNodePolicy",
    "AmazonEKS_CNI_Policy",
    "AmazonEC2ContainerRegistryReadOnly",
    "AmazonEBSCSIDriverPolicy",
)
_ADDONS = ("vpc-cni", "coredns", "kube-proxy", "aws-ebs-csi-driver", "eks-pod-identity-agent")
# Add-on settings: the VPC CNI enforces NetworkPolicies only when told to (its network policy
# agent); without it every policy of infra/netpol.py is accepted and ignored.
_ADDON_CONFIG: dict[str, dict[str, str]] = {"vpc-cni": {"enableNetworkPolicy": "true"}}


@dataclass(frozen=True)
class ClusterArgs:
    cluster_name: str
    region: str
    kubernetes_version: str
    zones: tuple[str, ...]
    private_subnet_ids: Sequence[pulumi.Input[str]]
    node_groups: Mapping[str, NodeGroupConfig]


def _assume_role(service: str) -> str:
    return json.dumps(
        {
            "Version": "2012-10-17",
            "Statement": [
                {
                    "Effect": "Allow",
                    "Principal": {"Service": service},
                    "Action": ["sts:AssumeRole", "sts:TagSession"],
                }
            ],
        }
    )


def kubeconfig(name: str, endpoint: str, ca_data: str, region: str) -> str:
    """A kubeconfig that authenticates with `aws eks get-token` (no long-lived credentials)."""
    return json.dumps(
        {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": name,
                    "cluster": {"server": endpoint, "certificate-authority-data": ca_data},
                }
            ],
            "contexts": [{"name": name, "context": {"cluster": name, "user": name}}],
            "current-context": name,
            "users": [
                {
                    "name": name,
                    "user": {
                        "exec": {
                            "apiVersion": "client.authentication.k8s.io/v1beta1",
                            "command": "aws",
                            "args": [
                                "eks",
                                "get-token",
                                "--cluster-name",
                                name,
                                "--region",
                                region,
                            ],
                        }
                    },
                }
            ],
        }
    )


class Cluster(pulumi.ComponentResource):
    cluster_name: pulumi.Output[str]
    endpoint: pulumi.Output[str]
    kubeconfig: pulumi.Output[str]
    provider: k8s.Provider

    def __init__(
        self, name: str, args: ClusterArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("likes:infra:Cluster", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        cluster_role = aws.iam.Role(
            f"{name}-cluster-role",
            assume_role_policy=_assume_role("eks.amazonaws.com"),
            opts=child,
        )
        attach = aws.iam.RolePolicyAttachment(
            f"{name}-cluster-policy",
            role=cluster_role.name,
            policy_arn="arn:aws:iam::aws:policy/AmazonEKSClusterPolicy",
            opts=child,
        )
        cluster = aws.eks.Cluster(
            f"{name}-eks",
            name=args.cluster_name,
            version=args.kubernetes_version,
            role_arn=cluster_role.arn,
            vpc_config=aws.eks.ClusterVpcConfigArgs(
                subnet_ids=list(args.private_subnet_ids),
                endpoint_private_access=True,
                endpoint_public_access=True,
            ),
            access_config=aws.eks.ClusterAccessConfigArgs(
                authentication_mode="API",
                bootstrap_cluster_creator_admin_permissions=True,
            ),
            enabled_cluster_log_types=["api", "audit", "authenticator"],
            opts=pulumi.ResourceOptions(parent=self, depends_on=[attach]),
        )
        node_role = aws.iam.Role(
            f"{name}-node-role", assume_role_policy=_assume_role("ec2.amazonaws.com"), opts=child
        )
        node_attachments = [
            aws.iam.RolePolicyAttachment(
                f"{name}-node-{policy}",
                role=node_role.name,
                policy_arn=f"arn:aws:iam::aws:policy/{policy}",
                opts=child,
            )
            for policy in _NODE_POLICIES
        ]
        node_groups: list[aws.eks.NodeGroup] = []
        for workload, ng in args.node_groups.items():
            # Datastores: a group per zone, so scaling adds capacity where the volumes live.
            placements: list[tuple[str, list[pulumi.Input[str]]]] = (
                [(z, [s]) for z, s in zip(args.zones, args.private_subnet_ids, strict=True)]
                if ng.per_zone
                else [("all", list(args.private_subnet_ids))]
            )
            for where, subnets in placements:
                suffix = workload if where == "all" else f"{workload}-{where}"
                node_groups.append(
                    aws.eks.NodeGroup(
                        f"{name}-ng-{suffix}",
                        cluster_name=cluster.name,
                        node_group_name=suffix,
                        node_role_arn=node_role.arn,
                        subnet_ids=subnets,
                        instance_types=ng.instance_types,
                        disk_size=ng.disk_gib,
                        scaling_config=aws.eks.NodeGroupScalingConfigArgs(
                            min_size=ng.min_size, desired_size=ng.desired_size, max_size=ng.max_size
                        ),
                        labels={kx.WORKLOAD_LABEL: workload},
                        taints=[
                            aws.eks.NodeGroupTaintArgs(
                                key=kx.WORKLOAD_LABEL, value=workload, effect="NO_SCHEDULE"
                            )
                        ]
                        if workload in TAINTED_CLASSES
                        else None,
                        update_config=aws.eks.NodeGroupUpdateConfigArgs(max_unavailable=1),
                        opts=pulumi.ResourceOptions(parent=self, depends_on=node_attachments),
                    )
                )
        for addon in _ADDONS:
            aws.eks.Addon(
                f"{name}-addon-{addon}",
                cluster_name=cluster.name,
                addon_name=addon,
                configuration_values=json.dumps(_ADDON_CONFIG[addon])
                if addon in _ADDON_CONFIG
                else None,
                resolve_conflicts_on_update="OVERWRITE",
                opts=pulumi.ResourceOptions(parent=self, depends_on=node_groups),
            )
        self.cluster_name = cluster.name
        self.endpoint = cluster.endpoint
        self.kubeconfig = pulumi.Output.secret(
            pulumi.Output.all(
                cluster.name,
                cluster.endpoint,
                cluster.certificate_authority.apply(lambda ca: ca.data if ca else ""),
            ).apply(lambda a: kubeconfig(a[0], a[1], a[2] or "", args.region))
        )
        self.provider = k8s.Provider(
            f"{name}-k8s",
            kubeconfig=self.kubeconfig,
            enable_server_side_apply=True,
            opts=pulumi.ResourceOptions(parent=self, depends_on=node_groups),
        )
        self.register_outputs(
            {
                "cluster_name": self.cluster_name,
                "endpoint": self.endpoint,
                "kubeconfig": self.kubeconfig,
            }
        )
