"""The import graph of the package (every import in every module, those inside functions too: a lazy
import is still a dependency): no module depends on itself through others, and the quantization package
depends on no toolchain (a toolchain names its quantized form; the forms and the search never ask for a
toolchain)."""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx

PACKAGE = Path(__file__).resolve().parents[1] / "sparse_lower"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported(node: ast.AST, package: str, modules: set[str]) -> set[str]:
    """The package's modules an import statement in `package` names: a name imported from a package is
    its module where it is one, else what it is imported from."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    elif isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            base = ".".join(parts[:len(parts) - node.level + 1] + ([node.module] if node.module else []))
        names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
    else:
        return set()
    found = set()
    for name in names:
        while name not in modules and "." in name:
            name = name.rsplit(".", 1)[0]
        if name in modules:
            found.add(name)
    return found


def import_graph() -> nx.DiGraph:
    paths = {module_name(path): path for path in PACKAGE.rglob("*.py")}
    graph = nx.DiGraph()
    graph.add_nodes_from(paths)
    for module, path in paths.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            graph.add_edges_from((module, target) for target in imported(node, package, set(paths)) if target != module)
    return graph


def test_no_module_depends_on_itself():
    graph = import_graph()
    assert len(graph) > 100 and graph.number_of_edges() > 300  # the whole package was read
    cycles = sorted(nx.simple_cycles(graph), key=len)
    assert not cycles, "\n".join(" -> ".join([*cycle, cycle[0]]) for cycle in cycles[:10])


def test_quantization_depends_on_no_toolchain():
    graph = import_graph()
    quantization = [m for m in graph if m.startswith("sparse_lower.quantization")]
    reached = set().union(*(nx.descendants(graph, m) for m in quantization))
    assert not {m for m in reached if m.startswith("sparse_lower.toolchains")}
