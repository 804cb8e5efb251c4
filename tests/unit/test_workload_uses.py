"""Each workload's `uses` (the servers the NetworkPolicies let it reach) is what its code reads.

A static scan: the settings fields naming a server (workloads.SERVERS) that a workload's package
reads, directly or through the contracts' client helpers (`clients.cassandra(settings)`...). A
new dependency in the code fails here until the workload declares it, and the declaration is what
infra/netpol.py opens the network for; a stale declaration fails too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from services.contracts import workloads

ROOT = Path(__file__).resolve().parents[2]
# services/contracts modules taking settings
CONTRACT_HELPERS = ("clients", "etcd", "auth", "kafka", "registry", "flags")
# settings properties that read a server field
PROPERTIES = {
    "count_cache_startup": "count_cache_nodes",
    "idem_store_startup": "idem_store_nodes",
    "feature_store_startup": "feature_store_nodes",
    "hot_pool_addresses": "hot_pools",
}
PORT_FIELDS = {port: host for host, port in workloads.SERVERS.items() if port}
# Servers a workload reaches at addresses its settings do not hold: the read service follows the
# hot-pool addresses the operator publishes in etcd (netpol opens that flow from the operator's
# rendered hot_pools).
DYNAMIC: dict[str, set[str]] = {workloads.READ.name: {"hot_pools"}}


def _field(name: str) -> str | None:
    name = PROPERTIES.get(name, name)
    name = PORT_FIELDS.get(name, name)
    return name if name in workloads.SERVERS else None


def _reads(tree: ast.AST) -> set[str]:
    return {f for n in ast.walk(tree) if isinstance(n, ast.Attribute) if (f := _field(n.attr))}


def _helper_reads() -> dict[tuple[str, str], set[str]]:
    """(module, function) -> server fields it reads, following its calls to functions of its
    own module and of the other helper modules (`kafka.from_settings(...)` inside clients)."""
    funcs: dict[tuple[str, str], ast.FunctionDef | ast.AsyncFunctionDef] = {}
    module_aliases: dict[str, dict[str, str]] = {}
    for mod in CONTRACT_HELPERS:
        tree = ast.parse((ROOT / "services" / "contracts" / f"{mod}.py").read_text())
        module_aliases[mod] = _aliases(tree)
        for n in tree.body:
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
                funcs[(mod, n.name)] = n
    reads = {key: _reads(f) for key, f in funcs.items()}
    calls: dict[tuple[str, str], set[tuple[str, str]]] = {}
    for (mod, name), f in funcs.items():
        callees = set()
        for c in ast.walk(f):
            if not isinstance(c, ast.Call):
                continue
            if isinstance(c.func, ast.Name) and (mod, c.func.id) in funcs:
                callees.add((mod, c.func.id))
            elif (
                isinstance(c.func, ast.Attribute)
                and isinstance(c.func.value, ast.Name)
                and c.func.value.id in module_aliases[mod]
            ):
                target = (module_aliases[mod][c.func.value.id], c.func.attr)
                if target in funcs:
                    callees.add(target)
        calls[(mod, name)] = callees
    for _ in funcs:  # a fixpoint over the helpers' call graph
        for key in funcs:
            for callee in calls[key]:
                reads[key] |= reads[callee]
    return reads


def _aliases(tree: ast.AST) -> dict[str, str]:
    """Local name -> contracts helper module, from `from services.contracts import x [as y]`."""
    out = {}
    for n in ast.walk(tree):
        if isinstance(n, ast.ImportFrom) and n.module == "services.contracts":
            out.update({a.asname or a.name: a.name for a in n.names if a.name in CONTRACT_HELPERS})
    return out


def used_servers(w: workloads.Workload) -> set[str]:
    package = ROOT.joinpath(*w.module.split(".")[:2])
    helpers = _helper_reads()
    used: set[str] = set()
    for path in sorted(package.rglob("*.py")):
        if path.name == "settings.py":
            continue  # declares the fields; reading them there is validation, not a connection
        tree = ast.parse(path.read_text())
        aliases = _aliases(tree)
        used |= _reads(tree)
        for c in ast.walk(tree):
            if (
                isinstance(c, ast.Call)
                and isinstance(c.func, ast.Attribute)
                and isinstance(c.func.value, ast.Name)
                and c.func.value.id in aliases
            ):
                used |= helpers.get((aliases[c.func.value.id], c.func.attr), set())
    return used


@pytest.mark.parametrize("w", workloads.ALL, ids=lambda w: w.name)
def test_uses_is_what_the_code_reads(w: workloads.Workload) -> None:
    assert set(w.uses) <= set(workloads.SERVERS), "uses names a field SERVERS does not know"
    assert set(w.uses) == used_servers(w) | DYNAMIC.get(w.name, set())


@pytest.mark.parametrize("w", workloads.ALL, ids=lambda w: w.name)
def test_every_used_field_is_a_setting_of_the_workload(w: workloads.Workload) -> None:
    fields = w.settings_class().model_fields
    dynamic = DYNAMIC.get(w.name, set())
    for f in w.uses:
        if f not in dynamic:
            assert f in fields, f"{w.name} uses {f}, which {w.settings} does not have"
            port = workloads.SERVERS[f]
            assert port is None or port in fields


def test_the_scan_sees_through_the_client_helpers() -> None:
    # the write service reaches Cassandra and Kafka only through clients.*: the scan must see it
    assert {"cassandra_hosts", "kafka_bootstrap"} <= used_servers(workloads.WRITE)
