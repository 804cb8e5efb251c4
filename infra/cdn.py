"""CDN (Cloudflare): cache rules for the like-count read, bypass for personalised reads and for
writes, the WAF managed rulesets, and the DNS record that points the API host at the gateway.

One stack owns a zone's rulesets; every stack declares its own DNS record. Cloudflare keeps one
entry-point ruleset per phase per zone, and a zone-level `Ruleset` resource *is* that entry point:
two stacks declaring it for the same zone (prod-us and prod-eu share likes.example.com) would
overwrite each other's rules on every `pulumi up`, and destroying either stack would delete the
rules the other still serves. One zone per stack was the other way out, but it would put each
region's API under its own delegated subdomain zone for no gain: the rules are the same for every
region. So the owner (`likes:cdn.ownsZone: true`, exactly one stack per zone, checked across the
stack files by tests/infra/test_cdn.py) scopes its rules to every API hostname routed through the
zone (`likes:cdn.zoneHostnames`, the other regions' included), and the others only point their
own hostname at their gateway.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pulumi
import pulumi_cloudflare as cloudflare

# Cloudflare's own managed rulesets (ids are global constants in every zone).
CLOUDFLARE_MANAGED_RULESET = "efb7b8c949ac4650a09736fc376e9aee"
OWASP_CORE_RULESET = "4814384a9e5d4991b9815dcfc25d2f1f"

HAS_AUTHORIZATION = 'any(lower(http.request.headers.names[*])[*] eq "authorization")'
LIKE_COUNT_READ = (
    'http.request.method eq "GET"'
    ' and starts_with(http.request.uri.path, "/v1/posts/")'
    ' and ends_with(http.request.uri.path, "/likes")'
)
# Cached: anonymous GETs of a post's count. The origin's Cache-Control (5-30 s by heat) rules.
CACHEABLE = f"({LIKE_COUNT_READ}) and not {HAS_AUTHORIZATION}"
# Never cached: anything carrying a credential (has_liked is per user) and every non-GET.
BYPASS = f'{HAS_AUTHORIZATION} or http.request.method ne "GET"'


@dataclass(frozen=True)
class CdnArgs:
    zone_id: str
    hostname: str
    origin_hostname: pulumi.Input[str]
    fallback_ttl_seconds: int
    owns_zone: bool  # declares the zone's phase entry-point rulesets
    zone_hostnames: Sequence[str] = ()  # the owner's: every API host of the zone


def for_hosts(hostnames: Sequence[str], expression: str) -> str:
    """`expression`, for requests to these hosts only (the zone may serve other sites)."""
    hosts = " ".join(f'"{h}"' for h in sorted(set(hostnames)))
    return f"http.host in {{{hosts}}} and ({expression})"


class Cdn(pulumi.ComponentResource):
    hostname: str

    def __init__(
        self, name: str, args: CdnArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("likes:infra:Cdn", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        cf = cloudflare
        if args.owns_zone:
            self._rulesets(name, args, child)
        cf.DnsRecord(
            f"{name}-api",
            zone_id=args.zone_id,
            name=args.hostname,
            type="CNAME",
            content=args.origin_hostname,
            proxied=True,  # through the edge: cache, WAF and the origin's address stays private
            ttl=1,
            comment="like API -> Envoy gateway NLB",
            opts=child,
        )
        self.hostname = args.hostname
        self.register_outputs({"hostname": self.hostname})

    def _rulesets(self, name: str, args: CdnArgs, child: pulumi.ResourceOptions) -> None:
        cf = cloudflare
        cf.Ruleset(
            f"{name}-cache-rules",
            zone_id=args.zone_id,
            kind="zone",
            name="likes cache rules",
            phase="http_request_cache_settings",
            rules=[
                cf.RulesetRuleArgs(
                    ref="like_counts_cache",
                    description="like counts: cache, honour the origin's TTL (5-30 s by heat)",
                    expression=for_hosts(args.zone_hostnames, CACHEABLE),
                    action="set_cache_settings",
                    action_parameters=cf.RulesetRuleActionParametersArgs(
                        cache=True,
                        edge_ttl=cf.RulesetRuleActionParametersEdgeTtlArgs(
                            mode="respect_origin", default=args.fallback_ttl_seconds
                        ),
                        browser_ttl=cf.RulesetRuleActionParametersBrowserTtlArgs(
                            mode="respect_origin"
                        ),
                    ),
                ),
                # Last, so it wins over any earlier rule that matched the same request.
                cf.RulesetRuleArgs(
                    ref="bypass_personal_and_writes",
                    description="bypass: requests with Authorization, and all non-GET",
                    expression=for_hosts(args.zone_hostnames, BYPASS),
                    action="set_cache_settings",
                    action_parameters=cf.RulesetRuleActionParametersArgs(cache=False),
                ),
            ],
            opts=child,
        )
        cf.Ruleset(
            f"{name}-waf",
            zone_id=args.zone_id,
            kind="zone",
            name="likes WAF managed rules",
            phase="http_request_firewall_managed",
            rules=[
                cf.RulesetRuleArgs(
                    ref=f"execute_{ruleset_id[:8]}",
                    description=description,
                    expression=for_hosts(args.zone_hostnames, "true"),
                    action="execute",
                    action_parameters=cf.RulesetRuleActionParametersArgs(id=ruleset_id),
                )
                for ruleset_id, description in (
                    (CLOUDFLARE_MANAGED_RULESET, "Cloudflare Managed Ruleset"),
                    (OWASP_CORE_RULESET, "Cloudflare OWASP Core Ruleset"),
                )
            ],
            opts=child,
        )
