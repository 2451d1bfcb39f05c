"""The import graph of agentload's five packages, read from the source with `ast`, as markdown.

Prints the graph between packages and subpackages (a mermaid flowchart: solid arrows for imports
that run when a module is imported, dashed for those inside functions, which run only when
called) and the import cycles, among subpackages and among modules. `--write NAME` puts it into
docs/architecture.md's block `<!-- import-graph:NAME -->` ... `<!-- /import-graph -->` instead.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("loadgen", "server", "kernels", "traces", "golden_al")
ARCHITECTURE = REPO / "docs" / "architecture.md"


@dataclass(frozen=True)
class Import:
    source: str  # the importing module, dotted
    target: str  # the imported module (or package), dotted
    at_import: bool  # runs when `source` is imported (not inside a function, not TYPE_CHECKING-only)


def module_files() -> dict[str, Path]:
    """Every module of the five packages by dotted name (a package by its __init__.py)."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            parts = path.relative_to(REPO).with_suffix("").parts
            modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imported_names(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """Dotted names an import statement may bring in: `from a import b` may mean module a.b."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = module.split(".") if is_package else module.split(".")[:-1]
    if node.level:
        base = base[: len(base) - node.level + 1]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]


def imports_of(module: str, path: Path, modules: dict[str, Path]) -> list[Import]:
    """The first-party imports of one module, each once, marked by when it runs."""
    found: dict[str, bool] = {}

    def visit(node: ast.AST, at_import: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                visit(child, False)
            elif isinstance(child, ast.If) and _is_type_checking(child):
                for stmt in child.orelse:
                    visit(stmt, at_import)
            elif isinstance(child, (ast.Import, ast.ImportFrom)):
                for name in _imported_names(child, module, path.name == "__init__.py"):
                    if name in modules and name != module:
                        found[name] = found.get(name, False) or at_import
            else:
                visit(child, at_import)

    visit(ast.parse(path.read_text(), str(path)), True)
    return [Import(module, target, at_import) for target, at_import in sorted(found.items())]


def all_imports() -> list[Import]:
    modules = module_files()
    return [imp for name, path in modules.items() for imp in imports_of(name, path, modules)]


def unit_of(module: str, modules: dict[str, Path]) -> str:
    """The (sub)package a module belongs to: `loadgen.transport.wire` -> `loadgen.transport`."""
    if modules[module].name == "__init__.py":
        return module
    return module.rpartition(".")[0]


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            connect(node)
    return sorted(found)


def _node_id(unit: str) -> str:
    return unit.replace(".", "_")


def render(imports: list[Import], modules: dict[str, Path], revision: str) -> str:
    unit_edges: dict[tuple[str, str], list[bool]] = defaultdict(list)
    module_edges: dict[str, set[str]] = defaultdict(set)
    for imp in imports:
        source_unit, target_unit = unit_of(imp.source, modules), unit_of(imp.target, modules)
        if source_unit != target_unit:
            unit_edges[(source_unit, target_unit)].append(imp.at_import)
        if imp.at_import:
            module_edges[imp.source].add(imp.target)
    units = sorted({unit_of(m, modules) for m in modules})
    lines = [f"Generated by `python docs/import_graph.py` at {revision}: {len(modules)} modules in "
             f"{len(units)} packages and subpackages. A solid arrow: some import runs when the module is "
             "imported; dashed: every import of it is inside a function.", "", "```mermaid", "flowchart LR"]
    for package in PACKAGES:
        members = [u for u in units if u.split(".")[0] == package]
        lines.append(f"  subgraph {package}_pkg [{package}]")
        lines += [f"    {_node_id(u)}[{u}]" for u in members]
        lines.append("  end")
    for (source, target), kinds in sorted(unit_edges.items()):
        arrow = "-->" if any(kinds) else "-.->"
        lines.append(f"  {_node_id(source)} {arrow} {_node_id(target)}")
    lines += ["```", ""]
    unit_graph: dict[str, set[str]] = defaultdict(set)
    for (source, target), kinds in unit_edges.items():
        if any(kinds):
            unit_graph[source].add(target)
    package_cycles = cycles(unit_graph)
    module_cycles = cycles(module_edges)
    lines.append("Cycles among packages and subpackages (imports that run at import time): "
                 + ("; ".join(" <-> ".join(c) for c in package_cycles) if package_cycles else "none") + ".")
    lines.append("")
    lines.append("Cycles among modules (imports that run at import time): "
                 + ("; ".join(" <-> ".join(c) for c in module_cycles) if module_cycles else "none") + ".")
    return "\n".join(lines) + "\n"


def revision() -> str:
    result = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True)
    return f"commit {result.stdout.strip()}" if result.returncode == 0 else "an unknown commit"


def write_block(name: str, text: str) -> None:
    """Replace the body of `<!-- import-graph:NAME -->` ... `<!-- /import-graph -->`."""
    block = re.compile(rf"(<!-- import-graph:{re.escape(name)} -->\n).*?(<!-- /import-graph -->)", re.S)
    doc = ARCHITECTURE.read_text()
    if not block.search(doc):
        raise SystemExit(f"no block <!-- import-graph:{name} --> in {ARCHITECTURE.relative_to(REPO)}")
    ARCHITECTURE.write_text(block.sub(lambda m: m.group(1) + text + m.group(2), doc))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", metavar="NAME",
                        help="write into docs/architecture.md's block <!-- import-graph:NAME --> instead of printing")
    args = parser.parse_args(argv)
    text = render(all_imports(), module_files(), revision())
    if args.write:
        write_block(args.write, text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
