"""The package's import graph: no cycle, and folders by role on floors, each importing only lower ones."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "include" / "kafka_ledger"


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py") if "migrations/versions" not in p.as_posix()}


def import_graph() -> dict[str, set[str]]:
    """Module -> the package's modules it imports anywhere in its body (inside functions and TYPE_CHECKING too)."""
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            for target in targets:
                # `from kafka_ledger.ledger import db` imports the module kafka_ledger.ledger.db.
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != name and target.startswith("kafka_ledger"):
                    found.add(target)
        graph[name] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every strongly connected group of more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph()
    # A package's __init__ that re-exports its own modules is not a cycle worth the name; ours import nothing.
    assert cycles(graph) == []


def test_the_walk_sees_imports_inside_functions() -> None:
    graph = import_graph()
    assert "kafka_ledger.ledger.db" in graph["kafka_ledger.ops.cli"]
    assert len(graph) > 20


# The package's folders by role, each on its floor: a module may import its own folder's modules and those of lower
# floors, never a folder on its own floor or above (docs: the README's Layout).
FLOORS: dict[str, int] = {
    "model": 1, "observe": 1,
    "formats": 2,
    "config": 3,
    "ledger": 4, "kafka": 4, "spark": 4,
    "sinks": 5,
    "batch": 6,
    "runtimes": 7,
    "airflow": 8, "ops": 8,
}
# Modules outside the folders: the package itself, and the doorbell trigger's former home (kept for one release:
# Airflow's trigger table names it).
OUTSIDE = {"kafka_ledger", "kafka_ledger.doorbell"}


def room(module: str) -> str:
    return module.split(".")[1]


def test_every_module_lives_in_a_folder_of_a_floor():
    assert {room(m) for m in import_graph() if m not in OUTSIDE} == set(FLOORS)


def test_no_import_runs_back_up_or_across_a_floor():
    upward = [f"{module} -> {target}" for module, targets in import_graph().items() if module not in OUTSIDE
              for target in targets if target not in OUTSIDE and room(target) != room(module)
              and FLOORS[room(target)] >= FLOORS[room(module)]]
    assert upward == []


def test_the_floors_are_the_longest_chain_of_folders_and_fewer_than_before():
    """12 floors before the folders (2a48b79), 7 until the formats went below the declaration that asks them to
    validate their part of it (#56); the chain of folder imports is as long as FLOORS says, no longer."""
    graph = import_graph()
    edges = {(room(m), room(t)) for m, targets in graph.items() if m not in OUTSIDE
             for t in targets if t not in OUTSIDE and room(t) != room(m)}
    depth: dict[str, int] = {}

    def floor(folder: str) -> int:
        if folder not in depth:
            depth[folder] = 1 + max((floor(b) for a, b in edges if a == folder), default=0)
        return depth[folder]

    assert max(floor(f) for f in FLOORS) == max(FLOORS.values()) == 8
    assert all(floor(f) <= FLOORS[f] for f in FLOORS)


def test_the_readme_layout_names_every_folder_on_its_floor():
    readme = (PACKAGE.parents[1] / "README.md").read_text()
    layout = readme.split("## Layout", 1)[1].split("\n## ", 1)[0]
    import re

    shown = {m.group(2): int(m.group(1)) for m in re.finditer(r"^\|\s*(\d)\s*\|\s*`(\w+)/`", layout, re.M)}
    assert shown == FLOORS


def test_no_module_outside_the_sinks_and_the_declaration_asks_which_sink_it_is():
    """Code outside sinks/ asks a sink what it can do (sinks/base.py), never whether it is an Iceberg table or an
    entity table: a new sink is a new class, not one more branch across the package."""
    import re

    found = []
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] in ("sinks", "config"):
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"isinstance\([^)]*Iceberg|is_entity_table|IcebergSink|PostgresSink|PostgresEntitySink", line):
                found.append(f"{relative}:{number}: {line.strip()}")
    assert found == []


def test_no_module_outside_the_formats_asks_which_format_it_is():
    """Code outside formats/ asks a value format what it does (formats/base.py: its declaration, pins, binding,
    secrets, columns), never whether it is Avro or JSON: a new format is a module under formats/, not one more branch
    across the package."""
    import re

    asks = re.compile(r"\.format\s*(==|!=|\bin\b)|[\"']avro[\"']|AvroFormat|JsonFormat|isinstance\([^)]*Format\b")
    found = []
    for path in PACKAGE.rglob("*.py"):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] == "formats" or "migrations" in relative.parts:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if asks.search(line):
                found.append(f"{relative}:{number}: {line.strip()}")
    assert found == []
