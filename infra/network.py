"""Network: one VPC over three availability zones, public subnets for load balancers and NAT,
private subnets for the nodes (and, through the VPC CNI, every pod)."""

from __future__ import annotations

from dataclasses import dataclass
from ipaddress import IPv4Network

import pulumi
import pulumi_aws as aws


@dataclass(frozen=True)
class NetworkArgs:
    name_prefix: str
    vpc_cidr: IPv4Network
    zones: tuple[str, ...]
    cluster_name: str


def subnet_plan(cidr: IPv4Network, zones: int) -> tuple[list[IPv4Network], list[IPv4Network]]:
    """(private, public) subnets: a /19 per zone for nodes and pods, a /22 per zone for ELBs/NAT."""
    nineteens = list(cidr.subnets(new_prefix=19))
    private = nineteens[:zones]
    public = list(nineteens[zones].subnets(new_prefix=22))[:zones]
    return private, public


class Network(pulumi.ComponentResource):
    vpc_id: pulumi.Output[str]
    private_subnet_ids: list[pulumi.Output[str]]
    public_subnet_ids: list[pulumi.Output[str]]

    def __init__(
        self, name: str, args: NetworkArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("likes:infra:Network", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        tags = {"likes:stack": args.name_prefix}
        shared = {f"kubernetes.io/cluster/{args.cluster_name}": "shared"}
        vpc = aws.ec2.Vpc(
            f"{name}-vpc",
            cidr_block=str(args.vpc_cidr),
            enable_dns_hostnames=True,
            enable_dns_support=True,
            tags={**tags, "Name": args.name_prefix},
            opts=child,
        )
        igw = aws.ec2.InternetGateway(f"{name}-igw", vpc_id=vpc.id, tags=tags, opts=child)
        public_rt = aws.ec2.RouteTable(
            f"{name}-public",
            vpc_id=vpc.id,
            routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", gateway_id=igw.id)],
            tags=tags,
            opts=child,
        )
        private_cidrs, public_cidrs = subnet_plan(args.vpc_cidr, len(args.zones))
        self.private_subnet_ids = []
        self.public_subnet_ids = []
        for zone, priv, pub in zip(args.zones, private_cidrs, public_cidrs, strict=True):
            public = aws.ec2.Subnet(
                f"{name}-public-{zone}",
                vpc_id=vpc.id,
                cidr_block=str(pub),
                availability_zone=zone,
                map_public_ip_on_launch=False,
                tags={**tags, **shared, "kubernetes.io/role/elb": "1", "Name": f"public-{zone}"},
                opts=child,
            )
            aws.ec2.RouteTableAssociation(
                f"{name}-public-{zone}",
                subnet_id=public.id,
                route_table_id=public_rt.id,
                opts=child,
            )
            # One NAT per zone: a zone outage must not cut the other zones' egress.
            eip = aws.ec2.Eip(f"{name}-nat-{zone}", domain="vpc", tags=tags, opts=child)
            nat = aws.ec2.NatGateway(
                f"{name}-nat-{zone}",
                allocation_id=eip.id,
                subnet_id=public.id,
                tags=tags,
                opts=child,
            )
            private = aws.ec2.Subnet(
                f"{name}-private-{zone}",
                vpc_id=vpc.id,
                cidr_block=str(priv),
                availability_zone=zone,
                tags={
                    **tags,
                    **shared,
                    "kubernetes.io/role/internal-elb": "1",
                    "Name": f"private-{zone}",
                },
                opts=child,
            )
            private_rt = aws.ec2.RouteTable(
                f"{name}-private-{zone}",
                vpc_id=vpc.id,
                routes=[aws.ec2.RouteTableRouteArgs(cidr_block="0.0.0.0/0", nat_gateway_id=nat.id)],
                tags=tags,
                opts=child,
            )
            aws.ec2.RouteTableAssociation(
                f"{name}-private-{zone}",
                subnet_id=private.id,
                route_table_id=private_rt.id,
                opts=child,
            )
            self.public_subnet_ids.append(public.id)
            self.private_subnet_ids.append(private.id)
        self.vpc_id = vpc.id
        self.register_outputs(
            {
                "vpc_id": self.vpc_id,
                "private_subnet_ids": self.private_subnet_ids,
                "public_subnet_ids": self.public_subnet_ids,
            }
        )
