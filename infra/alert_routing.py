"""Which Alertmanager receivers an alert reaches under a rendered config, evaluated the way
Alertmanager walks its route tree; the alert-routing policy reads the rendered ConfigMaps with it
(tests/infra compare it with `amtool config routes test`)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

__all__ = ["MatcherError", "integrations", "receivers_for"]

_MATCHER = re.compile(r'^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*$')


class MatcherError(ValueError):
    """A matcher this evaluator does not understand (say so instead of guessing)."""


def _matches(matcher: str, labels: Mapping[str, str]) -> bool:
    m = _MATCHER.match(matcher)
    if m is None:
        raise MatcherError(f"unsupported matcher {matcher!r}")
    name, op, value = m.group(1), m.group(2), m.group(3).replace('\\"', '"')
    have = labels.get(name, "")
    if op == "=":
        return have == value
    if op == "!=":
        return have != value
    found = re.fullmatch(value, have) is not None
    return found if op == "=~" else not found


def _route_matches(route: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    ok = all(_matches(m, labels) for m in route.get("matchers") or [])
    ok = ok and all(labels.get(k, "") == v for k, v in (route.get("match") or {}).items())
    return ok and all(
        re.fullmatch(v, labels.get(k, "")) is not None
        for k, v in (route.get("match_re") or {}).items()
    )


def _walk(route: Mapping[str, Any], labels: Mapping[str, str], inherited: str) -> list[str]:
    receiver = route.get("receiver") or inherited
    found: list[str] = []
    for child in route.get("routes") or []:
        if _route_matches(child, labels):
            found += _walk(child, labels, receiver)
            if not child.get("continue", False):
                break
    return found or [receiver]


def receivers_for(config: Mapping[str, Any], labels: Mapping[str, str]) -> list[str]:
    """The receivers an alert with these labels is sent to (several when routes `continue`)."""
    return _walk(config["route"], labels, config["route"]["receiver"])


def integrations(config: Mapping[str, Any], receiver: str) -> list[str]:
    """The kinds of integration a receiver sends through (`webhook`, `pagerduty`, ...); an empty
    list means it sends nothing anywhere."""
    for r in config.get("receivers") or []:
        if r.get("name") == receiver:
            return [
                k.removesuffix("_configs") for k, v in r.items() if k.endswith("_configs") and v
            ]
    raise KeyError(f"no receiver named {receiver!r}")
