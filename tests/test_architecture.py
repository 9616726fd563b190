"""The package's layers, read from its sources (docs/architecture.md draws them).

Every import counts: at module level, inside functions, under TYPE_CHECKING, and
`importlib.import_module` of a literal name. No module may import one of a higher layer, and
the imports have no cycle.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "kernelhub"

# Lowest first; a module may import its own layer and those listed before it.
LAYERS = (
    ("core", ("kernelhub._core",)),
    ("operand formats", ("kernelhub.quantization", "kernelhub._qwix")),
    ("grouped-matmul kit", ("kernelhub._grouped_matmul",)),
    ("contracts", ("kernelhub.ops",)),
    ("backends", ("kernelhub._xla", "kernelhub._pallas", "kernelhub._collectives",
                  "kernelhub._composite")),
    ("loader", ("kernelhub._loader",)),
    ("library", ("kernelhub.tuning", "kernelhub.parallel", "kernelhub.export",
                 "kernelhub.testing", "kernelhub._verify", "kernelhub.quantized_training")),
    ("facade", ("kernelhub", "kernelhub._public")),
    ("command line", ("kernelhub._cli", "kernelhub.cli")),
)


def _module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _resolve(name: str) -> str | None:
    """The module `name` refers to: itself, or the package or module holding the attribute."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(name: str, path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(tree):
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"):
            targets = [str(node.args[0].value)]
        for target in targets:
            if target.startswith("kernelhub"):
                resolved = _resolve(target)
                if resolved and resolved != name:
                    found.add(resolved)
    return found


GRAPH = {name: _imports(name, path) for name, path in MODULES.items()}


def _layer(name: str) -> int:
    best, level = -1, None
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            if (name == prefix or name.startswith(prefix + ".")) and len(prefix) > best:
                best, level = len(prefix), index
    assert level is not None, f"{name} belongs to no layer: add it to LAYERS and the docs"
    return level


def test_every_module_has_a_layer():
    for name in MODULES:
        _layer(name)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_imports_point_down(name):
    own = _layer(name)
    upward = sorted(target for target in GRAPH[name] if _layer(target) > own)
    assert not upward, (f"{name} ({LAYERS[own][0]}) imports from higher layers: "
                        + ", ".join(f"{t} ({LAYERS[_layer(t)][0]})" for t in upward))


def test_the_core_imports_only_the_core():
    for name, targets in GRAPH.items():
        if _layer(name) == 0:
            assert all(_layer(t) == 0 for t in targets), (name, sorted(targets))


def test_no_import_cycles():
    index, low, on_stack, stack, cycles = {}, {}, set(), [], []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in GRAPH[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in GRAPH:
        if node not in index:
            visit(node)
    assert not cycles, f"import cycles: {cycles}"
