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
CONTRACT_HELPERS = ("clients", "etcd", "auth")  # services/contracts modules taking settings
# settings properties that read a server field
PROPERTIES = {
    "count_cache_startup": "count_cache_nodes",
    "idem_store_startup": "idem_store_nodes",
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
    """(module, function) -> server fields it reads, following calls inside its module."""
    out: dict[tuple[str, str], set[str]] = {}
    for mod in CONTRACT_HELPERS:
        tree = ast.parse((ROOT / "services" / "contracts" / f"{mod}.py").read_text())
        funcs = {
            n.name: n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
        }
        reads = {name: _reads(f) for name, f in funcs.items()}
        calls = {
            name: {
                c.func.id
                for c in ast.walk(f)
                if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id in funcs
            }
            for name, f in funcs.items()
        }
        for _ in funcs:  # a fixpoint over the module's call graph
            for name in funcs:
                for callee in calls[name]:
                    reads[name] |= reads[callee]
        out.update({(mod, name): r for name, r in reads.items()})
    return out


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
