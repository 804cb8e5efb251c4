"""Layout rules the review asked for (section 5), checked over the source so they stay true: each
topic name is written once, and the Pulumi program's modules import each other without a cycle."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

from services.contracts import events

REPO = Path(__file__).resolve().parents[2]
CODE = ("infra", "services", "local", "operators", "cli")  # not tests/ or bench/: they may spell


def _modules(top: str) -> Iterator[tuple[str, Path]]:
    for path in sorted((REPO / top).rglob("*.py")):
        parts = path.relative_to(REPO).with_suffix("").parts
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def test_each_topic_name_is_written_once() -> None:
    """Topic names lived in three places (contracts/events.py, infra/kafka.py and
    infra/schema_registry.py): a rename in one left the others creating the old topic."""
    names = {*events.EVENT_TOPICS, events.DEAD_LETTER}
    where: dict[str, list[str]] = {}
    for top in CODE:
        for module, path in _modules(top):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Constant) and node.value in names:
                    where.setdefault(str(node.value), []).append(f"{module}:{node.lineno}")
    assert sorted(where) == sorted(names)  # the scan sees the definitions
    assert {name: sites for name, sites in where.items() if len(sites) > 1} == {}
    assert all(sites[0].startswith("services.contracts.events:") for sites in where.values())


def _imports(module: str, path: Path, package: str) -> set[str]:
    """The `package` modules `module` imports, at any depth of its code (a lazy import inside a
    function is an edge too: infra.plan imported infra.cli that way)."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package
                anchor = module.split(".")[: -node.level]
                base = ".".join([*anchor, base] if base else anchor)
            out.add(base)
            out.update(f"{base}.{a.name}" for a in node.names)
    return {m for m in out if m == package or m.startswith(f"{package}.")}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 on the path, 2 done
    stack: list[str] = []

    def visit(n: str) -> list[str] | None:
        state[n] = 1
        stack.append(n)
        for m in sorted(graph.get(n, ())):
            if state.get(m) == 1:
                return [*stack[stack.index(m) :], m]
            if m not in state and (found := visit(m)):
                return found
        stack.pop()
        state[n] = 2
        return None

    for n in sorted(graph):
        if n not in state and (found := visit(n)):
            return found
    return None


def test_the_program_has_no_import_cycle() -> None:
    """infra.cli imported infra.plan and infra.plan imported infra.cli back (review section 5)."""
    modules = dict(_modules("infra"))
    graph = {m: _imports(m, p, "infra") & modules.keys() - {m, "infra"} for m, p in modules.items()}
    assert "infra.plan" in graph["infra.cli"]  # the scan sees the edge that made the cycle
    assert _cycle(graph) is None


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
