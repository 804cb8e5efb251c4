"""The CDN across the stacks: one owner per Cloudflare zone declares the zone's phase rulesets,
and its rules cover every API hostname routed through the zone (see infra/cdn.py for why)."""

from __future__ import annotations

import re
from collections import defaultdict

import pytest
from pydantic import ValidationError

from infra import cdn, config, plan

RULESET = "cloudflare:index/ruleset:Ruleset"
DNS = "cloudflare:index/dnsRecord:DnsRecord"


def _zones(configs: dict[str, config.StackConfig]) -> dict[str, list[str]]:
    zones: dict[str, list[str]] = defaultdict(list)
    for stack, c in configs.items():
        zones[c.cdn.zone_id].append(stack)
    return zones


def _hosts(expression: str) -> set[str]:
    m = re.match(r'^http\.host in \{((?:"[^"]+" ?)+)\} and \(', expression)
    assert m, f"a rule not scoped to the API hosts: {expression}"
    return set(re.findall(r'"([^"]+)"', m.group(1)))


def test_two_stacks_share_a_zone(configs: dict[str, config.StackConfig]) -> None:
    # the case this file is about: prod-us and prod-eu serve from one zone
    assert any(len(stacks) > 1 for stacks in _zones(configs).values())


def test_each_zone_phase_has_exactly_one_ruleset_across_the_stacks(
    plans: dict[str, plan.Plan], configs: dict[str, config.StackConfig]
) -> None:
    declared: dict[tuple[str, str], list[str]] = defaultdict(list)
    for stack, p in plans.items():
        for r in p.of_type(RULESET):
            assert r.inputs["kind"] == "zone"
            declared[(r.inputs["zoneId"], r.inputs["phase"])].append(stack)
    for zone in _zones(configs):
        for phase in ("http_request_cache_settings", "http_request_firewall_managed"):
            owners = declared[(zone, phase)]
            assert len(owners) == 1, f"zone {zone} phase {phase} declared by {owners}"


def test_the_owner_covers_every_hostname_of_its_zone(
    plans: dict[str, plan.Plan], configs: dict[str, config.StackConfig]
) -> None:
    for zone, stacks in _zones(configs).items():
        hosts = {configs[s].cdn.hostname for s in stacks}
        (owner,) = [s for s in stacks if configs[s].cdn.owns_zone]
        rulesets = plans[owner].of_type(RULESET)
        assert rulesets
        for rs in rulesets:
            for rule in rs.inputs["rules"]:
                assert _hosts(rule["expression"]) == hosts, (owner, rule["ref"])
        for s in stacks:  # every stack points its own hostname at its own gateway
            (record,) = plans[s].of_type(DNS)
            assert (record.inputs["zoneId"], record.inputs["name"]) == (
                zone,
                configs[s].cdn.hostname,
            )


def test_a_rule_for_the_hosts_keeps_the_expression_whole() -> None:
    got = cdn.for_hosts(["b.example.com", "a.example.com"], 'x eq "1" or y eq "2"')
    assert got == 'http.host in {"a.example.com" "b.example.com"} and (x eq "1" or y eq "2")'


def test_the_owner_must_list_its_own_host_and_only_the_owner_lists_hosts() -> None:
    base = {"zone_id": "0" * 32, "hostname": "api.example.com"}
    config.CdnConfig(**base, owns_zone=True, zone_hostnames=["api.example.com", "eu.example.com"])
    config.CdnConfig(**base, owns_zone=False)
    with pytest.raises(ValidationError, match="its own too"):
        config.CdnConfig(**base, owns_zone=True, zone_hostnames=["eu.example.com"])
    with pytest.raises(ValidationError, match="owner"):
        config.CdnConfig(**base, owns_zone=False, zone_hostnames=["api.example.com"])
