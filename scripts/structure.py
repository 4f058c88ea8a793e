"""The package's structure in numbers, from its own import lines: what a redesign is measured by.

    python scripts/structure.py [--root DIR] [--json]

Prints modules and packages, the import layers (the longest chain of imports between specbench modules, import
cycles counted as one layer), the imports that run upward (those inside a cycle: a module imports one that imports
it back, directly or through others), the cycles between folders (a sub-package counted as one node), the largest files, and how far the whole Hydra config travels: the functions
that take the config object itself (a parameter named ``cfg``) and the modules they are in. Imports inside functions
count as much as those at the top of a file: a lazy import still ties two modules together.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from specbench.errors import SpecbenchError  # noqa: E402  # standard library only
from specbench.reporting import reporting_user_errors  # noqa: E402

PACKAGE = "specbench"


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def imported_modules(tree: ast.AST, name: str, is_package: bool, known: set[str]) -> set[str]:
    """The package's modules that ``name`` imports, resolved to modules (``from a import b`` is ``a.b`` where that
    is a module, else ``a``)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_package else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name and target.split(".")[0] == PACKAGE:
                found.add(target)
    return found


def strongly_connected(graph: dict[str, set[str]]) -> list[set[str]]:
    """Tarjan's components of ``graph``, iteratively (no recursion limit on a long chain)."""
    index, low, on_stack, stack, components, counter = {}, {}, set(), [], [], [0]
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                components.append(component)
    return components


def layers(graph: dict[str, set[str]], components: list[set[str]]) -> int:
    """The longest import chain, in components (a module that imports nothing of the package is layer 1)."""
    component_of = {member: i for i, component in enumerate(components) for member in component}
    depth: dict[int, int] = {}
    for i, component in enumerate(components):  # Tarjan emits a component after every one it reaches
        below = {component_of[child] for member in component for child in graph[member]} - {i}
        depth[i] = 1 + max((depth[j] for j in below), default=0)
    return max(depth.values(), default=0)


def config_travel(trees: dict[str, ast.AST]) -> dict[str, list[str]]:
    """For each module, its functions that take the whole config (a parameter named ``cfg``)."""
    taking = defaultdict(list)
    for name, tree in trees.items():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
                if any(argument.arg == "cfg" for argument in arguments):
                    taking[name].append(node.name)
    return dict(taking)


def measure(root: Path) -> dict:
    files = sorted((root / PACKAGE).rglob("*.py"))
    names = {module_name(path, root): path for path in files}
    trees = {name: ast.parse(path.read_text(), str(path)) for name, path in names.items()}
    known = set(names)
    graph = {name: imported_modules(tree, name, names[name].name == "__init__.py", known)
             for name, tree in trees.items()}
    components = strongly_connected(graph)
    cycles = [sorted(component) for component in components if len(component) > 1]
    in_cycle = {member: i for i, cycle in enumerate(cycles) for member in cycle}
    upward = sorted(f"{source} -> {target}" for source, targets in graph.items() for target in targets
                    if source in in_cycle and in_cycle.get(target) == in_cycle[source])
    packages = sorted({name for name, path in names.items() if path.name == "__init__.py"})
    # The same graph with each sub-package as one node: a cycle there is two folders leaning on each other.
    folder = {name: name if path.parent == root / PACKAGE else ".".join(name.split(".")[:2])
              for name, path in names.items()}
    folders = defaultdict(set)
    for source, targets in graph.items():
        folders[folder[source]].update(folder[target] for target in targets if folder[target] != folder[source])
    for node in list(folders.values()):
        for target in node:
            folders.setdefault(target, set())
    folder_cycles = [sorted(component) for component in strongly_connected(dict(folders)) if len(component) > 1]
    sizes = sorted(((len(path.read_text().splitlines()), str(path.relative_to(root))) for path in files), reverse=True)
    travel = config_travel(trees)
    return {
        "modules": sum(1 for path in files if path.name != "__init__.py"),
        "packages": len(packages),
        "modules_at_package_root": sum(1 for name, path in names.items()
                                       if path.parent == root / PACKAGE and path.name != "__init__.py"),
        "imports": sum(len(targets) for targets in graph.values()),
        "import_layers": layers(graph, components),
        "import_cycles": cycles,
        "imports_upward": upward,
        "folder_cycles": folder_cycles,
        "largest_files": [f"{path} {lines}" for lines, path in sizes[:6]],
        "files_over_800_lines": [path for lines, path in sizes if lines > 800],
        "functions_taking_cfg": sum(len(functions) for functions in travel.values()),
        "modules_taking_cfg": {name: sorted(functions) for name, functions in sorted(travel.items())},
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT,
                        help="the checkout to measure (default: this one)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    if not (args.root / PACKAGE).is_dir():
        raise SpecbenchError(f"{args.root} holds no {PACKAGE}/ package; pass --root a checkout of specbench")
    figures = measure(args.root)
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for key, value in figures.items():
        if isinstance(value, dict):
            print(f"{key}:")
            for name, functions in value.items():
                print(f"  {name}: {', '.join(functions)}")
        elif isinstance(value, list):
            print(f"{key}: {len(value)}")
            for item in value:
                print(f"  {item}")
        else:
            print(f"{key}: {value}")


if __name__ == "__main__":
    sys.exit(reporting_user_errors("structure", main)())
